"""Files that a crash cannot half-write: atomic replacement, and safetensors files (arrays, no
pickle) whose header holds JSON values, read back with one-line errors."""

import hashlib
import json
import os
import tempfile
from collections.abc import Callable

import numpy as np
import safetensors


def write_atomically(path: str, data: bytes | Callable[[str], None]) -> None:
    """Writes `data` to `path` so that `path` holds its old content or all of `data`, whatever:
    a temporary file in the same directory, synced, then renamed over it (a failed write removes
    it; a killed process leaves it, never a partial `path`). `data` is the bytes, or a function
    that writes them into the file it is named (no copy of a large file in memory)."""
    directory = os.path.dirname(path) or "."
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".tmp", delete=False) as f:
        try:
            if callable(data):
                data(f.name)
            else:
                f.write(data)
                f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0o022)  # the temporary file is private (0600): give it the usual mode
            os.umask(umask)
            os.chmod(f.name, 0o666 & ~umask)
            os.replace(f.name, path)
        except BaseException:
            os.unlink(f.name)
            raise
    # The rename itself survives a power cut only once the directory is synced.
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove_partial_writes(directory: str) -> None:
    """Removes the temporary files of writes that a killed process left in `directory`."""
    for name in os.listdir(directory):
        if name.startswith(tempfile.gettempprefix()) and name.endswith(".tmp"):
            os.remove(os.path.join(directory, name))


def row_major(x) -> np.ndarray:
    """`x` as a row-major (C-order) numpy array: safetensors writes an array's memory as it lies,
    whatever its strides, and a TPU hands some arrays to the host in column-major order (a
    (128, 3) weight matrix, say), which would be written transposed. A row-major array is returned
    as it is, sharing its memory."""
    return np.asarray(x, order="C")


def read_safetensors(path: str, what: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, header) of the safetensors file at `path`; ValueError saying what is wrong, `what`
    being the flag that named the file."""
    if os.path.isdir(path):
        raise ValueError(f"{what} {path} is a directory, not a file")
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path}: no such file")
    try:
        with safetensors.safe_open(path, framework="numpy") as f:
            header = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors reports a truncated or garbled file in several ways
        raise ValueError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]})")
    return tensors, header


def header_value(path: str, header: dict[str, str], name: str, before: dict | None = None):
    """The JSON value of `name` in a file's header, or its value in `before` (files saved before the
    field existed); ValueError naming the file and the field."""
    if name not in header and name in (before or {}):
        return before[name]
    if name not in header:
        raise ValueError(f"{path} has no {name} in its header: it was not saved by this script")
    try:
        return json.loads(header[name])
    except ValueError:
        raise ValueError(f"{path}: the header's {name} is not valid JSON "
                         f"({header[name][:40]!r})") from None


def source_digest(*paths: str) -> str:
    """SHA-256 of the files' bytes: a checkpoint resumes only under the code that wrote it."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()

"""Model files and training checkpoints: arrays in safetensors (no pickle) with JSON values in the
header, written atomically and checked when read; and a TensorBoard log made durable by them.

Why safetensors for checkpoints too, not orbax-checkpoint: a checkpoint is then one file, replaced
whole by the same atomic rename as the model file, where orbax writes a directory per checkpoint and
its import adds 0.36 s to every start of the script (measured here)."""

import concurrent.futures
import hashlib
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from tensorboardX import SummaryWriter

from utils.cli import flag


def write_atomically(path: str, data: bytes) -> None:
    """Writes `data` to `path` so that `path` holds its old content or all of `data`, whatever:
    a temporary file in the same directory, synced, then renamed over it (a failed write removes
    it; a killed process leaves it, never a partial `path`)."""
    directory = os.path.dirname(path) or "."
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".tmp", delete=False) as f:
        try:
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


# --------------------------------------------------------------------------------------------------
# Model files: the final parameters, with the arguments that rebuild the network
# --------------------------------------------------------------------------------------------------
def save_model(path: str, params: dict, network_args: dict, metadata: dict[str, str]) -> None:
    """Writes `params` to `path` atomically, with `network_args` ({name: value}, JSON-encoded) and
    `metadata` in the header."""
    tensors = {f"{module}/{name}": np.asarray(value)
               for module, leaves in params.items() for name, value in leaves.items()}
    header = {name: json.dumps(value) for name, value in network_args.items()} | metadata
    write_atomically(path, safetensors.numpy.save(tensors, header))


def read_network_args(path: str, names: tuple[str, ...], before: dict | None = None) -> dict:
    """The arguments that rebuild the network, from the header of the model file at `path`
    (`before`: see header_value)."""
    _, header = read_safetensors(path, "--load-model")
    return {name: header_value(path, header, name, before) for name in names}


def load_model(path: str, network_args: dict, expected: dict, before: dict | None = None) -> dict:
    """The parameters saved at `path`, checked against this run's `network_args` and the shapes of
    `expected`; raises ValueError saying what is wrong."""
    tensors, header = read_safetensors(path, "--load-model")
    for name, value in network_args.items():
        saved, wanted = header_value(path, header, name, before), json.loads(json.dumps(value))
        if saved != wanted:
            show = lambda v: " ".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
            raise ValueError(f"{path} was trained with {flag(name)} {show(saved)}, "
                             f"not {show(wanted)}")
    shapes = {f"{module}/{name}": (tuple(x.shape), np.dtype(x.dtype))
              for module, leaves in expected.items() for name, x in leaves.items()}
    if {name: (t.shape, t.dtype) for name, t in tensors.items()} != shapes:
        raise ValueError(f"{path} does not hold the parameters of this network")
    if not all(np.isfinite(t).all() for t in tensors.values()):
        raise ValueError(f"{path} holds non-finite parameters")
    params = {}
    for key, value in tensors.items():
        module, name = key.rsplit("/", 1)
        params.setdefault(module, {})[name] = jnp.asarray(value)
    return params


# --------------------------------------------------------------------------------------------------
# Training checkpoints: any pytrees of arrays, each leaf named by its path in the tree
# --------------------------------------------------------------------------------------------------
def is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def state_bytes(trees: dict, header: dict[str, str]) -> bytes:
    """The pytrees in `trees` ({prefix: tree}) as a safetensors file: a leaf is the tensor
    `prefix + keystr(its path)`; a typed random key is stored as its raw data (safetensors holds
    numbers only), its implementation in the header's key_impls."""
    leaves = jax.tree_util.tree_flatten_with_path(trees)[0]
    names = [f"{key_path[0].key}{jax.tree_util.keystr(key_path[1:])}" for key_path, _ in leaves]
    key_impls = {name: str(jax.random.key_impl(x))
                 for name, (_, x) in zip(names, leaves) if is_key(x)}
    raw = jax.device_get([jax.random.key_data(x) if is_key(x) else x for _, x in leaves])  # at once
    tensors = {name: np.asarray(x) for name, x in zip(names, raw)}
    return safetensors.numpy.save(tensors, header | {"key_impls": json.dumps(key_impls)})


def restore(path: str, tensors: dict[str, np.ndarray], header: dict[str, str], prefix: str, like):
    """The pytree of `like`'s structure (arrays or jax.ShapeDtypeStructs) from what `state_bytes`
    wrote under `prefix`; ValueError unless every leaf is there with its shape and dtype, and
    nothing else is."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
    names = [prefix + jax.tree_util.keystr(key_path) for key_path, _ in leaves]
    key_impls = header_value(path, header, "key_impls")
    restored = []
    for name, (_, x) in zip(names, leaves):
        stored = jax.eval_shape(jax.random.key_data, x) if is_key(x) else x
        found = (tensors[name].shape, tensors[name].dtype) if name in tensors else None
        if found != (stored.shape, stored.dtype):
            raise ValueError(f"{path} does not hold {name} as {stored.dtype}{list(stored.shape)}: "
                             f"it is not a checkpoint of this run's state")
        value = tensors[name]
        if is_key(x):
            try:
                value = jax.random.wrap_key_data(value, impl=key_impls.get(name, "none"))
            except ValueError as e:  # an implementation JAX does not know
                raise ValueError(f"{path}: {name}: {str(e).splitlines()[0]}") from None
            if value.dtype != x.dtype:
                raise ValueError(f"{path} holds {name} as a {value.dtype} key, not {x.dtype}")
        restored.append(value)
    extra = {name for name in tensors if name.startswith(prefix)} - set(names)
    if extra:
        raise ValueError(f"{path} holds {sorted(extra)[0]}, which this run's state has not")
    return jax.tree_util.tree_unflatten(treedef, restored)


class RunLog:
    """A tensorboardX SummaryWriter that also writes the run's checkpoints, each once the log up to
    its step is on disk: whatever kills the process, the log holds every step a resume starts after.
    tensorboardX writes from a queue in a thread and flushes every two minutes; closing is its one
    synchronous flush, so a checkpoint closes the event file and starts the next. Closing and
    writing happen in a background thread, one checkpoint at a time: training does not wait for the
    disk."""

    def __init__(self, logdir: str, step: int = 0, purge_step: int | None = None):
        # purge_step: TensorBoard drops what earlier files logged from that step on (a killed run's
        # steps after its checkpoint, which the resumed run logs again).
        self.logdir, self.files, self.pending = logdir, 0, None
        self.disk = concurrent.futures.ThreadPoolExecutor(1)
        # Event files sort by the second they were made in, so a resumed log waits for a second that
        # no file of the run before it was made in (less than a second, right after a kill).
        made = [int(name.split(".")[3]) for name in os.listdir(logdir) if name.startswith("events.out.tfevents.")]
        time.sleep(max(0.0, max(made, default=0) + 1 - time.time()))
        self.writer = self.open(step, purge_step)

    def open(self, step: int, purge_step: int | None = None) -> SummaryWriter:
        # Files sort by their second of creation, then by this suffix: the step they start at (a
        # name used twice would truncate the first file).
        self.files += 1
        return SummaryWriter(self.logdir, purge_step=purge_step,
                             filename_suffix=f".{step:012d}.{os.getpid()}.{self.files:06d}")

    def save_state(self, path: str, trees: dict, header: dict[str, str], step: int) -> None:
        """Writes `trees` and `header` to `path` (see `state_bytes`) atomically in the background,
        once the log up to `step` is on disk. The arrays must not change (JAX's do not)."""
        self.wait()
        logged, self.writer = self.writer, self.open(step)
        self.pending = self.disk.submit(self.write, logged, path, trees, header)

    @staticmethod
    def write(logged: SummaryWriter, path: str, trees: dict, header: dict[str, str]) -> None:
        logged.close()  # first the log up to the checkpoint's step, then the checkpoint
        write_atomically(path, state_bytes(trees, header))

    def wait(self) -> None:
        """Returns once the last checkpoint is on disk; raises what its write raised."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.writer.close()
            self.disk.shutdown()

    def __getattr__(self, name):
        return getattr(self.writer, name)

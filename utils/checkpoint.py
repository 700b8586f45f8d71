"""Model files: Haiku parameters in safetensors (no pickle), with the arguments that rebuild the
network as JSON in the header, written atomically and checked when read."""

import json
import os
import tempfile

import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from utils.cli import flag


def save_model(path: str, params: dict, network_args: dict, metadata: dict[str, str]) -> None:
    """Writes `params` to `path` atomically (a temporary file in the same directory, then a rename), with
    `network_args` ({name: value}, JSON-encoded) and `metadata` in the header."""
    tensors = {f"{module}/{name}": np.asarray(value)
               for module, leaves in params.items() for name, value in leaves.items()}
    header = {name: json.dumps(value) for name, value in network_args.items()} | metadata
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path) or ".", suffix=".tmp", delete=False) as f:
        try:
            f.write(safetensors.numpy.save(tensors, header))
            f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0o022)  # the temporary file is private (0600); give the model the usual mode
            os.umask(umask)
            os.chmod(f.name, 0o666 & ~umask)
            os.replace(f.name, path)
        except BaseException:  # a failed save leaves no partial file behind
            os.unlink(f.name)
            raise


def load_model(path: str, network_args: dict, expected: dict) -> dict:
    """The parameters saved at `path`, checked against this run's `network_args` and the shapes of
    `expected`; raises ValueError saying what is wrong."""
    try:
        with safetensors.safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors reports a truncated or garbled file in several ways
        raise ValueError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]})")
    for name, value in network_args.items():
        if name not in metadata:
            raise ValueError(f"{path} has no {name} in its header: it was not saved by this script")
        saved, wanted = json.loads(metadata[name]), json.loads(json.dumps(value))
        if saved != wanted:
            show = lambda v: " ".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
            raise ValueError(f"{path} was trained with {flag(name)} {show(saved)}, not {show(wanted)}; "
                             f"pass the arguments it was trained with")
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

"""Model files: a script's final parameters in safetensors, with the arguments that rebuild its
network in the header, so that `--load-model` needs nothing else."""

import json
import os

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from utils.cli import flag, show
from utils.files import header_value, read_safetensors, row_major, write_atomically

MODEL = "model.safetensors"


def save_model(path: str, params: dict, network_args: dict, metadata: dict[str, str]) -> None:
    """Writes `params` to `path` atomically, with `network_args` ({name: value}, JSON-encoded) and
    `metadata` in the header."""
    tensors = {f"{module}/{name}": row_major(value)
               for module, leaves in params.items() for name, value in leaves.items()}
    header = {name: json.dumps(value) for name, value in network_args.items()} | metadata
    write_atomically(path, safetensors.numpy.save(tensors, header))


def save_run_model(run_dir: str, script: str, args, params: dict, network_args: tuple[str, ...],
                   step: int) -> str:
    """A run's final parameters as run_dir/model.safetensors, its header holding the arguments in
    `network_args`, the script that wrote it (its file name without .py), the step and all the run's
    arguments; the path."""
    path = os.path.join(run_dir, MODEL)
    save_model(path, params, {name: getattr(args, name) for name in network_args},
               {"script": json.dumps(script), "global_step": str(step),
                "args": json.dumps(vars(args))})
    return path


def check_writer(path: str, script: str, fields: set[str]) -> None:
    """ValueError unless the model file at `path` was written by `script` (a file name, no .py):
    as its header's `script` says, or, in a file from before it said, as the run's arguments show,
    each of which must be one of `fields` (the script's Args). Two scripts may share a network."""
    _, header = read_safetensors(path, "--load-model")
    if "script" in header:
        writer = header_value(path, header, "script")
        if writer != script:
            raise ValueError(f"{path} was written by {writer}.py, not {script}.py")
    elif "args" in header:
        foreign = sorted(set(header_value(path, header, "args")) - fields)
        if foreign:
            raise ValueError(f"{path} was written by another script: its run had "
                             f"{flag(foreign[0])}, which {script}.py has not")


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


def load_params(path: str, network: hk.Transformed, obs: jax.ShapeDtypeStruct, args,
                network_args: tuple[str, ...], before: dict | None = None) -> dict:
    """The parameters of the model file at `path` for `network` (which takes batches of `obs`),
    checked against `args`' values of `network_args`; ValueError saying what is wrong."""
    like = jax.ShapeDtypeStruct((1, *obs.shape), obs.dtype)
    shapes = jax.eval_shape(network.init, jax.random.key(0), like)
    return load_model(path, {name: getattr(args, name) for name in network_args}, shapes, before)

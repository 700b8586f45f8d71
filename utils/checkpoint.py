"""Checkpoints and resume: a run's whole training state, written atomically in the background
every few iterations, so that a resumed run is the run that would have been, bit for bit.

A checkpoint is one safetensors file (why not orbax-checkpoint: one file, replaced whole by the
same atomic rename as the model file, and no import cost at start-up) holding any pytrees of
arrays, each leaf named by its path, with the run's arguments, progress and code digest in the
header. Any script whose training state is a pytree can use it."""

import concurrent.futures
import dataclasses
import glob
import json
import os
from typing import NamedTuple

import jax
import numpy as np
import safetensors.numpy

from utils import cli
from utils.files import (
    header_value,
    read_safetensors,
    remove_partial_writes,
    row_major,
    source_digest,
    write_atomically,
)
from utils.startup import precision_environment

CHECKPOINT = "checkpoint.safetensors"
UTILS = os.path.dirname(os.path.abspath(__file__))


class History(NamedTuple):
    """The learning curve: the mean return of the training episodes that ended in each
    iteration."""
    steps: list
    seconds: list
    returns: list


class Progress(NamedTuple):
    """How far training is: with the training state, what a checkpoint holds."""
    iteration: int
    history: History
    train_seconds: float


def fresh_start() -> Progress:
    return Progress(0, History([], [], []), 0.0)


# --------------------------------------------------------------------------------------------------
# Training checkpoints: any pytrees of arrays, each leaf named by its path in the tree
# --------------------------------------------------------------------------------------------------
def is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def write_state(path: str, trees: dict, header: dict[str, str]) -> None:
    """The pytrees in `trees` ({prefix: tree}) written to `path` as a safetensors file
    (state_tensors), atomically, streamed into the file: no copy of a large state in memory (an
    SR-DQN seed's 1M-step buffer is 113 MB)."""
    tensors, header = state_tensors(trees, header)
    write_atomically(path, lambda name: safetensors.numpy.save_file(tensors, name, header))


def state_tensors(trees: dict, header: dict[str, str]) -> tuple[dict[str, np.ndarray],
                                                                 dict[str, str]]:
    """The pytrees in `trees` ({prefix: tree}) as safetensors' tensors and header: a leaf is the
    tensor `prefix + keystr(its path)`; a typed random key is stored as its raw data (safetensors
    holds numbers only), its implementation in the header's key_impls. On the CPU the tensors may
    share the arrays' memory: keep the arrays until the tensors are written."""
    arrays, key_impls = host_arrays(trees)
    tensors = {name: row_major(x) for name, x in arrays.items()}
    return tensors, header | {"key_impls": json.dumps(key_impls)}


def host_arrays(trees: dict) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The leaves of `trees` ({prefix: tree}) on the host, by state_tensors' names, in the memory
    order the device hands them over (a TPU's may be column-major), a typed key as its raw data;
    and {name: implementation} of those keys."""
    leaves = jax.tree_util.tree_flatten_with_path(trees)[0]
    names = [f"{key_path[0].key}{jax.tree_util.keystr(key_path[1:])}" for key_path, _ in leaves]
    key_impls = {name: str(jax.random.key_impl(x))
                 for name, (_, x) in zip(names, leaves) if is_key(x)}
    raw = jax.device_get([jax.random.key_data(x) if is_key(x) else x for _, x in leaves])  # at once
    return dict(zip(names, raw)), key_impls


def restore(path: str, tensors: dict[str, np.ndarray], header: dict[str, str], prefix: str, like):
    """The pytree of `like`'s structure (arrays or jax.ShapeDtypeStructs) from what `write_state`
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


# --------------------------------------------------------------------------------------------------
# A run's checkpoint: its state, learning curve, progress and arguments and code
# --------------------------------------------------------------------------------------------------
def checkpoint_format(script: str) -> str:
    return f"{os.path.splitext(os.path.basename(script))[0]} checkpoint 1"


def code_version(*scripts: str) -> str:
    """A digest of the code that decides what a run of `scripts` trains, logs and evaluates: the
    scripts and every shared module."""
    return source_digest(*scripts, *sorted(glob.glob(os.path.join(UTILS, "*.py"))))


class Checkpointer:
    """Writes `script`'s checkpoints into `run_dir`, each once `log` (flushed first) holds every
    step before it, in a background thread, one at a time: training does not wait for the disk."""

    def __init__(self, script: str, run_dir: str, args, log):
        self.path, self.log = os.path.join(run_dir, CHECKPOINT), log
        self.header = {"format": checkpoint_format(script), "code": code_version(script),
                       "args": {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
                                if f.init and f.name != "resume"}, **cli.env_vars()}
        self.disk = concurrent.futures.ThreadPoolExecutor(1)
        self.pending = None

    def save(self, state, progress: Progress, step: int) -> None:
        """Writes `state` and `progress`, `step` being the environment step the state is at.
        `state` must not be handed to an update step any more (it would take over its memory): the
        training loop gives a copy of it, made before the next step (utils/training.py), which
        the background thread brings to the host while training goes on."""
        self.wait()
        self.log.flush()  # first the log up to the checkpoint's step, then the checkpoint
        kept = sum(s <= step for s in progress.history.steps)  # the curve up to the state
        history = History(*(np.array(column[:kept], dtype) for column, dtype in
                            zip(progress.history, (np.int64, np.float64, np.float64))))
        header = self.header | {"iteration": progress.iteration,
                                "train_seconds": progress.train_seconds}
        header = {name: json.dumps(value) for name, value in header.items()}
        self.pending = self.disk.submit(self.write, {"runner": state, "history": history}, header)

    def write(self, trees: dict, header: dict[str, str]) -> None:
        """In the background thread: the state to the host, then to disk."""
        write_state(self.path, trees, header)

    def wait(self) -> None:
        """Returns once the last checkpoint is on disk; raises what its write raised."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.disk.shutdown()


def read_checkpoint(script: str, run_dir: str) -> tuple[str, dict, dict]:
    """(path, tensors, header) of `run_dir`'s checkpoint if this code can resume it, else
    ValueError."""
    path = os.path.join(run_dir, CHECKPOINT)
    if not os.path.isdir(run_dir):
        raise ValueError(f"--resume {run_dir}: no such run directory")
    status = None  # a run killed outright has no summary.json
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            status = json.load(f)["status"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if status == "completed":
        raise ValueError(f"--resume {run_dir}: that run completed; nothing to resume")
    if not os.path.exists(path):
        raise ValueError(f"--resume {run_dir} has no {CHECKPOINT} (it ran with "
                         f"--checkpoint-every 0, or stopped before its first)")
    tensors, header = read_safetensors(path, "--resume")
    if header.get("format") != json.dumps(checkpoint_format(script)):
        raise ValueError(f"{path} is not a checkpoint of this script")
    if header_value(path, header, "code") != code_version(script):
        raise ValueError(f"{path} was written by another version of "
                         f"{os.path.basename(script)} or utils/; resume it with the code that "
                         f"wrote it")
    written_in, running_in = json.loads(header.get("env_vars", '""')), precision_environment()
    if written_in != running_in:
        raise ValueError(f"{path} was written {under(written_in)}, and this process runs "
                         f"{under(running_in)}: resume it as it was run")
    return path, tensors, header


def under(environment: str) -> str:
    """Where a run computed: "with JAX_DEFAULT_MATMUL_PRECISION=high", or at the scripts' own
    precision."""
    return f"with {environment}" if environment else "at the scripts' own precision"


def read_checkpoint_args(script: str, run_dir: str) -> dict:
    path, _, header = read_checkpoint(script, run_dir)
    return header_value(path, header, "args")


def load_checkpoint(script: str, run_dir: str, like, shardings) -> tuple[object, Progress]:
    """The training state (placed on `shardings`) and Progress of `run_dir`'s checkpoint; `like`
    gives the state's structure, shapes and dtypes."""
    path, tensors, header = read_checkpoint(script, run_dir)
    state = jax.device_put(restore(path, tensors, header, "runner", like), shardings)
    if any(f"history.{name}" not in tensors for name in History._fields):
        raise ValueError(f"{path} has no learning curve: it is not a checkpoint of this script")
    history = History(*(tensors[f"history.{name}"].tolist() for name in History._fields))
    remove_partial_writes(run_dir)  # of a run killed while writing a checkpoint
    return state, Progress(header_value(path, header, "iteration"), history,
                           header_value(path, header, "train_seconds"))

"""What the scripts share around a run: parsing with one-line errors, the checks of the arguments
every training script has, run directories that never clash, stopping cleanly on Ctrl-C, the
machine a run trains on, and summary.json. None of it touches the algorithm."""

import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import platform
import re
import resource
import signal
import sys
import time
import typing
from collections.abc import Callable
from typing import Literal, NoReturn

import tyro

from utils import startup


def flag(name: str) -> str:
    """The command-line flag of an Args field: learning_rate -> --learning-rate."""
    return "--" + name.replace("_", "-")


def given_fields(args_type: type, argv: list[str]) -> set[str]:
    """The fields of the dataclass `args_type` whose flag `argv` gives (--name, --name=value, or
    --no-name for a bool; tyro takes --name_with_underscores too and no abbreviations)."""
    flags = {token.split("=", 1)[0].replace("_", "-") for token in argv if token.startswith("--")}
    return {field.name for field in dataclasses.fields(args_type)
            if flag(field.name) in flags or "--no-" + flag(field.name)[2:] in flags}


def show(value) -> str:
    """A value as it is typed on the command line."""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def adopt(args, saved: dict, given: set[str], source: str,
          may_change: tuple[str, ...] = ()) -> str | None:
    """Sets each field of `args` named in `saved` to its saved (JSON) value, keeping the fields in
    `may_change` that the command line gives; returns an error if it gives another one a different
    value. `source` names what was saved ("runs/x was run with ...")."""
    hints = typing.get_type_hints(type(args))
    for name, value in saved.items():
        if name in given and name in may_change:
            continue
        current = getattr(args, name)
        if isinstance(value, list) and all(type(v) is int for v in value):  # JSON has no tuples
            value = tuple(value)
        # The field's own type (a bool is no int, an int may be a float), and its choices.
        same_type = isinstance(value, type(current)) and (type(value) is bool) == (
            type(current) is bool)
        if not (same_type or type(current) is float and type(value) is int):
            return f"{source} with {flag(name)} {value!r}, which is not a {type(current).__name__}"
        hint = hints.get(name)
        choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else ()
        if choices and value not in choices:
            return (f"{source} with {flag(name)} {show(value)}, which is none of this script's "
                    f"choices ({', '.join(map(show, choices))})")
        if name in given and value != current:
            return (f"{source} with {flag(name)} {show(value)}, not {show(current)} (leave the "
                    f"flag out to use the saved value)")
        setattr(args, name, value)
    return None


def parse_args(args_type: type, check_args: Callable, description: str,
               argv: list[str] | None = None, take_saved: Callable | None = None):
    """The command line as `args_type`, or exit status 2 with one `error:` line: tyro's own parse
    errors (condensed from its boxed message) and whatever `check_args(args)` returns, if not None.
    Before the check, `take_saved(args, given)` may fill `args` from a saved run (see `adopt`),
    `given` being the fields the command line sets; it returns an error or None."""
    argv = sys.argv[1:] if argv is None else argv
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            args = tyro.cli(args_type, args=argv, description=description)
    except SystemExit as exit_:
        if exit_.code:  # tyro's box: a title line, then the message up to a rule
            rule = set("─-╰╯")
            lines = messages.getvalue().splitlines()[1:]
            body = [line.strip().strip("│").strip() for line in lines]
            body = list(itertools.dropwhile(lambda line: not line or set(line) <= rule, body))
            message = itertools.takewhile(lambda line: line and not set(line) <= rule, body)
            print(f"error: {' '.join(message)}", file=sys.stderr)
        raise
    error = take_saved(args, given_fields(args_type, argv)) if take_saved else None
    error = error or check_args(args)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    return args


def check_numbers(args, positive=(), positive_finite=(), non_negative_finite=(),
                  unit_interval=()) -> str | None:
    """What is wrong with the fields of `args` named in each group, or None."""
    for name in positive:
        if getattr(args, name) <= 0:
            return f"{flag(name)} must be positive, got {getattr(args, name)}"
    # `not x > 0` rather than `x <= 0`: NaN fails every comparison; math.isfinite turns away inf.
    for name in positive_finite:
        if not (getattr(args, name) > 0 and math.isfinite(getattr(args, name))):
            return f"{flag(name)} must be a positive finite number, got {getattr(args, name)}"
    for name in non_negative_finite:
        if not (getattr(args, name) >= 0 and math.isfinite(getattr(args, name))):
            return f"{flag(name)} must be a non-negative finite number, got {getattr(args, name)}"
    for name in unit_interval:
        if not 0 <= getattr(args, name) <= 1:
            return f"{flag(name)} must be in [0, 1], got {getattr(args, name)}"
    return None


def check_run_args(args) -> str | None:
    """What is wrong with the fields every script shares (utils.contract.RunArgs), or None: the
    budget, the seed, the run's name, the devices, the compilation cache, checkpoints, evaluation
    and the environment. A script checks its own fields in its check_args."""
    import jax  # here: parsing the command line needs no JAX

    from utils.env import check_env_id

    error = check_numbers(args, positive=("total_timesteps", "eval_episodes"))
    if error:
        return error
    if not 0 <= args.sticky_action_prob < 1:
        return f"--sticky-action-prob must be in [0, 1), got {args.sticky_action_prob}"
    if not 0 <= args.seed < 2**32:  # jax.random.key takes a 32-bit seed
        return f"--seed must be in [0, {2**32 - 1}], got {args.seed}"
    plain_name = re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", args.exp_name)
    if not plain_name or ".." in args.exp_name:
        return (f"--exp-name must be a plain name of letters, digits, '_', '-' and '.' (no path, "
                f"no '..', at most 100 characters), got {args.exp_name!r}")
    if args.num_devices < 0:
        return f"--num-devices must be 0 (automatic) or positive, got {args.num_devices}"
    if args.num_devices > len(jax.devices()):
        return (f"--num-devices {args.num_devices} is more than the {len(jax.devices())} devices "
                f"JAX has")
    cache_dir = os.path.expanduser(args.jax_cache_dir)
    if args.jax_cache_dir and os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        return f"--jax-cache-dir {args.jax_cache_dir} exists and is not a directory"
    if args.checkpoint_every < 0:
        return f"--checkpoint-every must be 0 (never) or positive, got {args.checkpoint_every}"
    if args.eval_every < 0:
        return f"--eval-every must be 0 (only at the end) or positive, got {args.eval_every}"
    return check_env_id(args.env_id)


def check_rollout(args, minibatches: str | None = None, epochs: str | None = None) -> str | None:
    """What is wrong with an on-policy script's batches, or None: rollouts of num_envs x num_steps
    (fields of `args`), cut into minibatches for epochs where the script names those fields (PPO's
    and PQN's num_minibatches and update_epochs; one gradient step a rollout where it names none),
    split over --num-devices, within the budget and within what the optimizer can count."""
    counts = [name for name in (minibatches, epochs) if name]
    error = check_numbers(args, positive=("num_envs", "num_steps", *counts))
    if error:
        return error
    num_minibatches = getattr(args, minibatches) if minibatches else 1
    num_epochs = getattr(args, epochs) if epochs else 1
    batch_size = args.num_envs * args.num_steps
    if batch_size % num_minibatches:
        return (f"the batch (num_envs * num_steps = {batch_size}) does not divide into "
                f"{flag(minibatches)} {num_minibatches}")
    if args.total_timesteps < batch_size:
        return (f"--total-timesteps {args.total_timesteps} is less than one batch "
                f"(num_envs * num_steps = {batch_size})")
    num_updates = args.total_timesteps // batch_size * num_epochs * num_minibatches
    if num_updates >= 2**31:  # optax counts gradient steps (schedule, Adam's bias fix) in int32
        per_batch = " x ".join(["--total-timesteps / batch", *map(flag, counts)])
        return (f"{num_updates:,} gradient steps ({per_batch}) is more than the optimizer can "
                f"count ({2**31 - 1:,})")
    minibatch_size = batch_size // num_minibatches
    if args.num_devices and (args.num_envs % args.num_devices or minibatch_size % args.num_devices):
        return (f"--num-devices {args.num_devices} must divide both --num-envs {args.num_envs} and "
                f"the minibatch size {minibatch_size}")
    return None


def default_num_devices(num_devices: int, *sizes: int) -> int:
    """`num_devices`, or where it is 0: on a CPU, two wherever JAX has two and every one of `sizes`
    (what is split over the devices) splits in two (then a seed is one run on any CPU count), else
    one; on a GPU or TPU, one chip."""
    import jax

    if num_devices:
        return num_devices
    if jax.devices()[0].platform != "cpu":
        return 1
    return 2 if all(size % 2 == 0 for size in sizes) and len(jax.devices()) >= 2 else 1


def check_memory(what: str, state, compiled=None) -> None:
    """ValueError where `what` would need more memory than the OS can give: the training state
    (`state`, arrays or their shapes, e.g. from jax.eval_shape) and, once `compiled` (an
    ahead-of-time compiled program), what XLA says the program holds at once besides it (an
    output written into a donated argument's memory counts once)."""
    import jax

    needed = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))
    if compiled is not None:
        analysis = compiled.memory_analysis()
        needed = max(needed, analysis.argument_size_in_bytes) + analysis.temp_size_in_bytes \
            + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    available = available_memory_bytes()
    if needed > available:
        raise ValueError(f"{what} would need about {needed / 2**30:,.1f} GiB of memory and "
                         f"{available / 2**30:,.1f} GiB are available")


def available_memory_bytes() -> int:
    """Memory the OS can give this process now: the machine's (MemAvailable, or all of it where
    unknown), within what its cgroup (v2) leaves and its address-space limit (RLIMIT_AS) leaves."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            line = next(line for line in f if line.startswith("MemAvailable"))
            available = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):  # "max" where the cgroup sets no limit
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            available = min(available, int(f.read()) - int(g.read()))
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            with open("/proc/self/status") as f:
                line = next(line for line in f if line.startswith("VmSize"))
                available = min(available, limit - int(line.split()[1]) * 1024)
    return available


def make_run_dir(name: str) -> str:
    """A new runs/{name}__{unix time}; never an existing run's directory."""
    base = os.path.join("runs", f"{name}__{int(time.time())}")
    for attempt in range(100):
        run_dir = base + (f"_{attempt}" if attempt else "")
        with contextlib.suppress(FileExistsError):
            os.makedirs(run_dir)
            return run_dir
    raise FileExistsError(f"{base} and 99 more like it exist")


class StopSignals:
    """While active, SIGINT (Ctrl-C) and SIGTERM ask the run to stop at the next safe point, the end
    of the current iteration; a second signal acts at once."""

    def __enter__(self):
        self.received = None
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        self.received = signum
        self.__exit__()

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def fail(message: str) -> NoReturn:
    """The scripts' refusal: one `error:` line and exit 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def or_exit(read: Callable, *args):
    """read(*args), or one `error:` line and exit 2 where it raises ValueError (a file the user
    named that this code cannot use)."""
    try:
        return read(*args)
    except ValueError as e:
        fail(str(e))


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def num_cores() -> int:
    """The cores this process may run on (its affinity), which bound what a benchmark can use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine(devices: list | None = None, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and family (they decide how a seed's run rounds), its cores and
    AVX-512; with JAX `devices` that are not CPUs, their kind and count first."""
    info = cpu_info(cpuinfo)
    name = info.get("model name") or platform.processor() or "unknown CPU"
    avx512 = "AVX-512" if "avx512f" in info.get("flags", "").split() else "no AVX-512"
    cpu = f"{name}, CPU family {info.get('cpu family', '?')}, {num_cores()} cores, {avx512}"
    if devices and devices[0].platform != "cpu":
        return f"{devices[0].device_kind} x {len(devices)} ({cpu})"
    return cpu


def env_vars() -> dict[str, str]:
    """{"env_vars": "JAX_DEFAULT_MATMUL_PRECISION=high"} (say) where the environment changes what
    the programs compute (utils.startup.precision_environment), for a record's command to run the
    same; {} otherwise."""
    environment = startup.precision_environment()
    return {"env_vars": environment} if environment else {}


class RunSummary(dict):
    """A run's summary.json, written when its `with` block ends, however it ends: an exception
    marks the run failed (Ctrl-C: interrupted) and is raised on. The wall time and the arguments
    are added last."""

    def __init__(self, run_dir: str, args, wall_start: float, **fields):
        super().__init__(status="failed", **fields)
        self.path = os.path.join(run_dir, "summary.json")
        self.args, self.wall_start = args, wall_start

    def __enter__(self) -> "RunSummary":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            self.update(status=status, error=f"{type(error).__name__}: {error}")
        self.update(wall_seconds=time.time() - self.wall_start, args=vars(self.args))
        with open(self.path, "w") as f:
            json.dump(self, f, indent=2)

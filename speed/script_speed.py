"""Whole-process time, training speed, compile time and peak memory of a script, side by side across
versions of it: an earlier commit, this tree, this tree with extra flags, and sets of cores with a
device count.

Each round runs every version once, alternating, so slow drifts of the machine hit every version
alike; a first, unrecorded round warms the compilation cache (with --cold-cache, none: every run
compiles its programs into a new, empty cache, as a first run does). The script is any one in the
repository root that prints `summary: PATH` (ppo_breakout.py by default). Per run it records the
wall time of the whole process, its peak resident memory, and summary.json's training SPS, compile,
training and evaluation seconds and sampled return. Versions:
- `--base COMMIT ...`: the script at earlier commits (each checked out into a temporary git
  worktree);
- this tree, and this tree with each `--variant`'s extra flags, or each `--env-variant`'s
  environment variable (e.g. MALLOC_ARENA_MAX=16);
- `--cores-devices CORES:DEVICES ...`: each version above pinned to CORES with taskset (a list such
  as 0 or 0,1), with DEVICES devices for JAX's CPU backend and `--num-devices DEVICES`.

    python speed/script_speed.py --base fc64c6e --rounds 5 --variant=--no-diagnostics \\
        --out results/ppo_breakout/speed/script_speed.json
    python speed/script_speed.py --flags="--seed 1 --exp-name speed" --rounds 3 \\
        --cores-devices 0:1 0,1:1 0,1:2 0,1:4 --out results/shared/device_speed.json
    python speed/script_speed.py --cold-cache --rounds 2 \\
        --env-variant=XLA_FLAGS=--xla_cpu_use_fusion_emitters=false \\
        --out results/shared/cold_peak_ppo.json
"""

import dataclasses
import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import common  # noqa: E402
from tools.common import ROOT, fail  # noqa: E402


@dataclasses.dataclass
class Args:
    script: str = "ppo_breakout.py"
    """the script to time, relative to the repository root; it must print `summary: PATH`"""
    flags: str = "--seed 1 --num-devices 2 --exp-name speed"
    """the flags of every run, as one string"""
    base: tuple[str, ...] = ()
    """earlier commits to compare with (none compares versions of this tree only)"""
    variant: tuple[str, ...] = ()
    """extra flags of further versions of this tree, one version each (e.g. --no-diagnostics)"""
    env_variant: tuple[str, ...] = ()
    """NAME=VALUE: an environment variable of a further version of this tree, one version each"""
    cores_devices: tuple[str, ...] = ()
    """CORES:DEVICES, one configuration each, for every version (e.g. 0:1 0,1:2)"""
    rounds: int = 5
    """recorded rounds (after one warm-up round)"""
    cold_cache: bool = False
    """each run with a new, empty --jax-cache-dir and no warm-up round: the peak of a first run"""
    out: str = ""
    """write the report here as JSON"""


PATH_FLAGS = ("--load-model", "--resume")  # the contract's flags that name a file or a run


def absolute_paths(flags: list[str]) -> list[str]:
    """The flags with each PATH_FLAGS value made absolute from this process's directory: the runs
    start in a work directory of their own, and a path means what it meant where it was typed."""
    out = list(flags)
    for i, flag in enumerate(out):
        name, equals, value = flag.partition("=")
        if name in PATH_FLAGS and equals and value:
            out[i] = f"{name}={os.path.abspath(value)}"
        elif flag in PATH_FLAGS and i + 1 < len(out) and out[i + 1]:
            out[i + 1] = os.path.abspath(out[i + 1])
    return out


class Version:
    """One thing to time: a tree, flags added to the common ones, cores and devices if pinned."""

    def __init__(self, tree: str, flags: list[str], cores: str = "", devices: int = 0,
                 env: dict[str, str] | None = None):
        self.tree, self.flags, self.cores, self.devices = tree, flags, cores, devices
        self.env = env or {}

    def run(self, script: str, flags: list[str], workdir: str, cold_cache: bool = False) -> dict:
        prefix, devices = [], []
        if cold_cache:  # a new cache per run, inside the work directory, removed with it
            flags = [*flags, "--jax-cache-dir", tempfile.mkdtemp(prefix="cache", dir=workdir)]
        env = os.environ | self.env if self.env else None
        if self.cores:
            prefix = ["taskset", "-c", self.cores]
            env = os.environ | self.env | {"JAX_NUM_CPU_DEVICES": str(self.devices)}
            devices = ["--num-devices", str(self.devices)]
        try:
            run = common.run_script(script, [*flags, *self.flags, *devices], workdir, self.tree,
                                    prefix, env)
        except (RuntimeError, ValueError, OSError) as e:
            fail(str(e))
        return common.speed_fields(run)


def parse_config(config: str) -> tuple[str, int]:
    cores, _, devices = config.partition(":")
    if not devices.isdigit() or int(devices) < 1 or not cores:
        fail(f"--cores-devices {config}: expected CORES:DEVICES, such as 0,1:2")
    available = os.sched_getaffinity(0)
    if any(not c.isdigit() or int(c) not in available for c in cores.split(",")):
        fail(f"--cores-devices {config}: this process may use cores {sorted(available)}")
    return cores, int(devices)


def parse_env(variant: str) -> dict[str, str]:
    name, equals, value = variant.partition("=")
    if not equals or not name.isidentifier():
        fail(f"--env-variant {variant}: expected NAME=VALUE, such as MALLOC_ARENA_MAX=16")
    return {name: value}


def base_trees(args: Args, tmp: str) -> dict[str, str]:
    """Where each earlier commit is checked out, by commit."""
    return {commit: os.path.join(tmp, f"base{i}") for i, commit in enumerate(args.base)}


def versions_of(args: Args, tmp: str) -> dict[str, Version]:
    """The versions by label: the base commits, "this tree", "this tree, FLAGS"; with
    configurations, each of them on each (labelled by the configuration alone if this tree is the
    only version)."""
    trees = {commit: Version(tree, []) for commit, tree in base_trees(args, tmp).items()}
    trees |= {"this tree": Version(ROOT, [])}
    trees |= {f"this tree, {flags}": Version(ROOT, shlex.split(flags)) for flags in args.variant}
    trees |= {f"this tree, {variant}": Version(ROOT, [], env=parse_env(variant))
              for variant in args.env_variant}
    if not args.cores_devices:
        return trees
    versions = {}
    for label, version in trees.items():
        for config in args.cores_devices:
            cores, devices = parse_config(config)
            name = config if len(trees) == 1 else f"{label} on {config}"
            versions[name] = Version(version.tree, version.flags, cores, devices, version.env)
    return versions


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if args.rounds < 1:
        fail(f"--rounds must be positive, got {args.rounds}")
    common.check_out(args.out)
    if not os.path.isfile(os.path.join(ROOT, args.script)):
        fail(f"--script {args.script}: no such file in {ROOT}")
    if args.cores_devices and shutil.which("taskset") is None:
        fail("taskset is not installed (util-linux)")
    try:
        flags = shlex.split(args.flags)
    except ValueError as e:  # an unclosed quote
        fail(f"--flags does not parse as a shell command line: {e}")
    if args.cold_cache and any(f.startswith("--jax-cache-dir") for f in flags + list(args.variant)):
        fail("--cold-cache gives every run its own --jax-cache-dir; leave it out of the flags")
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--git-dir"], capture_output=True)
    if args.base and git.returncode:
        fail(f"--base {args.base[0]}: the earlier commit comes from a git checkout, and {ROOT} is "
             "not one")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = os.path.join(tmp, "runs")
        os.makedirs(workdir)
        versions, added = versions_of(args, tmp), []
        try:
            for commit, tree in base_trees(args, tmp).items():
                out = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree,
                                      commit], capture_output=True, text=True)
                if out.returncode:
                    fail(f"--base {commit}: {out.stderr.strip().splitlines()[-1]}")
                added.append(tree)
            run_flags = absolute_paths(flags)
            rounds = common.alternate(
                {label: functools.partial(v.run, args.script, run_flags, workdir, args.cold_cache)
                 for label, v in versions.items()}, args.rounds,
                warm_up=() if args.cold_cache else None)
        finally:
            for tree in added:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree],
                               check=True)
    command = shlex.join(["python", args.script, *flags])
    if args.cores_devices:
        command += " --num-devices DEVICES"
    report = common.new_report(command, script=args.script, base=list(args.base) or None,
                               versions=list(versions), rounds=rounds)
    if args.cores_devices:
        report["configs"] = list(args.cores_devices)
    report["cache"] = "cold" if args.cold_cache else "warm"
    common.write_report(report, args.out, echo=False)


if __name__ == "__main__":
    main()

"""Training speed of pqn_minatar.py against purejaxql's PQN for MinAtar (mttga/purejaxql), side by
side on one machine: pqn_minatar.py at each --num-devices, and purejaxql's own code under its own
pinned packages, at the same --total-timesteps with the same configuration (its MinAtar config,
which pqn_minatar.py's defaults are but for ε's floor, which changes no work per step). This
project's PPO (ppo_breakout.py, its defaults) runs in the same rounds on the same game and
steps, so PQN's speed and whole-run time stand beside PPO's.

Each round runs every version once, in turn (common.alternate), so slow drifts of the machine hit
them alike; a first, unrecorded round runs pqn_minatar.py alone to fill its compilation cache
(purejaxql keeps none, so nothing of it would warm). Both sides report training SPS with
compilation excluded:
- pqn_minatar.py: summary.json's `sps`, the steps over the seconds from the training loop's start
  to the end of its last iteration: every jitted update_step (compiled ahead of time), its metrics
  fetched, logged and checkpointed as the script always does; not compiling, evaluating or saving.
- purejaxql: speed/purejaxql_pqn.py runs its make_train under jit(vmap) as its own command
  does, compiled ahead of time; `sps` is the steps over the one call of the compiled program (the
  whole training in one lax.scan, no host work between iterations).
Per round, each pqn_minatar.py version's SPS over purejaxql's; the report gives their median and
range, and whether the --target speed-up held in every round. Each run's whole-process wall time
and peak memory are recorded too (pqn_minatar.py's includes its final evaluation; purejaxql's
includes its compilation, which is not cached).

purejaxql, in a directory of its own beside this checkout (../purejaxql) with a virtual
environment of its pinned packages (../venv-purejaxql; the versions last measured with are in
speed/purejaxql_requirements.txt), from the repository root:

    git clone https://github.com/mttga/purejaxql ../purejaxql   # measured at 47af6d7
    python -m venv ../venv-purejaxql
    ../venv-purejaxql/bin/pip install -r speed/purejaxql_requirements.txt
    ../venv-purejaxql/bin/pip install --no-deps -e ../purejaxql

    python speed/pqn_speed.py --purejaxql ../purejaxql \\
        --python ../venv-purejaxql/bin/python --total-timesteps 2000000 --rounds 3 \\
        --out results/pqn_minatar/speed/pqn_speed.json
"""

import dataclasses
import functools
import importlib.metadata
import os
import shlex
import sys
import tempfile

import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from speed import purejaxql_pqn  # noqa: E402
from tools import common  # noqa: E402
from tools.common import ROOT, fail  # noqa: E402

SCRIPT = "pqn_minatar.py"
PPO = "ppo_breakout.py"
DRIVER = os.path.join(ROOT, "speed", "purejaxql_pqn.py")
PUREJAXQL = "purejaxql"  # the reference version's label
ROLLOUT = 128 * 32  # environments x steps of one iteration, both sides (purejaxql's MinAtar config)
OUR_PACKAGES = ("jax", "jaxlib", "dm-haiku", "rlax", "optax", "distrax", "gymnax", "numpy")
MEASURED = {
    SCRIPT: "summary.json's sps: steps over the training loop's seconds, from its start to the end "
            "of its last iteration (update_step compiled ahead of time; metrics fetched, logged "
            "and checkpointed each iteration); compiling, evaluating and saving excluded",
    PUREJAXQL: "steps over the seconds of one call of jit(vmap(make_train(config))), compiled "
               "ahead of time (the whole training in one lax.scan); compiling excluded",
}


@dataclasses.dataclass
class Args:
    purejaxql: str = ""
    """a checkout of mttga/purejaxql (its purejaxql/pqn_minatar.py and purejaxql/config/)"""
    python: str = ""
    """the Python interpreter of purejaxql's own packages (a virtual environment)"""
    total_timesteps: int = 2_000_000
    """environment steps of training, both sides"""
    env_id: str = "Breakout-MinAtar"
    """the MinAtar game, both sides"""
    num_devices: tuple[int, ...] = (2, 1)
    """pqn_minatar.py's --num-devices, one version each"""
    ppo_devices: tuple[int, ...] = (2,)
    """ppo_breakout.py's --num-devices, one version each (none: PPO does not run)"""
    flags: str = "--seed 1 --exp-name speed"
    """pqn_minatar.py's other flags, as one string (ppo_breakout.py gets them too)"""
    rounds: int = 3
    """recorded rounds (after one warm-up run of each pqn_minatar.py version)"""
    target: float = 5.0
    """the speed-up to check: pqn_minatar.py's training SPS over purejaxql's, in every round"""
    out: str = ""
    """write the report here as JSON"""


def label(devices: int, script: str = SCRIPT) -> str:
    return f"{script}, {devices} device{'s' if devices > 1 else ''}"


def our_flags(args: Args) -> list[str]:
    """pqn_minatar.py's flags but --num-devices."""
    return [*shlex.split(args.flags), "--env-id", args.env_id,
            "--total-timesteps", str(args.total_timesteps)]


def commands(args: Args) -> dict[str, list[str]]:
    """The command of each version by its label: pqn_minatar.py per device count, ppo_breakout.py
    per device count, then purejaxql."""
    ours = {label(d, script): common.script_command(script, [*our_flags(args), "--num-devices",
                                                             str(d)])
            for script, counts in ((SCRIPT, args.num_devices), (PPO, args.ppo_devices))
            for d in counts}
    return ours | {PUREJAXQL: [args.python, DRIVER, "--repo", args.purejaxql, "--env-id",
                               args.env_id, "--total-timesteps", str(args.total_timesteps)]}


def measure(command: list[str], workdir: str, summaries: dict, key: str) -> dict:
    """One run's speed fields; its summary.json is kept in `summaries[key]` (the last one wins)."""
    try:
        run = common.run_reporting(command, workdir, os.environ | {"WANDB_MODE": "disabled"})
    except (RuntimeError, ValueError, OSError) as e:
        fail(str(e))
    summaries[key] = run.summary
    extra = ("took_seconds", "last_returned_episode_returns")
    return common.speed_fields(run) | {k: run.summary[k] for k in extra if k in run.summary}


def verdict(name: str, ratios: dict, target: float) -> str:
    """A line on one version's ratios: median, range, and the target held or not."""
    rounds = len(ratios["per_round"])
    missed = sum(r < target for r in ratios["per_round"])
    held = f"missed in {missed} of {rounds}" if missed else "held in every round"
    low, high = ratios["range"]
    over = f"{rounds} round{'s' if rounds > 1 else ''}"
    return (f"{name}: training SPS {ratios['median']:.2f}x purejaxql's (range {low:.2f}-"
            f"{high:.2f} over {over}); target {target:g}x {held}")


def against_ppo(name: str, rounds: list[dict[str, dict]], devices: int) -> tuple[dict, str] | None:
    """PQN version `name`'s training SPS and whole-run wall time over PPO's on as many devices, per
    round, with a line saying so; None where PPO did not run on that many."""
    ppo = label(devices, PPO)
    if ppo not in rounds[0]:
        return None
    sps = common.round_ratios(rounds, name, ppo)
    wall = common.round_ratios(rounds, name, ppo, "wall_seconds")
    return {"sps": sps, "wall_seconds": wall}, (
        f"{name}: training SPS {sps['median']:.2f}x {PPO}'s on as many devices, whole run "
        f"{wall['median']:.2f}x its wall time (medians over {len(rounds)} round"
        f"{'s' if len(rounds) > 1 else ''})")


def check_args(args: Args) -> None:
    if args.rounds < 1:
        fail(f"--rounds must be positive, got {args.rounds}")
    if args.total_timesteps < ROLLOUT:
        fail(f"--total-timesteps {args.total_timesteps} is less than one iteration ({ROLLOUT} "
             "steps)")
    if not args.num_devices or min(args.num_devices) < 1:
        fail(f"--num-devices must name positive counts, got {list(args.num_devices)}")
    if args.ppo_devices and min(args.ppo_devices) < 1:
        fail(f"--ppo-devices must name positive counts, got {list(args.ppo_devices)}")
    if not os.path.isfile(os.path.join(args.purejaxql, "purejaxql", "pqn_minatar.py")):
        fail(f"--purejaxql {args.purejaxql!r}: not a checkout of mttga/purejaxql (no "
             "purejaxql/pqn_minatar.py in it)")
    if not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        fail(f"--python {args.python!r}: not an executable file")
    try:
        shlex.split(args.flags)
    except ValueError as e:  # an unclosed quote
        fail(f"--flags does not parse as a shell command line: {e}")
    common.check_out(args.out)


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    check_args(args)
    args.purejaxql, args.python = os.path.abspath(args.purejaxql), os.path.abspath(args.python)
    summaries = {}
    with tempfile.TemporaryDirectory() as workdir:
        versions = {name: functools.partial(measure, command, workdir, summaries, name)
                    for name, command in commands(args).items()}
        ours = [name for name in versions if name != PUREJAXQL]
        rounds = common.alternate(versions, args.rounds, warm_up=ours)
    pqn = {d: label(d) for d in args.num_devices}
    ratios = {name: common.round_ratios(rounds, name, PUREJAXQL) for name in pqn.values()}
    beside_ppo = {pqn[d]: against_ppo(pqn[d], rounds, d) for d in args.num_devices}
    beside_ppo = {name: found for name, found in beside_ppo.items() if found is not None}
    theirs = summaries[PUREJAXQL]
    report = common.new_report(
        shlex.join(["python", SCRIPT, *our_flags(args), "--num-devices", "DEVICES"]),
        commands={name: shlex.join(command) for name, command in commands(args).items()},
        env_id=args.env_id, total_timesteps=args.total_timesteps, measured=MEASURED,
        versions=list(versions), rounds=rounds, ratios=ratios, target=args.target,
        over_ppo={name: found[0] for name, found in beside_ppo.items()},
        ours={"commit": purejaxql_pqn.commit(ROOT),
              "packages": {p: importlib.metadata.version(p) for p in OUR_PACKAGES}},
        purejaxql={k: theirs[k] for k in ("purejaxql_commit", "overrides", "devices", "config",
                                          "packages")})
    common.write_report(report, args.out, echo=False)
    for name in pqn.values():
        print(verdict(name, ratios[name], args.target))
    for _, line in beside_ppo.values():
        print(line)


if __name__ == "__main__":
    main()

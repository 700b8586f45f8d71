"""Whole-process time and training speed of ppo_breakout.py, side by side with an earlier commit.

Each round runs `python ppo_breakout.py --seed 1 --num-devices 2` once per version, alternating, so
slow drifts of the machine hit every version alike: the earlier commit (checked out into a temporary
git worktree), this tree, and this tree with each `--variant`'s extra flags. A first, unrecorded round
warms the compilation cache. Per run it records the wall time of the whole process, its peak memory
and the parts summary.json times; per round, each version's wall time over the earlier commit's.

    python benchmarks/script_speed.py --base fc64c6e --rounds 5 --variant=--no-diagnostics \\
        --out benchmarks/results/script_speed.json
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.harness_speed import timed  # noqa: E402
from benchmarks.results_table import cpu_name  # noqa: E402

COMMAND = ["--seed", "1", "--num-devices", "2", "--exp-name", "speed"]


@dataclasses.dataclass
class Args:
    base: str = "fc64c6e"
    """the earlier commit to compare with"""
    rounds: int = 5
    """recorded rounds (after one warm-up round)"""
    variant: tuple[str, ...] = ()
    """extra flags of further versions of this tree, one version each (e.g. --no-diagnostics)"""
    out: str = ""
    """write the report here as JSON"""


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_once(tree: str, extra: list[str], workdir: str) -> dict:
    """One whole process in `workdir` (its runs/ lands there): wall time, peak memory, summary.json's parts."""
    try:
        run = timed([sys.executable, os.path.join(tree, "ppo_breakout.py"), *COMMAND, *extra], workdir)
    except RuntimeError as e:
        fail(str(e))
    summary_path = run["stdout"].strip().splitlines()[-1].removeprefix("summary: ")
    with open(os.path.join(workdir, summary_path)) as f:
        summary = json.load(f)
    return {"wall_seconds": run["wall_seconds"], "peak_memory_mb": run["peak_memory_gb"] * 1024, "sps": summary["sps"],
            "compile_seconds": summary["compile_seconds"], "train_seconds": summary["train_seconds"],
            "eval_seconds": summary["eval_seconds"], "sampled": summary["eval"]["sampled"]["mean"]}


def check_rounds_and_out(rounds: int, out: str) -> None:
    if rounds < 1:
        fail(f"--rounds must be positive, got {rounds}")
    if out and os.path.exists(out):
        fail(f"--out {out} exists; choose another name")


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    check_rounds_and_out(args.rounds, args.out)
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "--git-dir"], capture_output=True).returncode:
        fail(f"--base {args.base}: the earlier commit comes from a git checkout, and {ROOT} is "
             "not one")
    with tempfile.TemporaryDirectory() as tmp:
        base_tree, workdir = os.path.join(tmp, "base"), os.path.join(tmp, "runs")
        os.makedirs(workdir)
        added = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", base_tree, args.base],
                               capture_output=True, text=True)
        if added.returncode:
            fail(f"--base {args.base}: {added.stderr.strip().splitlines()[-1]}")
        try:
            versions = {args.base: (base_tree, []), "this tree": (ROOT, [])}
            versions |= {f"this tree, {flags}": (ROOT, flags.split()) for flags in args.variant}
            rounds = []
            for i in range(args.rounds + 1):
                runs = {label: run_once(tree, extra, workdir) for label, (tree, extra) in versions.items()}
                if i:  # round 0 warms the cache
                    rounds.append(runs)
                    print(" | ".join(f"{label}: {r['wall_seconds']:.2f} s, {r['sps']:,.0f} SPS"
                                     for label, r in runs.items()), flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_tree], check=True)
    report = {"command": "python ppo_breakout.py " + " ".join(COMMAND), "base": args.base, "machine": cpu_name(),
              "versions": list(versions), "rounds": rounds}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

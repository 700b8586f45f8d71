"""Reproduces the README's results table: ppo_breakout.py run once per seed, each as its own process.

Each run is timed from outside (process start to exit, so imports, compilation, training and the
evaluation all count), its peak memory read from the OS, and its summary.json read back.

Run:  python benchmarks/results_table.py --seeds 1 2 3 4 5 --total-timesteps 1000000
      python benchmarks/results_table.py --script-args="--update-epochs 3"   # other settings
"""

import dataclasses
import json
import os
import resource
import shlex
import subprocess
import sys
import time

import tyro

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ppo_breakout.py")


@dataclasses.dataclass
class Args:
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    """the seeds to run, one process each, one after another"""
    total_timesteps: int = 1_000_000
    """passed to ppo_breakout.py"""
    exp_name: str = "results_table"
    """passed to ppo_breakout.py; the run directories are runs/{env_id}__{exp_name}__{seed}__{time}"""
    script_args: str = ""
    """more arguments for ppo_breakout.py, as one string, e.g. --script-args='--update-epochs 3'"""


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = None
    if not args.seeds:
        error = "give at least one seed (--seeds 1 2 3)"
    elif args.total_timesteps <= 0:
        error = f"--total-timesteps must be positive, got {args.total_timesteps}"
    try:
        script_args = shlex.split(args.script_args)
    except ValueError as e:  # an unclosed quote
        error = error or f"--script-args does not parse as a shell command line: {e}"
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    rows = []
    for seed in args.seeds:
        command = [sys.executable, SCRIPT, "--seed", str(seed), "--total-timesteps",
                   str(args.total_timesteps), "--exp-name", args.exp_name, *script_args]
        start = time.time()
        result = subprocess.run(command, capture_output=True, text=True)
        wall = time.time() - start
        if result.returncode != 0:  # the script's own error line, and its exit status (2: bad args)
            print(f"error: seed {seed} failed: {result.stderr.strip()}", file=sys.stderr)
            sys.exit(result.returncode)
        # ru_maxrss of children: the largest peak of any child so far, in KiB on Linux.
        peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        summary_path = result.stdout.strip().splitlines()[-1].removeprefix("summary: ")
        summary = json.load(open(summary_path))
        rows.append((seed, summary, wall, peak_gb))
        print(f"seed {seed}: sampled {summary['eval']['sampled']['mean']:.2f}, "
              f"wall {wall:.1f}s", file=sys.stderr)

    print("| seed | sampled eval return | greedy eval return | wall s | compile s | train SPS |")
    print("|---:|---:|---:|---:|---:|---:|")
    for seed, s, wall, _ in rows:
        print(f"| {seed} | {s['eval']['sampled']['mean']:.2f} ± {s['eval']['sampled']['std']:.2f} "
              f"| {s['eval']['greedy']['mean']:.2f} ± {s['eval']['greedy']['std']:.2f} "
              f"| {wall:.1f} | {s['compile_seconds']:.1f} | {s['sps']:,.0f} |")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    sampled = [s["eval"]["sampled"]["mean"] for _, s, _, _ in rows]
    print(f"| **mean** | **{mean(sampled):.2f}** (min {min(sampled):.2f}) "
          f"| {mean([s['eval']['greedy']['mean'] for _, s, _, _ in rows]):.2f} "
          f"| {mean([w for _, _, w, _ in rows]):.1f} | {mean([s['compile_seconds'] for _, s, _, _ in rows]):.1f} "
          f"| {mean([s['sps'] for _, s, _, _ in rows]):,.0f} |")
    print(f"\npeak memory of any run: {max(p for *_, p in rows):.2f} GB")


if __name__ == "__main__":
    main()

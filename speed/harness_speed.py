"""Measures the tuning harness against separate runs of the script, side by side, and writes JSON.

Each round runs, one after another: `tools/tune.py --num-seeds N` (in --num-chunks chunks),
the same with `--num-chunks 1` (all iterations in one call, no progress), and `ppo_breakout.py
--seed k` for k = 1..N, each in its own process. Every process is timed from start to exit and its
peak memory (resident set) read from the OS. All share one fresh compilation cache: the first round
compiles (cold), the later ones find the programs there (warm). Alternating the commands in every
round spreads a busy machine's slow spells over all of them, so their ratios are what to read.

Run:  python speed/harness_speed.py --rounds 3 \\
          --out results/shared/harness_speed.json
"""

import dataclasses
import json
import os
import sys
import tempfile

import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import common  # noqa: E402


@dataclasses.dataclass
class Args:
    num_seeds: int = 8
    """seeds: one harness run of this many against this many script runs"""
    rounds: int = 3
    """rounds of all the commands; the first compiles into the fresh cache"""
    num_chunks: int = 10
    """the harness's chunks (it runs with 1 as well)"""
    total_timesteps: int = 1_000_000
    """steps per seed, for every command"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def timed(command: list[str], cwd: str) -> dict:
    """Runs `command`; its wall seconds, peak resident memory in GB and stdout."""
    run = common.run_timed(command, cwd)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or [""])[-1]
        common.fail(f"{' '.join(command)} exited with {run.returncode}: {last}")
    return {"wall_seconds": run.wall_seconds, "peak_memory_gb": run.peak_rss_mb / 2**10,
            "stdout": run.stdout}


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    for name in ("num_seeds", "rounds", "num_chunks", "total_timesteps"):
        if getattr(args, name) <= 0:
            common.fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    common.check_out(args.out)
    rounds = []
    with tempfile.TemporaryDirectory() as work:
        cache = os.path.join(work, "jax_cache")
        harness_command = common.script_command("tools/tune.py", [
            "--num-seeds", str(args.num_seeds), "--ppo.total-timesteps", str(args.total_timesteps),
            "--ppo.jax-cache-dir", cache, "--quiet"])
        for r in range(args.rounds):
            row = {}
            for name, chunks in (("harness", args.num_chunks), ("harness_one_chunk", 1)):
                run = timed(harness_command + ["--num-chunks", str(chunks)], work)
                timing = json.loads(run.pop("stdout"))["timing"]
                row[name] = {**run, "train_seconds": timing["train_seconds"],
                             "compile_seconds": timing["compile_seconds"]}
            row["script"] = []
            for seed in range(1, args.num_seeds + 1):
                run = timed(common.script_command("ppo_breakout.py", [
                    "--seed", str(seed), "--total-timesteps", str(args.total_timesteps),
                    "--jax-cache-dir", cache]), work)
                summary, _ = common.read_summary(run.pop("stdout"), work)
                run |= {k: summary[k] for k in ("train_seconds", "compile_seconds")}
                row["script"].append(run)
            script_wall = sum(s["wall_seconds"] for s in row["script"])
            script_peak = max(s["peak_memory_gb"] for s in row["script"])
            harness, one_chunk = row["harness"], row["harness_one_chunk"]
            row["ratio"] = harness["wall_seconds"] / script_wall
            row["one_chunk_train_ratio"] = harness["train_seconds"] / one_chunk["train_seconds"]
            print(f"round {r + 1}: harness {harness['wall_seconds']:.1f} s "
                  f"({harness['peak_memory_gb']:.2f} GB), {args.num_seeds} script runs "
                  f"{script_wall:.1f} s (peak {script_peak:.2f} GB): ratio {row['ratio']:.2f}; "
                  f"training in {args.num_chunks} chunks / in one: "
                  f"{row['one_chunk_train_ratio']:.3f}", file=sys.stderr, flush=True)
            rounds.append(row)
    common.write_report(common.new_report(num_seeds=args.num_seeds, num_chunks=args.num_chunks,
                                          total_timesteps=args.total_timesteps, rounds=rounds),
                        args.out)


if __name__ == "__main__":
    main()

"""Measures the tuning harness against separate runs of the script, side by side, and writes JSON.

Each round runs, one after another: `benchmarks/tune.py --num-seeds N` (in --num-chunks chunks),
the same with `--num-chunks 1` (all iterations in one call, no progress), and `ppo_breakout.py
--seed k` for k = 1..N, each in its own process. Every process is timed from start to exit and its
peak memory (resident set) read from the OS. All share one fresh compilation cache: the first round
compiles (cold), the later ones find the programs there (warm). Alternating the commands in every
round spreads a busy machine's slow spells over all of them, so their ratios are what to read.

Run:  python benchmarks/harness_speed.py --rounds 3 --out benchmarks/results/harness_speed.json
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    """Runs `command`; its wall seconds and peak resident memory in GB (os.wait4's rusage of the child)."""
    start = time.time()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stdout = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}")
    return {"wall_seconds": time.time() - start, "peak_memory_gb": usage.ru_maxrss / 2**20, "stdout": stdout}


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = next((f"--{n.replace('_', '-')} must be positive, got {getattr(args, n)}"
                  for n in ("num_seeds", "rounds", "num_chunks", "total_timesteps") if getattr(args, n) <= 0), None)
    if not error and args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        error = f"--out {args.out}: its directory does not exist"
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, ROOT)
    from benchmarks.tune import machine  # after the checks: importing it starts JAX

    rounds = []
    with tempfile.TemporaryDirectory() as work:
        cache = os.path.join(work, "jax_cache")
        harness = [sys.executable, os.path.join(ROOT, "benchmarks", "tune.py"), "--num-seeds", str(args.num_seeds),
                   "--ppo.total-timesteps", str(args.total_timesteps), "--ppo.jax-cache-dir", cache, "--quiet"]
        for r in range(args.rounds):
            row = {}
            for name, chunks in (("harness", args.num_chunks), ("harness_one_chunk", 1)):
                run = timed(harness + ["--num-chunks", str(chunks)], work)
                timing = json.loads(run.pop("stdout"))["timing"]
                row[name] = {**run, "train_seconds": timing["train_seconds"],
                             "compile_seconds": timing["compile_seconds"]}
            row["script"] = []
            for seed in range(1, args.num_seeds + 1):
                run = timed([sys.executable, os.path.join(ROOT, "ppo_breakout.py"), "--seed", str(seed),
                             "--total-timesteps", str(args.total_timesteps), "--jax-cache-dir", cache], work)
                summary_path = run.pop("stdout").strip().splitlines()[-1].removeprefix("summary: ")
                with open(os.path.join(work, summary_path)) as f:
                    run["train_seconds"] = json.load(f)["train_seconds"]
                row["script"].append(run)
            script_wall = sum(s["wall_seconds"] for s in row["script"])
            row["ratio"] = row["harness"]["wall_seconds"] / script_wall
            row["one_chunk_train_ratio"] = row["harness"]["train_seconds"] / row["harness_one_chunk"]["train_seconds"]
            print(f"round {r + 1}: harness {row['harness']['wall_seconds']:.1f} s "
                  f"({row['harness']['peak_memory_gb']:.2f} GB), {args.num_seeds} script runs {script_wall:.1f} s "
                  f"(peak {max(s['peak_memory_gb'] for s in row['script']):.2f} GB): ratio {row['ratio']:.2f}; "
                  f"training in {args.num_chunks} chunks / in one: {row['one_chunk_train_ratio']:.3f}",
                  file=sys.stderr, flush=True)
            rounds.append(row)
    out = {"command": "python benchmarks/harness_speed.py " + " ".join(sys.argv[1:]), "machine": machine(),
           "num_seeds": args.num_seeds, "num_chunks": args.num_chunks, "total_timesteps": args.total_timesteps,
           "rounds": rounds}
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

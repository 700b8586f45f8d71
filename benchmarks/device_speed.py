"""What more cores and devices do: ppo_breakout.py's speed on a set of cores with a device count.

Each configuration is `CORES:DEVICES`: the process is pinned to CORES with taskset (a list such as
0 or 0,1), JAX's CPU backend gets DEVICES devices, and the run splits its environments over them
(`--num-devices DEVICES`). Each round runs every configuration once, alternating, after one
unrecorded round that warms the compilation cache. Per run it records the wall time of the whole
process, training SPS and the sampled evaluation (the same random numbers on every device count:
what differs is rounding).

    python benchmarks/device_speed.py --configs 0:1 0,1:1 0,1:2 0,1:4 --rounds 3 \\
        --out benchmarks/results/device_speed.json
"""

import dataclasses
import json
import os
import shutil
import sys
import tempfile

import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.harness_speed import timed  # noqa: E402
from benchmarks.results_table import cpu_name  # noqa: E402
from benchmarks.script_speed import check_rounds_and_out, fail  # noqa: E402

COMMAND = ["--seed", "1", "--exp-name", "speed"]


@dataclasses.dataclass
class Args:
    configs: tuple[str, ...] = ("0:1", "0,1:1", "0,1:2", "0,1:4")
    """CORES:DEVICES, one configuration each"""
    rounds: int = 3
    """recorded rounds (after one warm-up round)"""
    out: str = ""
    """write the report here as JSON"""


def parse(config: str) -> tuple[str, int]:
    cores, _, devices = config.partition(":")
    if not devices.isdigit() or int(devices) < 1 or not cores:
        fail(f"--configs {config}: expected CORES:DEVICES, such as 0,1:2")
    available = os.sched_getaffinity(0)
    if any(not c.isdigit() or int(c) not in available for c in cores.split(",")):
        fail(f"--configs {config}: this process may use cores {sorted(available)}")
    return cores, int(devices)


def run_once(cores: str, devices: int, workdir: str) -> dict:
    command = ["taskset", "-c", cores, "env", f"JAX_NUM_CPU_DEVICES={devices}", sys.executable,
               os.path.join(ROOT, "ppo_breakout.py"), *COMMAND, "--num-devices", str(devices)]
    try:
        run = timed(command, workdir)
    except RuntimeError as e:
        fail(str(e))
    summary_path = run["stdout"].strip().splitlines()[-1].removeprefix("summary: ")
    with open(os.path.join(workdir, summary_path)) as f:
        summary = json.load(f)
    return {"wall_seconds": run["wall_seconds"], "sps": summary["sps"],
            "sampled": summary["eval"]["sampled"]["mean"]}


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    check_rounds_and_out(args.rounds, args.out)
    if shutil.which("taskset") is None:
        fail("taskset is not installed (util-linux)")
    configs = {config: parse(config) for config in args.configs}
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.rounds + 1):
            runs = {config: run_once(*parsed, workdir) for config, parsed in configs.items()}
            if i:  # round 0 warms the cache
                rounds.append(runs)
                print(" | ".join(f"{config}: {r['wall_seconds']:.2f} s, {r['sps']:,.0f} SPS, "
                                 f"{r['sampled']:.2f}" for config, r in runs.items()), flush=True)
    report = {"command": "python ppo_breakout.py " + " ".join(COMMAND) + " --num-devices DEVICES",
              "machine": cpu_name(), "configs": list(configs), "rounds": rounds}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

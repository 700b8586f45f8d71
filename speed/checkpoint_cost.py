"""What checkpoints cost training, measured side by side in one process.

Whole runs with and without checkpoints differ by less than a busy machine's run-to-run noise. So
this compiles a script's update once (--script, any that keeps utils/contract.py; ppo_breakout by
default, its flags in --script-args) and trains in blocks of --block iterations, alternating
blocks that write a checkpoint every --checkpoint-every iterations with blocks that write none (the
order flips every pair), each block timed whole: logging, checkpoints and the wait for the
background writes included. Neighbouring blocks share the machine's state, so their ratio is what to
read. It also times each checkpoint: the main thread's time in Checkpointer.save (flushing the log
included), and the CPU time of the background write (serializing, writing and syncing), which on a
machine with every core busy training is at most what that write takes from training.

The update runs on the script's default device count: NUM_DEVICES (2) for a script that splits
its work over them, one for a script that runs on one device; the report records the count.

Run:  python speed/checkpoint_cost.py --pairs 40 \\
          --out results/shared/checkpoint_cost.json
      python speed/checkpoint_cost.py --script pqn_minatar --script-args="--num-envs 256"
"""

import contextlib
import dataclasses
import io
import os
import shlex
import sys
import tempfile
import time

NUM_DEVICES = 2  # the script's default device count, which the measured update is split over
# JAX's CPU backend has one device unless told before it starts (importing the script starts it).
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(NUM_DEVICES))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402

from tools import common, tune  # noqa: E402
from utils import checkpoint, cli, contract, training  # noqa: E402
from utils.env import make_env  # noqa: E402


@dataclasses.dataclass
class Args:
    script: str = "ppo_breakout"
    """the script whose training is measured (a name, or a path relative to the project)"""
    script_args: str = ""
    """the script's flags, as one string (its defaults otherwise; devices and budget are set)"""
    checkpoint_every: int = 5
    """iterations between checkpoints in the blocks that write them"""
    block: int = 10
    """iterations per block"""
    pairs: int = 40
    """pairs of blocks (one with checkpoints, one without), after one warm-up pair"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = next((f"{cli.flag(n)} must be positive, got {getattr(bench, n)}"
                  for n in ("checkpoint_every", "block", "pairs") if getattr(bench, n) <= 0), None)
    if error is None and bench.block < bench.checkpoint_every:  # a block would write none
        error = f"--block {bench.block} is shorter than --checkpoint-every {bench.checkpoint_every}"
    if error is None and len(jax.devices()) < NUM_DEVICES:
        error = (f"JAX has {len(jax.devices())} device(s) and the update is split over "
                 f"{NUM_DEVICES}: unset JAX_NUM_CPU_DEVICES or set it to {NUM_DEVICES} or more")
    if error:
        common.fail(error)
    common.check_out(bench.out)
    # The script's settings and its default device count (NUM_DEVICES where it splits its work;
    # a one-device script, DQN, its one), long enough for every block.
    script = tune.load_script(bench.script)
    flags = shlex.split(bench.script_args)
    args = training.parse_args(script, flags)
    args.total_timesteps = args.steps_per_iteration * bench.block * 2 * (bench.pairs + 1)
    args = contract.fill_runtime_fields(script, args)
    args.checkpoint_every = bench.checkpoint_every
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    agent = script.make_agent(args, env, env_params)

    main_seconds, background_cpu_seconds = [], []
    save, write = checkpoint.Checkpointer.save, checkpoint.Checkpointer.write

    def timed_save(*save_args, **kwargs):  # in the main thread
        start = time.perf_counter()
        save(*save_args, **kwargs)
        main_seconds.append(time.perf_counter() - start)

    def timed_write(*write_args):  # in the background thread
        start = time.thread_time()
        write(*write_args)
        background_cpu_seconds.append(time.thread_time() - start)
    checkpoint.Checkpointer.save, checkpoint.Checkpointer.write = timed_save, timed_write

    # The script's loop (its main) with its bookkeeping, checkpoints on or off by block.
    seconds, iteration = {"on": [], "off": []}, 0
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), \
            contextlib.redirect_stdout(io.StringIO()):
        with training.Run(script, args, agent, env, env_params) as run:
            runner, update_step = run.state, run.update_step
            checkpoints, run.train_start = run.checkpoints, time.time()
            for pair in range(bench.pairs + 1):
                for kind in (("on", "off") if pair % 2 else ("off", "on")):
                    run.checkpoints = checkpoints if kind == "on" else None
                    start = time.perf_counter()
                    for _ in range(bench.block):
                        iteration += 1
                        runner, metrics = update_step(runner)
                        run.log_iteration(iteration, metrics, lambda _: {}, str)
                        run.end_iteration(iteration, runner)
                    run.read_pending()  # the block's last iteration and write count as its own
                    checkpoints.wait()
                    if pair:  # pair 0 warms up
                        seconds[kind].append(time.perf_counter() - start)
            run.checkpoints = checkpoints
            checkpoint_bytes = os.path.getsize(checkpoints.path)
    ratios = np.array(seconds["on"]) / np.array(seconds["off"])
    iteration = np.median(seconds["off"]) / bench.block
    per_checkpoint = np.median(main_seconds) + np.median(background_cpu_seconds)
    def summary(x) -> dict:
        return {"median": float(np.median(x)), "quartiles": np.percentile(x, [25, 75]).tolist(),
                "range": [float(np.min(x)), float(np.max(x))]}
    report = common.new_report(
        script=tune.name_of(script), script_args=bench.script_args,
        load_average=os.getloadavg(), devices=args.num_devices,
        platform=jax.devices()[0].platform, block_iterations=bench.block,
        checkpoint_every=bench.checkpoint_every, steps_per_iteration=args.steps_per_iteration,
        checkpoint_bytes=checkpoint_bytes,
        seconds=seconds, block_ratio=summary(ratios),
        main_thread_ms=summary(1e3 * np.array(main_seconds)),
        background_cpu_ms=summary(1e3 * np.array(background_cpu_seconds)),
        iteration_ms=1e3 * iteration,
        cost_bound=per_checkpoint / (bench.checkpoint_every * iteration))
    common.write_report(report, bench.out)


if __name__ == "__main__":
    main()

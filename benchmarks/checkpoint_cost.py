"""What checkpoints cost training, measured side by side in one process.

Whole runs with and without checkpoints differ by less than a busy machine's run-to-run noise. So
this compiles ppo_breakout.py's update once and trains in blocks of --block iterations, alternating
blocks that write a checkpoint every --checkpoint-every iterations with blocks that write none (the
order flips every pair), each block timed whole: logging, checkpoints and the wait for the
background writes included. Neighbouring blocks share the machine's state, so their ratio is what to
read. It also times each checkpoint: the main thread's time in Checkpointer.save (flushing the log
included), and the CPU time of the background write (serializing, writing and syncing), which on a
machine with every core busy training is at most what that write takes from training.

The update is split over NUM_DEVICES (2) devices, the script's default; the report records the
count it ran on.

Run:  python benchmarks/checkpoint_cost.py --pairs 40 --out benchmarks/results/checkpoint_cost.json
"""

import contextlib
import dataclasses
import functools
import io
import os
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

import ppo_breakout as ppo  # noqa: E402
from benchmarks import common  # noqa: E402
from utils import checkpoint, cli, parallel, training  # noqa: E402


@dataclasses.dataclass
class Args:
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
    # The script's defaults on NUM_DEVICES devices, long enough for every block.
    args = ppo.Args(num_devices=NUM_DEVICES,
                    total_timesteps=8192 * bench.block * 2 * (bench.pairs + 1))
    args = ppo.fill_runtime_fields(args)
    args.checkpoint_every = bench.checkpoint_every
    env, env_params = ppo.make_env(args.env_id, args.sticky_action_prob)
    network = ppo.make_network(env.action_space(env_params).n, args.hidden_sizes, args.activation,
                               args.layer_norm, args.conv_channels)
    optimizer = ppo.make_optimizer(args)
    mesh = parallel.make_mesh(args.num_devices)
    init = functools.partial(ppo.init_runner, env=env, env_params=env_params, network=network,
                             optimizer=optimizer, num_envs=args.num_envs)
    runner = jax.jit(init, out_shardings=parallel.shardings(mesh, ppo.RUNNER_SPECS))(
        jax.random.key(args.seed))
    update_step = ppo.make_parallel_update_step(args, env, env_params, network, optimizer, mesh)
    update_step = update_step.lower(runner).compile()

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

    # The script's loop (ppo_breakout.main) with its bookkeeping, checkpoints on or off by block.
    seconds, iteration = {"on": [], "off": []}, 0
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), \
            contextlib.redirect_stdout(io.StringIO()):
        with training.Run(ppo.__file__, args, None, 0.0, time.time()) as run:
            checkpoints, run.train_start = run.checkpoints, time.time()
            for pair in range(bench.pairs + 1):
                for kind in (("on", "off") if pair % 2 else ("off", "on")):
                    run.checkpoints = checkpoints if kind == "on" else None
                    start = time.perf_counter()
                    for _ in range(bench.block):
                        iteration += 1
                        runner, metrics = update_step(runner)
                        metrics = jax.device_get(metrics)
                        run.log_iteration(iteration, metrics, ppo.iteration_scalars(args, metrics),
                                          metrics.get("histograms"))
                        run.end_iteration(iteration, runner)
                    checkpoints.wait()  # the block's last write counts as its own
                    if pair:  # pair 0 warms up
                        seconds[kind].append(time.perf_counter() - start)
            run.checkpoints = checkpoints
    ratios = np.array(seconds["on"]) / np.array(seconds["off"])
    iteration = np.median(seconds["off"]) / bench.block
    per_checkpoint = np.median(main_seconds) + np.median(background_cpu_seconds)
    def summary(x) -> dict:
        return {"median": float(np.median(x)), "quartiles": np.percentile(x, [25, 75]).tolist(),
                "range": [float(np.min(x)), float(np.max(x))]}
    report = common.new_report(
        load_average=os.getloadavg(), devices=mesh.devices.size,
        platform=jax.devices()[0].platform, block_iterations=bench.block,
        checkpoint_every=bench.checkpoint_every, steps_per_iteration=args.batch_size,
        seconds=seconds, block_ratio=summary(ratios),
        main_thread_ms=summary(1e3 * np.array(main_seconds)),
        background_cpu_ms=summary(1e3 * np.array(background_cpu_seconds)),
        iteration_ms=1e3 * iteration,
        cost_bound=per_checkpoint / (bench.checkpoint_every * iteration))
    common.write_report(report, bench.out)


if __name__ == "__main__":
    main()

"""What the training loop costs, and what the many-seed harness gains, on the devices JAX has (a GPU
or TPU where there is one, else the CPU), in one process, for any script that keeps
utils/contract.py.

- The loop: the script run as a user runs it (its main(), here, in a work directory of its own),
  its training SPS as its summary.json reports it, against its update step compiled the same way
  and called back to back with nothing read between them (the bare step), for as many iterations;
  alternating, --rounds times. With --precisions, the bare step again at each other float32
  matrix-product precision (utils/startup.py sets the scripts' own).
- The harness: tools/tune.py's training of N seeds for each --harness-seeds N, its aggregate
  training SPS (N x steps per seed / training seconds), with the seeds side by side as the harness
  does by default on this device (or in groups of --harness-vmap-seeds; N is padded to whole
  groups on every device, and the row says how many seeds trained); with --harness-one-at-a-time
  N, each device's seeds one after another (a CPU's default), to compare.

Run:  python speed/loop_speed.py --script ppo_breakout --rounds 2 --precisions default \\
          --harness-seeds 1 8 32 '--script-args=--num-devices 1' --out loop_speed_ppo.json
"""

import contextlib
import copy
import dataclasses
import os
import shlex
import statistics
import sys
import time

# On a CPU, one JAX device per core, as the harness has them; set before JAX starts.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(len(os.sched_getaffinity(0))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import tyro  # noqa: E402

from tools import common, tune  # noqa: E402
from utils import contract, parallel, training  # noqa: E402
from utils.env import make_env  # noqa: E402


@dataclasses.dataclass
class Args:
    script: str = "ppo_breakout"
    """the script measured (a name, or a path relative to the project)"""
    script_args: str = ""
    """the script's flags for its runs, as one string (its --total-timesteps sets the iterations
    timed)"""
    rounds: int = 2
    """rounds of (the script's run, the bare step), after one unrecorded round that compiles"""
    precisions: tuple[str, ...] = ()
    """other float32 matrix-product precisions to time the bare step at (default, high, highest)"""
    harness_seeds: tuple[int, ...] = ()
    """seed counts N to time the harness with, the seeds side by side as it trains them here"""
    harness_one_at_a_time: tuple[int, ...] = ()
    """seed counts N to time the harness with, the seeds one after another"""
    harness_vmap_seeds: int = 0
    """seeds side by side in each group for --harness-seeds (0: the harness's default here; on a
    GPU or TPU up to 16 at once, equal groups of at most 8 past that); the groups run one after
    another"""
    harness_timesteps: int = 0
    """steps per seed of each harness measurement (0: the script's --total-timesteps)"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def script_run(script, flags: list[str]) -> dict:
    """The script's main() with `flags` in a new work directory: its summary.json's timings."""
    summary = common.main_in_work_dir(script, flags)
    return {k: summary[k] for k in ("sps", "compile_seconds", "train_seconds", "global_step")}


def bare_step(script, args, precision: str | None = None) -> dict:
    """The script's update step compiled as its run compiles it (donated state; its data-parallel
    version on more than one device), run for the run's iterations back to back after one
    unrecorded step, nothing read between them: its SPS."""
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    agent = script.make_agent(args, env, env_params)
    if args.num_devices > 1:
        mesh = parallel.make_mesh(args.num_devices)
        init = jax.jit(agent.init, out_shardings=parallel.shardings(mesh, agent.state_specs))
        step = agent.parallel_update_step(mesh)
    else:
        init, step = jax.jit(agent.init), agent.update_step
    key = jax.random.split(jax.random.key(args.seed))[0]
    start = time.perf_counter()
    with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
        compiled = jax.jit(step, donate_argnums=0).lower(jax.eval_shape(init, key)).compile()
    compile_seconds = time.perf_counter() - start
    state = jax.block_until_ready(compiled(init(key))[0])
    start = time.perf_counter()
    for _ in range(args.num_iterations):
        state, _ = compiled(state)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    return {"sps": args.num_iterations * args.steps_per_iteration / seconds,
            "compile_seconds": compile_seconds, "train_seconds": seconds}


def harness(script, args, num_seeds: int, timesteps: int, vmap_seeds: int) -> dict:
    """tools/tune.py's training of `num_seeds` seeds of `args`, `vmap_seeds` at once (0: its
    default here): the aggregate training SPS."""
    cfg = copy.copy(args)
    cfg.total_timesteps = timesteps or args.total_timesteps
    cfg = contract.fill_runtime_fields(script, cfg)
    result = tune.train_seeds(cfg, list(range(1, num_seeds + 1)), eval_episodes=8, num_chunks=2,
                              vmap_seeds=vmap_seeds)
    steps = num_seeds * cfg.num_iterations * cfg.steps_per_iteration
    devices, group = tune.seed_layout(num_seeds, 0, vmap_seeds)
    # The seeds the devices trained: N padded to whole groups on every device (a padding seed
    # repeats the last; its work is not counted in the SPS).
    trained = num_seeds + -num_seeds % (devices * group)
    row = {"seeds": num_seeds, "trained_seeds": trained, "vmap_seeds": result.vmap_seeds,
           "steps_per_seed": cfg.num_iterations * cfg.steps_per_iteration,
           "sps": steps / result.train_seconds, "compile_seconds": result.compile_seconds,
           "train_seconds": result.train_seconds}
    padded = f", {trained} trained: padded to whole groups" if trained > num_seeds else ""
    print(f"harness, {num_seeds} seeds ({result.vmap_seeds} at once{padded}): {row['sps']:,.0f} "
          f"SPS, compiled in {result.compile_seconds:.1f} s", file=sys.stderr, flush=True)
    return row


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if bench.rounds < 0:
        common.fail(f"--rounds must be 0 or more, got {bench.rounds}")
    if bench.harness_timesteps < 0:
        common.fail(f"--harness-timesteps must be 0 or more, got {bench.harness_timesteps}")
    if bench.harness_vmap_seeds < 0:
        common.fail(f"--harness-vmap-seeds must be 0 or more, got {bench.harness_vmap_seeds}")
    if any(n <= 0 for n in bench.harness_seeds + bench.harness_one_at_a_time):
        common.fail("harness seed counts must be positive")
    common.check_out(bench.out)
    try:
        script = tune.load_script(bench.script)
        flags = [*shlex.split(bench.script_args), "--exp-name", "loop_speed"]
    except ValueError as e:
        common.fail(str(e))
    args = training.parse_args(script, flags)  # one error line and exit 2 for a bad flag
    rounds, precisions, seeds = [], {}, []

    def write(echo: bool) -> None:
        # After every measurement, so a run cut short by a time limit keeps what it measured.
        ratios = [row["ratio"] for row in rounds]
        if bench.out or echo:
            common.write_report(common.new_report(
                machine=common.machine(jax.devices()), script=tune.name_of(script),
                script_args=bench.script_args, num_devices=args.num_devices,
                matmul_precision=jax.config.jax_default_matmul_precision or "default",
                steps_per_iteration=args.steps_per_iteration, iterations=args.num_iterations,
                rounds=rounds, ratio_median=statistics.median(ratios) if ratios else None,
                bare_step_at_precision=precisions, harness=seeds), bench.out, echo)

    for r in range(bench.rounds + 1 if bench.rounds else 0):
        row = {"script": script_run(script, flags), "bare": bare_step(script, args)}
        row["ratio"] = row["script"]["sps"] / row["bare"]["sps"]
        print(f"round {r}{' (compiles; not recorded)' if r == 0 else ''}: script "
              f"{row['script']['sps']:,.0f} SPS, bare step {row['bare']['sps']:,.0f}: "
              f"{row['ratio']:.3f}", file=sys.stderr, flush=True)
        if r:
            rounds.append(row)
            write(echo=False)
    for precision in bench.precisions:
        precisions[precision] = bare_step(script, args, precision)
        print(f"bare step at {precision} precision: {precisions[precision]['sps']:,.0f} SPS",
              file=sys.stderr, flush=True)
        write(echo=False)
    runs = ([(n, bench.harness_vmap_seeds) for n in bench.harness_seeds]
            + [(n, 1) for n in bench.harness_one_at_a_time])
    for n, vmap in runs:
        seeds.append(harness(script, args, n, bench.harness_timesteps, vmap))
        write(echo=False)
    write(echo=True)


if __name__ == "__main__":
    main()

"""What PPO's update step costs to compile, whole and part by part, at each float32 matrix-product
precision and with each way of computing its convolution, and what each compiled program then
takes to run: on a TPU the first run's compile is the update step's, and this says which part of
it to cut and what a cut would cost in speed.

Parts (each compiled alone, the compilation cache off, one seed's state):
- `update_step`: ppo_breakout's update step as the script compiles it (one iteration, metrics);
- `iteration_no_metrics`: the PPO iteration (rollout, GAE, epochs) without the metrics;
- `rollout_128`, `rollout_1`: the rollout of 128 steps, and of 1;
- `env_step`: one step of the environments;
- `epochs`: the epochs of minibatch gradient steps over one iteration's batch;
- `one_minibatch`: one minibatch gradient step;
- `forward`: the network applied to the environments' observations.
Convolutions (--convs): `matmul`, utils/layers.py's matrix products (the script's, everywhere);
`xla`, XLA's own convolution (DQN's on an accelerator; the same function, other rounding).

Run:  python speed/ppo_step_compile.py --precisions highest default --convs matmul xla \\
          --out ppo_step_compile.json
"""

import contextlib
import dataclasses
import functools
import os
import shlex
import sys
import time
from unittest import mock

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the cache off: every program compiled
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import tyro  # noqa: E402

import ppo_breakout as ppo  # noqa: E402
from speed.dqn_profile import timed  # noqa: E402
from tools import common  # noqa: E402
from utils import training  # noqa: E402
from utils.env import make_env  # noqa: E402

PARTS = ("update_step", "iteration_no_metrics", "rollout_128", "rollout_1", "env_step", "epochs",
         "one_minibatch", "forward")
PRECISIONS = ("highest", "high", "default")
CONVS = ("matmul", "xla")


@dataclasses.dataclass
class Args:
    script_args: str = "--num-devices 1"
    """ppo_breakout.py's flags, as one string (--jax-cache-dir is set to "", the cache off)"""
    parts: tuple[str, ...] = PARTS
    """the parts to compile"""
    precisions: tuple[str, ...] = ("highest", "default")
    """float32 matrix-product precisions to compile each part at (highest: the scripts' own)"""
    convs: tuple[str, ...] = ("matmul",)
    """ways to compute the convolution: matmul (the script's), xla (XLA's convolution)"""
    repeats: int = 3
    """timed runs of each compiled part (after one unrecorded run), their median reported (0: no
    run)"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def parts(args, env, env_params):
    """Each part: (function, its inputs), built from a fresh network (so that a patched
    convolution is the one traced)."""
    agent = ppo.make_agent(args, env, env_params)
    network, optimizer = agent.network, agent.optimizer
    runner = jax.jit(agent.init)(jax.random.key(args.seed))
    _, traj = jax.jit(lambda r: ppo.collect_trajectories(r, env, env_params, network,
                                                         args.num_steps))(runner)
    flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
    # The values stand in for the advantages and targets: what compiles depends on shapes alone.
    batch = jax.tree.map(flat, ppo.Batch(obs=traj.obs, action=traj.action, logits=traj.logits,
                                         value=traj.value, advantage=traj.value,
                                         target=traj.value))
    minibatch = jax.tree.map(lambda x: x[:args.minibatch_size], batch)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    rollout = lambda n: lambda r: ppo.collect_trajectories(r, env, env_params, network, n)  # noqa: E731
    epoch = functools.partial(ppo.update_epoch, batch=batch, network=network,
                              optimizer=optimizer, args=args)
    return {
        "update_step": (agent.update_step, (runner,)),
        "iteration_no_metrics": (ppo.make_ppo_iteration(args, env, env_params, network,
                                                        optimizer), (runner,)),
        "rollout_128": (rollout(128), (runner,)),
        "rollout_1": (rollout(1), (runner,)),
        "env_step": (lambda k, s, a: step(k, s, a, env_params),
                     (jax.random.split(jax.random.key(3), args.num_envs), runner.env_state,
                      jnp.zeros(args.num_envs, jnp.int32))),
        "epochs": (lambda ts, keys: jax.lax.scan(epoch, ts, keys),
                   (runner.train_state, jax.random.split(jax.random.key(2), args.update_epochs))),
        "one_minibatch": (lambda ts, mb: ppo.update_minibatch(ts, mb, network, optimizer, args),
                          (runner.train_state, minibatch)),
        "forward": (network.apply, (runner.train_state.params, runner.obs)),
    }


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    unknown = ((set(bench.parts) - set(PARTS)) | (set(bench.precisions) - set(PRECISIONS))
               | (set(bench.convs) - set(CONVS)))
    if unknown:
        common.fail(f"unknown {sorted(unknown)}: parts {PARTS}, precisions {PRECISIONS}, "
                    f"convs {CONVS}")
    if bench.repeats < 0:
        common.fail(f"--repeats must be 0 or more, got {bench.repeats}")
    common.check_out(bench.out)
    try:
        flags = [*shlex.split(bench.script_args), "--jax-cache-dir", ""]
    except ValueError as e:
        common.fail(f"--script-args {bench.script_args!r}: {e}")
    args = training.parse_args(ppo, flags)
    if not args.conv_channels and bench.convs != ("matmul",):
        common.fail("--convs xla needs a convolution: the game's network has none "
                    "(--conv-channels 0)")
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    rows = []

    def write(echo: bool) -> None:
        if bench.out or echo:
            common.write_report(common.new_report(
                machine=common.machine(jax.devices()), script_args=bench.script_args, rows=rows),
                bench.out, echo)

    for conv in bench.convs:
        patch = (mock.patch.object(ppo, "conv_relu_pool", functools.partial(
            ppo.conv_relu_pool, xla_conv=True)) if conv == "xla" else contextlib.nullcontext())
        for precision in bench.precisions:
            with patch, jax.default_matmul_precision(precision):
                programs = parts(args, env, env_params)
                for name in bench.parts:
                    fn, inputs = programs[name]
                    start = time.perf_counter()
                    lowered = jax.jit(fn).lower(*inputs)
                    lowered_at = time.perf_counter()
                    compiled = lowered.compile()
                    compile_s, text = time.perf_counter() - lowered_at, lowered.as_text()
                    row = {"part": name, "conv": conv, "precision": precision,
                           "lower_s": lowered_at - start, "compile_s": compile_s,
                           "stablehlo_lines": text.count("\n"),
                           "convolutions": text.count("stablehlo.convolution"),
                           "optimized_hlo_lines": compiled.as_text().count("\n")}
                    if bench.repeats:
                        row["run_ms"] = 1e3 * timed(compiled, *inputs, repeats=bench.repeats)
                    print(" | ".join(f"{k} {v:,.4g}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in row.items()), file=sys.stderr, flush=True)
                    rows.append(row)
                    write(echo=False)  # a time limit that stops the run keeps what it measured
    write(echo=True)


if __name__ == "__main__":
    main()

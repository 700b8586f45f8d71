"""What one DQN gradient step and one batch draw cost on the device JAX has, as dqn_minatar.py does
them and in variants that compute the same thing another way, for N seeds side by side (vmap, as
the harness trains them on an accelerator). A variant that is faster here is a candidate for the
script; one that changes the numbers needs many-seed scores before it can go in.

Gradient step variants (a fixed batch, one iteration's gradient steps in one `lax.scan`):
- `script`: dqn_minatar.gradient_step as it is;
- `matmul_conv`, `xla_conv`: the convolution as utils/layers.py's matrix products (the script's
  on a CPU), or as XLA's convolution (the script's elsewhere): the same function;
- `one_online_pass`, `two_online_passes`: the online network applied to the observations and
  the next observations in one pass (the script's on an accelerator), or in two (on a CPU): the
  same function;
- `sgd`: plain SGD in place of Adam (not the same training: Adam's share of the step);
- `precision_default`, `precision_high`: float32 products at the device's default precision, or
  at `high`, instead of the scripts' `highest` (on a TPU: one bfloat16 pass, or three; not the
  same numbers).
Batch draw variants (a chunk's batches at once, an iteration's chunks in one `lax.scan`, from a
full buffer of random transitions):
- `script`: dqn_minatar.sample_batch (only what the target reads is gathered);
- `flashbax`: flashbax's sample of whole windows, then the same n-step reduction.

Each figure is the median of --repeats runs after one that compiles, in microseconds per gradient
step (per batch drawn) of all N seeds together. With --hlo-dir, each program's optimized HLO is
written there (gzipped) and its products counted: `products`, the convolutions and dot products
in it; `loop_products`, those in the steps' loop; `seed_window_products`, those of the loop that
XLA wrote as a convolution whose window runs over the seeds (base dilation, `lhs_dilate`), the
form a TPU gives the products that vmap batches.

Run:  python speed/dqn_step_variants.py --seeds 1 8 --out variants.json
"""

import contextlib
import dataclasses
import functools
import gzip
import os
import re
import sys
import time
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
import tyro  # noqa: E402
from flashbax.buffers.trajectory_buffer import TrajectoryBufferState  # noqa: E402

import dqn_minatar as dqn  # noqa: E402
from speed.dqn_profile import report_writer, script_setup, timed  # noqa: E402
from tools import common  # noqa: E402

GRADIENT_VARIANTS = ("script", "matmul_conv", "xla_conv", "one_online_pass", "two_online_passes",
                     "sgd", "precision_default", "precision_high")
SAMPLE_VARIANTS = ("script", "flashbax")


@dataclasses.dataclass
class Args:
    script_args: str = ""
    """dqn_minatar.py's flags, as one string (its defaults otherwise)"""
    seeds: tuple[int, ...] = (1,)
    """seed counts N to time, each N seeds side by side"""
    gradient: tuple[str, ...] = GRADIENT_VARIANTS
    """the gradient step variants to time"""
    sample: tuple[str, ...] = SAMPLE_VARIANTS
    """the batch draw variants to time"""
    repeats: int = 3
    """timed runs of each program (after one unrecorded run), their median reported"""
    hlo_dir: str = ""
    """write each program's optimized HLO here, gzipped, and count its products in the JSON"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def one_online_pass(params, network, obs, next_obs):
    """dqn_minatar.online_q_values as an accelerator computes it."""
    return tuple(jnp.split(network.apply(params, jnp.concatenate([obs, next_obs])), 2))


def two_online_passes(params, network, obs, next_obs):
    """dqn_minatar.online_q_values as a CPU computes it."""
    return network.apply(params, obs), network.apply(params, next_obs)


def gradient_variant(name: str):
    """The variant's context (patches in force while its program is traced) and optimizer
    factory."""
    if name in ("matmul_conv", "xla_conv"):
        conv = functools.partial(dqn.layers.conv_relu_pool, xla_conv=name == "xla_conv")
        return mock.patch.object(dqn.layers, "conv_relu_pool",
                                 lambda obs, channels, xla_conv: conv(obs, channels)), None
    if name in ("one_online_pass", "two_online_passes"):
        passes = one_online_pass if name == "one_online_pass" else two_online_passes
        return mock.patch.object(dqn, "online_q_values", passes), None
    if name == "sgd":
        return contextlib.nullcontext(), lambda args: optax.sgd(args.learning_rate)
    if name in ("precision_default", "precision_high"):
        return jax.default_matmul_precision(name.removeprefix("precision_")), None
    return contextlib.nullcontext(), None


def random_batch(key, args, obs_shape, num_actions) -> dqn.Batch:
    keys = jax.random.split(key, 5)
    grid = lambda k: jax.random.bernoulli(k, 0.2, (args.batch_size, *obs_shape)).astype(jnp.uint8)  # noqa: E731
    return dqn.Batch(obs=grid(keys[0]), action=jax.random.randint(keys[1], (args.batch_size,), 0,
                                                                   num_actions),
                     reward=jax.random.normal(keys[2], (args.batch_size,)),
                     discount=jnp.full((args.batch_size,), args.gamma ** args.n_step),
                     next_obs=grid(keys[3]))


def full_buffer(key, args, codec, obs_shape, num_actions) -> TrajectoryBufferState:
    """A full buffer of random transitions, laid out as the script's."""
    rows, length = args.num_envs, args.buffer_size // args.num_envs
    keys = jax.random.split(key, 6)
    grids = lambda k: codec.encode(jax.random.bernoulli(k, 0.2, (rows, length, *obs_shape)))  # noqa: E731
    experience = dqn.Transition(
        obs=grids(keys[0]), action=jax.random.randint(keys[1], (rows, length), 0, num_actions),
        reward=jax.random.normal(keys[2], (rows, length)),
        terminated=jax.random.bernoulli(keys[3], 0.01, (rows, length)),
        truncated=jax.random.bernoulli(keys[4], 0.001, (rows, length)), next_obs=grids(keys[5]))
    return TrajectoryBufferState(experience=experience, current_index=jnp.array(7, jnp.int32),
                                 is_full=jnp.array(True))


def flashbax_sample(buffer_state, key, buffer, args, codec) -> dqn.Batch:
    """The batch as flashbax's whole windows give it: every field at every step of the window."""
    windows = buffer.sample(buffer_state, key).experience
    reward, discount, last = jax.vmap(dqn.n_step_return, in_axes=(0, 0, 0, None))(
        windows.reward, windows.terminated, windows.truncated, args.gamma)
    next_obs = windows.next_obs[jnp.arange(args.batch_size), last]
    return dqn.Batch(obs=codec.decode(windows.obs[:, 0]), action=windows.action[:, 0],
                     reward=reward, discount=discount, next_obs=codec.decode(next_obs))


def time_program(fn, inputs, repeats: int) -> tuple[float, float, str]:
    """(seconds of one run, median over `repeats`; seconds of the first call, its compile; the
    optimized HLO)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*inputs).compile()
    compile_seconds = time.perf_counter() - start
    return timed(compiled, *inputs, repeats=repeats), compile_seconds, compiled.as_text()


def count_products(hlo: str) -> dict:
    """The products in an optimized HLO text; those in its loops' bodies and what they call (the
    timed steps, not the initialisation); and of these, those written as a convolution whose
    window runs over a batch axis by base dilation (a TPU's form of a product per seed)."""
    bodies, name = {}, None  # each computation's lines, by its name
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.endswith("{"):
            name = line.removeprefix("ENTRY ").split()[0]
            bodies[name] = []
        elif name:
            bodies[name].append(line)
    calls = {n: set(re.findall(r"%[\w.-]+", "\n".join(lines))) & bodies.keys()
             for n, lines in bodies.items()}
    in_loop = set(re.findall(r"body=(%[\w.-]+)", hlo))
    todo = list(in_loop)
    while todo:
        for called in calls[todo.pop()] - in_loop:
            in_loop.add(called)
            todo.append(called)
    product = re.compile(r"= \S+ (?:convolution|dot)\(")
    loop = [line for n in in_loop for line in bodies[n] if product.search(line)]
    return {"products": len(product.findall(hlo)), "loop_products": len(loop),
            "seed_window_products": sum("lhs_dilate=" in line for line in loop)}


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if bench.repeats <= 0 or any(n <= 0 for n in bench.seeds):
        common.fail("--repeats and --seeds must be positive")
    unknown = (set(bench.gradient) - set(GRADIENT_VARIANTS)) | (set(bench.sample)
                                                               - set(SAMPLE_VARIANTS))
    if unknown:
        common.fail(f"unknown variants {sorted(unknown)}: gradient {GRADIENT_VARIANTS}, "
                    f"sample {SAMPLE_VARIANTS}")
    common.check_out(bench.out)
    if bench.hlo_dir and not os.path.isdir(bench.hlo_dir):
        common.fail(f"--hlo-dir {bench.hlo_dir}: no such directory")
    args, env, env_params, codec = script_setup(dqn, bench.script_args)
    num_actions = env.action_space(env_params).n
    obs_shape = env.observation_space(env_params).shape
    buffer = dqn.make_buffer(args)
    num_chunks, _, updates_per_chunk = dqn.interleaving(args)
    num_updates = num_chunks * updates_per_chunk
    rows = []
    write = report_writer(bench, rows, gradient_steps_per_program=num_updates)

    def record(part, variant, n, seconds, compile_seconds, hlo):
        row = {"part": part, "variant": variant, "seeds": n,
               "us_per_step": 1e6 * seconds / num_updates, "compile_seconds": compile_seconds}
        if bench.hlo_dir:
            with gzip.open(os.path.join(bench.hlo_dir, f"{part}_{variant}_{n}.hlo.gz"), "wt") as f:
                f.write(hlo)
            row |= count_products(hlo)
        print(" | ".join(f"{k} {v:,.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in row.items()), file=sys.stderr, flush=True)
        rows.append(row)
        write(echo=False)  # after each row: a time limit that stops the run keeps what it measured

    for n in bench.seeds:
        keys = jax.random.split(jax.random.key(args.seed), n)
        for variant in bench.gradient:
            patch, make_optimizer = gradient_variant(variant)
            with patch:
                network = dqn.make_network(num_actions, args.hidden_sizes, args.layer_norm,
                                           args.conv_channels, args.conv_style)
                optimizer = (make_optimizer or dqn.make_optimizer)(args)

                def steps(key):
                    mb = random_batch(key, args, obs_shape, num_actions)
                    params = network.init(key, mb.obs)
                    train_state = dqn.TrainState(params, params, optimizer.init(params))

                    def one(train_state, _):
                        return dqn.gradient_step(train_state, mb, network, optimizer,
                                                 args.loss)[0], None
                    final = jax.lax.scan(one, train_state, None, length=num_updates)[0]
                    return jax.tree.map(jnp.sum, final.params)

                record("gradient", variant, n, *time_program(jax.vmap(steps), (keys,),
                                                             bench.repeats))
        if bench.sample:
            states = jax.jit(jax.vmap(lambda k: full_buffer(k, args, codec, obs_shape,
                                                            num_actions)))(keys)
        for variant in bench.sample:
            sample = (functools.partial(flashbax_sample, buffer=buffer, args=args, codec=codec)
                      if variant == "flashbax" else
                      functools.partial(dqn.sample_batch, batch_size=args.batch_size,
                                        n=args.n_step, gamma=args.gamma, codec=codec))

            def draws(buffer_state, key):
                def chunk(_, key):  # a chunk's batches at once, as the update step draws them
                    batches = jax.vmap(sample, in_axes=(None, 0))(
                        buffer_state, jax.random.split(key, updates_per_chunk))
                    return None, sum(jnp.sum(x.astype(jnp.float32)) for x in batches)
                return jax.lax.scan(chunk, None, jax.random.split(key, num_chunks))[1]

            record("sample", variant, n, *time_program(jax.vmap(draws), (states, keys),
                                                       bench.repeats))
    write(echo=True)


if __name__ == "__main__":
    main()

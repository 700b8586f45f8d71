"""Where a DQN iteration's time goes, on the device JAX has (a GPU or TPU where there is one, else
the CPU): the update step of dqn_minatar.py or sr_dqn_minatar.py (--script), and each of its parts
compiled and run alone, as many times as one iteration runs it, for N seeds side by side (vmap, as
the harness trains them on an accelerator).

The parts, with the script's default settings (or --script-args) on a state past the warm-up:
- `rollout`: the iteration's environment steps, epsilon-greedy on the acting network;
- `buffer_add`: writing each chunk's transitions into the replay buffer;
- `sample`: drawing the gradient steps' batches of n-step windows (a chunk's at once) and unpacking
  their observations;
- `gradient`: the gradient steps on a fixed batch (three forward passes, a backward one, the
  optimizer's step; sr_dqn_minatar's with AdamW and the target's EMA step);
- `target` (dqn_minatar): the target network's update check after each chunk;
- `reset` (sr_dqn_minatar): the iteration's fresh networks, and the reset check after each chunk
  (seeds side by side compute the reset in every chunk and keep it where one is due).
Each part's time is the median of --repeats runs, in milliseconds per iteration; `sum_over_whole`
says how much of the whole step the parts account for (the rest: what XLA fuses across them).
A part alone can cost another time than inside the step, so --without (sr_dqn_minatar) also
times the whole step with a part taken out: `sample` (every batch one of zeros, nothing read
from the buffer), `gradient` (the clock moves, the networks stay; the batches still drawn) or
`reset` (never reset); whole_ms minus `without_<part>_ms` is that part's share in place.

Run:  python speed/dqn_profile.py --seeds 1 8 --out profile.json
      python speed/dqn_profile.py --script sr_dqn_minatar --seeds 1 8 --out profile.json
"""

import dataclasses
import functools
import os
import shlex
import statistics
import sys
import time
import types
from typing import Literal
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import tyro  # noqa: E402

import dqn_minatar  # noqa: E402
import sr_dqn_minatar  # noqa: E402
from tools import common  # noqa: E402
from utils import contract, training  # noqa: E402
from utils.env import make_env  # noqa: E402


@dataclasses.dataclass
class Args:
    script: Literal["dqn_minatar", "sr_dqn_minatar"] = "dqn_minatar"
    """the script whose update step is profiled"""
    script_args: str = ""
    """the script's flags, as one string (its defaults otherwise)"""
    seeds: tuple[int, ...] = (1,)
    """seed counts N to profile, each N seeds side by side"""
    repeats: int = 5
    """timed runs of each program (after one unrecorded run), their median reported"""
    without: tuple[Literal["sample", "gradient", "reset"], ...] = ()
    """(sr_dqn_minatar) also time the whole step with each of these parts taken out"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def timed(fn, *inputs, repeats: int) -> float:
    """Median seconds of fn(*inputs) over `repeats` runs, after one that compiles and warms up."""
    jax.block_until_ready(fn(*inputs))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def checksum(tree) -> jax.Array:
    """One number from every leaf, so that XLA keeps the work that made them."""
    return sum(jnp.sum(jnp.asarray(x, jnp.float32)) for x in jax.tree.leaves(tree))


def past_warm_up(init, update_step, args):
    """One seed's state past the warm-up, its buffer part-filled: what most of a run's iterations
    start from."""
    step = jax.jit(update_step, donate_argnums=0)
    state = jax.jit(init)(jax.random.key(args.seed))
    while int(state.env_steps) < 2 * args.learning_starts:
        state, _ = step(state)
    return state


def script_setup(script, script_args: str) -> tuple:
    """The script's args (its flags as one string, one device), environment and its parameters,
    and observation codec."""
    args = training.parse_args(script, [*shlex.split(script_args), "--num-devices", "1"])
    args = contract.fill_runtime_fields(script, args)
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    return args, env, env_params, script.grid_codec(env.observation_space(env_params).shape)


def report_writer(bench, rows: list, **fields):
    """write(echo): the report of `rows` so far (the machine, the script's flags, the products'
    precision and `fields` before them) to bench.out, and to stdout where `echo`."""
    def write(echo: bool) -> None:
        if bench.out or echo:
            common.write_report(common.new_report(
                machine=common.machine(jax.devices()), script_args=bench.script_args,
                matmul_precision=jax.config.jax_default_matmul_precision or "default",
                **fields, rows=rows), bench.out, echo)
    return write


def built(script, args, env, env_params) -> types.SimpleNamespace:
    """What both scripts build alike (the same names in each): the network, optimizer, buffer and
    codec, the interleaving, the epsilon schedule, the update step and the initial state, and the
    rollout and buffer parts."""
    b = types.SimpleNamespace()
    b.network = script.make_network(env.action_space(env_params).n, args.hidden_sizes,
                                    args.layer_norm, args.conv_channels, args.conv_style)
    b.optimizer, b.buffer = script.make_optimizer(args), script.make_buffer(args)
    b.codec = script.grid_codec(env.observation_space(env_params).shape)
    b.num_chunks, b.steps_per_chunk, b.updates_per_chunk = script.interleaving(args)
    b.num_updates = b.num_chunks * b.updates_per_chunk
    b.epsilon_at = script.epsilon_schedule(args)
    b.update_step = script.make_update_step(args, env, env_params, b.network, b.optimizer,
                                            b.buffer, b.codec)
    b.init = functools.partial(script.init_runner, env=env, env_params=env_params,
                               network=b.network, optimizer=b.optimizer, buffer=b.buffer,
                               num_envs=args.num_envs, codec=b.codec)
    # sr_dqn_minatar acts with the network --act-with-target names; dqn_minatar with the online one
    acting = (args.act_with_target,) if hasattr(args, "act_with_target") else ()

    def rollout(runner):  # the iteration's environment steps
        def chunk(runner, _):
            runner, (transitions, _, _) = script.collect_transitions(
                runner, env, env_params, b.network, b.steps_per_chunk, b.epsilon_at, b.codec,
                *acting)
            return runner, checksum(transitions)
        return jax.lax.scan(chunk, runner, None, length=b.num_chunks)

    def buffer_add(runner):  # each chunk's transitions written into the buffer
        rollout = jax.eval_shape(lambda runner: script.collect_transitions(
            runner, env, env_params, b.network, b.steps_per_chunk, b.epsilon_at, b.codec,
            *acting)[1][0], runner)  # (steps, envs, ...): the buffer takes (envs, steps, ...)
        transitions = jax.tree.map(
            lambda x: jnp.zeros((x.shape[1], x.shape[0], *x.shape[2:]), x.dtype), rollout)
        def chunk(buffer_state, _):
            return b.buffer.add(buffer_state, transitions), None
        return jax.lax.scan(chunk, runner.buffer_state, None, length=b.num_chunks)[0]

    b.rollout, b.buffer_add = rollout, buffer_add
    return b


def dqn_parts(args, env, env_params):
    """dqn_minatar's update step and its parts, each a function of one seed's runner state."""
    dqn, b = dqn_minatar, built(dqn_minatar, args, env, env_params)
    sample_batch = functools.partial(dqn.sample_batch, batch_size=args.batch_size, n=args.n_step,
                                     gamma=args.gamma, codec=b.codec)

    def sample(runner):
        def chunk(_, key):  # a chunk's batches at once, as the update step draws them
            keys = jax.random.split(key, b.updates_per_chunk)
            batches = jax.vmap(sample_batch, in_axes=(None, 0))(runner.buffer_state, keys)
            return None, checksum(batches)
        return jax.lax.scan(chunk, None, jax.random.split(runner.key, b.num_chunks))[1]

    def gradient(runner):
        mb = sample_batch(runner.buffer_state, runner.key)

        def one(train_state, _):
            return dqn.gradient_step(train_state, mb, b.network, b.optimizer, args.loss)[0], None
        return jax.lax.scan(one, runner.train_state, None, length=b.num_updates)[0]

    def target(runner):
        steps = args.num_envs * b.steps_per_chunk

        def chunk(train_state, i):  # the clock of the iteration's chunks
            before = runner.env_steps + i * steps
            return dqn.update_target(train_state, before, before + steps,
                                     args.target_update_period, args.tau), None
        return jax.lax.scan(chunk, runner.train_state, jnp.arange(b.num_chunks))[0]

    return b.init, b.update_step, {"rollout": b.rollout, "buffer_add": b.buffer_add,
                                   "sample": sample, "gradient": gradient, "target": target}


def sr_dqn_parts(args, env, env_params):
    """sr_dqn_minatar's update step and its parts, each a function of one seed's runner state."""
    sr, b = sr_dqn_minatar, built(sr_dqn_minatar, args, env, env_params)
    sample_batch = functools.partial(sr.sample_batch, batch_size=args.batch_size,
                                     max_n=sr.max_n(args), codec=b.codec)
    total = sr.total_gradient_steps(args)

    def sample(runner):
        def chunk(_, key):  # a chunk's batches at once, each with its n and gamma, as the step does
            keys = jax.random.split(key, b.updates_per_chunk)
            n, gamma = sr.n_and_gamma(args, runner.train_state.since_reset
                                      + jnp.arange(b.updates_per_chunk))
            batches = jax.vmap(sample_batch, in_axes=(None, 0, 0, 0))(runner.buffer_state, keys,
                                                                      n, gamma)
            return None, checksum(batches)
        return jax.lax.scan(chunk, None, jax.random.split(runner.key, b.num_chunks))[1]

    def gradient(runner):
        n, gamma = sr.n_and_gamma(args, runner.train_state.since_reset)
        mb = sample_batch(runner.buffer_state, runner.key, n, gamma)

        def one(train_state, _):
            return sr.gradient_step(train_state, mb, b.network, b.optimizer, args.loss,
                                    args.tau)[0], None
        return jax.lax.scan(one, runner.train_state, None, length=b.num_updates)[0]

    def reset(runner):
        fresh = sr.fresh_networks(runner.key, b.network, runner.obs)

        def chunk(train_state, _):  # the gradient-step clock as the chunks move it
            before = train_state.steps
            train_state = train_state._replace(steps=before + b.updates_per_chunk)
            return jax.lax.cond(sr.reset_due(before, train_state.steps, args.reset_period, total),
                                lambda: sr.reset(train_state, fresh, b.optimizer, args.shrink),
                                lambda: train_state), None
        return jax.lax.scan(chunk, runner.train_state, None, length=b.num_chunks)[0]

    return b.init, b.update_step, {"rollout": b.rollout, "buffer_add": b.buffer_add,
                                   "sample": sample, "gradient": gradient, "reset": reset}


PARTS = {"dqn_minatar": dqn_parts, "sr_dqn_minatar": sr_dqn_parts}


def no_sample(buffer_state, key, n, gamma, batch_size, max_n, codec) -> sr_dqn_minatar.Batch:
    """sr_dqn_minatar.sample_batch with nothing drawn: a batch of zeros, its discount gamma^n."""
    packed = jnp.zeros((batch_size, buffer_state.obs.shape[-1]), jnp.uint8)
    zeros = jnp.zeros(batch_size)
    return sr_dqn_minatar.Batch(obs=codec.decode(packed), action=zeros.astype(jnp.int32),
                                reward=zeros, discount=zeros + gamma ** n,
                                next_obs=codec.decode(packed))


def no_gradient(train_state, mb, network, optimizer, loss, tau):
    """sr_dqn_minatar.gradient_step with no step taken but the clock's; the batch kept alive in
    the loss terms."""
    kept = checksum(mb)
    return train_state._replace(steps=train_state.steps + 1,
                                since_reset=train_state.since_reset + 1), {"td_loss": kept,
                                                                           "q_values": kept}


WITHOUT = {"sample": ("sample_batch", no_sample), "gradient": ("gradient_step", no_gradient),
           "reset": ("reset", lambda train_state, fresh, optimizer, shrink: train_state)}


def step_without(part: str, args, env, env_params, states):
    """sr_dqn_minatar's update step for N seeds side by side, compiled with `part` taken out."""
    name, stand_in = WITHOUT[part]
    with mock.patch.object(sr_dqn_minatar, name, stand_in):  # in force while the step is traced
        b = built(sr_dqn_minatar, args, env, env_params)
        return jax.jit(jax.vmap(b.update_step)).lower(states).compile()


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if bench.repeats <= 0 or any(n <= 0 for n in bench.seeds):
        common.fail("--repeats and --seeds must be positive")
    if bench.without and bench.script != "sr_dqn_minatar":
        common.fail("--without takes parts out of sr_dqn_minatar's step only")
    common.check_out(bench.out)
    script = {"dqn_minatar": dqn_minatar, "sr_dqn_minatar": sr_dqn_minatar}[bench.script]
    args, env, env_params, _ = script_setup(script, bench.script_args)
    init, update_step, programs = PARTS[bench.script](args, env, env_params)
    state = past_warm_up(init, update_step, args)
    rows = []
    write = report_writer(bench, rows, script=bench.script,
                          steps_per_iteration=args.steps_per_iteration,
                          interleaving=dict(zip(("chunks", "steps_per_chunk", "updates_per_chunk"),
                                                script.interleaving(args))))

    for n in bench.seeds:
        states = jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), state)
        vmapped = lambda fn: jax.jit(jax.vmap(fn))  # noqa: E731
        whole = timed(vmapped(update_step), states, repeats=bench.repeats)
        row = {"seeds": n, "whole_ms": 1e3 * whole,
               "sps": n * args.steps_per_iteration / whole}
        for name, fn in programs.items():
            row[f"{name}_ms"] = 1e3 * timed(vmapped(fn), states, repeats=bench.repeats)
        row["sum_over_whole"] = sum(row[f"{name}_ms"] for name in programs) / row["whole_ms"]
        for part in bench.without:
            row[f"without_{part}_ms"] = 1e3 * timed(
                step_without(part, args, env, env_params, states), states, repeats=bench.repeats)
        print(" | ".join(f"{k} {v:,.3g}" for k, v in row.items()), file=sys.stderr, flush=True)
        rows.append(row)
        write(echo=False)  # after each row: a time limit that stops the run keeps what it measured
    write(echo=True)


if __name__ == "__main__":
    main()

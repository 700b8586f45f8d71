"""What drawing sr_dqn_minatar.py's batches costs on the device JAX has, whole and by part, for N
seeds side by side (vmap, as the harness trains them): a chunk's batches at once, an iteration's
chunks in one `lax.scan`, from a full buffer of random transitions laid out as the script's.

Variants:
- `script`: sr_dqn_minatar.sample_batch as it is (each gradient step's n and gamma);
- `indices`: only the windows' rows and slots (window_indices);
- `observations`: only the observation and action gathers, where a window starts and three steps
  on, unpacked;
- `windows`: only the windows' rewards and episode ends, as the script reads them on an
  accelerator (two blocks of steps per window, window_steps with `blocked`), and their n-step
  returns;
- `windows_gathered`: the same, read as max_n single-step gathers per field, as the script reads
  them on a CPU (and everywhere until 01fb5f3, which read two slices of max_n per field).

Each figure is the median of --repeats runs after one that compiles, in microseconds per batch
drawn, all N seeds together.

Run:  python speed/sr_dqn_sample.py --seeds 1 8 --out sample.json
"""

import dataclasses
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import tyro  # noqa: E402

import sr_dqn_minatar as sr  # noqa: E402
from speed.dqn_profile import checksum, report_writer, script_setup  # noqa: E402
from speed.dqn_step_variants import full_buffer, time_program  # noqa: E402
from tools import common  # noqa: E402

VARIANTS = ("script", "indices", "observations", "windows", "windows_gathered")


@dataclasses.dataclass
class Args:
    script_args: str = ""
    """sr_dqn_minatar.py's flags, as one string (its defaults otherwise)"""
    seeds: tuple[int, ...] = (1,)
    """seed counts N to time, each N seeds side by side"""
    variants: tuple[str, ...] = VARIANTS
    """the variants to time"""
    repeats: int = 3
    """timed runs of each program (after one unrecorded run), their median reported"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def full_replay(key, args, codec, obs_shape, num_actions) -> sr.Replay:
    """A full buffer of random transitions, laid out as the script's (every row written once)."""
    steps = sr.Transition(*full_buffer(key, args, codec, obs_shape, num_actions).experience)
    buffer = sr.make_buffer(args)
    return buffer.add(buffer.init(jax.tree.map(lambda x: x[0, 0], steps)), steps)


def draw(variant: str, replay: sr.Replay, key, n, gamma, max_n: int, batch_size: int, codec):
    """One batch's worth of the variant's work, as a pytree to checksum."""
    if variant == "script":
        return sr.sample_batch(replay, key, n, gamma, batch_size, max_n, codec)
    rows, slots = sr.window_indices(replay, key, batch_size, max_n)
    if variant == "indices":
        return rows, slots
    if variant == "observations":
        length = sr.row_length(replay)
        first, stop = rows * length + slots[:, 0], rows * length + slots[:, 3]
        return (codec.decode(replay.obs[first]), replay.action[first],
                codec.decode(replay.next_obs[stop]))
    windows = sr.window_steps(replay, rows, slots, blocked=variant == "windows")
    return jax.vmap(sr.n_step_return, in_axes=(0, 0, 0, None, None))(*windows, n, gamma)


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if bench.repeats <= 0 or any(n <= 0 for n in bench.seeds):
        common.fail("--repeats and --seeds must be positive")
    if unknown := set(bench.variants) - set(VARIANTS):
        common.fail(f"unknown variants {sorted(unknown)}: choose from {VARIANTS}")
    common.check_out(bench.out)
    args, env, env_params, codec = script_setup(sr, bench.script_args)
    obs_shape = env.observation_space(env_params).shape
    num_chunks, _, updates_per_chunk = sr.interleaving(args)
    num_batches = num_chunks * updates_per_chunk
    rows = []
    write = report_writer(bench, rows, batches_per_program=num_batches,
                          batch_size=args.batch_size, buffer_size=args.buffer_size,
                          max_n=sr.max_n(args))

    for seeds in bench.seeds:
        keys = jax.random.split(jax.random.key(args.seed), seeds)
        states = jax.jit(jax.vmap(lambda k: full_replay(
            k, args, codec, obs_shape, env.action_space(env_params).n)))(keys)
        for variant in bench.variants:
            one = functools.partial(draw, variant, max_n=sr.max_n(args),
                                    batch_size=args.batch_size, codec=codec)

            def draws(replay, key, variant=variant, one=one):
                def chunk(_, key):  # a chunk's batches at once, each with its n and gamma
                    n, gamma = sr.n_and_gamma(args, jnp.arange(updates_per_chunk))
                    batches = jax.vmap(one, in_axes=(None, 0, 0, 0))(
                        replay, jax.random.split(key, updates_per_chunk), n, gamma)
                    return None, checksum(batches)
                return jax.lax.scan(chunk, None, jax.random.split(key, num_chunks))[1]

            seconds, compile_seconds, _ = time_program(jax.vmap(draws), (states, keys),
                                                       bench.repeats)
            rows.append({"variant": variant, "seeds": seeds,
                         "us_per_batch": 1e6 * seconds / num_batches,
                         "compile_seconds": compile_seconds})
            print(f"seeds {seeds} {variant}: {rows[-1]['us_per_batch']:.2f} us per batch "
                  f"(compile {compile_seconds:.1f} s)", file=sys.stderr, flush=True)
            write(echo=False)  # after each row: a time limit that stops the run keeps what it has
    write(echo=True)


if __name__ == "__main__":
    main()

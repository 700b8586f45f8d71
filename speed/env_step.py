"""What a game's own step costs: each game's environment as the scripts make it (utils/env.py:
gymnax's game with sticky actions and auto-reset), --num-envs of them stepped side by side under
vmap with uniform random actions, --steps steps in one compiled lax.scan, on the device JAX has.
Each game is compiled once, then timed --repeats times; the median is its figure, in milliseconds
per step of all the environments and in environment steps per second. A script's training SPS
cannot exceed the last for its game (DQN's 32 environments per seed, ten seeds side by side, step
320 at a time).

Run:  python speed/env_step.py --out env_step.json
      python speed/env_step.py --games Seaquest-MinAtar Freeway-MinAtar --num-envs 320
      python speed/env_step.py --games Seaquest-MinAtar --seaquest-rows 100 32   # gymnax's, ours
"""

import dataclasses
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import tyro  # noqa: E402

from tools import common  # noqa: E402
from utils.env import make_env, set_seaquest_rows  # noqa: E402

GAMES = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar",
         "SpaceInvaders-MinAtar")


@dataclasses.dataclass
class Args:
    games: tuple[str, ...] = GAMES
    """the gymnax environments timed"""
    num_envs: int = 320
    """environments stepped side by side"""
    steps: int = 200
    """steps of all of them in each timed call"""
    repeats: int = 5
    """timed calls per game, after one that compiles"""
    sticky_action_prob: float = 0.1
    """the scripts' training default"""
    seaquest_rows: tuple[int, ...] = ()
    """Seaquest timed with its entity buffers at each of these sizes, one row each (gymnax's own:
    100; the scripts': utils.env.SEAQUEST_ROWS); none: as the scripts make it"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def steps_program(env, env_params, num_envs: int, steps: int):
    """A jitted function of a key: `steps` steps of `num_envs` environments from their reset,
    random actions; returns the rewards' sum, which the timing waits for."""
    num_actions = env.action_space(env_params).n
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def run(key):
        reset_key, key = jax.random.split(key)
        _, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), env_params)

        def one(carry, _):
            state, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            actions = jax.random.randint(action_key, (num_envs,), 0, num_actions)
            _, state, reward, *_ = step(jax.random.split(step_key, num_envs), state, actions,
                                        env_params)
            return (state, key), reward.sum()
        return jax.lax.scan(one, (state, key), None, length=steps)[1].sum()
    return jax.jit(run)


def time_game(env_id: str, bench: Args, seaquest_rows: int = 0) -> dict:
    env, env_params = make_env(env_id, bench.sticky_action_prob)
    if seaquest_rows:  # after make_env, which sets the scripts' size; read when traced
        set_seaquest_rows(seaquest_rows)
    run = steps_program(env, env_params, bench.num_envs, bench.steps)
    start = time.perf_counter()
    jax.block_until_ready(run(jax.random.key(0)))
    compile_seconds = time.perf_counter() - start
    seconds = []
    for repeat in range(bench.repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(jax.random.key(repeat + 1)))
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"game": env_id, **({"seaquest_rows": seaquest_rows} if seaquest_rows else {}),
            "ms_per_step": 1e3 * median / bench.steps,
            "env_steps_per_second": bench.num_envs * bench.steps / median,
            "seconds": seconds, "first_call_seconds": compile_seconds}


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = next((f"--{name.replace('_', '-')} must be positive, got {getattr(bench, name)}"
                  for name in ("num_envs", "steps", "repeats") if getattr(bench, name) <= 0), None)
    if error is None and not bench.games:
        error = "--games names no game"
    if error is None and any(rows <= 0 for rows in bench.seaquest_rows):
        error = f"--seaquest-rows must be positive, got {min(bench.seaquest_rows)}"
    if error:
        common.fail(error)
    common.check_out(bench.out)
    for env_id in bench.games:  # an unknown id: one line before anything is timed
        try:
            make_env(env_id, bench.sticky_action_prob)
        except (ValueError, KeyError) as e:
            common.fail(f"--games {env_id}: {str(e).splitlines()[0] if str(e) else 'unknown'}")
    rows = []
    timed = [(env_id, size) for env_id in bench.games
             for size in (bench.seaquest_rows if env_id == "Seaquest-MinAtar" else ()) or [0]]
    for env_id, size in timed:
        rows.append(time_game(env_id, bench, size))
        label = f"{env_id} ({size} rows)" if size else env_id
        print(f"{label}: {rows[-1]['ms_per_step']:.2f} ms per step of {bench.num_envs} "
              f"environments, {rows[-1]['env_steps_per_second']:,.0f} steps/s", file=sys.stderr,
              flush=True)
    common.write_report(common.new_report(
        machine=common.machine(jax.devices()), num_envs=bench.num_envs, steps=bench.steps,
        repeats=bench.repeats, sticky_action_prob=bench.sticky_action_prob, rows=rows),
        bench.out, True)


if __name__ == "__main__":
    main()

"""Tuning harness: ppo_breakout.py's training for several seeds at once, to compare settings by measurement.

All seeds train side by side under `vmap`, the whole run inside one `jit` (a `lax.scan` over iterations),
so one compilation serves every seed. The seeds are split across the devices (on a CPU, one per core),
as many devices as divide --num-seeds. Each seed's final policy is then evaluated on complete episodes
with sampled actions. It prints one JSON line: the per-seed evaluation, their mean and minimum, and a
10-point learning curve (mean return of the training episodes that ended in each tenth of training).

It reuses ppo_breakout.py's functions, so it measures exactly that algorithm; but each seed runs on one
device without the script's data-parallel split (whose keys also fold in the device index) and
vmapped matmuls do not round exactly as single-seed ones, so seed k here is not `--seed k` there.

Run:  python benchmarks/tune.py --ppo.gae-lambda 0.9 --num-seeds 4
"""

import dataclasses
import json
import os
import sys

num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(num_cores or 1))  # before JAX starts

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import tyro
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_breakout  # noqa: E402
from utils.evaluation import evaluate  # noqa: E402


@dataclasses.dataclass
class Args:
    ppo: ppo_breakout.Args = dataclasses.field(default_factory=ppo_breakout.Args)
    """the settings under test (--ppo.seed and --ppo.num-devices are ignored: see --first-seed)"""
    num_seeds: int = 4
    """the number of seeds trained side by side"""
    first_seed: int = 1
    """seeds first_seed, first_seed + 1, ... are trained"""
    eval_episodes: int = 128
    """complete episodes per seed in the final evaluation (sampled actions)"""


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = ppo_breakout.find_arg_error(args.ppo) or (
        "--num-seeds and --eval-episodes must be positive" if min(args.num_seeds, args.eval_episodes) <= 0 else None)
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    cfg = args.ppo
    ppo_breakout.fill_runtime_fields(cfg)

    env, env_params = gymnax.make(cfg.env_id)
    network = ppo_breakout.make_network(env.action_space(env_params).n, cfg.hidden_sizes, cfg.activation)
    optimizer = ppo_breakout.make_optimizer(cfg)
    update_step = ppo_breakout.make_update_step(cfg, env, env_params, network, optimizer)

    def init(seed: jax.Array):
        # The same keys and initialisation as ppo_breakout.main, for one seed.
        runner_key, eval_key = jax.random.split(jax.random.key(seed))
        return ppo_breakout.init_runner(runner_key, env, env_params, network, optimizer, cfg.num_envs), eval_key

    def train(runner: ppo_breakout.RunnerState, eval_key: jax.Array):
        def iteration(runner, _):
            runner, metrics = update_step(runner)
            return runner, (metrics["episode_return_sum"], metrics["episodes"])

        runner, (return_sums, episodes) = jax.lax.scan(iteration, runner, None, length=cfg.num_iterations)
        result = evaluate(eval_key, runner.params, False, env=env, env_params=env_params,
                          policy_apply=lambda p, o: network.apply(p, o)[0], num_episodes=args.eval_episodes,
                          max_steps=env_params.max_steps_in_episode + 1)
        return result.returns.mean(), return_sums, episodes

    seeds = jnp.arange(args.first_seed, args.first_seed + args.num_seeds)
    # Initialised outside shard_map: the orthogonal init's batched QR (LAPACK) deadlocked jaxlib 0.10.2
    # when two CPU devices ran it at once, each vmapped over several seeds.
    runners, eval_keys = jax.jit(jax.vmap(init))(seeds)
    num_devices = max(n for n in range(1, len(jax.devices()) + 1) if args.num_seeds % n == 0)
    mesh = Mesh(np.array(jax.devices()[:num_devices]), ("seeds",))
    # Seeds never talk to each other: no collectives, so nothing for check_vma to check.
    train_seeds = jax.shard_map(jax.vmap(train), mesh=mesh, in_specs=P("seeds"), out_specs=P("seeds"),
                                check_vma=False)
    eval_returns, return_sums, episodes = map(np.asarray, jax.jit(train_seeds)(runners, eval_keys))
    tenths = np.array_split(np.arange(cfg.num_iterations), min(10, cfg.num_iterations))
    curve = [return_sums[:, t].sum() / max(episodes[:, t].sum(), 1) for t in tenths]
    print(json.dumps({
        "seeds": seeds.tolist(), "eval": [round(float(r), 2) for r in eval_returns],
        "mean": round(float(eval_returns.mean()), 2), "min": round(float(eval_returns.min()), 2),
        "curve": [round(float(c), 1) for c in curve],
        "changed_args": {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                         if f.init and f.name not in ("seed", "num_devices")
                         and getattr(cfg, f.name) != f.default},
    }))


if __name__ == "__main__":
    main()

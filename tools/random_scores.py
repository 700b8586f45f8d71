"""The uniform random policy's return on each MinAtar game, under both evaluation protocols.

These are the zero points of the normalised score that tools/aggregate.py takes across games:
(return - random) / (published PPO - random).

Run:  python tools/random_scores.py --out results/shared/random_scores.json
"""

import dataclasses
import json
import os
import shlex
import sys

import jax
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from utils.env import make_env  # noqa: E402
from utils.evaluation import PROTOCOLS, evaluate, protocol_params  # noqa: E402

GAMES = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar",
         "Seaquest-MinAtar")


@dataclasses.dataclass
class Args:
    episodes: int = 1000
    """complete episodes per game and protocol"""
    seed: int = 0
    """the evaluation key's seed"""
    out: str = ""
    """write the JSON to this file"""


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if args.episodes <= 0:
        print(f"error: --episodes must be positive, got {args.episodes}", file=sys.stderr)
        sys.exit(2)
    scores = {}
    for env_id in GAMES:
        env, env_params = make_env(env_id, 0.0)
        num_actions = env.action_space(env_params).n

        def uniform(params, obs, key, greedy, num_actions=num_actions):
            return jax.random.randint(key, obs.shape[:1], 0, num_actions)

        scores[env_id] = {}
        for protocol in PROTOCOLS:
            params = protocol_params(env_id, env_params, protocol)
            result = evaluate(jax.random.key(args.seed), None, False, env=env, env_params=params,
                              act=uniform, num_episodes=args.episodes,
                              max_steps=params.env_params.max_steps_in_episode + 1)
            scores[env_id][protocol] = float(result.returns.mean())
            print(f"{env_id:24s} {protocol:8s} {scores[env_id][protocol]:8.3f}", file=sys.stderr)
    out = {"command": shlex.join(["python", "tools/random_scores.py", *sys.argv[1:]]),
           "episodes": args.episodes, "random_returns": scores}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

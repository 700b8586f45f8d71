"""Trains purejaxql's PQN for MinAtar (mttga/purejaxql, `purejaxql/pqn_minatar.py`) and reports its
compile and training time as this project's scripts do: a summary.json, named by a last line
`summary: PATH`. speed/pqn_speed.py starts it, under purejaxql's own interpreter and pinned
packages (not this project's); it imports nothing of this project.

What runs is purejaxql's own code: its Hydra config composed as its command line composes it,

    python purejaxql/pqn_minatar.py +alg=pqn_minatar alg.ENV_NAME=ENV alg.TOTAL_TIMESTEPS=N \\
        alg.TEST_DURING_TRAINING=False WANDB_MODE=disabled SAVE_PATH=null

then what its `single_run` does: `jax.jit(jax.vmap(make_train(config)))` over NUM_SEEDS (1) keys.
One change of timing, none of work: the jitted function is compiled ahead of time
(`.lower(keys).compile()`), so that training time is the compiled run alone. purejaxql's own
"Took N seconds" counts compilation and training together (their sum is reported as
`took_seconds`).

    /path/to/venv/bin/python speed/purejaxql_pqn.py --repo /path/to/purejaxql \\
        --total-timesteps 2000000
"""

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time


def overrides(env_id: str, total_timesteps: int) -> list[str]:
    """purejaxql's command-line overrides: its MinAtar config on `env_id` for `total_timesteps`,
    with no test episodes during training, no wandb and no saved parameters."""
    return ["+alg=pqn_minatar", f"alg.ENV_NAME={env_id}", f"alg.TOTAL_TIMESTEPS={total_timesteps}",
            "alg.TEST_DURING_TRAINING=False", "WANDB_MODE=disabled", "SAVE_PATH=null"]


def commit(repo: str) -> str:
    """The checkout's commit, with "-dirty" if it has changes ("" outside git)."""
    def git(*args):
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    head = git("rev-parse", "HEAD")
    if head.returncode:
        return ""
    return head.stdout.strip() + ("-dirty" if git("status", "--porcelain").stdout.strip() else "")


def packages() -> dict[str, str]:
    """Every installed distribution and its version, as `pip freeze` lists them."""
    return dict(sorted((d.metadata["Name"], d.version) for d in importlib.metadata.distributions()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="a checkout of mttga/purejaxql")
    parser.add_argument("--total-timesteps", type=int, default=2_000_000)
    parser.add_argument("--env-id", default="Breakout-MinAtar")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.repo))  # this checkout's purejaxql, not another

    import jax
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from purejaxql import pqn_minatar

    config_dir = os.path.join(os.path.abspath(args.repo), "purejaxql", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):  # as @hydra.main
        config = OmegaConf.to_container(
            compose("config", overrides=overrides(args.env_id, args.total_timesteps)))
    config = {**config, **config["alg"]}  # as single_run merges them

    keys = jax.random.split(jax.random.PRNGKey(config["SEED"]), config["NUM_SEEDS"])
    start = time.time()
    train = jax.jit(jax.vmap(pqn_minatar.make_train(config))).lower(keys).compile()
    compile_seconds = time.time() - start
    start = time.time()
    outs = jax.block_until_ready(train(keys))
    train_seconds = time.time() - start

    steps = config["NUM_UPDATES"] * config["NUM_STEPS"] * config["NUM_ENVS"]  # per seed
    # LogWrapper's return of each environment's last finished episode, averaged over the last
    # update's steps and environments: a sign that it learned, not a score.
    last_return = float(outs["metrics"]["returned_episode_returns"][:, -1].mean())
    summary = {
        "status": "completed", "env_id": args.env_id, "global_step": steps,
        "iterations": config["NUM_UPDATES"], "seeds": config["NUM_SEEDS"],
        "compile_seconds": compile_seconds, "train_seconds": train_seconds,
        "took_seconds": compile_seconds + train_seconds, "sps": steps / train_seconds,
        "last_returned_episode_returns": last_return, "devices": str(jax.devices()),
        "purejaxql_commit": commit(args.repo), "overrides": overrides(args.env_id,
                                                                      args.total_timesteps),
        "config": config, "packages": packages(),
    }
    run_dir = os.path.join("runs", f"{args.env_id}__purejaxql_pqn__{int(time.time())}")
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1, default=str)  # e.g. a NumPy scalar
    print(f"{args.env_id}: {steps:,} steps in {train_seconds:.1f} s ({steps / train_seconds:,.0f} "
          f"SPS) after compiling in {compile_seconds:.1f} s")
    print(f"summary: {path}")


if __name__ == "__main__":
    main()

"""What the final evaluation costs at each pool width, and whether it plays the same episodes: a
model file's network evaluated as a script's run evaluates it (both pairs of evaluations, each
policy under both protocols, --eval-episodes episodes each, on one device), with each device's pool
(utils/evaluation.py's slots that play episodes side by side, POOL_WIDTH of them) at each of
--widths. Each width is compiled once, then each pair timed --repeats times; the median is its
figure. Every width's results (returns, lengths, endings, last observations, fingerprints, recorded
frames) are compared with the first width's, array for array: a wider pool changes how many
episodes play at once, and each episode draws from its own keys, so the numbers should not move.
A narrow pool plays its episodes in turn (256 episodes in 32 slots: 8 after one another in each),
so long episodes make many loop iterations.

Run:  python speed/eval_width.py --model models/pqn_minatar__Freeway.safetensors --widths 32 256
"""

import dataclasses
import os
import statistics
import sys
import time
from typing import Any, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402

from tools import common  # noqa: E402
from tools.tune import load_script  # noqa: E402
from utils import evaluation, model, training  # noqa: E402
from utils.env import make_env  # noqa: E402
from utils.files import header_value, read_safetensors  # noqa: E402


@dataclasses.dataclass
class Args:
    model: str = "models/pqn_minatar__Freeway.safetensors"
    """the model file that plays (its script from its header or, in older files, its name, as
    models/<script>__<game>.safetensors; its game and network from its header)"""
    widths: tuple[int, ...] = (evaluation.POOL_WIDTH, 256)
    """pool widths timed, each compared with the first (at most --eval-episodes)"""
    eval_episodes: int = 256
    """episodes of each evaluation, as a script's --eval-episodes"""
    seed: int = 1
    """the evaluation's seed, as a script's --seed with --load-model"""
    repeats: int = 2
    """timed calls of each pair, after one that is not recorded"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def check(bench: Args) -> str | None:
    """What is wrong with the command line, or None."""
    for name in ("eval_episodes", "repeats"):
        if getattr(bench, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(bench, name)}"
    if not bench.widths:
        return "--widths names no width"
    if min(bench.widths) <= 0:
        return f"--widths must be positive, got {min(bench.widths)}"
    if max(bench.widths) > bench.eval_episodes:  # evaluate would play a narrower pool
        return (f"--widths {max(bench.widths)} is more than --eval-episodes "
                f"{bench.eval_episodes}: no pool is wider than its episodes")
    return None


class Loaded(NamedTuple):
    """A model file's network and what plays it, as the script's --load-model makes them."""
    script: Any  # the script's module
    args: Any  # its Args for --load-model
    env: Any
    env_params: Any
    agent: Any  # utils.contract.Agent
    params: dict


def load(path: str, seed: int) -> Loaded:
    """What `python SCRIPT.py --load-model path --seed seed` evaluates."""
    _, header = read_safetensors(path, "--model")
    # Files from before headers named their script are named for it (models/<script>__<game>).
    name = (header_value(path, header, "script") if "script" in header
            else os.path.basename(path).split("__")[0])
    script = load_script(name)
    args = training.parse_args(script, ["--load-model", path, "--seed", str(seed),
                                        "--num-devices", "1", "--jax-cache-dir", ""])
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    agent = script.make_agent(args, env, env_params)
    obs = jax.eval_shape(env.reset, jax.random.key(0), env_params)[0]
    params = model.load_params(path, agent.network, obs, args, script.NETWORK_ARGS,
                               getattr(script, "ADDED_ARGS", {}))
    return Loaded(script, args, env, env_params, agent, params)


def time_width(width: int, bench: Args, loaded: Loaded, eval_key: jax.Array) -> tuple[dict, dict]:
    """(the width's row, its results by policy on the host)."""
    params = loaded.params
    start = time.perf_counter()
    play = evaluation.compile_final_evaluation(
        loaded.env, loaded.args.env_id, loaded.env_params, loaded.agent.act, bench.eval_episodes,
        1, eval_key, params, width)
    compile_seconds = time.perf_counter() - start
    seconds, results = {}, {}
    for policy in evaluation.EVALUATION_PAIRS:
        runs = []
        for _ in range(bench.repeats + 1):
            start = time.perf_counter()
            results[policy] = jax.block_until_ready(play(params, policy))
            runs.append(time.perf_counter() - start)
        seconds[policy] = statistics.median(runs[1:])
        results[policy] = jax.device_get(results[policy])
    means = {f"{evaluation.PROTOCOL_OF[evaluation.EVALUATIONS[i][0]]}/{policy}":
             float(results[policy].returns[j].mean())
             for policy, pair in evaluation.EVALUATION_PAIRS.items() for j, i in enumerate(pair)}
    return {"width": width, "compile_seconds": compile_seconds,
            "seconds_per_pair": seconds, "seconds_both_pairs": sum(seconds.values()),
            "mean_returns": means}, results


def same(a: dict, b: dict) -> bool:
    """Whether two widths' results are equal, array for array."""
    return all(np.array_equal(x, y) for policy in a
               for x, y in zip(jax.tree.leaves(a[policy]), jax.tree.leaves(b[policy])))


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = check(bench)
    if error:
        common.fail(error)
    common.check_out(bench.out)
    try:
        loaded = load(bench.model, bench.seed)
    except ValueError as e:
        common.fail(str(e))
    eval_key = jax.random.split(jax.random.key(loaded.args.seed))[1]  # as training.Run's
    rows, first = [], None
    for width in bench.widths:
        row, results = time_width(width, bench, loaded, eval_key)
        if first is None:  # the width the others are compared with
            first = results
        row["identical_to_first_width"] = same(results, first)
        rows.append(row)
        print(f"width {width}: {row['seconds_both_pairs']:.2f} s both pairs, compile "
              f"{row['compile_seconds']:.1f} s, identical to width {bench.widths[0]}: "
              f"{row['identical_to_first_width']}", file=sys.stderr, flush=True)
    common.write_report(common.new_report(
        machine=common.machine(jax.devices()), script=training.script_name(loaded.script),
        model=os.path.relpath(os.path.abspath(bench.model), ROOT), env_id=loaded.args.env_id,
        seed=loaded.args.seed, eval_episodes=bench.eval_episodes, repeats=bench.repeats,
        rows=rows), bench.out, True)


if __name__ == "__main__":
    main()

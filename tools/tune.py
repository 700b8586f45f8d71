"""Tuning harness: an algorithm script's training for many seeds at once, with the statistics to
compare settings. --script names the script, any that keeps utils/contract.py: ppo_breakout (the
default), pqn_minatar, or the path of another; its settings are flags named after it, up to its
first "_": --ppo.learning-rate, --pqn.q-lambda.

The seeds are split across the devices (on a CPU, one per core). On a CPU each device trains its
seeds one after another with `lax.map` (a device's only seed with no loop around it), so a seed's
result does not depend on which other seeds run, on how many, or on the number of devices. On a GPU
or TPU each device trains its seeds side by side in one `vmap`ped program (--vmap-seeds: how many at
once); a seed's result then depends on that count too, as a batched program may round differently,
but not on which other seeds run beside it.
Training runs in --num-chunks jitted chunks of iterations, the runner state donated from one to the
next; after each chunk the progress is printed (stderr) and a curve point recorded. Each seed's
final policy is then evaluated on complete episodes under both protocols, with the policy the script
reports (its HEADLINE_POLICY): PPO's sampled actions, PQN's greedy ones; with --both-policies, the
other one too.

Output (stdout, and --out): JSON with the per-seed returns, their mean and interquartile mean (IQM)
with 95% bootstrap intervals, the share of seeds past the first wall (return >= 30), the pooled
learning curve with a band, and with --baseline the comparison against an earlier result on the same
seeds (differences with intervals, probability of improvement). See tools/stats.py. Its `code` is
a digest of the harness and the script that ran (utils.checkpoint.code_version): the same at a
commit whose two files and utils/ are the same.

With --checkpoint-dir, the training state is written there after every chunk; a run killed midway
resumes from its last chunk when the same command runs again, and ends with the same result, bit for
bit, as a run never interrupted; its JSON then says how many chunks came from the checkpoint
(`resumed_after_chunk`).

Seed k here is not `ppo_breakout.py --seed k` (nor pqn_minatar's): a script splits one seed's
environments over the devices and folds the device index into its keys. Docs: docs/tuning.md.

Run:  python tools/tune.py --num-seeds 8 --ppo.gae-lambda 0.95 --out lambda95.json
      python tools/tune.py --script pqn_minatar --num-seeds 8 --pqn.q-lambda 0.8
"""

import copy
import dataclasses
import functools
import importlib.util
import json
import os
import re
import resource
import shlex
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(num_cores or 1))  # before JAX starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import common, stats  # noqa: E402
from utils import checkpoint, cli, contract, files, startup  # noqa: E402
from utils.env import make_env  # noqa: E402
from utils.evaluation import PROTOCOLS, SAFETY_BOUND, evaluate_each, protocol_settings  # noqa: E402

DEFAULT_SCRIPT = "ppo_breakout"


# --------------------------------------------------------------------------------------------------
# The script under test: any that keeps utils/contract.py, named on the command line
# --------------------------------------------------------------------------------------------------
def load_script(script: str):
    """The module of `script`: a script in the project's root by name (ppo_breakout), or a path
    ending in .py, relative to the project's root (tests/tiny_pg.py); imported once."""
    path = os.path.join(ROOT, script if script.endswith(".py") else f"{script}.py")
    name = os.path.splitext(os.path.basename(path))[0]
    if name not in sys.modules:
        if not os.path.isfile(path):
            raise ValueError(f"--script {script}: no such script")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def name_of(script) -> str:
    """ppo_breakout for the module of ppo_breakout.py."""
    return os.path.splitext(os.path.basename(script.__file__))[0]


def group_of(script: str) -> str:
    """The flag group of a script's settings: its name up to the first "_" (ppo_breakout: ppo)."""
    return name_of(load_script(script)).split("_")[0]


def script_of(cfg):
    """The module of the script whose Args `cfg` is."""
    return sys.modules[type(cfg).__module__]


def script_given(argv: list[str]) -> str:
    """The --script that `argv` gives, or the default: it decides which flags parse."""
    for i, token in enumerate(argv):
        if token == "--script" and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--script="):
            return token.split("=", 1)[1]
    return DEFAULT_SCRIPT


def with_settings(base: type, script: str) -> type:
    """`base` (the harness's or the search's own arguments) with a flag group of `script`'s
    settings, named by group_of."""
    module = load_script(script)
    own = [cli.flag(f.name) for f in dataclasses.fields(base)
           if f.name in ("first_seed", "num_devices")]  # what this command sets, not the script
    help_text = f"the settings of {name_of(module)}.py (this command sets {', '.join(own)} itself)"
    # No default instance: tyro then leaves out the fields filled at runtime (init=False).
    field = (group_of(script), Annotated[module.Args, tyro.conf.arg(help=help_text)],
             dataclasses.field(kw_only=True))
    return dataclasses.make_dataclass("Args", [field], bases=(base,))


def parse(base: type, description: str, argv: list[str] | None = None):
    """The command line as `base` with the settings of the script it names; one error line and
    exit 2 for a script that cannot be loaded."""
    argv = sys.argv[1:] if argv is None else argv
    script = script_given(argv)
    try:
        args_type, group = with_settings(base, script), group_of(script)
        other = next((t for t in argv if re.match(r"--\w+\.", t) and
                      not t.startswith(f"--{group}.")), None)
        if other:  # a setting of another script would not parse: say which flags do
            raise ValueError(f"{other.split('=')[0]}: the settings of --script {script} are "
                             f"--{group}.* flags")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return cli.parse_args(args_type, lambda _: None, description, argv)


def make_args(base: type, script: str = DEFAULT_SCRIPT, **fields):
    """`base`'s arguments with `script`'s settings, as `parse` would make them (for tests and
    callers in Python)."""
    settings = {group_of(script): load_script(script).Args()}
    return with_settings(base, script)(script=script, **(settings | fields))


@dataclasses.dataclass
class Args:
    script: str = DEFAULT_SCRIPT
    """the algorithm trained: a script of this project by name (ppo_breakout, pqn_minatar) or the
    path of one that keeps utils/contract.py; its settings are --NAME.* flags, NAME its name up to
    the first "_" (--ppo.gae-lambda). The script's per-game rows are not applied: give them as
    flags"""
    num_seeds: int = 8
    """the number of seeds trained"""
    first_seed: int = 1
    """seeds first_seed, first_seed + 1, ... are trained"""
    eval_episodes: int = 128
    """complete episodes per seed in the final evaluation (the script's headline policy)"""
    both_policies: bool = False
    """also evaluate the script's other policy (greedy and sampled both), as many episodes under
    both protocols; the headline policy stays in eval_returns"""
    num_chunks: int = 10
    """training runs in this many jitted chunks of iterations (at most one per iteration), each
    giving a progress line and a learning-curve point; 1 runs all iterations in one call"""
    num_devices: int = 0
    """the number of devices the seeds are split across; 0 takes all, up to one per seed"""
    vmap_seeds: int = 0
    """seeds each device trains side by side in one vmapped program, its groups one after
    another (0: one on a CPU, where vmap gains nothing; on a GPU or TPU all of a device's seeds
    up to 16, equal groups of at most 8 past that); a seed's result depends on this count"""
    out: str = ""
    """also write the JSON result to this file"""
    baseline: str = ""
    """a result JSON of another setting that ran (at least) these seeds, to compare this one
    against on them"""
    quiet: bool = False
    """no progress lines"""
    stability: bool = False
    """also record, per seed over all of training, the extremes of the metrics the script names in
    STABILITY_METRICS (PPO: the largest logit gap and the log-ratio's range, what loss_stability.py
    is about) and whether any loss, gradient norm or parameter went non-finite"""
    checkpoint_dir: str = ""
    """write the training state to this directory after every chunk; the same command run again
    continues from it (--out, --baseline, --quiet, --both-policies and --num-devices may change;
    another device count keeps the returns, while --stability's extremes may differ in their last
    digits)"""


class SeedsResult(NamedTuple):
    # (seeds,) mean return of each seed's evaluation episodes, gymnax's protocol
    eval_returns: np.ndarray
    eval_returns_minatar: np.ndarray  # (seeds,) the same under MinAtar's protocol
    minatar_bound_hits: np.ndarray  # (seeds,) MinAtar-protocol episodes stopped by the safety bound
    # (seeds, chunks) summed return of the training episodes ended in each chunk
    return_sums: np.ndarray
    episodes: np.ndarray  # (seeds, chunks) the number of those episodes
    chunk_steps: list[int]  # environment steps per seed done at the end of each chunk
    compile_seconds: float  # compiling before training, and waiting for it after (not beside it)
    train_seconds: float
    eval_seconds: float
    # per seed: logit_gap_max, log_ratio_min, log_ratio_max, non_finite
    stability: dict | None = None
    vmap_seeds: int = 1  # seeds trained side by side on each device
    # seconds to set up: the seeds' initial states (compiled and run; on a GPU or TPU while the
    # training chunk's program compiles), that program (compiled), the evaluation's (compiled;
    # on a GPU or TPU while the seeds train)
    compile_parts: dict | None = None
    # of train_seconds, this process's writing of the checkpoint after each chunk
    checkpoint_seconds: float = 0.0
    # with both_policies, the other policy's (seeds,) returns: gymnax's and MinAtar's protocol
    other_returns: np.ndarray | None = None
    other_returns_minatar: np.ndarray | None = None
    other_bound_hits: np.ndarray | None = None
    # chunks the run took from its checkpoint (0: it trained whole in this process)
    resumed_after_chunk: int = 0


def settings(args):
    """The Args of the script under test (of the harness's Args, or of search.py's)."""
    return getattr(args, group_of(args.script))


def check_settings(cfg) -> str | None:
    """What is wrong with the script's settings: the fields every script shares, then its own.
    The run's name, which the harness does not use, is the script's unless given."""
    named = copy.copy(cfg)
    named.exp_name = cfg.exp_name or name_of(script_of(cfg))
    return cli.check_run_args(named) or script_of(cfg).check_args(cfg)


def find_harness_error(args: Args) -> str | None:
    """What is wrong with the harness's own arguments (the script's are the script's to check)."""
    for name in ("num_seeds", "eval_episodes", "num_chunks"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    if args.num_devices < 0:
        return f"--num-devices must be 0 (all) or positive, got {args.num_devices}"
    if args.vmap_seeds < 0:
        return f"--vmap-seeds must be 0 (automatic) or positive, got {args.vmap_seeds}"
    if args.num_devices > len(jax.devices()):
        return (f"--num-devices {args.num_devices} is more than the {len(jax.devices())} devices "
                "JAX has")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        return f"--out {args.out}: its directory does not exist"
    if args.baseline:
        try:
            with open(args.baseline) as f:
                baseline = json.load(f)
            seeds = baseline["seeds"]
            baseline["eval_returns"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"--baseline {args.baseline} is not a result of this harness: {e!r}"
        if baseline.get("script", DEFAULT_SCRIPT) != name_of(load_script(args.script)):
            return f"--baseline {args.baseline} is a result of another script, not {args.script}"
        wanted = range(args.first_seed, args.first_seed + args.num_seeds)
        missing = [s for s in wanted if s not in seeds]
        if missing:
            return f"--baseline {args.baseline} has no result for seed {missing[0]}"
    return None


# --------------------------------------------------------------------------------------------------
# Checkpoints: a killed many-seed run resumes from its last chunk
# --------------------------------------------------------------------------------------------------
CHECKPOINT = common.HARNESS_CHECKPOINT


def not_used(script) -> set[str]:
    """The script arguments the harness does not use: the run's own (seed, devices, saving, ...),
    its evaluation's size (the harness's --eval-episodes) and the fields that only add logging."""
    return {*contract.NOT_RESULTS, "eval_episodes", *getattr(script, "QUIET_ARGS", {})}


def checkpoint_identity(cfg, seeds: list[int], eval_episodes: int, num_chunks: int,
                        stability: bool, vmap_seeds: int = 1) -> dict:
    """What a checkpoint must match to be resumed: the code and every argument that changes a result
    (not the device count: a seed's result does not depend on it; the seeds trained side by side,
    `vmap_seeds`, as resolved)."""
    script = script_of(cfg)
    code = checkpoint.code_version(__file__, script.__file__)
    used = {k: v for k, v in vars(cfg).items() if k not in not_used(script)}
    return {"format": "tune checkpoint 2", "code": code, "script": name_of(script), "args": used,
            "seeds": seeds, "eval_episodes": eval_episodes, "num_chunks": num_chunks,
            "stability": stability, "vmap_seeds": vmap_seeds,
            "env_vars": startup.precision_environment()}  # "" in checkpoints from before it


# On a TPU v5e 32 seeds at once trained slower than 32 in groups of 8 (PPO, PQN) and than 8 seeds
# (DQN), while 10 DQN seeds at once trained as fast as 8 (docs/accelerators.md, "The harness on
# the chip"). Nothing between 10 and 32 at once was measured: up to 16 go at once, more in groups.
MAX_AUTO_AT_ONCE, AUTO_GROUP = 16, 8


def seed_layout(num_seeds: int, num_devices: int = 0, vmap_seeds: int = 0) -> tuple[int, int]:
    """(devices, seeds side by side on each) for `num_seeds` seeds: the harness's --num-devices
    and --vmap-seeds with 0 resolved (all devices, up to one per seed; one seed at a time on a
    CPU; on an accelerator a device's seeds at once, or, past MAX_AUTO_AT_ONCE, in as few equal
    groups of at most AUTO_GROUP as hold them)."""
    num_devices = min(num_devices or len(jax.devices()), num_seeds)
    if vmap_seeds:
        return num_devices, vmap_seeds
    if jax.devices()[0].platform == "cpu":
        return num_devices, 1
    per_device = -(-num_seeds // num_devices)
    groups = 1 if per_device <= MAX_AUTO_AT_ONCE else -(-per_device // AUTO_GROUP)
    return num_devices, -(-per_device // groups)


def read_checkpoint(path: str, identity: dict) -> tuple[dict, dict] | None:
    """(tensors, header) of the checkpoint at `path` if it is one of this run, None if there is
    none, else ValueError saying why it cannot be resumed."""
    if not os.path.exists(path):
        return None
    tensors, header = files.read_safetensors(path, "--checkpoint-dir")
    if header.get("format") != json.dumps(identity["format"]):
        raise ValueError(f"{path} is not a checkpoint of this harness")
    for name, value in identity.items():
        saved = files.header_value(path, header, name, {"env_vars": ""})
        value = json.loads(json.dumps(value))
        if name == "args" and saved != value:  # name the first argument that differs
            group, name = group_of(identity["script"]), next(k for k in sorted(saved | value)
                                                             if saved.get(k) != value.get(k))
            saved, value, name = saved.get(name), value.get(name), f"{group}.{name}"
        if saved != value:
            reason = ("was written by another version of the code" if name == "code" else
                      f"was written {checkpoint.under(saved)}, and this process runs "
                      f"{checkpoint.under(value)}" if name == "env_vars" else
                      f"is of a run with --{name.replace('_', '-')} {saved}, not {value}")
            raise ValueError(f"{path} {reason}; give another --checkpoint-dir or remove it")
    return tensors, header


def save_chunks(path: str, identity: dict, runners, num_seeds: int,
                return_sums: list, episodes: list, extremes: list, train_seconds: float) -> None:
    """Writes the seeds' runners (the padding left out) and the chunks' results so far to `path`."""
    results = {"return_sums": np.stack(return_sums), "episodes": np.stack(episodes),
               "extremes": [np.stack(column) for column in zip(*extremes)]}  # --stability's, apart
    header = {name: json.dumps(value) for name, value in identity.items()}
    header["chunks_done"] = json.dumps(len(return_sums))
    header["train_seconds"] = json.dumps(train_seconds)
    checkpoint.write_state(path, {"runners": jax.tree.map(lambda x: x[:num_seeds], runners),
                                  "results": results}, header)


def restore_chunks(path: str, tensors: dict, header: dict, runners, num_seeds: int,
                   num_extremes: int) -> tuple:
    """What save_chunks wrote: the seeds' runners, the per-chunk return_sums, episodes and
    extremes, and the training seconds. `runners` gives the runners' structure."""
    done = files.header_value(path, header, "chunks_done")
    per_chunk = lambda dtype: np.zeros((done, num_seeds), dtype)  # noqa: E731
    results = checkpoint.restore(path, tensors, header, "results", {
        "return_sums": per_chunk(np.float32), "episodes": per_chunk(np.int32),
        "extremes": [per_chunk(np.float32)] * (num_extremes - 1) + [per_chunk(bool)]
        if num_extremes else []})
    seeds_only = jax.tree.map(lambda x: jax.ShapeDtypeStruct((num_seeds, *x.shape[1:]), x.dtype),
                              runners)
    extremes = [list(chunk) for chunk in zip(*results["extremes"])] or [[] for _ in range(done)]
    return (checkpoint.restore(path, tensors, header, "runners", seeds_only),
            list(results["return_sums"]), list(results["episodes"]), extremes,
            files.header_value(path, header, "train_seconds"))


# Each kind of extreme: how two values combine (a NaN does not hide the extreme before it), where
# it starts, and how the chunks' values reduce.
EXTREMES = {"max": (jnp.fmax, -jnp.inf, np.nanmax), "min": (jnp.fmin, jnp.inf, np.nanmin)}


def train_seeds(cfg, seeds: list[int], eval_episodes: int, num_chunks: int,
                num_devices: int = 0,
                on_chunk: Callable[[int, int, int, np.ndarray, np.ndarray], None] | None = None,
                stability: bool = False, checkpoint_path: str = "",
                vmap_seeds: int = 0,
                on_compiled: Callable[[str, float], None] | None = None,
                both_policies: bool = False,
                evaluation_beside_training: bool | None = None) -> SeedsResult:
    """Trains and evaluates `cfg` (a script's Args, whose module is the script) for each seed, with
    what the script's make_agent hands over. `cfg` must have its runtime fields filled.

    After each chunk, on_chunk(chunk, num_chunks, steps_per_seed, return_sums, episodes) gets that
    chunk's per-seed sums; an exception it raises (a pruned trial) stops training there. With a
    `checkpoint_path`, the state is written there after each chunk, and training continues from
    what is there (see read_checkpoint). As each program is compiled, on_compiled(part, seconds)
    hears of it (the seeds' initial states, the training chunk, the evaluation). With
    `both_policies`, the script's other policy is evaluated too, on the same episodes' keys.
    With `evaluation_beside_training` (None: on a GPU or TPU, whose host idles while it trains;
    a CPU's training would share its cores), the evaluation compiles in a thread while the seeds
    train, and compile_seconds counts only what is left of it when training ends; the seeds'
    initial states, too, compile and run in a thread while training's program compiles.
    """
    script, cfg = script_of(cfg), copy.copy(cfg)
    if not stability:  # what only adds logging is off (--stability reads PPO's diagnostics)
        for name, value in getattr(script, "QUIET_ARGS", {}).items():
            setattr(cfg, name, value)
    extreme_of = getattr(script, "STABILITY_METRICS", {}) if stability else {}
    # The training protocol (--ppo.sticky-action-prob) holds for the evaluation too.
    env, env_params = make_env(cfg.env_id, cfg.sticky_action_prob)
    agent = script.make_agent(cfg, env, env_params)
    greedy = script.HEADLINE_POLICY == "greedy"

    def init(seed: jax.Array):
        # The same keys and initialisation as the script's main, for one seed.
        runner_key, eval_key = jax.random.split(jax.random.key(seed))
        return agent.init(runner_key), eval_key

    def train_chunk(runner, num_iterations: jax.Array):
        # The iteration count is an input, so chunks of unequal length share one compiled program.
        def iteration(_, carry):
            runner, return_sum, episodes, extremes = carry
            runner, metrics = agent.update_step(runner)
            if stability:  # fmax / fmin: a NaN does not hide the extremes before it
                *values, non_finite = extremes
                values = [EXTREMES[kind][0](x, metrics[name])
                          for x, (name, kind) in zip(values, extreme_of.items())]
                extremes = (*values, non_finite | ~metrics["finite"])
            return_sum = return_sum + metrics["episode_return_sum"]
            return runner, return_sum, episodes + metrics["episodes"], extremes

        extremes = ((*[EXTREMES[kind][1] for kind in extreme_of.values()], False) if stability
                    else ())
        return jax.lax.fori_loop(0, num_iterations, iteration,
                                 (runner, jnp.zeros(()), jnp.zeros((), jnp.int32), extremes))

    # Every evaluation, each policy under both protocols, in one loop body (evaluate_each):
    # one copy of the episode loop in the program, not one per evaluation.
    policies = [greedy, not greedy] if both_policies else [greedy]
    sticky, limits = protocol_settings(cfg.env_id, env_params, PROTOCOLS)
    evaluations = (np.repeat(policies, len(PROTOCOLS)), np.tile(sticky, len(policies)),
                   np.tile(limits, len(policies)))

    def evaluate_seed(params, eval_key: jax.Array):
        # (policies, protocols): the script's policy, then with both_policies the other one, the
        # mean returns and the episodes counted at MinAtar's safety bound.
        result = evaluate_each(eval_key, params, *evaluations, env=env, env_params=env_params,
                               act=agent.act, num_episodes=eval_episodes,
                               max_steps=int(limits.max()) + 1)
        bound_hits = (result.finished & ~result.terminated & (result.lengths >= SAFETY_BOUND))
        shape = (len(policies), len(PROTOCOLS))
        return result.returns.mean(-1).reshape(shape), bound_hits.sum(-1).reshape(shape)

    # The seed axis is padded to a multiple of the devices times the seeds side by side, so any
    # seed count uses all of them; a padding seed repeats the last one and is dropped. On a CPU
    # each device runs its seeds one at a time (lax.map; one seed with no loop, which XLA compiles
    # faster, on a chip by far): under vmap the rollout's lax.cond
    # becomes a select that runs both branches, which a CPU pays for in full, and unbatched runs
    # make a seed's result independent of its neighbours. An accelerator runs a group at once.
    num_devices, group = seed_layout(len(seeds), num_devices, vmap_seeds)
    padded = seeds + [seeds[-1]] * (-len(seeds) % (num_devices * group))
    mesh = Mesh(np.array(jax.devices()[:num_devices]), ("seeds",))
    seed_sharding = NamedSharding(mesh, P("seeds"))

    def per_device(fn, num_shared: int = 0):
        """fn(per_seed, *shared) on every seed, each device taking its share of the seed axis of
        per_seed, `group` seeds at a time; the `num_shared` arguments after it are the same for
        all seeds."""
        def mapped(per_seed, *shared):
            if jax.tree.leaves(per_seed)[0].shape[0] == 1:  # a device's one seed: no loop around it
                one = fn(jax.tree.map(lambda x: x[0], per_seed), *shared)
                return jax.tree.map(lambda x: x[None], one)
            if group == 1:
                return jax.lax.map(lambda x: fn(x, *shared), per_seed)
            groups = jax.tree.map(lambda x: x.reshape(-1, group, *x.shape[1:]), per_seed)
            done = jax.lax.map(jax.vmap(lambda x: fn(x, *shared)), groups)
            return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), done)
        # Seeds never talk to each other: no collectives, so nothing for check_vma to check.
        return jax.shard_map(mapped, mesh=mesh, in_specs=(P("seeds"), *[P()] * num_shared),
                             out_specs=P("seeds"), check_vma=False)

    compile_parts = {}

    def compile_part(part: str, make: Callable[[], Any]) -> Any:
        """make(), its seconds recorded as `part`'s and told to on_compiled."""
        start = time.time()
        made = make()
        compile_parts[part] = time.time() - start
        if on_compiled is not None:
            on_compiled(part, compile_parts[part])
        return made

    def like(tree):  # the shapes of the seed-sharded arrays `tree` describes
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type,
                                                           sharding=seed_sharding), tree)

    if evaluation_beside_training is None:
        evaluation_beside_training = jax.devices()[0].platform != "cpu"
    # Initialised outside shard_map: the orthogonal init's QR (LAPACK) deadlocked jaxlib 0.10.2 when
    # two CPU devices ran it at once.
    make_runners = jax.jit(lambda s: jax.lax.map(init, s))
    padded_seeds = np.array(padded, np.int32)
    iteration_counts = [len(c) for c in np.array_split(np.arange(cfg.num_iterations),
                                                       min(num_chunks, cfg.num_iterations))]

    def start_runners():
        return compile_part("init", lambda: jax.block_until_ready(
            jax.device_put(make_runners(padded_seeds), seed_sharding)))

    def training_program():  # from the initial states' shapes
        runners_like = like(jax.eval_shape(make_runners, padded_seeds))[0]
        return jax.jit(per_device(train_chunk, 1), donate_argnums=0).lower(
            runners_like, jnp.int32(iteration_counts[0])).compile()

    def evaluation_program():  # from its inputs' shapes: training donates the arrays themselves
        runners_like, eval_keys_like = like(jax.eval_shape(make_runners, padded_seeds))
        params_like = like(jax.eval_shape(agent.params, runners_like))
        return jax.jit(per_device(lambda x: evaluate_seed(*x))).lower(
            (params_like, eval_keys_like)).compile()

    def compile_evaluation():
        return compile_part("evaluate", evaluation_program)

    # Beside training, the host's cores would otherwise idle while the device works: the initial
    # states compile and run while training's program compiles, the evaluation while it trains.
    compile_start = time.time()
    if evaluation_beside_training:
        started = startup.in_background(start_runners)
        train = compile_part("train", training_program)
        evaluate_all = startup.in_background(compile_evaluation)
        runners, eval_keys = started.result()
    else:
        runners, eval_keys = start_runners()
        train = compile_part("train", training_program)
        evaluate_all = compile_evaluation()
    compile_seconds = time.time() - compile_start

    chunk_steps = [sum(iteration_counts[:chunk + 1]) * cfg.steps_per_iteration
                   for chunk in range(len(iteration_counts))]
    identity = checkpoint_identity(cfg, seeds, eval_episodes, num_chunks, stability, group)
    saved = read_checkpoint(checkpoint_path, identity) if checkpoint_path else None
    return_sums, episodes, extremes, train_seconds = [], [], [], 0.0
    if saved is not None:  # a padding seed repeats the last one at every chunk: padded again here
        seed_runners, return_sums, episodes, extremes, train_seconds = restore_chunks(
            checkpoint_path, *saved, runners, len(seeds), len(extreme_of) + 1 if stability else 0)
        pad = len(padded) - len(seeds)
        runners = jax.tree.map(lambda x: jnp.concatenate([x, *[x[-1:]] * pad]), seed_runners)
        runners = jax.device_put(runners, seed_sharding)

    resumed_after_chunk = len(return_sums)  # chunks taken from the checkpoint
    train_start, checkpoint_seconds = time.time() - train_seconds, 0.0
    for chunk in range(len(return_sums), len(iteration_counts)):
        runners, chunk_return_sums, chunk_episodes, chunk_extremes = train(
            runners, jnp.int32(iteration_counts[chunk]))
        extremes.append([np.asarray(x)[:len(seeds)] for x in chunk_extremes])
        return_sums.append(np.asarray(chunk_return_sums)[:len(seeds)])
        episodes.append(np.asarray(chunk_episodes)[:len(seeds)])
        if checkpoint_path:  # before the next chunk takes over the runners' memory (donated)
            save_start = time.time()
            save_chunks(checkpoint_path, identity, runners, len(seeds), return_sums, episodes,
                        extremes, save_start - train_start)
            checkpoint_seconds += time.time() - save_start
        if on_chunk is not None:
            on_chunk(chunk, len(iteration_counts), chunk_steps[chunk], return_sums[-1],
                     episodes[-1])
    train_seconds = time.time() - train_start

    if evaluation_beside_training:  # the wait for its compile counts as compiling
        wait_start = time.time()
        evaluate_all = evaluate_all.result()
        compile_seconds += time.time() - wait_start
    eval_start = time.time()
    results = evaluate_all((agent.params(runners), eval_keys))
    # (seeds, policies, protocols)
    protocol_returns, bound_hits = (np.asarray(x)[:len(seeds)] for x in results)
    if stability:
        *values, non_finite = (np.stack(x) for x in zip(*extremes))  # (chunks, seeds)
        stability = {name: EXTREMES[kind][2](x, 0).tolist()
                     for x, (name, kind) in zip(values, extreme_of.items())}
        stability["non_finite"] = non_finite.any(0).tolist()
    other = ({"other_returns": protocol_returns[:, 1, 0],
              "other_returns_minatar": protocol_returns[:, 1, 1],
              "other_bound_hits": bound_hits[:, 1, 1]} if both_policies else {})
    return SeedsResult(eval_returns=protocol_returns[:, 0, 0],
                       eval_returns_minatar=protocol_returns[:, 0, 1],
                       minatar_bound_hits=bound_hits[:, 0, 1],
                       return_sums=np.stack(return_sums, axis=1),
                       episodes=np.stack(episodes, axis=1), chunk_steps=chunk_steps,
                       compile_seconds=compile_seconds, train_seconds=train_seconds,
                       eval_seconds=time.time() - eval_start, stability=stability or None,
                       vmap_seeds=group, compile_parts=compile_parts,
                       resumed_after_chunk=resumed_after_chunk,
                       checkpoint_seconds=checkpoint_seconds, **other)


def changed_args(cfg) -> dict:
    """The script arguments that differ from the script's defaults
    (the harness picks seeds and devices)."""

    def default(f: dataclasses.Field):
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.init and f.name not in ("seed", "num_devices", "jax_cache_dir")
            and getattr(cfg, f.name) != default(f)}


def machine() -> str:
    """The CPU model and family (from /proc/cpuinfo), after JAX's device kind if not a CPU."""
    return common.machine(jax.devices())


def result_json(cfg, seeds: list[int], result: SeedsResult, eval_episodes: int,
                command: str, wall_seconds: float, baseline: dict | None = None) -> dict:
    """The harness's output: the raw per-seed numbers, then what tools/stats.py
    makes of them."""
    script = script_of(cfg)
    out = {
        "command": command,
        **cli.env_vars(),  # an environment the command needs to run the same products
        "script": name_of(script),
        # which code ran: the digest a checkpoint of this run holds (checkpoint_identity), that
        # utils.checkpoint.code_version gives at any commit for the harness and this script
        "code": checkpoint.code_version(__file__, script.__file__),
        "policy": script.HEADLINE_POLICY,
        "changed_args": changed_args(cfg),
        "args": {k: v for k, v in vars(cfg).items()
                 if k not in ("seed", "num_devices", "jax_cache_dir")},
        "seeds": seeds,
        "vmap_seeds": result.vmap_seeds,  # seeds trained side by side: part of what a seed gives
        "eval_episodes": eval_episodes,
        "eval_returns": [float(r) for r in result.eval_returns],
        "eval_returns_minatar": [float(r) for r in result.eval_returns_minatar],
        "minatar_bound_hits": [int(n) for n in result.minatar_bound_hits],
        "curve": {"steps": result.chunk_steps, "return_sums": result.return_sums.tolist(),
                  "episodes": result.episodes.tolist()},
        "summary": stats.summarize(result.eval_returns),
        "summary_minatar": stats.summarize(result.eval_returns_minatar),
        "pooled_curve": stats.pooled_curve(result.return_sums, result.episodes),
        "timing": {"compile_seconds": result.compile_seconds,
                   "compile_parts": result.compile_parts, "train_seconds": result.train_seconds,
                   "checkpoint_seconds": result.checkpoint_seconds,
                   "eval_seconds": result.eval_seconds, "wall_seconds": wall_seconds,
                   "peak_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                   "machine": machine(), "devices": len(jax.devices())},
    }
    if result.other_returns is not None:  # the other policy, on the same episodes' keys
        out["other_policy"] = {
            "policy": "sampled" if script.HEADLINE_POLICY == "greedy" else "greedy",
            "eval_returns": [float(r) for r in result.other_returns],
            "eval_returns_minatar": [float(r) for r in result.other_returns_minatar],
            "minatar_bound_hits": [int(n) for n in result.other_bound_hits],
            "summary": stats.summarize(result.other_returns),
            "summary_minatar": stats.summarize(result.other_returns_minatar)}
    if result.resumed_after_chunk:  # compile and wall seconds are the last process's alone
        out["resumed_after_chunk"] = result.resumed_after_chunk
    if result.stability is not None:
        out["stability"] = result.stability
    # on this run's seeds: a seed's result does not depend on the others run
    if baseline is not None:
        by_seed = dict(zip(baseline["seeds"], baseline["eval_returns"]))
        out["comparison"] = {"baseline": baseline["changed_args"],
                             "baseline_command": baseline["command"],
                             **stats.compare([by_seed[s] for s in seeds], result.eval_returns)}
    return out


def configure_jax(cache_dir: str) -> None:
    """startup.configure_jax, with JAX's persistent compilation cache on the CPU only: on a TPU the
    harness's evaluation program read back from the cache scored trained seeds wrongly
    (docs/accelerators.md, "The harness keeps no compilation cache on the chip")."""
    startup.configure_jax(cache_dir if jax.default_backend() == "cpu" else "")


def print_progress(chunk: int, num_chunks: int, steps: int, return_sums: np.ndarray,
                   episodes: np.ndarray, start: float, total_steps: int) -> None:
    """One line per chunk: how far training is, the time since the start, and the chunk's
    training return."""
    per_seed = return_sums / np.maximum(episodes, 1)
    training_return = return_sums.sum() / max(episodes.sum(), 1)
    print(f"chunk {chunk + 1:>2}/{num_chunks} | {steps:>9,} of {total_steps:,} steps per seed | "
          f"{time.time() - start:6.1f} s | training return {training_return:5.1f} "
          f"(IQM of seeds {stats.iqm(per_seed):5.1f})", file=sys.stderr, flush=True)


def print_compiled(part: str, seconds: float) -> None:
    """One line per program set up, so that a run stopped while compiling says where it was."""
    print(f"compiled {part} in {seconds:.1f} s", file=sys.stderr, flush=True)


def main() -> None:
    wall_start = time.time()
    args = parse(Args, __doc__.split("\n\n")[0])
    script = load_script(args.script)
    error = check_settings(settings(args)) or find_harness_error(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        cfg = contract.fill_runtime_fields(script, settings(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    configure_jax(cfg.jax_cache_dir)
    baseline = None
    if args.baseline:
        with open(args.baseline) as f:
            baseline = json.load(f)

    seeds = list(range(args.first_seed, args.first_seed + args.num_seeds))
    checkpoint_path = os.path.join(args.checkpoint_dir, CHECKPOINT) if args.checkpoint_dir else ""
    if checkpoint_path:  # a checkpoint that cannot be resumed stops the run before it starts
        try:
            if os.path.exists(args.checkpoint_dir) and not os.path.isdir(args.checkpoint_dir):
                raise ValueError(f"--checkpoint-dir {args.checkpoint_dir} is not a directory")
            group = seed_layout(len(seeds), args.num_devices, args.vmap_seeds)[1]
            read_checkpoint(checkpoint_path, checkpoint_identity(
                cfg, seeds, args.eval_episodes, args.num_chunks, args.stability, group))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    progress = None if args.quiet else functools.partial(
        print_progress, start=wall_start, total_steps=cfg.num_iterations * cfg.steps_per_iteration)
    if not args.quiet:
        print(f"{cfg.env_id}: {len(seeds)} seeds x {cfg.num_iterations} iterations of "
              f"{cfg.steps_per_iteration} steps", file=sys.stderr, flush=True)
    result = train_seeds(cfg, seeds, args.eval_episodes, args.num_chunks, args.num_devices,
                         on_chunk=progress, stability=args.stability,
                         checkpoint_path=checkpoint_path, vmap_seeds=args.vmap_seeds,
                         on_compiled=None if args.quiet else print_compiled,
                         both_policies=args.both_policies)
    command = common.without_cache_dir(shlex.join(["python", "tools/tune.py", *sys.argv[1:]]))
    out = result_json(cfg, seeds, result, args.eval_episodes, command,
                      time.time() - wall_start, baseline)
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    s = out["summary"]
    if not args.quiet:
        interval = "[{:.2f}, {:.2f}]".format(*s["iqm"]["ci"]) if s["iqm"]["ci"] else "(one seed)"
        print(f"eval return over {len(seeds)} seeds: IQM {s['iqm']['value']:.2f} {interval}, "
              f"mean {s['mean']['value']:.2f}, "
              f"{s['share_past_wall']['count']}/{len(seeds)} seeds >= 30; "
              f"compile {result.compile_seconds:.1f} s, train {result.train_seconds:.1f} s",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

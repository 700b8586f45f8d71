"""Hyperparameter search: an Optuna study over ppo_breakout.py's settings, each trial a run of the harness.

Each trial trains --num-seeds seeds at once with benchmarks/tune.py's `train_seeds` and scores the
interquartile mean (IQM) of their evaluation returns. After each chunk of training it reports the
chunk's training return, and a median pruner stops trials whose curve falls below the median of the
trials before them. The first trial of a new study is the script's defaults.

The study lives in a storage, so it resumes: run the same command again and it continues until
--n-trials trials have finished (completed or pruned); a trial left running by a killed process is
retried. The default storage is an SQLite file; point workers on many machines at one database URL
(e.g. postgresql://user:pass@host/db) and they share the study. With --out, the study is exported
as JSON: every trial, the best ones with bootstrap intervals, the parameter importances, and the
harness flags of the best trial (to confirm it on fresh seeds).

Run:  python benchmarks/search.py --n-trials 30 --num-seeds 8 --out benchmarks/results/search.json
Docs: docs/tuning.md
"""

import dataclasses
import functools
import json
import os
import socket
import sys
import time
import warnings

import optuna
import sqlalchemy
import tyro
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import stats, tune  # noqa: E402  (tune sets up JAX's devices first)

ppo_breakout = tune.ppo_breakout
# Heartbeats and their retry callback are marked experimental; they are what lets a study resume.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

# The search space: every ppo_breakout.Args field that shapes learning, by name, except the
# environment, the step budget and the seed. The torso's widths are two parameters, width_1 and width_2.
SEARCH_SPACE = {
    "learning_rate": FloatDistribution(1e-3, 2e-2, log=True),
    "anneal_lr": CategoricalDistribution([True, False]),
    "num_envs": CategoricalDistribution([32, 64, 128]),
    "num_steps": CategoricalDistribution([64, 128, 256]),
    "gamma": FloatDistribution(0.97, 0.999),
    "gae_lambda": FloatDistribution(0.8, 0.99),
    "num_minibatches": CategoricalDistribution([4, 8, 16, 32, 64]),
    "update_epochs": IntDistribution(2, 6),
    "norm_adv": CategoricalDistribution([True, False]),
    "clip_coef": FloatDistribution(0.1, 0.3),
    "clip_vloss": CategoricalDistribution([True, False]),
    "ent_coef": FloatDistribution(1e-3, 5e-2, log=True),
    "vf_coef": FloatDistribution(0.25, 1.0),
    "max_grad_norm": FloatDistribution(0.25, 2.0, log=True),
    "width_1": IntDistribution(32, 128, step=32),
    "width_2": IntDistribution(32, 96, step=32),
    "activation": CategoricalDistribution(["crelu", "relu"]),
}
WIDTHS = ("width_1", "width_2")


@dataclasses.dataclass
class Args:
    ppo: ppo_breakout.Args = dataclasses.field(default_factory=ppo_breakout.Args)
    """the settings that are not searched (and the values of --fixed ones)"""
    study_name: str = "breakout-ppo"
    """the study's name in the storage"""
    storage: str = "runs/search.db"
    """an SQLite file, or a database URL shared by workers on many machines (postgresql://...)"""
    n_trials: int = 30
    """run trials until the study holds this many finished (completed or pruned) ones"""
    num_seeds: int = 8
    """seeds per trial, trained at once"""
    first_seed: int = 1
    """every trial trains seeds first_seed, first_seed + 1, ... (the same seeds, so trials compare
    on equal terms)"""
    eval_episodes: int = 128
    """complete evaluation episodes per seed"""
    num_chunks: int = 10
    """chunks of training per trial: the points the pruner sees"""
    prune_from_chunk: int = 4
    """the pruner may stop a trial from this chunk on (1-based): early curves favour fast starters"""
    fixed: tuple[str, ...] = ()
    """search-space parameters held at their --ppo value instead of searched (hidden_sizes: both widths,
    from --ppo.hidden-sizes)"""
    sampler_seed: int | None = None
    """seed of the TPE sampler, plus the number of trials the study already holds (so a resumed study
    does not replay its first draws); None draws a fresh one. Concurrent workers need different seeds"""
    out: str = ""
    """write the study's report (JSON) here when the run ends"""


def find_search_error(args: Args) -> str | None:
    """What is wrong with the search's own arguments, before any storage is opened or made."""
    for name in ("n_trials", "num_seeds", "eval_episodes", "num_chunks", "prune_from_chunk"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    known = set(SEARCH_SPACE) | {"hidden_sizes"}
    unknown = [name for name in args.fixed if name not in known]
    if unknown:
        return f"--fixed {' '.join(unknown)}: not in the search space ({', '.join(sorted(known))})"
    if "://" in args.storage:
        try:
            sqlalchemy.engine.make_url(args.storage)
        except Exception as e:  # noqa: BLE001  (sqlalchemy raises several kinds)
            return f"--storage {args.storage} is not a database URL: {e}"
    elif os.path.isdir(args.storage):
        return f"--storage {args.storage} is a directory, not a file"
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        return f"--out {args.out}: its directory does not exist"
    return None


def open_storage(storage: str) -> optuna.storages.RDBStorage:
    """The study's storage. A trial whose worker stops beating for 5 minutes (a killed process) is
    marked failed, and retried once with the same parameters."""
    url = storage if "://" in storage else "sqlite:///" + os.path.abspath(storage)
    if "://" not in storage:
        os.makedirs(os.path.dirname(os.path.abspath(storage)), exist_ok=True)
    # SQLite: two workers on one file wait for each other's writes rather than fail.
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, heartbeat_interval=60, grace_period=300,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            # Workers that start together on a new database race to create its tables, and the losers
            # fail on a table or on the schema's version row that another made; once the schema
            # exists, opening the storage just reads it.
            if attempt == 4:
                raise
            time.sleep(1.0)


def suggest(trial: optuna.Trial, name: str, dist) -> object:
    """trial.suggest_* for one declared distribution (Optuna suggests by type, not from a distribution)."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_categorical(name, dist.choices)


def to_ppo_args(params: dict, base: ppo_breakout.Args) -> ppo_breakout.Args:
    """The script's settings for a trial's parameters: `base` with the searched fields replaced. A
    searched width makes the torso two layers, the other width taken from base's first or last layer."""
    fields = {k: v for k, v in params.items() if k not in WIDTHS}
    if any(w in params for w in WIDTHS):
        fields["hidden_sizes"] = (params.get("width_1", base.hidden_sizes[0]),
                                  params.get("width_2", base.hidden_sizes[-1]))
    return dataclasses.replace(base, **fields)


def searched(args: Args) -> dict:
    """The part of SEARCH_SPACE this run searches: all of it but --fixed."""
    return {name: dist for name, dist in SEARCH_SPACE.items()
            if name not in args.fixed and not (name in WIDTHS and "hidden_sizes" in args.fixed)}


def default_params(args: Args) -> dict:
    """The searched parameters at the script's defaults: the study's first trial."""
    defaults = ppo_breakout.Args()
    values = {**{name: getattr(defaults, name) for name in SEARCH_SPACE if name not in WIDTHS},
              **dict(zip(WIDTHS, defaults.hidden_sizes))}
    return {name: values[name] for name in searched(args)}


def ppo_flags(params: dict) -> str:
    """A trial's parameters as the harness's command-line flags (floats to 4 significant digits)."""
    cfg = to_ppo_args(params, ppo_breakout.Args())
    names = [k for k in params if k not in WIDTHS] + (["hidden_sizes"] if set(WIDTHS) & set(params) else [])
    flags = []
    for name in names:
        value, flag = getattr(cfg, name), name.replace("_", "-")
        if isinstance(value, bool):  # tyro's boolean flags: --ppo.x and --ppo.no-x
            flags.append(f"--ppo.{flag}" if value else f"--ppo.no-{flag}")
        elif isinstance(value, tuple):
            flags.append(f"--ppo.{flag} {' '.join(map(str, value))}")
        else:
            flags.append(f"--ppo.{flag} {value:.4g}" if isinstance(value, float) else f"--ppo.{flag} {value}")
    return " ".join(flags)


def objective(trial: optuna.Trial, args: Args) -> float:
    params = {name: suggest(trial, name, dist) for name, dist in searched(args).items()}
    cfg = to_ppo_args(params, args.ppo)
    error = ppo_breakout.check_args(cfg)
    if error:  # cannot happen with the declared space; kept so a bad edit fails loudly
        raise ValueError(f"trial {trial.number}: {error}")
    ppo_breakout.fill_runtime_fields(cfg)
    seeds = list(range(args.first_seed, args.first_seed + args.num_seeds))
    trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
    trial.set_user_attr("seeds", seeds)
    start = time.time()
    curve = {"return_sums": [], "episodes": []}  # [chunk][seed], as far as the trial got

    def on_chunk(chunk, num_chunks, steps, return_sums, episodes):
        # The pruner sees the chunk's training return pooled over the seeds.
        value = float(return_sums.sum() / max(episodes.sum(), 1))
        curve["return_sums"].append(return_sums.tolist())
        curve["episodes"].append(episodes.tolist())
        trial.set_user_attr("curve", curve)
        trial.report(value, chunk)
        print(f"trial {trial.number:>3} | chunk {chunk + 1:>2}/{num_chunks} | {time.time() - start:6.1f} s | "
              f"training return {value:5.1f}", file=sys.stderr, flush=True)
        if chunk + 1 >= args.prune_from_chunk and trial.should_prune():
            print(f"trial {trial.number:>3} pruned after chunk {chunk + 1}", file=sys.stderr, flush=True)
            raise optuna.TrialPruned()

    result = tune.train_seeds(cfg, seeds, args.eval_episodes, args.num_chunks, on_chunk=on_chunk)
    summary = stats.summarize(result.eval_returns)
    trial.set_user_attr("eval_returns", [float(r) for r in result.eval_returns])
    trial.set_user_attr("train_seconds", result.train_seconds)
    iqm = summary["iqm"]
    print(f"trial {trial.number:>3} finished: IQM {iqm['value']:.2f} [{iqm['ci'][0]:.2f}, {iqm['ci'][1]:.2f}] "
          f"in {time.time() - start:.0f} s | {ppo_flags(params)}", file=sys.stderr, flush=True)
    return iqm["value"]


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def report(study: optuna.Study, args: Args) -> dict:
    """The study as JSON: its space and settings, every trial, the best five with bootstrap
    intervals, and the parameter importances over the completed trials."""
    complete = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                      key=lambda t: -t.value)
    best = [{"number": t.number, "params": t.params, "flags": ppo_flags(t.params), "seeds": t.user_attrs["seeds"],
             "summary": stats.summarize(t.user_attrs["eval_returns"])} for t in complete[:5]]
    # PED-ANOVA (Watanabe et al. 2023): which parameters set the top 10% of trials apart. Optuna's
    # default, fANOVA, needs scikit-learn, which this project does not install.
    importances = (optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()) if len(complete) >= 2 else {})
    return {
        "study_name": study.study_name,
        "command": "python benchmarks/search.py " + " ".join(sys.argv[1:]),
        "search_space": {name: optuna.distributions.distribution_to_json(dist) for name, dist in SEARCH_SPACE.items()},
        "fixed": {name: getattr(args.ppo, name) for name in args.fixed},
        "settings": {"num_seeds": args.num_seeds, "first_seed": args.first_seed, "num_chunks": args.num_chunks,
                     "prune_from_chunk": args.prune_from_chunk, "total_timesteps": args.ppo.total_timesteps,
                     "eval_episodes": args.eval_episodes, "sampler": "TPE", "sampler_seed": args.sampler_seed,
                     "pruner": "median", "machine": tune.machine()},
        "trials": [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                    "intermediate_values": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                    "eval_returns": t.user_attrs.get("eval_returns"), "curve": t.user_attrs.get("curve"),
                    "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
                    if t.datetime_complete and t.datetime_start else None,
                    "worker": t.user_attrs.get("worker")} for t in study.get_trials(deepcopy=False)],
        "best": best,
        "importances": {"evaluator": "PedAnovaImportanceEvaluator", "values": dict(importances)},
    }


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = ppo_breakout.check_args(args.ppo) or find_search_error(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if args.ppo.jax_cache_dir:
        tune.jax.config.update("jax_compilation_cache_dir", os.path.expanduser(args.ppo.jax_cache_dir))
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # this script prints its own progress lines
    storage = open_storage(args.storage)
    # n_warmup_steps=0: when the pruner may act is --prune-from-chunk's to say, in the objective.
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    try:
        study = optuna.create_study(study_name=args.study_name, storage=storage, direction="maximize", pruner=pruner)
        study.enqueue_trial(default_params(args))  # by the one worker that made the study: the defaults first
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=args.study_name, storage=storage, pruner=pruner)
    seed = None if args.sampler_seed is None else args.sampler_seed + len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
    remaining = args.n_trials - len(finished(study))
    print(f"study {args.study_name!r}: {len(finished(study))} of {args.n_trials} trials finished", file=sys.stderr)
    if remaining > 0:
        study.optimize(
            functools.partial(objective, args=args), n_trials=remaining,
            # Other workers may finish trials meanwhile: stop once the study as a whole has enough.
            callbacks=[optuna.study.MaxTrialsCallback(args.n_trials, states=(TrialState.COMPLETE, TrialState.PRUNED))])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report(study, args), f, indent=1)
            f.write("\n")
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        print(f"best: trial {study.best_trial.number}, IQM {study.best_value:.2f}: "
              f"{ppo_flags(study.best_trial.params)}", file=sys.stderr)


if __name__ == "__main__":
    main()

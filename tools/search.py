"""Hyperparameter search: an Optuna study over an algorithm script's settings, a trial a harness
run. --script names the script, as for tools/tune.py (the default ppo_breakout, fixed settings
as --ppo.* flags; pqn_minatar, --pqn.*); the space is the script's own SEARCH_SPACE.

Each trial trains --num-seeds seeds at once with tools/tune.py's `train_seeds` and scores the
interquartile mean (IQM) of their evaluation returns. After each chunk of training it reports the
chunk's training return, and a median pruner stops trials whose curve falls below the median of the
trials before them. The first trial of a new study is the script's defaults.

The study lives in a storage, so it resumes: run the same command again and it continues until
--n-trials trials have finished (completed or pruned). Several workers share one study: processes
on one machine through a journal file (--storage runs/search.journal), workers on many machines
through a database server (--storage postgresql://user:pass@host:5432/db). They stop at exactly
--n-trials between them, and a trial whose worker was killed is retried by another. With --out,
the study is exported as JSON: every trial, the best ones with bootstrap intervals, the parameter
importances, and the harness flags of the best trial (to confirm it on fresh seeds).

Run:  python tools/search.py --n-trials 30 --num-seeds 8 \\
          --out results/ppo_breakout/tuning/search/search.json
      python tools/search.py --script pqn_minatar --n-trials 30 --storage runs/search_pqn.db
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
from typing import NamedTuple

import optuna
import sqlalchemy
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import common, stats, tune  # noqa: E402  (tune sets up JAX's devices first)
from utils import cli, contract  # noqa: E402

# Heartbeats and their retry callback are marked experimental; they are what lets a study resume.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class Space(NamedTuple):
    """One script's search: its parameters by name (the torso's widths are parameters of their own,
    named in `widths`), and the Args fields added since its first studies with the value they ran
    with (the script's ADDED_ARGS)."""
    params: dict
    widths: tuple[str, ...]
    added_args: dict


def distribution(spec):
    """An Optuna distribution of a SEARCH_SPACE entry: a list is a choice, (low, high) a uniform
    float, (low, high, "log") a log-uniform one, a range integers."""
    if isinstance(spec, list):
        return CategoricalDistribution(spec)
    if isinstance(spec, range):
        return IntDistribution(spec.start, spec[-1], step=spec.step)
    return FloatDistribution(spec[0], spec[1], log=spec[2:] == ("log",))


def space_of(script: str) -> Space:
    """The search space `script` declares (SEARCH_SPACE). hidden_sizes, one range per layer, is
    searched as parameters `width` (one layer) or `width_1`, `width_2`, ..."""
    module = tune.load_script(script)
    params, widths = {}, ()
    for name, spec in module.SEARCH_SPACE.items():
        if name == "hidden_sizes":
            widths = ("width",) if len(spec) == 1 else tuple(f"width_{i + 1}"
                                                            for i in range(len(spec)))
            params |= {width: distribution(layer) for width, layer in zip(widths, spec)}
        else:
            params[name] = distribution(spec)
    return Space(params, widths, getattr(module, "ADDED_ARGS", {}))


@dataclasses.dataclass
class Args:
    script: str = tune.DEFAULT_SCRIPT
    """the algorithm searched, as for tools/tune.py: its settings that are not searched (and
    the values of --fixed ones) are --NAME.* flags (--ppo.env-id)"""
    study_name: str = ""
    """the study's name in the storage ("": the game's and the script's, e.g. breakout-ppo)"""
    storage: str = "runs/search.db"
    """an SQLite file (one process), a file ending in .journal (processes on one machine), or a
    database URL for workers on many machines (postgresql://user:pass@host:5432/db)"""
    n_trials: int = 30
    """run trials until the study holds this many finished (completed or pruned) ones, counted over
    all its workers"""
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
    """the pruner may stop a trial from this chunk on (1-based): early curves favour fast
    starters"""
    fixed: tuple[str, ...] = ()
    """search-space parameters held at their --ppo (or --pqn, ...) value instead of searched
    (hidden_sizes: every width, from --ppo.hidden-sizes)"""
    sampler_seed: int | None = None
    """seed of the TPE sampler, plus the number of trials up to this worker's first one: trial
    numbers are unique, so workers given the same seed still draw apart; None draws a fresh one"""
    heartbeat_interval: int = 60
    """seconds between a running trial's heartbeats in a database; a trial silent for five of them
    (its worker was killed) is failed and retried once by another worker"""
    out: str = ""
    """write the study's report (JSON) here when the run ends"""


def find_search_error(args: Args) -> str | None:
    """What is wrong with the search's own arguments, before any storage is opened or made."""
    for name in ("n_trials", "num_seeds", "eval_episodes", "num_chunks", "prune_from_chunk",
                 "heartbeat_interval"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    known = set(space_of(args.script).params) | {"hidden_sizes"}
    unknown = [name for name in args.fixed if name not in known]
    if unknown:
        return (f"--fixed {' '.join(unknown)}: not in the search space of {args.script} "
                f"({', '.join(sorted(known))})")
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


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def database_url(storage: str) -> sqlalchemy.URL:
    """--storage as an SQLAlchemy URL: a path is an SQLite file; postgresql:// means the pinned
    driver, psycopg 3 (SQLAlchemy's own default for it is psycopg2)."""
    if "://" not in storage:
        return sqlalchemy.engine.make_url("sqlite:///" + os.path.abspath(storage))
    url = sqlalchemy.engine.make_url(storage)
    return url.set(drivername="postgresql+psycopg") if url.drivername == "postgresql" else url


def shown(storage: str) -> str:
    """--storage as messages show it: a URL without its password."""
    if "://" not in storage:
        return storage
    return sqlalchemy.engine.make_url(storage).render_as_string(hide_password=True)


def open_storage(args: Args) -> optuna.storages.BaseStorage:
    """The study's storage, or one error line and exit 2 if it cannot be reached. In a database, a
    trial whose worker stops beating (a killed process) is failed and retried once with the same
    parameters; a journal file has no heartbeat (Optuna 5.0)."""
    if args.storage.endswith(".journal"):
        os.makedirs(os.path.dirname(os.path.abspath(args.storage)), exist_ok=True)
        backend = optuna.storages.journal.JournalFileBackend(args.storage)
        return optuna.storages.JournalStorage(backend)
    url = database_url(args.storage)
    if url.get_backend_name() == "sqlite":
        os.makedirs(os.path.dirname(url.database), exist_ok=True)
        # Two processes on one file wait for each other's writes rather than fail.
        first_connect_args = connect_args = {"timeout": 60}
    elif url.get_backend_name() in ("postgresql", "mysql"):
        # A host that drops packets fails the first connection in seconds, not after the system's
        # TCP timeout; the search's later connections may take longer.
        first_connect_args, connect_args = {"connect_timeout": 3}, {"connect_timeout": 30}
    else:
        first_connect_args = connect_args = {}
    try:
        with sqlalchemy.create_engine(url, connect_args=first_connect_args).connect():
            pass
    except ImportError as e:  # a driver SQLAlchemy knows but this Python lacks
        fail(f"--storage {shown(args.storage)}: its driver is not installed ({e}); "
             "postgresql:// uses psycopg, from requirements.txt")
    except sqlalchemy.exc.NoSuchModuleError as e:
        fail(f"--storage {shown(args.storage)}: {e}")
    except sqlalchemy.exc.DBAPIError as e:
        reason = " ".join(str(e.orig).split())  # the driver's message, on one line
        fail(f"--storage {shown(args.storage)}: cannot connect: {reason}")
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url.render_as_string(hide_password=False),
                engine_kwargs={"connect_args": connect_args},
                heartbeat_interval=args.heartbeat_interval,
                grace_period=5 * args.heartbeat_interval,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=1))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError,
                sqlalchemy.exc.ProgrammingError):
            # Workers that start together on a new database race to create its tables, and the
            # losers fail on a table or on the schema's version row that another made; once the
            # schema exists, opening the storage just reads it.
            if attempt == 4:
                raise
            time.sleep(1.0)


def study_name(args: Args) -> str:
    """--study-name, or the game's and the script's: breakout-ppo."""
    game = tune.settings(args).env_id.split("-")[0].lower()
    return args.study_name or f"{game}-{tune.group_of(args.script)}"


def study_settings(args: Args) -> dict:
    """What makes one study's trials comparable: the script, the space searched, every other
    setting a trial trains with, the harness's seeds and chunks. Its first worker stores them; the
    others must match."""
    space = searched(args)
    cfg = tune.settings(args)
    runtime = {f.name for f in dataclasses.fields(cfg) if not f.init}
    run_only = tune.not_used(tune.script_of(cfg)) | runtime
    widths = space_of(args.script).widths
    shaped = set(space) | ({"hidden_sizes"} if set(widths) <= set(space) else set())
    fixed = dataclasses.asdict(cfg)
    settings = {
        "script": tune.name_of(tune.script_of(cfg)),
        "searched": {name: optuna.distributions.distribution_to_json(dist)
                     for name, dist in space.items()},
        tune.group_of(args.script): {name: value for name, value in fixed.items()
                                     if name not in run_only | shaped},
        **{name: getattr(args, name) for name in ("num_seeds", "first_seed", "eval_episodes",
                                                  "num_chunks", "prune_from_chunk")},
        **cli.env_vars(),  # another precision than the scripts' (on a TPU, other numbers)
    }
    return json.loads(json.dumps(settings))  # as the storage gives it back (tuples as lists)


def differences(stored: dict, ours: dict, prefix: str = "") -> list[str]:
    """The settings that differ, as `name: value there, value here`."""
    found = []
    for name in sorted(set(stored) | set(ours)):
        there, here = stored.get(name, "unset"), ours.get(name, "unset")
        if isinstance(there, dict) and isinstance(here, dict):
            found += differences(there, here, f"{prefix}{name}.")
        elif there != here:
            found.append(f"{prefix}{name}: {there} there, {here} here")
    return found


def stored_settings(study: optuna.Study) -> dict:
    """The settings the study's maker stored, as they read today: a study stored before --script
    existed searched ppo_breakout, and one stored before a field of Args existed ran with the value
    that field had then."""
    settings = {"script": tune.DEFAULT_SCRIPT, **study.user_attrs["search"]["settings"]}
    space, group = space_of(settings["script"]), tune.group_of(settings["script"])
    settings[group] = {**space.added_args, **settings[group]}
    return settings


def open_study(args: Args, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """Makes the study, or joins it if another worker made it. Its maker enqueues the defaults as
    the first trial and then stores the settings; the others wait for those, then check them."""
    # n_warmup_steps=0: when the pruner may act is --prune-from-chunk's to say, in the objective.
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    settings, name = study_settings(args), study_name(args)
    where = f"study {name!r} in {shown(args.storage)}"
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                    pruner=pruner)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, pruner=pruner)
    else:
        study.enqueue_trial(default_params(args))
        # Last, and in one write: the other workers wait for it.
        command = common.without_cache_dir("python tools/search.py " + " ".join(sys.argv[1:]))
        command = command.replace(args.storage, shown(args.storage))  # no password in a report
        study.set_user_attr("search", {"settings": settings, "sampler_seed": args.sampler_seed,
                                       "command": command})
        return study
    if study.directions != [optuna.study.StudyDirection.MAXIMIZE]:
        fail(f"{where} has direction {', '.join(d.name.lower() for d in study.directions)}, "
             "not maximize; choose another --study-name")
    deadline = time.time() + 10
    while "search" not in study.user_attrs:
        if time.time() > deadline:
            fail(f"{where} holds no search settings (made by another program, or its maker stopped "
                 "while making it); choose another --study-name")
        time.sleep(0.2)
    stored = stored_settings(study)
    if stored["script"] != settings["script"]:
        fail(f"{where} searches {stored['script']}, not {args.script}; give --script "
             f"{stored['script']} or another --study-name")
    differ = differences(stored, settings)
    if differ:
        fail(f"{where} was made with other settings ({'; '.join(differ[:3])}); choose another "
             "--study-name or its settings")
    return study


def suggest(trial: optuna.Trial, name: str, dist) -> object:
    """trial.suggest_* for one declared distribution (Optuna suggests by type, not from a
    distribution)."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_categorical(name, dist.choices)


def to_args(params: dict, base):
    """The script's settings for a trial's parameters: `base` (a script's Args) with the searched
    fields replaced. A searched width makes the torso one layer per width of the space, a width
    not searched taken from base's first or last layer."""
    widths = space_of(tune.script_of(base).__file__).widths
    fields = {k: v for k, v in params.items() if k not in widths}
    if any(w in params for w in widths):
        ends = (base.hidden_sizes[0], base.hidden_sizes[-1])
        fields["hidden_sizes"] = tuple(params.get(w, end) for w, end in zip(widths, ends))
    return dataclasses.replace(base, **fields)


def searched(args: Args) -> dict:
    """The part of the script's space this run searches: all of it but --fixed."""
    space = space_of(args.script)
    return {name: dist for name, dist in space.params.items() if name not in args.fixed
            and not (name in space.widths and "hidden_sizes" in args.fixed)}


def default_params(args: Args) -> dict:
    """The searched parameters at the script's defaults: the study's first trial."""
    space, defaults = space_of(args.script), tune.load_script(args.script).Args()
    values = {**{name: getattr(defaults, name) for name in space.params
                 if name not in space.widths},
              **dict(zip(space.widths, getattr(defaults, "hidden_sizes", ())))}
    return {name: values[name] for name in searched(args)}


def harness_flags(params: dict, script: str) -> str:
    """A trial's parameters as the harness's command-line flags (floats to 4 significant digits),
    after --script where the harness would not train that script by default."""
    group, widths = tune.group_of(script), space_of(script).widths
    cfg = to_args(params, tune.load_script(script).Args())
    names = [k for k in params if k not in widths]
    names += ["hidden_sizes"] if set(widths) & set(params) else []
    flags = [] if script == tune.DEFAULT_SCRIPT else [f"--script {script}"]
    for name in names:
        value, flag = getattr(cfg, name), name.replace("_", "-")
        if isinstance(value, bool):  # tyro's boolean flags: --ppo.x and --ppo.no-x
            flags.append(f"--{group}.{flag}" if value else f"--{group}.no-{flag}")
        elif isinstance(value, tuple):
            flags.append(f"--{group}.{flag} {' '.join(map(str, value))}")
        else:
            flags.append(f"--{group}.{flag} {value:.4g}" if isinstance(value, float)
                         else f"--{group}.{flag} {value}")
    return " ".join(flags)


def objective(trial: optuna.Trial, args: Args) -> float:
    params = {name: suggest(trial, name, dist) for name, dist in searched(args).items()}
    cfg = to_args(params, tune.settings(args))
    error = tune.check_settings(cfg)
    if error:  # cannot happen with the declared space; kept so a bad edit fails loudly
        raise ValueError(f"trial {trial.number}: {error}")
    contract.fill_runtime_fields(tune.script_of(cfg), cfg)
    seeds = list(range(args.first_seed, args.first_seed + args.num_seeds))
    trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
    trial.set_user_attr("machine", tune.machine())
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
        print(f"trial {trial.number:>3} | chunk {chunk + 1:>2}/{num_chunks} | "
              f"{time.time() - start:6.1f} s | training return {value:5.1f}", file=sys.stderr,
              flush=True)
        if chunk + 1 >= args.prune_from_chunk and trial.should_prune():
            print(f"trial {trial.number:>3} pruned after chunk {chunk + 1}", file=sys.stderr,
                  flush=True)
            raise optuna.TrialPruned()

    result = tune.train_seeds(cfg, seeds, args.eval_episodes, args.num_chunks, on_chunk=on_chunk)
    summary = stats.summarize(result.eval_returns)
    trial.set_user_attr("eval_returns", [float(r) for r in result.eval_returns])
    trial.set_user_attr("train_seconds", result.train_seconds)
    iqm = summary["iqm"]
    print(f"trial {trial.number:>3} finished: IQM {iqm['value']:.2f} "
          f"[{iqm['ci'][0]:.2f}, {iqm['ci'][1]:.2f}] in {time.time() - start:.0f} s | "
          f"{harness_flags(params, args.script)}", file=sys.stderr, flush=True)
    return iqm["value"]


# ---- Workers that share one study ----

# Trials that hold a place in the --n-trials budget: all but the failed ones.
HOLDING = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)


class PastBudget(Exception):
    """A trial made after the budget was taken: it fails without running."""


class WorkerSampler(optuna.samplers.BaseSampler):
    """Multivariate TPE, seeded when this worker's first trial is made: --sampler-seed plus the
    number of trials up to it. Optuna's hooks tell a trial's number before anything is drawn."""

    def __init__(self, seed: int | None):
        self.seed, self.tpe = seed, None

    def before_trial(self, study, trial):
        if self.tpe is None:
            seed = None if self.seed is None else self.seed + trial.number + 1
            self.tpe = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
        self.tpe.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return self.tpe.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self.tpe.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.tpe.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values):
        self.tpe.after_trial(study, trial, state, values)


def within_budget(trial: optuna.Trial, n_trials: int) -> bool:
    """Whether fewer than n_trials trials numbered below this one hold a place in the budget.
    Optuna numbers a study's trials one at a time (under a lock on the study), so all of those are
    visible now; counting finished trials only would let workers that start at once overshoot."""
    holding = trial.study.get_trials(deepcopy=False, states=HOLDING)
    return sum(t.number < trial.number for t in holding) < n_trials


def budgeted_objective(trial: optuna.Trial, args: Args) -> float:
    if not within_budget(trial, args.n_trials):
        trial.set_user_attr("past_budget", True)
        print(f"trial {trial.number:>3} not run: {args.n_trials} trials hold the budget",
              file=sys.stderr, flush=True)
        raise PastBudget()
    return objective(trial, args)


def run_worker(study: optuna.Study, args: Args, heartbeat: bool) -> None:
    """Runs trials until the study holds --n-trials finished ones. With heartbeats a worker stays
    while others' trials run: one whose worker dies goes stale, and a waiting worker retries it;
    and every worker ends on the same study, so each exports the same report."""
    study.sampler = WorkerSampler(args.sampler_seed)
    waiting = False
    while True:
        if heartbeat:
            optuna.storages.fail_stale_trials(study)  # a retry comes back as a waiting trial
        trials = study.get_trials(deepcopy=False)
        holding = [t for t in trials if t.state in HOLDING]
        if len(holding) < args.n_trials or any(t.state == TrialState.WAITING for t in trials):
            study.optimize(functools.partial(budgeted_objective, args=args), n_trials=1,
                           catch=(PastBudget,))
        elif heartbeat and any(t.state == TrialState.RUNNING for t in trials):
            if not waiting:
                print("the budget is taken: waiting for the other workers' running trials",
                      file=sys.stderr, flush=True)
            waiting = True
            time.sleep(args.heartbeat_interval)
        else:
            return


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def report(study: optuna.Study) -> dict:
    """The study as JSON: its space and settings, every trial, the best five with bootstrap
    intervals, and the parameter importances over the completed trials. Read from the study alone,
    so any worker exports the same."""
    made, settings = study.user_attrs["search"], stored_settings(study)
    script = settings["script"]
    space, fixed = space_of(script), settings[tune.group_of(script)]
    # Trials past the budget never ran: they are the workers' bookkeeping, not the search's.
    trials = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("past_budget")]
    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: -t.value)
    best = [{"number": t.number, "params": t.params, "flags": harness_flags(t.params, script),
             "seeds": t.user_attrs["seeds"],
             "summary": stats.summarize(t.user_attrs["eval_returns"])} for t in complete[:5]]
    # PED-ANOVA (Watanabe et al. 2023): which parameters set the top 10% of trials apart. Optuna's
    # default, fANOVA, needs scikit-learn, which this project does not install.
    importances = {}
    if len(complete) >= 2:
        importances = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    machines = sorted({t.user_attrs["machine"] for t in trials if "machine" in t.user_attrs})
    return {
        "study_name": study.study_name,
        "script": script,
        "command": made["command"],
        **({"env_vars": settings["env_vars"]} if "env_vars" in settings else {}),
        "search_space": {name: optuna.distributions.distribution_to_json(dist)
                         for name, dist in space.params.items()},
        "fixed": {name: fixed[name] for name in [*space.params, "hidden_sizes"] if name in fixed},
        "settings": {**{name: settings[name] for name in ("num_seeds", "first_seed", "num_chunks",
                                                          "prune_from_chunk")},
                     "total_timesteps": fixed["total_timesteps"],
                     "eval_episodes": settings["eval_episodes"],
                     "sampler": "TPE", "sampler_seed": made["sampler_seed"], "pruner": "median",
                     "machine": "; ".join(machines)},
        "trials": [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                    "intermediate_values": {str(k): v
                                            for k, v in sorted(t.intermediate_values.items())},
                    "eval_returns": t.user_attrs.get("eval_returns"),
                    "curve": t.user_attrs.get("curve"),
                    "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
                    if t.datetime_complete and t.datetime_start else None,
                    "worker": t.user_attrs.get("worker")} for t in trials],
        "best": best,
        # Ties in name order: Optuna leaves them in set order, which differs between processes.
        "importances": {"evaluator": "PedAnovaImportanceEvaluator", "values": dict(
            sorted(importances.items(), key=lambda name_value: (-name_value[1], name_value[0])))},
    }


def main() -> None:
    args = tune.parse(Args, __doc__.split("\n\n")[0])
    error = tune.check_settings(tune.settings(args)) or find_search_error(args)
    if error:
        fail(error)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # this script prints its own progress lines
    storage = open_storage(args)
    study = open_study(args, storage)
    tune.configure_jax(tune.settings(args).jax_cache_dir)
    print(f"study {study.study_name!r}: {len(finished(study))} of {args.n_trials} trials finished",
          file=sys.stderr)
    run_worker(study, args, heartbeat=isinstance(storage, optuna.storages.RDBStorage))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report(study), f, indent=1)
            f.write("\n")
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        print(f"best: trial {study.best_trial.number}, IQM {study.best_value:.2f}: "
              f"{harness_flags(study.best_trial.params, args.script)}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""tools/search.py: a study of tiny trials that resumes, two processes sharing a journal file,
pruning from the chunk curve, bad input stopped before any storage is made, and workers sharing a
study on a real PostgreSQL server (tests/postgres_server.py starts one): the exact budget, a seed
per worker, the defaults once, a killed worker's trial retried, and bad database URLs."""

import dataclasses
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import warnings

import optuna
import pytest
from optuna.trial import TrialState

import postgres_server
import ppo_breakout
import pqn_minatar
from helpers import Finished, run_main
from tools import search

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEARCH = os.path.join(ROOT, "tools", "search.py")
FIXED = ("num_envs", "num_steps", "update_epochs", "hidden_sizes")
# Tiny trials: the rollout shape, epochs and widths held; the rest of the space is searched.
TINY = ["--ppo.total-timesteps", "4096", "--ppo.num-envs", "16", "--ppo.num-steps", "128",
        "--ppo.update-epochs", "1", "--fixed", *FIXED,
        "--num-seeds", "2", "--num-chunks", "2", "--eval-episodes", "8"]


def args_of(script: str = "ppo_breakout", **fields):
    """search.py's arguments for `script`, as its command line would make them."""
    return search.tune.make_args(search.Args, script, **fields)


def search_command(storage, *flags):
    """`python SEARCH` on TINY trials, as a user runs it. Like the runs in this process, it uses the
    script's default compilation cache: a setting compiled by one is loaded by the others."""
    return [sys.executable, SEARCH, *TINY, "--storage", str(storage), *flags]


def refusal(argv, monkeypatch, capsys) -> tuple[int, str, float]:
    """search.py's main() on these flags in this process, for input it must refuse before any
    training: (exit status, stderr, seconds taken). In-process, a case does not pay a new
    process's imports (about 5 s); one test below checks the refusal from the shell."""
    def no_trial(*_):
        raise AssertionError("search.py went on to run trials instead of refusing")

    monkeypatch.setattr(sys, "argv", [SEARCH, *argv])
    monkeypatch.setattr(search, "run_worker", no_trial)
    verbosity = optuna.logging.get_verbosity()
    start = time.time()
    try:
        with pytest.raises(SystemExit) as exit_, warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # as search.py
            search.main()
    finally:
        optuna.logging.set_verbosity(verbosity)  # main() quiets Optuna before opening the storage
    return exit_.value.code, capsys.readouterr().err, time.time() - start


@pytest.mark.parametrize("backend, cache_dir", [("cpu", "the-cache"), ("tpu", "")])
def test_a_search_uses_jaxs_compilation_cache_on_the_cpu_only(tmp_path, monkeypatch, backend,
                                                              cache_dir):
    """As the harness (tools.tune.configure_jax): on a TPU a program read back from the cache
    evaluated wrongly."""
    given = []

    def stop(cache):  # startup.configure_jax, the last step before the trials
        given.append(cache)
        raise SystemExit(0)

    monkeypatch.setattr(search.tune.jax, "default_backend", lambda: backend)
    monkeypatch.setattr(search.tune.startup, "configure_jax", stop)
    monkeypatch.setattr(sys, "argv", [SEARCH, *TINY, "--storage", str(tmp_path / "study.db"),
                                      "--ppo.jax-cache-dir", "the-cache"])
    verbosity = optuna.logging.get_verbosity()
    try:
        with pytest.raises(SystemExit), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # as search.py
            search.main()
    finally:
        optuna.logging.set_verbosity(verbosity)
    assert given == [cache_dir]


def load(storage) -> optuna.Study:
    return optuna.load_study(study_name="breakout-ppo", storage=f"sqlite:///{storage}")


def run_search(cwd, storage, *flags) -> Finished:
    """search.py's main() on TINY trials in this process (helpers.run_main), as `python SEARCH`
    runs in `cwd`: the trials without a new process's imports (about 5 s). It uses the script's
    default compilation cache, as every other run in this process does."""
    verbosity = optuna.logging.get_verbosity()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # as search.py
            return run_main(search, cwd, *TINY, "--storage", str(storage), *flags, timeout=300)
    finally:
        optuna.logging.set_verbosity(verbosity)  # main() quiets Optuna


def test_search_runs_two_trials_and_resumes(tmp_path):
    storage = tmp_path / "study.db"
    first = run_search(tmp_path, storage, "--n-trials", "1", "--sampler-seed", "0")
    assert first.returncode == 0, first.stderr
    (trial,) = load(storage).trials
    assert trial.state == TrialState.COMPLETE
    assert trial.params == search.default_params(args_of(fixed=FIXED))  # the defaults go first

    second = run_search(tmp_path, storage, "--n-trials", "2", "--sampler-seed", "0",
                        "--out", str(tmp_path / "report.json"))
    assert second.returncode == 0, second.stderr
    assert "1 of 2 trials finished" in second.stderr
    trials = load(storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert (trials[0].params, trials[0].value) == (trial.params, trial.value)  # resumed
    assert trials[1].params != trial.params
    assert sorted(trials[1].intermediate_values) == [0, 1]  # one point per chunk
    # A worker where the environment sets another precision (on a TPU, other numbers) does not
    # join the study.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "high")
        assert search.study_settings(args_of(fixed=FIXED))["env_vars"] == (
            "JAX_DEFAULT_MATMUL_PRECISION=high")
        other = run_search(tmp_path, storage, "--n-trials", "3")
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1
    assert "(env_vars: unset there, JAX_DEFAULT_MATMUL_PRECISION=high here)" in other.stderr
    assert len(load(storage).trials) == 2

    report = json.loads((tmp_path / "report.json").read_text())
    assert [t["number"] for t in report["trials"]] == [0, 1]
    assert report["best"][0]["summary"]["iqm"]["value"] == max(t.value for t in trials)
    assert set(report["importances"]["values"]) <= set(search.space_of("ppo_breakout").params)
    assert report["best"][0]["flags"].startswith("--ppo.")


def test_two_processes_share_a_journal_file(tmp_path):
    storage = tmp_path / "study.journal"
    command = search_command(storage, "--n-trials", "2", "--sampler-seed", "0")
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(storage)))
    trials = search.finished(optuna.load_study(study_name="breakout-ppo", storage=journal))
    assert all(t.state == TrialState.COMPLETE for t in trials) and len(trials) == 2
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both processes ran trials
    assert trials[0].params != trials[1].params


def test_a_trial_below_the_pruners_bar_stops_after_the_chunk_it_may_be_pruned_from(tmp_path):
    # The killed-worker test's defaults trial (8 iterations, here in 3 chunks): the compilation
    # cache holds its programs once either has run.
    ppo = ppo_breakout.Args(total_timesteps=16384, num_envs=16, num_steps=128,
                                   update_epochs=1, jax_cache_dir="")
    args = args_of(ppo=ppo, fixed=FIXED, num_seeds=2, eval_episodes=8, num_chunks=3,
                       prune_from_chunk=2)
    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.ThresholdPruner(lower=1e9))
    study.enqueue_trial(search.default_params(args))
    study.optimize(lambda trial: search.objective(trial, args), n_trials=1)
    (trial,) = study.trials
    assert trial.state == TrialState.PRUNED
    # Chunk 1 may not be pruned; chunk 2 was; chunk 3 never ran.
    assert sorted(trial.intermediate_values) == [0, 1]
    assert "eval_returns" not in trial.user_attrs


def test_every_searched_parameter_is_a_field_of_the_script():
    fields = {f.name for f in dataclasses.fields(ppo_breakout.Args)}
    space = search.space_of("ppo_breakout")
    assert set(space.params) - set(space.widths) <= fields
    cfg = search.to_args({"width_1": 96, "width_2": 32, "gae_lambda": 0.8}, ppo_breakout.Args())
    assert (cfg.hidden_sizes, cfg.gae_lambda) == ((96, 32), 0.8)
    flags = search.harness_flags({"width_1": 96, "width_2": 32, "anneal_lr": False,
                                  "ent_coef": 0.012345}, "ppo_breakout")
    assert flags == "--ppo.no-anneal-lr --ppo.ent-coef 0.01235 --ppo.hidden-sizes 96 32"


@pytest.mark.parametrize("flags, message", [
    (["--fixed", "num_envs", "warp_drive"], "error: --fixed warp_drive: not in the search space"),
    (["--ppo.clip-coef", "0"], "error: --clip-coef must be in (0, 1], got 0.0"),
    (["--storage", "{tmp}"], "error: --storage {tmp} is a directory, not a file"),
    (["--storage", "sqlite://:bad:url"],
     "error: --storage sqlite://:bad:url is not a database URL"),
])
def test_bad_input_exits_2_with_one_line_and_makes_no_storage(tmp_path, monkeypatch, capsys,
                                                             flags, message):
    flags = [f.format(tmp=tmp_path) for f in flags]
    status, stderr, _ = refusal(["--storage", str(tmp_path / "study.db"), *flags], monkeypatch,
                                capsys)
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith(message.format(tmp=tmp_path))
    assert os.listdir(tmp_path) == []


def test_from_the_shell_bad_input_exits_2_with_one_line(tmp_path):
    result = subprocess.run([sys.executable, SEARCH, "--storage", str(tmp_path / "study.db"),
                             "--n-trials", "-1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: --n-trials must be positive, got -1"]
    assert os.listdir(tmp_path) == []


# ---- Workers on a PostgreSQL server ----

@pytest.fixture(scope="module")
def server():
    """A real server for the tests below: they fail, never skip, where it cannot start."""
    try:
        with postgres_server.Server() as server:
            yield server
    except postgres_server.ServerError as e:
        pytest.fail(f"the PostgreSQL server these tests need did not start: {e}")


def test_three_workers_that_start_at_once_share_one_postgres_study_exactly(server, tmp_path):
    url = server.create_database("three")
    workers = [subprocess.Popen(
        search_command(url, "--n-trials", "3", "--sampler-seed", "0",
                       "--heartbeat-interval", "1", "--out", str(tmp_path / f"{i}.json")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    for worker in workers:
        _, stderr = worker.communicate(timeout=400)
        assert worker.returncode == 0, stderr
    study = optuna.load_study(study_name="breakout-ppo", storage=url)
    done = search.finished(study)
    assert len(done) == 3  # not one more, though all three started at once
    # The others were made past the budget, by workers that started a trial at the same moment.
    assert all(t.state == TrialState.COMPLETE or t.user_attrs.get("past_budget")
               for t in study.trials)
    assert len({tuple(sorted(t.params.items())) for t in done}) == 3  # each worker draws its own
    defaults = search.default_params(args_of(fixed=FIXED))
    enqueued = [t.params for t in study.trials if "fixed_params" in t.system_attrs]
    assert enqueued == [defaults]  # by the one worker that made the study
    assert sum(t.params == defaults for t in study.trials) == 1
    reports = {(tmp_path / f"{i}.json").read_text() for i in range(3)}
    assert len(reports) == 1  # every worker exports the same study
    report = reports.pop()
    assert [t["number"] for t in json.loads(report)["trials"]] == [t.number for t in done]
    assert postgres_server.PASSWORD not in report  # the command it records shows ***


def test_a_study_made_with_other_settings_or_direction_is_refused(server, tmp_path, monkeypatch,
                                                                 capsys):
    url = server.create_database("other")
    optuna.create_study(study_name="minimizing", storage=url, direction="minimize")
    made = run_search(tmp_path, url, "--n-trials", "1")
    assert made.returncode == 0, made.stderr
    cases = [(["--study-name", "minimizing"], "has direction minimize, not maximize"),
             (["--num-seeds", "3"], "was made with other settings (num_seeds: 2 there, 3 here)"),
             (["--fixed", "num_envs", "num_steps", "update_epochs"],
              "searched.width_1: unset there")]
    for flags, message in cases:
        status, stderr, seconds = refusal(
            search_command(url, "--n-trials", "2", *flags)[2:], monkeypatch, capsys)
        assert status == 2, stderr
        (line,) = stderr.strip().splitlines()
        assert line.startswith("error: study ") and message in line, line
        assert seconds < 8  # refused at once, not after the 10 s wait for settings
    assert len(optuna.load_study(study_name="breakout-ppo", storage=url).trials) == 1  # untouched


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # retried_trial_number
def test_a_killed_workers_trial_is_finished_by_another(server, tmp_path):
    url = server.create_database("killed")
    # Eight chunks of one iteration: the first worker is killed between two of them. One trial in
    # the budget: the other worker waits for the killed one's heartbeat to go stale, then retries
    # it.
    flags = ["--n-trials", "1", "--heartbeat-interval", "1", "--ppo.total-timesteps", "16384",
             "--num-chunks", "8"]
    first = subprocess.Popen(search_command(url, *flags), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    killed = None
    while killed is None:
        assert time.time() < deadline and first.poll() is None, "no chunk reported"
        time.sleep(0.2)
        try:
            trials = optuna.load_study(study_name="breakout-ppo", storage=url).trials
        except KeyError:  # the study is not made yet
            continue
        running = [t for t in trials if t.state == TrialState.RUNNING and t.intermediate_values]
        killed = running[0] if running else None
    first.kill()  # SIGKILL: its trial stays RUNNING until its heartbeat goes stale
    first.wait()
    study = optuna.load_study(study_name="breakout-ppo", storage=url)
    assert study.trials[killed.number].state == TrialState.RUNNING

    # The other worker, in this process (another process would only repeat the imports).
    second = run_search(tmp_path, url, *flags)
    assert second.returncode == 0, second.stderr
    assert "waiting for the other workers' running trials" in second.stderr
    study = optuna.load_study(study_name="breakout-ppo", storage=url)
    assert study.trials[killed.number].state == TrialState.FAIL
    retried = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number
    (retry,) = [t for t in study.trials if retried(t) == killed.number]
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    assert retry.user_attrs["worker"] != killed.user_attrs["worker"]
    assert len(search.finished(study)) == 1  # the failed trial gave its place back to the retry


def test_a_study_stored_before_a_field_existed_is_joined_with_its_value_then(tmp_path, capsys):
    args = args_of(storage=str(tmp_path / "study.db"), fixed=FIXED)
    args.ppo.conv_channels = 0  # the network of the days before the field existed
    storage = search.open_storage(args)
    study = search.open_study(args, storage)
    older = json.loads(json.dumps(study.user_attrs["search"]))
    del older["settings"]["ppo"]["conv_channels"]  # as a study made before the field existed
    study.set_user_attr("search", older)
    assert search.open_study(args, storage).user_attrs["search"] == older  # joined
    args.ppo.conv_channels = 8  # today's default: but that study ran without a convolution
    with pytest.raises(SystemExit):
        search.open_study(args, storage)
    assert "ppo.conv_channels: 0 there, 8 here" in capsys.readouterr().err


def test_a_trial_numbered_past_the_budget_does_not_run(server):
    url = server.create_database("budget")
    study = optuna.create_study(study_name="budget", storage=url, direction="maximize")
    first, second, third = (study.ask() for _ in range(3))  # three workers start a trial at once
    assert [search.within_budget(t, 2) for t in (first, second, third)] == [True, True, False]
    study.tell(second, 1.0)  # a finished trial keeps its place; a failed one gives it back
    study.tell(first, state=TrialState.FAIL)
    assert search.within_budget(third, 2)


def test_workers_given_the_same_sampler_seed_draw_apart(server):
    url = server.create_database("seeds")
    optuna.create_study(study_name="seeds", storage=url, direction="maximize")
    workers = [optuna.load_study(study_name="seeds", storage=url, sampler=search.WorkerSampler(0))
               for _ in range(2)]
    draws = [[study.ask().suggest_float("x", 0, 1) for study in workers] for _ in range(2)]
    assert len({x for pair in draws for x in pair}) == 4


@pytest.fixture(scope="module")
def silent_port():
    """A port that takes connections and never answers: a host that drops packets, to a client."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshakes; nothing reads
        yield listener.getsockname()[1]


@pytest.mark.parametrize("url, message", [
    ("postgresql+psycopg://postgres@127.0.0.1:{free}/search", "cannot connect: connection failed"),
    ("postgresql://postgres@127.0.0.1:{silent}/search",
     "cannot connect: connection timeout expired"),
    ("postgresql://postgres:wrong-password@127.0.0.1:{port}/search",
     "password authentication failed"),
    ("postgresql://postgres:{password}@127.0.0.1:{port}/no_such_database",
     'database "no_such_database" does not exist'),
    ("postgresql+psycopg2://postgres:{password}@127.0.0.1:{port}/search",
     "its driver is not installed"),
    ("postgresql+nosuchdriver://postgres@127.0.0.1:{port}/search", "Can't load plugin"),
])
def test_a_bad_database_url_fails_fast_with_one_line(server, silent_port, monkeypatch, capsys,
                                                     url, message):
    url = url.format(free=postgres_server.free_port(), silent=silent_port, port=server.port,
                     password=postgres_server.PASSWORD)
    status, stderr, seconds = refusal(["--storage", url], monkeypatch, capsys)
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith("error: --storage postgresql") and message in line, line
    assert postgres_server.PASSWORD not in line and "wrong-password" not in line  # shown as ***
    assert seconds < 8  # the silent host: a connect timeout, not minutes


# ---- PQN: --script pqn_minatar ----

# Tiny trials: the rollout's shape, epochs and network held; the rest of PQN's space is searched.
# The defaults trial is test_tools_tune.py's tiny PQN run: the compilation cache holds its
# programs once either has run.
PQN_FIXED = ("num_envs", "num_steps", "update_epochs", "hidden_sizes", "conv_channels")
PQN_TINY = ["--script", "pqn_minatar", "--pqn.total-timesteps", "8192", "--pqn.num-envs", "16",
            "--fixed", *PQN_FIXED,
            "--num-seeds", "2", "--num-chunks", "2", "--eval-episodes", "4"]


def test_pqns_space_holds_its_defaults_passes_its_check_and_gives_the_harness_flags():
    space, pqn = search.space_of("pqn_minatar"), pqn_minatar
    assert set(space.params) - set(space.widths) <= {f.name for f in dataclasses.fields(pqn.Args)}
    defaults = search.default_params(args_of(script="pqn_minatar"))
    for name, dist in space.params.items():
        assert dist._contains(dist.to_internal_repr(defaults[name])), name
    # Every rollout shape of the space, at its ends, splits into every minibatch count on two
    # devices.
    shapes = [space.params[name].choices for name in ("num_envs", "num_steps", "num_minibatches")]
    ends = [{name: getattr(dist, end) for name, dist in space.params.items()
             if not hasattr(dist, "choices")} for end in ("low", "high")]
    for (num_envs, num_steps, num_minibatches), end in itertools.product(
            itertools.product(*shapes), ends):
        params = {**end, "num_envs": num_envs, "num_steps": num_steps,
                  "num_minibatches": num_minibatches}
        assert pqn.check_args(search.to_args(params, pqn.Args(num_devices=2))) is None, params
    # The flags a report gives are the harness's: --script, then the --pqn group.
    flags = search.harness_flags(defaults, "pqn_minatar")
    assert flags.startswith("--script pqn_minatar --pqn.learning-rate 0.0005 ")
    harness = search.tune.parse(search.tune.Args, "", flags.split())
    assert harness.script == "pqn_minatar"
    assert search.tune.settings(harness) == search.to_args(defaults, pqn.Args()) == pqn.Args()


def test_a_tiny_pqn_study_runs_its_defaults_first_and_reports_pqn_flags(tmp_path):
    storage = tmp_path / "study.db"
    verbosity = optuna.logging.get_verbosity()
    try:
        finished = run_main(search, tmp_path, *PQN_TINY, "--storage", str(storage),
                            "--n-trials", "2", "--sampler-seed", "0", "--out", "report.json")
    finally:
        optuna.logging.set_verbosity(verbosity)  # main() quiets Optuna
    assert finished.returncode == 0, finished.stderr
    study = optuna.load_study(study_name="breakout-pqn", storage=f"sqlite:///{storage}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    first, second = (t.params for t in study.trials)
    assert first == search.default_params(args_of(script="pqn_minatar", fixed=PQN_FIXED))
    assert (first["learning_rate"], first["q_lambda"], first["num_minibatches"]) == (5e-4, 0.65, 32)
    assert second != first and set(second) == set(first)

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["script"] == "pqn_minatar" and report["study_name"] == "breakout-pqn"
    assert set(report["search_space"]) == set(search.space_of("pqn_minatar").params)
    assert report["fixed"]["num_envs"] == 16 and report["settings"]["total_timesteps"] == 8192
    best = report["best"][0]
    assert best["flags"] == search.harness_flags(best["params"], "pqn_minatar")
    options = [token for token in best["flags"].split() if token.startswith("--")]
    assert options[0] == "--script" and best["flags"].startswith("--script pqn_minatar ")
    assert options[1:] and all(option.startswith("--pqn.") for option in options[1:])


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # as search.py
def test_a_study_refuses_a_worker_of_another_script(tmp_path, monkeypatch, capsys):
    storage = str(tmp_path / "study.db")
    pqn = args_of(script="pqn_minatar", storage=storage)
    made = search.open_study(pqn, search.open_storage(pqn))
    assert made.study_name == "breakout-pqn"
    assert search.open_study(pqn, search.open_storage(pqn)).user_attrs == made.user_attrs  # joined
    status, stderr, _ = refusal(["--storage", storage, "--study-name", "breakout-pqn"],
                                monkeypatch, capsys)
    assert (status, stderr.strip().splitlines()) == (2, [
        f"error: study 'breakout-pqn' in {storage} searches pqn_minatar, not ppo_breakout; give "
        f"--script pqn_minatar or another --study-name"])

    ppo = args_of(storage=storage, study_name="shared")
    study = search.open_study(ppo, search.open_storage(ppo))
    refused = [f"error: study 'shared' in {storage} searches ppo_breakout, not pqn_minatar; give "
               f"--script ppo_breakout or another --study-name"]
    pqn_worker = ["--script", "pqn_minatar", "--storage", storage, "--study-name", "shared"]
    status, stderr, _ = refusal(pqn_worker, monkeypatch, capsys)
    assert (status, stderr.strip().splitlines()) == (2, refused)
    # A study stored before --script existed searched PPO: PPO's workers join it, PQN's do not.
    older = json.loads(json.dumps(study.user_attrs["search"]))
    del older["settings"]["script"]
    study.set_user_attr("search", older)
    assert search.open_study(ppo, search.open_storage(ppo)).user_attrs["search"] == older
    status, stderr, _ = refusal(pqn_worker, monkeypatch, capsys)
    assert (status, stderr.strip().splitlines()) == (2, refused)
    assert len(study.trials) == 1  # the defaults, waiting: no worker ran a trial


@pytest.mark.parametrize("flags, message", [
    (["--pqn.q-lambda", "0.8"],
     "error: --pqn.q-lambda: the settings of --script ppo_breakout are --ppo.* flags"),
    (["--script", "pqn_minatar", "--ppo.gae-lambda", "0.8"],
     "error: --ppo.gae-lambda: the settings of --script pqn_minatar are --pqn.* flags"),
    (["--script", "pqn_minatar", "--fixed", "q_lambda", "gae_lambda"],
     "error: --fixed gae_lambda: not in the search space of pqn_minatar"),
    (["--script", "pqn_minatar", "--pqn.q-lambda", "2"],
     "error: --q-lambda must be in [0, 1], got 2.0"),
])
def test_a_search_refuses_flags_its_script_cannot_use(tmp_path, monkeypatch, capsys, flags,
                                                      message):
    status, stderr, _ = refusal(["--storage", str(tmp_path / "study.db"), *flags], monkeypatch,
                                capsys)
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith(message)
    assert os.listdir(tmp_path) == []

"""benchmarks/search.py: a study of tiny trials that resumes, two workers sharing one storage, pruning from
the chunk curve, and bad input stopped before any storage is made."""

import dataclasses
import json
import os
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from benchmarks import search

SEARCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "search.py")
# Tiny trials: the rollout shape, epochs and widths held; the rest of the space is searched.
TINY = ["--ppo.total-timesteps", "4096", "--ppo.num-envs", "16", "--ppo.num-steps", "128",
        "--ppo.update-epochs", "1", "--fixed", "num_envs", "num_steps", "update_epochs", "hidden_sizes",
        "--num-seeds", "2", "--num-chunks", "2", "--eval-episodes", "8"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("jax_cache"))


def search_command(storage, cache_dir, *flags):
    return [sys.executable, SEARCH, *TINY, "--storage", str(storage), "--ppo.jax-cache-dir", cache_dir, *flags]


def load(storage) -> optuna.Study:
    return optuna.load_study(study_name="breakout-ppo", storage=f"sqlite:///{storage}")


def test_search_runs_two_trials_and_resumes(tmp_path, cache_dir):
    storage = tmp_path / "study.db"
    first = subprocess.run(search_command(storage, cache_dir, "--n-trials", "1", "--sampler-seed", "0"),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    (trial,) = load(storage).trials
    assert trial.state == TrialState.COMPLETE
    assert trial.params == search.default_params(search.Args(fixed=("num_envs", "num_steps", "update_epochs",
                                                                     "hidden_sizes")))  # the defaults go first

    second = subprocess.run(search_command(storage, cache_dir, "--n-trials", "2", "--sampler-seed", "0",
                                           "--out", str(tmp_path / "report.json")),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "1 of 2 trials finished" in second.stderr
    trials = load(storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert (trials[0].params, trials[0].value) == (trial.params, trial.value)  # resumed, not restarted
    assert trials[1].params != trial.params
    assert sorted(trials[1].intermediate_values) == [0, 1]  # one point per chunk

    report = json.loads((tmp_path / "report.json").read_text())
    assert [t["number"] for t in report["trials"]] == [0, 1]
    assert report["best"][0]["summary"]["iqm"]["value"] == max(t.value for t in trials)
    assert set(report["importances"]["values"]) <= set(search.SEARCH_SPACE)
    assert report["best"][0]["flags"].startswith("--ppo.")


def test_two_workers_share_one_storage(tmp_path, cache_dir):
    storage = tmp_path / "study.db"
    workers = [subprocess.Popen(search_command(storage, cache_dir, "--n-trials", "2", "--sampler-seed", str(seed)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (0, 1)]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr
    trials = load(storage).trials
    assert all(t.state == TrialState.COMPLETE for t in trials) and len(trials) >= 2
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both processes ran trials
    assert len({tuple(sorted(t.params.items())) for t in trials}) == len(trials)  # none ran twice


def test_a_trial_below_the_pruners_bar_stops_after_the_chunk_it_may_be_pruned_from(tmp_path):
    args = search.Args(ppo=search.ppo_breakout.Args(total_timesteps=6144, num_envs=16, num_steps=128,
                                                    update_epochs=1, jax_cache_dir=""),
                       fixed=("num_envs", "num_steps", "update_epochs", "hidden_sizes"), num_seeds=2,
                       eval_episodes=8, num_chunks=3, prune_from_chunk=2)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=1e9))
    study.enqueue_trial(search.default_params(args))
    study.optimize(lambda trial: search.objective(trial, args), n_trials=1)
    (trial,) = study.trials
    assert trial.state == TrialState.PRUNED
    assert sorted(trial.intermediate_values) == [0, 1]  # chunk 1 may not be pruned; chunk 2 was; 3 never ran
    assert "eval_returns" not in trial.user_attrs


def test_every_searched_parameter_is_a_field_of_the_script():
    fields = {f.name for f in dataclasses.fields(search.ppo_breakout.Args)}
    assert set(search.SEARCH_SPACE) - set(search.WIDTHS) <= fields
    cfg = search.to_ppo_args({"width_1": 96, "width_2": 32, "gae_lambda": 0.8}, search.ppo_breakout.Args())
    assert (cfg.hidden_sizes, cfg.gae_lambda) == ((96, 32), 0.8)
    assert search.ppo_flags({"width_1": 96, "width_2": 32, "anneal_lr": False, "ent_coef": 0.012345}) == (
        "--ppo.no-anneal-lr --ppo.ent-coef 0.01235 --ppo.hidden-sizes 96 32")


@pytest.mark.parametrize("flags, message", [
    (["--fixed", "num_envs", "warp_drive"], "error: --fixed warp_drive: not in the search space"),
    (["--ppo.clip-coef", "0"], "error: --clip-coef must be in (0, 1], got 0.0"),
    (["--storage", "{tmp}"], "error: --storage {tmp} is a directory, not a file"),
    (["--storage", "sqlite://:bad:url"], "error: --storage sqlite://:bad:url is not a database URL"),
])
def test_bad_input_exits_2_with_one_line_and_makes_no_storage(tmp_path, flags, message):
    flags = [f.format(tmp=tmp_path) for f in flags]
    result = subprocess.run([sys.executable, SEARCH, "--storage", str(tmp_path / "study.db"), *flags],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(message.format(tmp=tmp_path))
    assert os.listdir(tmp_path) == []

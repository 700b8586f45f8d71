"""Tests of utils/contract.py: a minimal script that keeps the contract and nothing more
(tests/tiny_pg.py) runs through the many-seed harness, one search trial and a results-table row,
with no edit to a shared file; what the contract leaves to the machinery is filled there, and a
script that breaks a duty gets one error line. Its training, --resume and --load-model:
test_utils_training.py."""

import json
import os

import numpy as np
import pytest

import tiny_pg
from helpers import run_main
from tools import results_table, search, tune
from utils import training

SCRIPT = "tests/tiny_pg.py"  # as the harness and the results table name it


def test_the_harness_the_search_and_the_results_table_take_it(tmp_path):
    settings = ["--tiny.total-timesteps", "1024", "--tiny.num-envs", "4", "--num-seeds", "2",
                "--num-chunks", "2", "--eval-episodes", "4"]
    harness = run_main(tune, tmp_path, "--script", SCRIPT, *settings, "--out", "seeds.json")
    assert harness.returncode == 0, harness.stderr
    result = json.loads((tmp_path / "seeds.json").read_text())
    assert (result["script"], result["policy"], result["seeds"]) == ("tiny_pg", "sampled", [1, 2])
    assert np.isfinite(result["eval_returns"] + result["eval_returns_minatar"]).all()

    trial = run_main(search, tmp_path, "--script", SCRIPT, *settings, "--n-trials", "1",
                     "--storage", "study.db", "--out", "study.json")
    assert trial.returncode == 0, trial.stderr
    study = json.loads((tmp_path / "study.json").read_text())
    assert study["script"] == "tiny_pg" and len(study["trials"]) == 1
    assert set(study["search_space"]) == {"learning_rate", "num_steps"}

    row = run_main(results_table, tmp_path, "--script", SCRIPT, "--seeds", "1",
                   "--total-timesteps", "1024", "--num-devices", "1",
                   "--script-args=--num-envs 4 --eval-episodes 4", "--out", "table.json")
    assert row.returncode == 0, row.stderr
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["policy"] == "sampled" and [r["seed"] for r in table["rows"]] == [1]


def refused(result, tmp_path, message: str) -> None:
    """One `error:` line holding `message`, exit 2, nothing written."""
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-500:]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_what_a_script_leaves_of_its_runtime_fields_the_machinery_fills():
    # tiny_pg sets steps_per_iteration alone: the iterations and its one device are filled.
    args = training.parse_args(tiny_pg, ["--total-timesteps", "2048", "--num-envs", "4"])
    assert (args.steps_per_iteration, args.num_iterations, args.num_devices) == (256, 8, 1)


def test_a_script_that_sets_no_steps_per_iteration_is_told_its_duty(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny_pg, "fill_runtime_fields", lambda args: args)
    refused(run_main(tiny_pg, tmp_path, timeout=120), tmp_path,
            "tiny_pg.py's fill_runtime_fields must set args.steps_per_iteration")


def test_a_budget_under_one_iteration_is_refused(tmp_path):
    refused(run_main(tiny_pg, tmp_path, "--total-timesteps", "100"), tmp_path,
            "--total-timesteps 100 is less than one iteration (512 steps)")


def test_a_script_on_one_device_is_refused_more(tmp_path):
    # tiny_pg hands over no parallel_update_step: --num-devices 2 (JAX has two, conftest.py).
    refused(run_main(tiny_pg, tmp_path, "--num-devices", "2"), tmp_path,
            "--num-devices 2: tiny_pg.py runs on one device")


@pytest.mark.parametrize("flags, num_steps", [([], 8), (["--num-steps", "16"], 16)])
def test_the_games_row_fills_what_the_command_line_leaves(flags, num_steps, monkeypatch):
    monkeypatch.setattr(tiny_pg, "GAME_DEFAULTS", {"CartPole-v1": {"num_steps": 8}},
                        raising=False)
    assert training.parse_args(tiny_pg, flags).num_steps == num_steps
    assert training.parse_args(tiny_pg, ["--env-id", "Acrobot-v1"]).num_steps == 64


@pytest.mark.parametrize("module", [tune, search])
def test_the_harness_and_the_search_offer_no_runtime_field_as_a_flag(module, capsys):
    with pytest.raises(SystemExit):
        tune.parse(module.Args, "", ["--script", "tests/tiny_pg.py", "--help"])
    shown = capsys.readouterr().out
    assert "--tiny.learning-rate" in shown and "--first-seed" in shown
    for name in ("steps-per-iteration", "num-iterations"):
        assert f"--tiny.{name}" not in shown
    own = "--first-seed, --num-devices" if module is tune else "--first-seed"  # no search devices
    assert f"(this command sets {own} itself)" in " ".join(shown.replace("│", " ").split())

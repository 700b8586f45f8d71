"""Tests of utils/contract.py: a minimal script that keeps the contract and nothing more
(tests/tiny_pg.py) runs through the many-seed harness, one search trial and a results-table row,
with no edit to a shared file. Its training, --resume and --load-model: test_utils_training.py."""

import json

import numpy as np

from benchmarks import results_table, search, tune
from helpers import run_main

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

"""Tests of utils/contract.py: a minimal script that keeps the contract and nothing more
(tests/tiny_pg.py) runs through training with checkpoints, a bit-identical --resume, --load-model,
the many-seed harness, one search trial and a results-table row, with no edit to a shared file."""

import json
import os
import signal

import numpy as np
import safetensors.numpy

import tiny_pg
from benchmarks import results_table, search, tune
from helpers import only_run_dir, read_summary, run_main
from utils import checkpoint, training

SCRIPT = "tests/tiny_pg.py"  # as the harness and the results table name it
TINY = ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "64", "--eval-episodes",
        "4", "--checkpoint-every", "2"]


def ends_with(run_dir) -> dict:
    """The model's and the last checkpoint's tensors (but the learning curve's seconds), and the
    evaluation."""
    tensors = {}
    for name in ("model.safetensors", checkpoint.CHECKPOINT):
        loaded = safetensors.numpy.load_file(os.path.join(run_dir, name))
        tensors |= {f"{name}:{key}": t.tobytes() for key, t in loaded.items()
                    if key != "history.seconds"}
    return {"tensors": tensors, "eval": read_summary(run_dir)["eval"]}


def test_training_checkpoints_resume_and_load_model(tmp_path, monkeypatch):
    (tmp_path / "whole").mkdir()
    whole = run_main(tiny_pg, tmp_path / "whole", *TINY)
    assert whole.returncode == 0, whole.stderr
    whole_dir = only_run_dir(tmp_path / "whole")
    summary = read_summary(whole_dir)
    assert summary["status"] == "completed" and summary["global_step"] == 2048
    assert summary["policy"] == "sampled" and summary["eval"]["sampled"]["mean"] > 0

    # Stopped by SIGTERM after its third iteration (one past a checkpoint), then resumed.
    end_iteration = training.Run.end_iteration

    def signal_after_third(run, iteration, state):
        end_iteration(run, iteration, state)
        if iteration == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    (tmp_path / "stopped").mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "end_iteration", signal_after_third)
        stopped = run_main(tiny_pg, tmp_path / "stopped", *TINY)
    assert stopped.returncode == 143, stopped.stderr
    run_dir = only_run_dir(tmp_path / "stopped")
    assert read_summary(run_dir)["global_step"] == 3 * 256
    resumed = run_main(tiny_pg, tmp_path / "stopped", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert ends_with(run_dir) == ends_with(whole_dir)

    # The saved model plays to the training run's own evaluation.
    (tmp_path / "load").mkdir()
    model = os.path.join(whole_dir, "model.safetensors")
    loaded = run_main(tiny_pg, tmp_path / "load", "--load-model", model, "--eval-episodes", "4")
    assert loaded.returncode == 0, loaded.stderr
    assert read_summary(only_run_dir(tmp_path / "load"))["eval"] == summary["eval"]


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

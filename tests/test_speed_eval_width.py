"""Tests of speed/eval_width.py: each width's evaluation is played in a pool of that width, the same
episodes at every width are found the same and different ones are not, and bad input gets one
line."""

import json
import os

import jax
import numpy as np
import pytest

from helpers import ROOT, run_main
from speed import eval_width
from utils import evaluation

MODEL = os.path.join(ROOT, "models", "pqn_minatar__Breakout.safetensors")


def test_it_plays_each_width_in_a_pool_of_that_width_and_finds_the_same_episodes(tmp_path,
                                                                                 monkeypatch):
    widths = []
    evaluate = evaluation.evaluate

    def recording(*args, **kwargs):  # the pool each evaluation is traced with
        widths.append(kwargs["width"])
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", recording)
    result = run_main(eval_width, tmp_path, "--model", MODEL, "--widths", "2", "8",
                      "--eval-episodes", "8", "--repeats", "1", "--out", "width.json",
                      timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "width.json").read_text())
    assert (report["script"], report["env_id"], report["seed"]) == ("pqn_minatar",
                                                                      "Breakout-MinAtar", 1)
    assert report["model"] == "models/pqn_minatar__Breakout.safetensors"
    assert sorted(set(widths)) == [2, 8]
    rows = report["rows"]
    assert [row["width"] for row in rows] == [2, 8]
    assert all(row["identical_to_first_width"] for row in rows)
    assert rows[0]["mean_returns"] == rows[1]["mean_returns"]
    assert set(rows[0]["mean_returns"]) == {"gymnax/sampled", "minatar/sampled", "gymnax/greedy",
                                            "minatar/greedy"}
    for row in rows:
        assert row["seconds_both_pairs"] == pytest.approx(sum(row["seconds_per_pair"].values()))


def test_results_that_differ_in_any_array_are_not_the_same():
    played = evaluation.EvalResult(*[np.zeros(3)] * 7)
    results = {"sampled": played, "greedy": played}
    assert eval_width.same(results, results)
    for field in evaluation.EvalResult._fields:
        other = played._replace(**{field: np.array([0.0, 1.0, 0.0])})
        assert not eval_width.same({"sampled": played, "greedy": other}, results), field


@pytest.mark.parametrize("flags, message", [
    (["--widths", "0"], "error: --widths must be positive, got 0"),
    (["--repeats", "0"], "error: --repeats must be positive, got 0"),
    (["--widths", "32", "64", "--eval-episodes", "48"],
     "error: --widths 64 is more than --eval-episodes 48: no pool is wider than its episodes"),
    (["--model", "nope.safetensors"], "error: --model nope.safetensors: no such file"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, flags, message):
    result = run_main(eval_width, tmp_path, *flags, "--out", "width.json", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "width.json").exists()


def test_the_model_is_loaded_as_the_script_loads_it_with_the_seed_asked():
    loaded = eval_width.load(MODEL, 7)
    assert (loaded.args.seed, loaded.args.env_id) == (7, "Breakout-MinAtar")
    assert loaded.script.__name__ == "pqn_minatar"
    assert jax.tree.structure(loaded.params) == jax.tree.structure(
        loaded.agent.network.init(jax.random.key(0), np.zeros((1, 10, 10, 4), np.float32)))

"""Tests of speed/env_step.py: its program steps as many environments as many times as asked, its
figures are the median call's, and bad input gets one line."""

import json
import statistics

import jax
import pytest

from helpers import run_main
from probe_envs import ProbeEnv, ProbeParams
from speed import env_step


def test_the_program_steps_every_environment_every_step():
    # The probe pays 1 for action 1 and the actions are uniform: the rewards' sum is
    # Binomial(num_envs x steps, 1/2), off by many standard deviations if fewer are stepped.
    env, num_envs, steps = ProbeEnv(), 64, 50
    total = float(env_step.steps_program(env, ProbeParams(), num_envs, steps)(jax.random.key(0)))
    n = num_envs * steps
    assert abs(total - n / 2) < 5 * (n / 4) ** 0.5, total


def test_it_times_each_game_and_reports_the_median_call(tmp_path):
    result = run_main(env_step, tmp_path, "--games", "Breakout-MinAtar", "CartPole-v1",
                      "--num-envs", "8", "--steps", "10", "--repeats", "3", "--out", "steps.json",
                      timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "steps.json").read_text())
    assert [row["game"] for row in report["rows"]] == ["Breakout-MinAtar", "CartPole-v1"]
    for row in report["rows"]:
        median = statistics.median(row["seconds"])
        assert len(row["seconds"]) == 3
        assert row["ms_per_step"] == pytest.approx(1e3 * median / 10)
        assert row["env_steps_per_second"] == pytest.approx(8 * 10 / median)
    assert report["num_envs"] == 8 and "machine" in report


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "error: --steps must be positive, got 0"),
    (["--games", "Nope-MinAtar"],
     "error: --games Nope-MinAtar: Nope-MinAtar is not in registered gymnax environments."),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, flags, message):
    result = run_main(env_step, tmp_path, *flags, "--out", "steps.json", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "steps.json").exists()

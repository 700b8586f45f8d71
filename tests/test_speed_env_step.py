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


def test_seaquest_is_timed_at_each_buffer_size_asked(tmp_path, monkeypatch):
    traced_at = []
    program = env_step.steps_program

    def recording(*args):  # the size gymnax reads when the step is traced
        from gymnax.environments.minatar import seaquest_helpers
        traced_at.append(seaquest_helpers.MAX_ENTITIES)
        return program(*args)

    monkeypatch.setattr(env_step, "steps_program", recording)
    monkeypatch.setattr(env_step.sys, "argv", [
        "env_step.py", "--games", "Seaquest-MinAtar", "Breakout-MinAtar", "--seaquest-rows", "100",
        "32", "--num-envs", "2", "--steps", "2", "--repeats", "1", "--out",
        str(tmp_path / "steps.json")])
    env_step.main()
    report = json.loads((tmp_path / "steps.json").read_text())
    assert [(row["game"], row.get("seaquest_rows")) for row in report["rows"]] == [
        ("Seaquest-MinAtar", 100), ("Seaquest-MinAtar", 32), ("Breakout-MinAtar", None)]
    assert traced_at[:2] == [100, 32]


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "error: --steps must be positive, got 0"),
    (["--seaquest-rows", "0"], "error: --seaquest-rows must be positive, got 0"),
    (["--games", "Nope-MinAtar"],
     "error: --games Nope-MinAtar: Nope-MinAtar is not in registered gymnax environments."),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, flags, message):
    result = run_main(env_step, tmp_path, *flags, "--out", "steps.json", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "steps.json").exists()

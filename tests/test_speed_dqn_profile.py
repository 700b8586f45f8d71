"""Tests of speed/dqn_profile.py: on the CPU, with tiny flags, it times DQN's and SR-DQN's update
steps and each of their parts for one seed and for two side by side."""

import json

from helpers import run_main
from speed import dqn_profile

TINY = ("--script-args=--total-timesteps 1536 --num-envs 16 --num-steps 32 --buffer-size 1024 "
        "--batch-size 8 --learning-starts 256 --target-update-period 256 --epsilon-decay-steps 512")


def test_it_times_the_step_and_each_part_for_each_seed_count(tmp_path):
    result = run_main(dqn_profile, tmp_path, TINY, "--seeds", "1", "2", "--repeats", "1",
                      "--out", "profile.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "profile.json").read_text())
    # 512 steps an iteration, 128 gradient steps: 32 chunks of one step, 4 gradient steps each
    assert report["interleaving"] == {"chunks": 32, "steps_per_chunk": 1, "updates_per_chunk": 4}
    assert [row["seeds"] for row in report["rows"]] == [1, 2]
    parts = ("rollout", "buffer_add", "sample", "gradient", "target")
    for row in report["rows"]:
        assert all(row[f"{part}_ms"] > 0 for part in parts)
        assert row["sps"] == row["seeds"] * 512 / (row["whole_ms"] / 1e3)
        assert row["sum_over_whole"] == sum(row[f"{part}_ms"] for part in parts) / row["whole_ms"]


SR_TINY = ("--script-args=--total-timesteps 1536 --num-envs 8 --num-steps 32 --buffer-size 1024 "
           "--batch-size 8 --learning-starts 256 --reset-period 512 --anneal-steps 64 "
           "--epsilon-decay-steps 512 --hidden-sizes 32 --conv-channels 4")


def test_it_times_sr_dqns_step_and_each_of_its_parts(tmp_path):
    result = run_main(dqn_profile, tmp_path, "--script", "sr_dqn_minatar", SR_TINY, "--seeds", "1",
                      "2", "--repeats", "1", "--out", "profile.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["script"] == "sr_dqn_minatar"
    # 256 steps an iteration at replay ratio 2, 512 gradient steps: 32 chunks of one step, 16 each
    assert report["interleaving"] == {"chunks": 32, "steps_per_chunk": 1, "updates_per_chunk": 16}
    parts = ("rollout", "buffer_add", "sample", "gradient", "reset")
    for row in report["rows"]:
        assert all(row[f"{part}_ms"] > 0 for part in parts)
        assert "target_ms" not in row
        assert row["sps"] == row["seeds"] * 256 / (row["whole_ms"] / 1e3)
        assert row["sum_over_whole"] == sum(row[f"{part}_ms"] for part in parts) / row["whole_ms"]

"""Tests of speed/dqn_profile.py: on the CPU, with tiny flags, it times DQN's and SR-DQN's update
steps and each of their parts for one seed and for two side by side, and SR-DQN's step with a part
taken out (stand-ins that remove their part and nothing else)."""

import json

import jax
import jax.numpy as jnp
import numpy as np

import sr_dqn_minatar as sr
from helpers import run_main
from speed import dqn_profile
from speed.dqn_profile import script_setup

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


def test_it_times_sr_dqns_step_with_each_part_taken_out(tmp_path):
    result = run_main(dqn_profile, tmp_path, "--script", "sr_dqn_minatar", SR_TINY, "--seeds", "2",
                      "--repeats", "1", "--without", "sample", "gradient", "reset",
                      "--out", "profile.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = json.loads((tmp_path / "profile.json").read_text())["rows"]
    assert all(row[f"without_{part}_ms"] > 0 for part in ("sample", "gradient", "reset"))


def test_the_stand_ins_take_out_their_part_and_nothing_else():
    # the step without a part must be the step's shape with that part's work gone: a batch of
    # sample_batch's shapes and dtypes read from nowhere; a clock that moves with the networks
    # unchanged; no reset where one is due
    args, env, env_params, codec = script_setup(sr, SR_TINY.removeprefix("--script-args="))
    b = dqn_profile.built(sr, args, env, env_params)
    runner = jax.jit(b.init)(jax.random.key(0))
    n, gamma = jnp.asarray(3), jnp.asarray(0.9)
    drawn = sr.sample_batch(runner.buffer_state, runner.key, n, gamma, args.batch_size, 10, codec)
    stand_in = dqn_profile.no_sample(runner.buffer_state, runner.key, n, gamma, args.batch_size,
                                     10, codec)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), stand_in) == jax.tree.map(
        lambda x: (x.shape, x.dtype), drawn)
    assert not any(np.any(x) for x in (stand_in.obs, stand_in.reward, stand_in.next_obs))
    state, info = dqn_profile.no_gradient(runner.train_state, drawn, b.network, b.optimizer,
                                          args.loss, args.tau)
    assert int(state.steps) == int(runner.train_state.steps) + 1
    assert int(state.since_reset) == int(runner.train_state.since_reset) + 1
    assert jax.tree.all(jax.tree.map(lambda a, c: bool((a == c).all()), state.params,
                                     runner.train_state.params))
    assert set(info) == {"td_loss", "q_values"}
    _, stand_in_reset = dqn_profile.WITHOUT["reset"]
    assert stand_in_reset(runner.train_state, None, None, 0.5) is runner.train_state


def test_without_is_refused_for_dqn_in_one_line(tmp_path):
    result = run_main(dqn_profile, tmp_path, "--without", "sample", timeout=120)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: --without takes parts out of sr_dqn_minatar's step only"]

"""The other games are first-class: every MinAtar game (and one classic-control environment) trains,
evaluates under both protocols and is drawn with its own channel names; MinAtar's protocol has no
time limit but the game's own."""

import json
import os

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ppo_breakout import only_run_dir, run_in_process

import ppo_breakout as ppo
from utils import evaluation, visualize

GAMES = ["Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar",
         "Seaquest-MinAtar"]
SMOKE = ["--total-timesteps", "512", "--num-envs", "8", "--num-steps", "32", "--num-minibatches", "2",
         "--update-epochs", "1", "--eval-episodes", "4", "--no-diagnostics"]


@pytest.mark.parametrize("env_id", GAMES)
def test_minatar_protocol_is_sticky_with_no_time_limit_but_the_games_own(env_id):
    env, env_params = ppo.make_env(env_id, 0.0)
    gymnax_params = evaluation.protocol_params(env_id, env_params, "gymnax")
    minatar_params = evaluation.protocol_params(env_id, env_params, "minatar")
    assert gymnax_params.sticky_action_prob == 0.0
    assert gymnax_params.env_params == env_params.env_params  # gymnax's own limit: 1000, Freeway 2500
    assert minatar_params.sticky_action_prob == 0.1
    expected = 2501 if env_id == "Freeway-MinAtar" else evaluation.SAFETY_BOUND
    assert minatar_params.env_params.max_steps_in_episode == expected


def test_other_environments_keep_their_time_limit_under_both_protocols():
    env, env_params = ppo.make_env("CartPole-v1", 0.0)
    for protocol in evaluation.PROTOCOLS:
        params = evaluation.protocol_params("CartPole-v1", env_params, protocol)
        assert params.env_params.max_steps_in_episode == env_params.env_params.max_steps_in_episode


def test_the_final_evaluation_plays_minatar_protocol_past_gymnax_time_limit(monkeypatch):
    # A Seaquest submarine that never moves lives for ever: gymnax's protocol cuts it at 1000 steps,
    # MinAtar's only at the safety bound (lowered here so the test is quick).
    monkeypatch.setattr(evaluation, "SAFETY_BOUND", 1200)
    env, env_params = ppo.make_env("Seaquest-MinAtar", 0.0)
    idle = lambda _, obs: jnp.zeros((obs.shape[0], 6)).at[:, 0].set(50.0)  # noqa: E731
    evaluate_pair, _ = evaluation.make_evaluate_pair(env, "Seaquest-MinAtar", env_params, idle, 2, 2)
    pair = jax.tree.map(np.asarray, evaluate_pair(jax.random.key(0), {}, 0))  # gymnax's, MinAtar's
    assert [evaluation.EVALUATIONS[i][0] for i in evaluation.EVALUATION_PAIRS["sampled"]] == ["", "sticky_0.1"]
    np.testing.assert_array_equal(pair.lengths, [[1000, 1000], [1200, 1200]])
    assert pair.frames.shape[2] == evaluation.RECORD_STEPS + 1  # frames 0..1001, not the bound's


@pytest.mark.parametrize("env_id", GAMES)
def test_gif_legend_names_every_channel_of_each_game(env_id):
    env, env_params = gymnax.make(env_id)
    obs, _ = env.reset(jax.random.key(0), env_params)
    names = visualize.GAME_CHANNELS[env_id]
    assert len(names) == obs.shape[-1] and len(set(names)) == len(names)


@pytest.mark.parametrize("env_id", [*GAMES, "CartPole-v1"])
def test_each_game_trains_evaluates_and_is_drawn(env_id, tmp_path):
    result = run_in_process(tmp_path, "--env-id", env_id, *SMOKE)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert os.path.basename(run_dir).startswith(f"{env_id}__ppo__1__")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "completed" and summary["global_step"] == 512
    grid = env_id.endswith("-MinAtar")  # the default convolution reads grids; CartPole's is a vector
    assert summary["args"]["conv_channels"] == (8 if grid else 0)
    for protocol in (summary["eval"], summary["eval"]["sticky_0.1"]):
        assert np.isfinite(protocol["sampled"]["mean"]) and np.isfinite(protocol["greedy"]["mean"])
    assert summary["eval"]["sticky_0.1"]["sampled"]["safety_bound_episodes"] >= 0
    assert os.path.exists(os.path.join(run_dir, "play.gif")) == grid  # the GIF draws grids too
    assert os.path.exists(os.path.join(run_dir, "behaviour.png"))

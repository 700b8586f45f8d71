"""Tests of utils/evaluation.py: `evaluate` on a probe environment with known returns, lengths and
episodes, and the two protocols (gymnax's time limit; MinAtar's sticky actions and the game's own
end), played past gymnax's limit by the final evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import GAMES
from probe_envs import ProbeEnv
from utils import evaluation
from utils.env import make_env
from utils.evaluation import evaluate


def test_evaluate_counts_complete_episodes_with_known_returns():
    env = ProbeEnv()
    policy = lambda params, obs: jnp.tile(params, (obs.shape[0], 1))  # noqa: E731
    greedy_one = jnp.array([0.0, 10.0])
    result = evaluate(jax.random.key(0), greedy_one, True, env=env, env_params=env.default_params,
                      policy_apply=policy, num_episodes=64, max_steps=10)
    assert result.finished.all()
    assert set(np.asarray(result.lengths)) == {2, 3, 4}  # horizon 6 is cut by the 4-step limit
    # nothing after the auto-reset counts
    np.testing.assert_array_equal(result.returns, result.lengths)

    # Uniform sampling (the logits are ignored only when greedy): about half the steps pay 1.
    sampled = evaluate(jax.random.key(0), greedy_one * 0.0, False, env=env,
                       env_params=env.default_params, policy_apply=policy, num_episodes=256,
                       max_steps=10)
    assert abs(float(sampled.returns.sum() / sampled.lengths.sum()) - 0.5) < 0.1

    # Stopped before the longer episodes end: those are reported as unfinished, never as done.
    cut = evaluate(jax.random.key(0), greedy_one, True, env=env, env_params=env.default_params,
                   policy_apply=policy, num_episodes=64, max_steps=2)
    assert np.all(np.asarray(cut.lengths) == 2)
    assert 0 < int(cut.finished.sum()) < 64


def test_evaluate_keeps_what_behaviour_diagnostics_need():
    # Greedy action 1 in the probe: an episode is fixed by its horizon (2, 3, or 6 cut to 4 by the
    # time limit), so there are exactly three distinct episodes, and the frames are the clock.
    env = ProbeEnv()
    policy = lambda params, obs: jnp.tile(params, (obs.shape[0], 1))  # noqa: E731
    result = jax.device_get(evaluate(
        jax.random.key(0), jnp.array([0.0, 10.0]), True, env=env, env_params=env.default_params,
        policy_apply=policy, num_episodes=64, max_steps=10, num_recorded=4))
    lengths = result.lengths
    np.testing.assert_array_equal(result.terminated, lengths < 4)  # 4 steps: the time limit
    # the step it ended on, pre-reset
    np.testing.assert_allclose(result.final_obs[:, 0], lengths / 10)
    assert len(np.unique(result.fingerprint)) == 3
    for length in (2, 3, 4):  # equal episodes, equal fingerprints
        assert len(np.unique(result.fingerprint[lengths == length])) == 1
    assert result.frames.shape == (4, 11, 2)
    for frames, length in zip(result.frames, lengths[:4]):
        np.testing.assert_allclose(frames[:length + 1, 0], np.arange(length + 1) / 10)

    # Sampled actions change the observations only through the clock here, which they do not touch:
    # the fingerprint depends on the observations alone, not on the actions or rewards.
    sampled = jax.device_get(evaluate(
        jax.random.key(1), jnp.zeros(2), False, env=env, env_params=env.default_params,
        policy_apply=policy, num_episodes=64, max_steps=10))
    assert len(np.unique(sampled.fingerprint)) == 3


@pytest.mark.parametrize("env_id", GAMES)
def test_minatar_protocol_is_sticky_with_no_time_limit_but_the_games_own(env_id):
    env, env_params = make_env(env_id, 0.0)
    gymnax_params = evaluation.protocol_params(env_id, env_params, "gymnax")
    minatar_params = evaluation.protocol_params(env_id, env_params, "minatar")
    assert gymnax_params.sticky_action_prob == 0.0
    # gymnax's own limit: 1000, Freeway 2500
    assert gymnax_params.env_params == env_params.env_params
    assert minatar_params.sticky_action_prob == 0.1
    expected = 2501 if env_id == "Freeway-MinAtar" else evaluation.SAFETY_BOUND
    assert minatar_params.env_params.max_steps_in_episode == expected


def test_other_environments_keep_their_time_limit_under_both_protocols():
    env, env_params = make_env("CartPole-v1", 0.0)
    for protocol in evaluation.PROTOCOLS:
        params = evaluation.protocol_params("CartPole-v1", env_params, protocol)
        assert params.env_params.max_steps_in_episode == env_params.env_params.max_steps_in_episode


def test_the_final_evaluation_plays_minatar_protocol_past_gymnax_time_limit(monkeypatch):
    # A Seaquest submarine that never moves lives for ever: gymnax's protocol cuts it at 1000 steps,
    # MinAtar's only at the safety bound (lowered here so the test is quick).
    monkeypatch.setattr(evaluation, "SAFETY_BOUND", 1200)
    env, env_params = make_env("Seaquest-MinAtar", 0.0)
    idle = lambda _, obs: jnp.zeros((obs.shape[0], 6)).at[:, 0].set(50.0)  # noqa: E731
    evaluate_pair, _ = evaluation.make_evaluate_pair(
        env, "Seaquest-MinAtar", env_params, idle, 2, 2)

    pair = jax.tree.map(np.asarray, evaluate_pair(jax.random.key(0), {}, 0))  # gymnax's, MinAtar's
    sampled_pair = evaluation.EVALUATION_PAIRS["sampled"]
    assert [evaluation.EVALUATIONS[i][0] for i in sampled_pair] == ["", "sticky_0.1"]

    np.testing.assert_array_equal(pair.lengths, [[1000, 1000], [1200, 1200]])
    assert pair.frames.shape[2] == evaluation.RECORD_STEPS + 1  # frames 0..1001, not the bound's

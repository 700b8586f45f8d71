"""Tests of utils/evaluation.py: `evaluate` on probe environments with known returns, lengths and
episodes, every episode counted once and whole however long, the same numbers whatever slot, pool
or device count plays them, and the two protocols (gymnax's time limit; MinAtar's sticky actions
and the game's own end), played past gymnax's limit by the final evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import GAMES
from probe_envs import ProbeEnv, ProbeParams
from utils import evaluation
from utils.env import StickyActions, StickyParams, make_env
from utils.evaluation import evaluate


def act_by_logits(params, obs, key, greedy):
    """The probe's policy: logits `params` for every observation, arg-max when greedy."""
    logits = jnp.tile(params, (obs.shape[0], 1))
    return jnp.where(greedy, jnp.argmax(logits, axis=-1), jax.random.categorical(key, logits))


GREEDY_ONE = jnp.array([0.0, 10.0])  # greedy: action 1, reward 1 every step
UNIFORM = jnp.zeros(2)  # sampled: each action half the time
LEANING_ONE = jnp.array([0.0, 0.5])  # greedy: action 1; sampled: action 1 62% of the time


def test_evaluate_counts_complete_episodes_with_known_returns():
    env = ProbeEnv()
    result = evaluate(jax.random.key(0), GREEDY_ONE, True, env=env, env_params=env.default_params,
                      act=act_by_logits, num_episodes=64, max_steps=10)
    assert result.finished.all()
    assert set(np.asarray(result.lengths)) == {2, 3, 4}  # horizon 6 is cut by the 4-step limit
    # nothing after the auto-reset counts
    np.testing.assert_array_equal(result.returns, result.lengths)

    # Uniform sampling (the logits are ignored only when greedy): about half the steps pay 1.
    sampled = evaluate(jax.random.key(0), UNIFORM, False, env=env, env_params=env.default_params,
                       act=act_by_logits, num_episodes=256, max_steps=10)
    assert abs(float(sampled.returns.sum() / sampled.lengths.sum()) - 0.5) < 0.1

    # Stopped before the longer episodes end: those are reported as unfinished, never as done. The
    # bound is each episode's own, also for episodes that start after others were stopped.
    for max_steps, width in ((2, 64), (3, 5)):
        cut = jax.device_get(evaluate(
            jax.random.key(0), GREEDY_ONE, True, env=env, env_params=env.default_params,
            act=act_by_logits, num_episodes=64, max_steps=max_steps, width=width))
        assert set(cut.lengths.tolist()) == set(range(2, max_steps + 1))  # horizons 2, 3, 6
        assert 0 < int(cut.finished.sum()) < 64
        np.testing.assert_array_equal(cut.terminated, cut.finished)  # horizons 2, 3: the game's
        np.testing.assert_array_equal(cut.lengths[~cut.finished], max_steps)


def test_evaluate_keeps_what_behaviour_diagnostics_need():
    # Greedy action 1 in the probe: an episode is fixed by its horizon (2, 3, or 6 cut to 4 by the
    # time limit), so there are exactly three distinct episodes, and the frames are the clock.
    env = ProbeEnv()
    result = jax.device_get(evaluate(
        jax.random.key(0), GREEDY_ONE, True, env=env, env_params=env.default_params,
        act=act_by_logits, num_episodes=64, max_steps=10, num_recorded=4))
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
        jax.random.key(1), UNIFORM, False, env=env, env_params=env.default_params,
        act=act_by_logits, num_episodes=64, max_steps=10))
    assert len(np.unique(sampled.fingerprint)) == 3


# --------------------------------------------------------------------------------------------------
# Every episode counted once and whole, however long, wherever it is played
# --------------------------------------------------------------------------------------------------
# Half the episodes end after 1 step, half after 300: an evaluation that waited for no episode by
# counting the first ones to end would report nearly only the short ones.
SHORT_AND_LONG = ProbeEnv(horizons=(1, 300))
NO_LIMIT = ProbeParams(max_steps_in_episode=1000)


@pytest.mark.parametrize("width", [evaluation.POOL_WIDTH, 256])
def test_every_episode_is_counted_once_and_whole_however_long(width):
    num_episodes = 256
    result = jax.device_get(evaluate(
        jax.random.key(0), GREEDY_ONE, True, env=SHORT_AND_LONG, env_params=NO_LIMIT,
        act=act_by_logits, num_episodes=num_episodes, max_steps=1001, num_recorded=4, width=width))
    # Each episode played to its own end, and its numbers are its own: the clock it ended on.
    assert result.finished.all() and result.terminated.all()
    assert set(result.lengths.tolist()) == {1, 300}
    np.testing.assert_array_equal(result.returns, result.lengths)
    np.testing.assert_allclose(result.final_obs[:, 0], result.lengths / 10, rtol=1e-6)
    # Which horizon an episode draws is a fair coin: about half are long, and the mean return is
    # the known mean, (1 + 300) / 2, within four standard errors.
    long_share = float(np.mean(result.lengths == 300))
    assert abs(long_share - 0.5) < 4 * 0.5 / np.sqrt(num_episodes), long_share
    standard_error = 299 * 0.5 / np.sqrt(num_episodes)
    assert abs(float(result.returns.mean()) - 150.5) < 4 * standard_error, result.returns.mean()
    # The recorded episodes are episodes 0-3 whole, however long.
    for frames, length in zip(result.frames, result.lengths[:4]):
        np.testing.assert_allclose(frames[:length + 1, 0], np.arange(length + 1) / 10, rtol=1e-6)


def sticky_probe(sticky: float) -> tuple[StickyActions, StickyParams]:
    """SHORT_AND_LONG with sticky actions: an episode's actions, repeats and horizon are all drawn
    from its keys."""
    return StickyActions(SHORT_AND_LONG), StickyParams(NO_LIMIT, sticky)


def test_an_episode_is_the_same_whatever_slot_plays_it():
    # Sampled actions, sticky repeats and random horizons: each episode's return depends on every
    # key it draws, and must not change when another slot of another pool plays it, after other
    # episodes or none.
    env, env_params = sticky_probe(0.3)
    num_episodes = 40

    def played(width):
        return jax.device_get(evaluate(
            jax.random.key(3), UNIFORM, False, env=env, env_params=env_params, act=act_by_logits,
            num_episodes=num_episodes, max_steps=1001, num_recorded=3, width=width))

    alone = played(num_episodes)  # each episode in a slot of its own, all at once
    assert len(np.unique(alone.returns)) > 10  # the keys do make episodes differ
    for width in (1, 3, 16):
        jax.tree.map(np.testing.assert_array_equal, played(width), alone)


def test_evaluate_each_gives_what_each_evaluation_gives_alone():
    # Greedy and sampled, with and without sticky actions, and time limits that cut the 300-step
    # episodes at 100 and 200 steps or not at all, in one loop: each as `evaluate` alone gives it
    # with its own parameters and a bound just past its own limit.
    env, env_params = sticky_probe(0.0)
    key = jax.random.key(7)
    greedy, sticky = np.array([True, False, True]), np.array([0.0, 0.3, 0.3], np.float32)
    limit = np.array([1000, 100, 200], np.int32)
    together = jax.device_get(evaluation.evaluate_each(
        key, LEANING_ONE, greedy, sticky, limit, env=env, env_params=env_params,
        act=act_by_logits, num_episodes=13, max_steps=1001))
    for i in range(3):
        played = env_params.replace(sticky_action_prob=float(sticky[i]), env_params=ProbeParams(
            max_steps_in_episode=int(limit[i])))
        alone = evaluate(key, LEANING_ONE, bool(greedy[i]), env=env, env_params=played,
                         act=act_by_logits, num_episodes=13, max_steps=int(limit[i]) + 1)
        each = jax.tree.map(lambda x: x[i], together._replace(frames=None))  # noqa: B023
        jax.tree.map(np.testing.assert_array_equal, each,
                     jax.device_get(alone._replace(frames=None)))
    assert sorted(set(together.lengths.max(1).tolist())) == [100, 200, 300]
    assert together.finished.all()  # a time limit ends an episode as the game's end does


def test_final_evaluation_is_the_same_on_one_device_or_two():
    # 13 episodes: on two devices, one plays 7 and the other 6 (and an extra one, not counted); the
    # recorded episodes 0-7 are on both.
    env, env_params = sticky_probe(0.0)  # each protocol sets its own stickiness
    key = jax.random.key(5)
    results = []
    for num_devices in (1, 2):
        evaluate_pair, _ = evaluation.make_evaluate_pair(env, "Probe", env_params, act_by_logits,
                                                         13, num_devices)
        results.append(jax.device_get([evaluate_pair(key, LEANING_ONE, pair) for pair in (0, 1)]))
    jax.tree.map(np.testing.assert_array_equal, *results)
    alone = evaluate(key, LEANING_ONE, True, env=env, env_params=env_params.replace(
        sticky_action_prob=0.1), act=act_by_logits, num_episodes=13, max_steps=1001,
        num_recorded=8, record_steps=evaluation.RECORD_STEPS)
    greedy_sticky = jax.tree.map(lambda x: x[1], results[1][1])  # as it gives alone
    jax.tree.map(np.testing.assert_array_equal, greedy_sticky, jax.device_get(alone))
    # Both evaluations of a pair play with the same key: the same horizons, drawn at reset, whatever
    # the actions; without sticky actions the greedy policy earns 1 a step.
    for pair in results[0]:
        np.testing.assert_array_equal(pair.lengths[0], pair.lengths[1])
    assert len(np.unique(results[0][0].returns)) > 4
    np.testing.assert_array_equal(results[0][1].returns[0], results[0][1].lengths[0])


# --------------------------------------------------------------------------------------------------
# The protocols
# --------------------------------------------------------------------------------------------------
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
    idle = lambda params, obs, key, greedy: jnp.zeros(obs.shape[0], jnp.int32)  # noqa: E731
    evaluate_pair, _ = evaluation.make_evaluate_pair(
        env, "Seaquest-MinAtar", env_params, idle, 2, 2)

    pair = jax.tree.map(np.asarray, evaluate_pair(jax.random.key(0), {}, 0))  # gymnax's, MinAtar's
    sampled_pair = evaluation.EVALUATION_PAIRS["sampled"]
    assert [evaluation.EVALUATIONS[i][0] for i in sampled_pair] == ["", "sticky_0.1"]

    np.testing.assert_array_equal(pair.lengths, [[1000, 1000], [1200, 1200]])
    assert pair.frames.shape[2] == evaluation.RECORD_STEPS + 1  # frames 0..1001, not the bound's

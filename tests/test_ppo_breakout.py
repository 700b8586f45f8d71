"""Tests of ppo_breakout.py: its pieces against references, and the script run the way a user runs it."""

import dataclasses
import functools
import contextlib
import glob
import io
import json
import os
import signal
import subprocess
import sys
import typing

import gymnax
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import rlax
import safetensors.numpy
import tyro
from PIL import Image, ImageSequence
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo_breakout as ppo
from probe_envs import ProbeEnv
from utils import checkpoint, cli, diagnostics, files, layers, logger, parallel, startup, visualize
from utils import model as model_file
from utils.env import StickyActions, StickyParams
from utils.evaluation import evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "ppo_breakout.py")


def network_args(args) -> dict:
    """What the script writes into a model file's header to rebuild the network."""
    return {name: getattr(args, name) for name in ppo.NETWORK_ARGS}


def run_script(tmp_path, *flags, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout)


class Finished(typing.NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_in_process(cwd, *flags) -> Finished:
    """main() in this process, as `python ppo_breakout.py FLAGS` run in `cwd`: what the script does,
    where a mutation-testing tool can see which test ran which function (it cannot in a subprocess)."""
    out, err = io.StringIO(), io.StringIO()
    old_cwd, old_argv = os.getcwd(), sys.argv
    try:
        os.chdir(cwd)
        sys.argv = ["ppo_breakout.py", *flags]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                ppo.main()
                code = 0
            except SystemExit as exit_:
                code = exit_.code or 0
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
    return Finished(code, out.getvalue(), err.getvalue())


# ------------------------------------------------------------------------------------------------
# GAE with gymnax 1.0's terminated / truncated endings
# ------------------------------------------------------------------------------------------------
def reference_gae(rewards, values, last_value, final_values, terminated, truncated, gamma, lam):
    """Plain-Python GAE for one environment, written from the definitions."""
    num_steps = len(rewards)
    advantages = [0.0] * num_steps
    next_advantage = 0.0
    for t in reversed(range(num_steps)):
        if terminated[t]:
            next_value, continues = 0.0, False
        elif truncated[t]:
            next_value, continues = final_values[t], False
        else:
            next_value = values[t + 1] if t + 1 < num_steps else last_value
            continues = True
        delta = rewards[t] + gamma * next_value - values[t]
        next_advantage = delta + (gamma * lam * next_advantage if continues else 0.0)
        advantages[t] = next_advantage
    return np.array(advantages)


def test_gae_matches_reference_on_terminated_and_truncated_episodes():
    rng = np.random.default_rng(0)
    num_steps, num_envs, gamma, lam = 7, 3, 0.9, 0.8
    terminated = np.zeros((num_steps, num_envs), bool)
    truncated = np.zeros((num_steps, num_envs), bool)
    terminated[2, 0] = True  # env 0: an episode that ends for good
    truncated[4, 1] = True  # env 1: an episode cut by the time limit
    terminated[1, 2] = truncated[5, 2] = True  # env 2: both kinds
    terminated[3, 2] = truncated[3, 2] = True  # ... and both on one step: termination wins
    rewards = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    values = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    final_values = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    last_value = rng.normal(size=num_envs).astype(np.float32)
    traj = ppo.Transition(obs=None, action=None, logits=None, value=jnp.asarray(values),
                          reward=jnp.asarray(rewards), terminated=jnp.asarray(terminated),
                          truncated=jnp.asarray(truncated), final_value=jnp.asarray(final_values),
                          episode_return=None, episode_length=None, active_units=None)

    advantages, targets = ppo.calculate_gae(traj, jnp.asarray(last_value), gamma, lam)

    for env in range(num_envs):
        expected = reference_gae(rewards[:, env], values[:, env], last_value[env],
                                 final_values[:, env], terminated[:, env], truncated[:, env], gamma, lam)
        np.testing.assert_allclose(advantages[:, env], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, advantages + values, rtol=1e-6)
    # The truncated step bootstraps from v(final_obs): changing it changes that step's advantage.
    shifted_traj = traj._replace(final_value=traj.final_value + 1.0)
    shifted = ppo.calculate_gae(shifted_traj, jnp.asarray(last_value), gamma, lam)[0]
    assert np.isclose(shifted[4, 1] - advantages[4, 1], gamma, atol=1e-5)
    assert np.isclose(shifted[2, 0], advantages[2, 0])  # terminated: v(final_obs) is not used


# ------------------------------------------------------------------------------------------------
# The clipped surrogate loss in log space
# ------------------------------------------------------------------------------------------------
def test_policy_loss_matches_rlax_fed_with_probability_ratios():
    key_new, key_old, key_act, key_adv = jax.random.split(jax.random.key(0), 4)
    logits = 3.0 * jax.random.normal(key_new, (512, 3))
    old_logits = logits + 0.3 * jax.random.normal(key_old, (512, 3))  # some ratios fall outside the clip
    actions = jax.random.randint(key_act, (512,), 0, 3)
    advantages = jax.random.normal(key_adv, (512,))

    loss, log_ratio = ppo.policy_loss(logits, old_logits, actions, advantages, 0.2)

    # Probabilities divided directly, in float64 numpy: the paper's r = pi / pi_old.
    def softmax64(z):
        z = np.asarray(z, np.float64)
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    rows = np.arange(512)
    ratio = softmax64(logits)[rows, actions] / softmax64(old_logits)[rows, actions]
    assert 0.0 < np.mean(np.abs(ratio - 1) > 0.2) < 1.0
    np.testing.assert_allclose(np.exp(log_ratio), ratio, rtol=1e-5)
    expected = rlax.clipped_surrogate_pg_loss(jnp.asarray(ratio, jnp.float32), advantages, 0.2)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    direct = -np.mean(np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.2) * advantages))
    np.testing.assert_allclose(loss, direct, rtol=1e-5)


def test_policy_loss_stays_finite_where_dividing_probabilities_fails():
    logits = jnp.array([[-200.0, 0.0, 0.0]])
    old_logits = jnp.array([[-201.0, 0.0, 0.0]])  # pi(a=0) underflows to 0 in float32 in both
    actions, advantages = jnp.array([0]), jnp.array([1.0])
    direct_ratio = jax.nn.softmax(logits)[0, 0] / jax.nn.softmax(old_logits)[0, 0]
    assert not jnp.isfinite(direct_ratio)  # 0 / 0

    loss, log_ratio = ppo.policy_loss(logits, old_logits, actions, advantages, 0.2)
    grads = jax.grad(lambda z: ppo.policy_loss(z, old_logits, actions, advantages, 0.2)[0])(logits)
    np.testing.assert_allclose(log_ratio, [1.0], rtol=1e-4)  # log(e^-200 / e^-201)
    np.testing.assert_allclose(loss, -1.2, rtol=1e-6)  # ratio e > 1 + eps: clipped
    assert jnp.all(jnp.isfinite(grads))


def loss_setup(**overrides):
    """A network, its parameters (a policy far from uniform) and a minibatch whose stored logits and
    values are the network's own (the first gradient step of an epoch: ratio 1, nothing clipped)."""
    settings = dict(num_envs=8, num_steps=32, num_minibatches=1) | overrides
    args = ppo.fill_runtime_fields(ppo.Args(**settings))
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    keys = jax.random.split(jax.random.key(0), 4)
    obs = jax.random.bernoulli(keys[0], 0.2, (64, 10, 10, 4)).astype(jnp.float32)
    params = network.init(keys[1], obs)
    params["policy"]["w"] = 300.0 * params["policy"]["w"]
    logits, values = network.apply(params, obs)
    mb = ppo.Batch(obs=obs, action=jax.random.randint(keys[2], (64,), 0, 3), logits=logits, value=values,
                   advantage=3.0 + 2.0 * jax.random.normal(keys[3], (64,)), target=values + 1.0)
    return args, network, params, mb


def sgd_step(params, network, mb, args):
    """A small plain gradient step on ppo_loss as it is (no normalisation of the advantages)."""
    grads, _ = jax.grad(ppo.ppo_loss, has_aux=True)(params, network, mb, args)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)


def test_each_loss_term_moves_the_policy_the_right_way():
    # Only the entropy bonus: a step raises the policy's entropy (a flipped sign would lower it).
    args, network, params, mb = loss_setup(vf_coef=0.0)
    zero_advantages = mb._replace(advantage=jnp.zeros(64))
    entropy = lambda p: ppo.ppo_loss(p, network, mb, args)[1]["entropy"]  # noqa: E731
    assert entropy(sgd_step(params, network, zero_advantages, args)) > entropy(params)
    # Only the surrogate: a step makes actions more likely in proportion to their advantage.
    args, network, params, mb = loss_setup(ent_coef=0.0, vf_coef=0.0)
    objective = lambda p: jnp.mean(mb.advantage * ppo.log_prob(network.apply(p, mb.obs)[0], mb.action))  # noqa: E731
    assert objective(sgd_step(params, network, mb, args)) > objective(params)
    # Only the value loss: a step brings the values towards the targets.
    args, network, params, mb = loss_setup(ent_coef=0.0)
    value_error = lambda p: float(jnp.mean(jnp.abs(network.apply(p, mb.obs)[1] - mb.target)))  # noqa: E731
    assert value_error(sgd_step(params, network, zero_advantages, args)) < value_error(params)


def test_loss_is_surrogate_minus_entropy_bonus_plus_value_loss():
    args, network, params, mb = loss_setup(ent_coef=0.03, vf_coef=0.7)
    loss, metrics = ppo.ppo_loss(params, network, mb, args)
    probs = jax.nn.softmax(network.apply(params, mb.obs)[0]).astype(np.float64)
    np.testing.assert_allclose(metrics["entropy"], np.mean(-np.sum(probs * np.log(probs), -1)), rtol=1e-5)
    expected = metrics["policy_loss"] - 0.03 * metrics["entropy"] + 0.7 * metrics["value_loss"]
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert metrics["value_loss"] > 0 and metrics["entropy"] > 0  # both terms are really there


@pytest.mark.parametrize("norm_adv", [True, False])
def test_an_epoch_steps_on_each_minibatch_with_its_advantages_normalised_within_it(norm_adv):
    args, network, params, batch = loss_setup(norm_adv=norm_adv, num_minibatches=2)
    key, lr = jax.random.key(5), 0.1
    optimizer = optax.sgd(lr)  # the step is the gradient itself, scaled
    (stepped, _), _ = ppo.update_epoch(ppo.TrainState(params, optimizer.init(params)), key, batch,
                                       network, optimizer, args)
    expected = params
    for rows in jax.random.permutation(key, 64).reshape(2, -1):  # the epoch's minibatches, in order
        mb = jax.tree.map(lambda x: x[rows], batch)
        a = mb.advantage
        assert abs(a.mean() - batch.advantage.mean()) > 0.05  # the minibatch's moments are its own
        if norm_adv:
            mb = mb._replace(advantage=(a - a.mean()) / (a.std() + 1e-8))
        grads, _ = jax.grad(ppo.ppo_loss, has_aux=True)(expected, network, mb, args)
        expected = jax.tree.map(lambda p, g: p - lr * g, expected, grads)
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), stepped, params)
    assert min(jax.tree.leaves(moved)) > 1e-4  # a real step, not a no-op
    for got, want in zip(jax.tree.leaves(stepped), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_optimizer_clips_the_global_norm_and_anneals_the_learning_rate_to_zero():
    args = ppo.fill_runtime_fields(ppo.Args(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=2,
                                            total_timesteps=8 * 16 * 5, max_grad_norm=0.5))
    optimizer = ppo.make_optimizer(args)  # 5 iterations x 2 epochs x 2 minibatches = 20 updates
    params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    state = optimizer.init(params)
    grads = {"a": jnp.array([3.0, 0.0, 4.0]), "b": jnp.array([0.0, 0.1])}  # global norm ~5.001
    norm = np.sqrt(25.01)
    for update in range(1, 21):
        _, state = optimizer.update(grads, state, params)
        rate = optax.tree_utils.tree_get(state, "learning_rate", filtering=lambda _, v: isinstance(v, jax.Array))
        np.testing.assert_allclose(rate, 5e-3 * (1 - (update - 1) / 20), atol=1e-9)  # the rate it used: linear
    # Adam's first moment holds the clipped gradient: scaled as a whole to norm 0.5, so the small
    # component keeps its share (clipping each element to +-0.5 would not).
    mu = optax.tree_utils.tree_get(state, "mu")
    np.testing.assert_allclose(mu["a"], np.array([3.0, 0.0, 4.0]) * 0.5 / norm * (1 - 0.9**20), rtol=1e-4)
    np.testing.assert_allclose(mu["b"], np.array([0.0, 0.1]) * 0.5 / norm * (1 - 0.9**20), rtol=1e-4)


def test_optimizer_keeps_the_rate_without_annealing_and_uses_adams_eps_of_1e5():
    args = ppo.fill_runtime_fields(ppo.Args(total_timesteps=20 * 64 * 128, num_minibatches=1, update_epochs=1,
                                            anneal_lr=False, num_devices=1))
    optimizer = ppo.make_optimizer(args)
    params = {"w": jnp.zeros(2)}
    state = optimizer.init(params)
    for _ in range(20):
        updates, state = optimizer.update({"w": jnp.array([1e-6, -1e-6])}, state, params)
        rate = optax.tree_utils.tree_get(state, "learning_rate", filtering=lambda _, v: isinstance(v, jax.Array))
        np.testing.assert_allclose(rate, 5e-3)
    # Adam's step is lr * m / (sqrt(v) + eps); with a gradient of 1e-6 and eps 1e-5 it is lr / 11, where
    # optax's default eps of 1e-8 would give nearly lr.
    np.testing.assert_allclose(updates["w"], [-5e-3 / 11, 5e-3 / 11], rtol=1e-3)


def test_direct_ratio_takes_the_same_step_where_both_are_finite():
    # --ratio direct divides softmax probabilities (the paper's formula); on ordinary logits its
    # minibatch step equals the log-space one, and its log_ratio is the same.
    args, network, params, mb = loss_setup()
    mb = mb._replace(logits=mb.logits + 0.3 * jax.random.normal(jax.random.key(7), mb.logits.shape))
    optimizer = optax.sgd(1.0)
    steps = {}
    for ratio in ("log", "direct"):
        ratio_args = dataclasses.replace(args, ratio=ratio)
        (steps[ratio], _), info = ppo.update_minibatch(ppo.TrainState(params, optimizer.init(params)), mb,
                                                       network, optimizer, ratio_args)
        clipfrac = ppo.loss_metrics(info, args.clip_coef)["clipfrac"]
        assert 0 < clipfrac < 1  # both sides of the clip are exercised
    for a, b in zip(jax.tree.leaves(steps["log"]), jax.tree.leaves(steps["direct"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    logits = network.apply(params, mb.obs)[0]
    np.testing.assert_allclose(ppo.policy_loss(logits, mb.logits, mb.action, mb.advantage, 0.2, "direct")[1],
                               ppo.policy_loss(logits, mb.logits, mb.action, mb.advantage, 0.2, "log")[1],
                               rtol=1e-4, atol=1e-5)
    # Where a probability underflows, the direct ratio is 0 / 0 and the log-space one is not.
    far = jnp.array([[-200.0, 0.0, 0.0]])
    assert np.isnan(ppo.policy_loss(far, far - 1.0, jnp.array([0]), jnp.array([1.0]), 0.2, "direct")[0])
    assert np.isfinite(ppo.policy_loss(far, far - 1.0, jnp.array([0]), jnp.array([1.0]), 0.2, "log")[0])


def test_value_loss_clipping_is_pessimistic():
    targets, old = jnp.array([1.0, 1.0, -1.0]), jnp.array([0.5, 0.5, 0.5])
    values = jnp.array([0.8, 2.0, -0.5])  # within the clip; up past it; down past it towards the target
    assert np.isclose(ppo.value_loss(values, old, targets, 0.2, clip_vloss=False),
                      0.5 * (0.04 + 1.0 + 0.25) / 3)
    # Clipped to old +- 0.2 = [0.3, 0.7]: max((0.8-1)^2, (0.7-1)^2) = 0.09; max(1, 0.09) = 1;
    # max((-0.5+1)^2, (0.3+1)^2) = 1.69.
    assert np.isclose(ppo.value_loss(values, old, targets, 0.2, clip_vloss=True),
                      0.5 * (0.09 + 1.0 + 1.69) / 3)


# ------------------------------------------------------------------------------------------------
# Rollout bookkeeping and evaluation, on a probe environment with known answers
# ------------------------------------------------------------------------------------------------
def always_action_one(obs, return_features=False):
    """Action 1 with certainty; the value is the probe's clock, time / 10, so v(o) tells which o it saw."""
    logits, value = jnp.tile(jnp.array([-20.0, 20.0]), (obs.shape[0], 1)), obs[:, 0]
    return (logits, value, obs) if return_features else (logits, value)


def probe_runner(key: jax.Array, num_envs: int = 16) -> ppo.RunnerState:
    """Fresh ProbeEnv environments for `always_action_one`, which has no parameters to train."""
    env = ProbeEnv()
    reset_key, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs),
                                                            env.default_params)
    return ppo.RunnerState(train_state=ppo.TrainState({}, None), env_state=env_state, obs=obs,
                           episode_return=jnp.zeros(num_envs), episode_length=jnp.zeros(num_envs, jnp.int32),
                           key=key)


def assert_truncated_steps_carry_the_value_of_final_obs(traj: ppo.Transition):
    # v(final_obs) is the value of the observation reached (time 4 / 10), not of the reset one (time
    # 0), on truncated steps; every other step carries 0, as GAE does not read it there.
    truncated, final_value = np.asarray(traj.truncated), np.asarray(traj.final_value)
    assert truncated.any()
    np.testing.assert_allclose(final_value[truncated], 0.4, rtol=1e-6)
    assert np.all(final_value[~truncated] == 0.0)


def test_rollout_records_only_completed_episodes_and_the_pre_reset_value():
    env, env_params = ProbeEnv(), ProbeEnv().default_params  # episodes of 2 or 3 steps, or 4 (truncated)
    network = hk.without_apply_rng(hk.transform(always_action_one))

    _, traj = ppo.collect_trajectories(probe_runner(jax.random.key(1)), env, env_params, network, num_steps=12)

    done = np.asarray(traj.terminated | traj.truncated)
    lengths, returns = np.asarray(traj.episode_length), np.asarray(traj.episode_return)
    assert np.all(lengths[~done] == 0) and np.all(returns[~done] == 0)
    assert set(lengths[done]) <= {2, 3, 4} and np.array_equal(returns[done], lengths[done])
    assert np.all(lengths[np.asarray(traj.truncated)] == 4)
    assert np.all(np.asarray(traj.terminated)[lengths == 4] == False)  # noqa: E712 (the time limit, not the game)
    assert (np.asarray(traj.terminated) & done).any()
    assert_truncated_steps_carry_the_value_of_final_obs(traj)
    assert np.all(np.asarray(traj.obs)[1:][done[:-1]][:, 0] == 0.0)  # the next step starts from a reset
    # Each step stores v(o_t) of the observation acted on (the probe's value is its clock), not of the
    # next one, and the action sampled there.
    np.testing.assert_allclose(traj.value, np.asarray(traj.obs)[..., 0])
    assert np.all(np.asarray(traj.action) == 1) and np.all(np.asarray(traj.reward) == 1)


def test_rollout_value_of_final_obs_per_device_and_under_vmap():
    # The rollout's lax.cond on "some environment was truncated" decides per device under shard_map
    # (the script) and becomes a select under vmap (benchmarks/tune.py). Either way a truncated step
    # must carry v(final_obs) = 0.4 (time 4 / 10) and every other step 0, also on the steps where
    # one device or one vmapped runner has a truncation and the other has none.
    env, env_params = ProbeEnv(), ProbeEnv().default_params
    network = hk.without_apply_rng(hk.transform(always_action_one))
    num_envs = 16

    def rollout(runner):
        return ppo.collect_trajectories(runner, env, env_params, network, num_steps=12)[1]

    def check(traj, groups):
        assert_truncated_steps_carry_the_value_of_final_obs(traj)
        any_truncated = [group.any(axis=1) for group in groups(np.asarray(traj.truncated))]
        assert (any_truncated[0] != any_truncated[1]).any()  # the cond went both ways on one step

    on_devices = jax.jit(jax.shard_map(rollout, mesh=parallel.make_mesh(2), in_specs=(ppo.RUNNER_SPECS,),
                                       out_specs=P(None, "envs"), check_vma=False))
    check(on_devices(probe_runner(jax.random.key(1), num_envs)),
          lambda x: (x[:, :num_envs // 2], x[:, num_envs // 2:]))

    runners = jax.vmap(probe_runner, in_axes=(0, None))(jax.random.split(jax.random.key(2), 2), num_envs)
    check(jax.jit(jax.vmap(rollout))(runners), lambda x: (x[0], x[1]))


def test_evaluate_counts_complete_episodes_with_known_returns():
    env = ProbeEnv()
    policy = lambda params, obs: jnp.tile(params, (obs.shape[0], 1))  # noqa: E731
    greedy_one = jnp.array([0.0, 10.0])
    result = evaluate(jax.random.key(0), greedy_one, True, env=env, env_params=env.default_params,
                      policy_apply=policy, num_episodes=64, max_steps=10)
    assert result.finished.all()
    assert set(np.asarray(result.lengths)) == {2, 3, 4}  # horizon 6 is cut by the 4-step limit
    np.testing.assert_array_equal(result.returns, result.lengths)  # nothing after the auto-reset counts

    # Uniform sampling (the logits are ignored only when greedy): about half the steps pay 1.
    sampled = evaluate(jax.random.key(0), greedy_one * 0.0, False, env=env, env_params=env.default_params,
                       policy_apply=policy, num_episodes=256, max_steps=10)
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
    np.testing.assert_allclose(result.final_obs[:, 0], lengths / 10)  # the step it ended on, pre-reset
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


def sticky_rollout(env, env_params, actions: np.ndarray, key: jax.Array):
    """Steps one environment through `actions`: (executed actions, observations, done flags)."""
    obs, state = env.reset(jax.random.key(0), env_params)

    def step(carry, action_and_key):
        state, _ = carry
        action, step_key = action_and_key
        obs, state, reward, terminated, truncated, _ = env.step(step_key, state, action, env_params)
        executed = state.last_action if hasattr(state, "last_action") else action
        return (state, obs), (executed, obs, terminated | truncated)

    _, out = jax.lax.scan(step, (state, obs), (jnp.asarray(actions), jax.random.split(key, len(actions))))
    return jax.device_get(out)


def test_sticky_actions_at_zero_change_nothing():
    # The wrapper draws with a key of its own, so at probability 0 the game sees the same keys.
    actions = np.random.default_rng(0).integers(0, 3, 300)
    base, base_params = gymnax.make("Breakout-MinAtar")
    env, env_params = ppo.make_env("Breakout-MinAtar", 0.0)
    wrapped = sticky_rollout(env, env_params, actions, jax.random.key(5))
    plain = sticky_rollout(base, base_params, actions, jax.random.key(5))
    np.testing.assert_array_equal(wrapped[0], actions)
    np.testing.assert_array_equal(wrapped[1], plain[1])
    np.testing.assert_array_equal(wrapped[2], plain[2])


def test_sticky_actions_repeat_the_executed_action_with_the_given_probability():
    prob, num_steps = 0.25, 20_000
    actions = np.random.default_rng(0).integers(0, 2, num_steps)
    env = StickyActions(ProbeEnv())  # episodes of 2-4 steps: thousands of episode boundaries
    executed, _, done = sticky_rollout(env, StickyParams(ProbeEnv().default_params, prob),
                                       actions, jax.random.key(1))
    previous = np.concatenate([[0], executed[:-1]])  # the first episode starts from action 0 (no-op)
    # Each step executes either the chosen action or the previous executed one, nothing else...
    assert np.all((executed == actions) | (executed == previous))
    # ... and repeats where the choice differs with probability prob (binomial: 4 standard errors).
    differs = actions != previous
    repeated = (executed == previous)[differs].mean()
    assert abs(repeated - prob) < 4 * np.sqrt(prob * (1 - prob) / differs.sum()), repeated
    # The last action carries over into the next episode, as in MinAtar: after a boundary the first
    # step repeats it as often as any other step.
    first = np.concatenate([[False], done[:-1]]) & differs
    assert first.sum() > 1000
    assert abs((executed == previous)[first].mean() - prob) < 4 * np.sqrt(prob * (1 - prob) / first.sum())


def test_play_gif_shows_every_step_of_each_episode():
    # Frames store only what changed (the rest is transparent); decoded, each must show every panel whole.
    rng = np.random.default_rng(0)
    episodes = [rng.random((n, 10, 10, 4)) < 0.1 for n in (6, 4)]
    with Image.open(io.BytesIO(visualize.play_gif(episodes, ["a", "b"]))) as image:
        frames = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]
    assert len(frames) == 6  # the longer episode's length; the shorter one stays on its last step
    size = 10 * visualize.CELL
    for t, frame in enumerate(frames):
        for i, episode in enumerate(episodes):
            panel = frame[visualize.LABEL:visualize.LABEL + size, i * (size + 4):i * (size + 4) + size]
            expected = visualize.PALETTE[visualize.grids_to_pixels(episode[min(t, len(episode) - 1)][None])[0]]
            np.testing.assert_array_equal(panel, expected, err_msg=f"frame {t}, episode {i}")


def test_breakout_behaviour_reads_where_the_ball_was_lost():
    obs = np.zeros((2, 10, 10, 4), np.float32)
    obs[:, 9, 6, visualize.BREAKOUT_PADDLE] = 1  # paddle at column 6
    obs[0, 9, 2, visualize.BREAKOUT_BALL] = 1  # ball lost at column 2
    obs[1, 9, 5, visualize.BREAKOUT_BALL] = 1
    obs[0, 1:4, :, visualize.BREAKOUT_BRICK] = 1  # a full wall: 30 bricks
    obs[1, 1, :7, visualize.BREAKOUT_BRICK] = 1
    lost = visualize.breakout_ball_lost(obs, np.array([True, True]))
    np.testing.assert_array_equal(lost["ball_column"], [2, 5])
    np.testing.assert_array_equal(lost["paddle_column"], [6, 6])
    np.testing.assert_array_equal(lost["bricks_left"], [30, 7])
    assert visualize.breakout_ball_lost(obs, np.array([False, True]))["bricks_left"].tolist() == [7]


def test_rollout_records_which_torso_units_fired():
    args, network, params, mb = loss_setup(hidden_sizes=(8, 4), activation="relu")
    params["torso_0"]["b"] = params["torso_0"]["b"].at[:3].set(-100.0)  # three first-layer units never fire
    env, env_params = ppo.make_env(args.env_id, 0.0)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(1), 4), env_params)
    runner = ppo.RunnerState(train_state=ppo.TrainState(params, None), env_state=env_state, obs=obs,
                             episode_return=jnp.zeros(4), episode_length=jnp.zeros(4, jnp.int32),
                             key=jax.random.key(2))
    _, traj = ppo.collect_trajectories(runner, env, env_params, network, num_steps=5)
    _, _, features = jax.vmap(lambda o: network.apply(params, o, return_features=True))(traj.obs)
    assert features.shape == (5, 4, 12)  # 8 + 4 ReLU features of 4 environments at 5 steps
    np.testing.assert_array_equal(traj.active_units, np.asarray(features > 0).any(axis=1))
    assert not np.asarray(traj.active_units)[:, :3].any()


def test_training_diagnostics_against_numpy_on_one_and_two_devices():
    rng = np.random.default_rng(0)
    n = 64
    actions = np.r_[np.zeros(32), np.ones(16), 2 * np.ones(16)]
    batch = ppo.Batch(obs=jnp.zeros((n, 1)), action=jnp.asarray(actions, jnp.int32),
                      logits=jnp.asarray(rng.normal(size=(n, 3)) * 5, jnp.float32),
                      value=jnp.asarray(rng.normal(size=n), jnp.float32),
                      advantage=jnp.asarray(rng.normal(loc=2.0, size=n), jnp.float32),
                      target=jnp.asarray(rng.normal(size=n), jnp.float32))
    b = jax.device_get(batch)
    # Units 0-3 fired on device 0's share, units 2-5 on device 1's; 6 and 7 on neither: 2 of 8 silent.
    active = jnp.array([[1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0, 0]], bool)
    # Each device's log-ratios, (epochs=1, minibatches=2, rows=2); 2.0 lies beyond the histogram.
    log_ratio = jnp.array([[[[-0.3, 0.1], [0.2, 0.5]]], [[[-0.1, 0.0], [0.4, 2.0]]]])
    expected = {
        "logit_gap_max": (b.logits.max(1) - b.logits.min(1)).max(),
        "advantage_mean": b.advantage.mean(), "advantage_std": b.advantage.std(),
        "value_error": np.sqrt(np.mean((b.target - b.value) ** 2)),
        "silent_units": 2 / 8, "log_ratio_min": -0.3, "log_ratio_max": 2.0,
    }
    log_ratio = jnp.concatenate([log_ratio[0], log_ratio[1]], axis=-1)
    single = jax.jit(diagnostics.training_diagnostics)(batch, active.any(axis=0), log_ratio)
    # The same, with the batch and log-ratios split over two devices as the data-parallel step
    # leaves them: XLA adds the reductions.
    mesh = parallel.make_mesh(2)
    sharded = jax.jit(diagnostics.training_diagnostics)(
        jax.device_put(batch, NamedSharding(mesh, P("envs"))), active.any(axis=0),
        jax.device_put(log_ratio, NamedSharding(mesh, P(None, None, "envs"))))
    for result in (single, sharded):
        for name, value in expected.items():
            np.testing.assert_allclose(result[name], value, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(result["action_frequency"], [0.5, 0.25, 0.25])
        for name, data in (("logits", b.logits), ("value", b.value), ("advantage", b.advantage)):
            h = result["histograms"][name]
            np.testing.assert_array_equal(h["counts"], np.histogram(data, np.asarray(h["edges"]))[0])
            np.testing.assert_allclose([h["edges"][0], h["edges"][-1]], [data.min(), data.max()], rtol=1e-6)
        # Every log-ratio of both devices, the 2.0 in the last bin.
        expected_counts = np.histogram(np.clip(log_ratio, -1, 0.999), np.linspace(-1, 1, 31))[0]
        np.testing.assert_array_equal(result["histograms"]["log_ratio"]["counts"], expected_counts)


def test_data_parallel_epoch_equals_the_single_device_epoch_on_the_whole_minibatch():
    # Two devices, each with half of a minibatch, must take exactly the step one device takes on all
    # of it. The halves have different advantage statistics, so normalising per device would fail,
    # and so would a sum of the gradients or a gradient not shared.
    assert len(jax.devices()) >= 2  # conftest.py asks for two CPU devices
    args = ppo.fill_runtime_fields(ppo.Args(num_envs=8, num_steps=32, num_minibatches=1))
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    keys = jax.random.split(jax.random.key(0), 6)
    n = args.minibatch_size
    mb = ppo.Batch(
        obs=jax.random.bernoulli(keys[0], 0.1, (n, 10, 10, 4)).astype(jnp.float32),
        action=jax.random.randint(keys[1], (n,), 0, 3),
        logits=jax.random.normal(keys[2], (n, 3)),
        value=jax.random.normal(keys[3], (n,)),
        advantage=jnp.concatenate([2.0 + jax.random.normal(keys[4], (n // 2,)),
                                   -1.0 + 3.0 * jax.random.normal(keys[5], (n // 2,))]),
        target=jnp.linspace(-1.0, 3.0, n))
    params = network.init(keys[0], mb.obs)
    optimizer = optax.sgd(1.0)  # an update linear in the gradient: a gradient off by a factor shows
    train_state = ppo.TrainState(params, optimizer.init(params))

    key = jax.random.key(1)  # one minibatch: the order within it does not change the step
    epoch = functools.partial(ppo.update_epoch, network=network, args=args)
    (single, _), _ = jax.jit(functools.partial(epoch, optimizer=optimizer))(train_state, key, mb)
    step = jax.shard_map(
        functools.partial(epoch, optimizer=parallel.with_mean_gradient(optimizer),
                          moments=ppo.moments_over_devices),
        mesh=parallel.make_mesh(2), in_specs=(P(), P(), P("envs")), out_specs=(P(), P()),
        check_vma=False)
    (sharded, _), _ = jax.jit(step)(train_state, key, mb)

    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), single, params)
    assert min(jax.tree.leaves(moved)) > 1e-4  # a real step, not a no-op
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_parallel_update_step_keeps_every_device_on_the_same_parameters():
    # After a few iterations on two devices, each with its share of the environments, the
    # replicated parameters must still be equal on both.
    args = ppo.fill_runtime_fields(ppo.Args(num_envs=8, num_steps=16, num_minibatches=2,
                                            update_epochs=2, total_timesteps=8 * 16 * 3))
    env, env_params = gymnax.make(args.env_id)
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    optimizer = ppo.make_optimizer(args)
    mesh = parallel.make_mesh(2)
    runner = jax.jit(functools.partial(ppo.init_runner, env=env, env_params=env_params, network=network,
                                       optimizer=optimizer, num_envs=args.num_envs),
                     out_shardings=parallel.shardings(mesh, ppo.RUNNER_SPECS))(jax.random.key(0))
    update_step = ppo.make_parallel_update_step(args, env, env_params, network, optimizer, mesh)
    start = runner.train_state.params
    for _ in range(args.num_iterations):
        runner, metrics = update_step(runner)
    for leaf, first in zip(jax.tree.leaves(runner.train_state.params), jax.tree.leaves(start)):
        shards = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        assert len(shards) == 2
        np.testing.assert_array_equal(shards[0], shards[1])
        assert not np.allclose(shards[0], np.asarray(first))  # they moved
    assert runner.obs.sharding.spec == P("envs")


def test_loss_metrics_average_every_epoch_and_minibatch():
    # The first gradient step sees the rollout's own parameters (ratio 1: nothing clipped); an Adam
    # step of size 1 then moves the policy so far that every later step clips everything. Over 2 epochs
    # x 2 minibatches the mean clip fraction is therefore 3/4: 1 would mean only the last step was
    # reported, 0 only the first.
    args = ppo.fill_runtime_fields(ppo.Args(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=2,
                                            learning_rate=1.0, anneal_lr=False, total_timesteps=128))
    env, env_params = gymnax.make(args.env_id)
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    optimizer = ppo.make_optimizer(args)
    runner = ppo.init_runner(jax.random.key(0), env, env_params, network, optimizer, args.num_envs)
    _, metrics = jax.jit(ppo.make_update_step(args, env, env_params, network, optimizer))(runner)
    assert np.isclose(metrics["clipfrac"], 0.75, atol=0.02)


# ------------------------------------------------------------------------------------------------
# Learning: a probe with a known optimum, then Breakout against the random policy
# ------------------------------------------------------------------------------------------------
def test_update_step_learns_the_probe_optimum_and_bootstraps_through_truncation():
    # Horizon 100 never comes: every episode is truncated at 4 steps, so nothing ever terminates and
    # the true value of every state under the optimal policy (always action 1) is 1 / (1 - gamma) = 2.
    # Treating truncation as termination would instead teach values between 1 and 1.875.
    env = ProbeEnv(horizons=(100,))
    env_params = env.default_params
    args = ppo.fill_runtime_fields(ppo.Args(
        num_envs=16, num_steps=16, num_minibatches=4, update_epochs=4, gamma=0.5, learning_rate=3e-3,
        anneal_lr=False, total_timesteps=16 * 16 * 150, ent_coef=0.0, clip_vloss=False))
    network = ppo.make_network(2, args.hidden_sizes, args.activation, args.layer_norm)
    optimizer = ppo.make_optimizer(args)
    runner = ppo.init_runner(jax.random.key(0), env, env_params, network, optimizer, args.num_envs)
    update_step = jax.jit(ppo.make_update_step(args, env, env_params, network, optimizer))
    for _ in range(args.num_iterations):
        runner, _ = update_step(runner)

    probe_obs = jnp.array([[t / 10.0, 1.0] for t in range(4)])
    logits, values = network.apply(runner.train_state.params, probe_obs)
    assert np.all(jax.nn.softmax(logits)[:, 1] > 0.95)
    np.testing.assert_allclose(values, 2.0, atol=0.15)


def random_policy_return(env_id: str, episodes: int = 256) -> float:
    env, env_params = gymnax.make(env_id)
    uniform = lambda params, obs: jnp.zeros((obs.shape[0], env.num_actions))  # noqa: E731
    result = evaluate(jax.random.key(0), None, False, env=env, env_params=env_params, policy_apply=uniform,
                      num_episodes=episodes, max_steps=env_params.max_steps_in_episode + 1)
    return float(result.returns.mean())


def test_short_breakout_run_learns_what_correct_code_reaches(tmp_path):
    # At 250k steps the correct code's sampled return was 13.0-16.7 over seeds 1-7, and a rollout that
    # stores v(next observation) scored 4.3-5.8 (docs/ppo_breakout.md, "Tests"): the bar sits between.
    # The bar was measured without LayerNorm, sticky actions and the convolution: the test pins those flags.
    result = run_in_process(tmp_path, "--total-timesteps", "250000", "--eval-episodes", "64", "--no-save-model",
                            "--no-layer-norm", "--sticky-action-prob", "0", "--conv-channels", "0")
    assert result.returncode == 0, result.stderr
    summary = json.load(open(glob.glob(str(tmp_path / "runs" / "*" / "summary.json"))[0]))
    random_return = random_policy_return("Breakout-MinAtar")
    trained = summary["eval"]["sampled"]["mean"]
    assert random_return < 1.0 and trained > 10.0, (trained, random_return)


# ------------------------------------------------------------------------------------------------
# The script as a user runs it
# ------------------------------------------------------------------------------------------------
TINY = ["--total-timesteps", "4096", "--num-envs", "16", "--num-steps", "128", "--num-minibatches", "4",
        "--update-epochs", "1", "--eval-episodes", "8", "--seed", "3"]
TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
        "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
        "losses/clipfrac", "losses/explained_variance",
        "eval/sampled_return", "eval/greedy_return", "eval/sticky_0.1/sampled_return",
        "eval/sticky_0.1/greedy_return", "eval/greedy_distinct_episodes"]
DIAGNOSTIC_TAGS = [f"diagnostics/{name}" for name in diagnostics.DIAGNOSTICS] + [
    f"diagnostics/action_{a}_frequency" for a in range(3)]


def only_run_dir(path) -> str:
    (run_dir,) = glob.glob(str(path / "runs" / "*"))
    return run_dir


def read_summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tiny_network_params(args: ppo.Args) -> hk.Params:
    """Freshly initialised parameters of the network `args` describes: the shapes a saved model must have."""
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm, args.conv_channels)
    return network.init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny training run of the script, shared by the tests that read what it leaves."""
    path = tmp_path_factory.mktemp("tiny")
    result = run_in_process(path, *TINY)
    assert result.returncode == 0, result.stderr
    return result, only_run_dir(path)


def test_script_logs_tensorboard_and_writes_summary(tiny_run):
    result, run_dir = tiny_run
    assert "eval (sampled, 8 episodes)" in result.stdout and "eval ( greedy, 8 episodes)" in result.stdout
    assert os.path.basename(run_dir).startswith("Breakout-MinAtar__ppo__3__")

    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert tag in scalars, tag
    assert len(scalars["losses/policy_loss"]) == 2  # one point per iteration
    assert [step for step, _ in scalars["charts/SPS"]] == [2048, 4096]
    learning_rates = [value for _, value in scalars["charts/learning_rate"]]
    # 2 iterations x 1 epoch x 4 minibatches: the last updates of each iteration are numbers 3 and 7 of 8.
    assert learning_rates == pytest.approx([5e-3 * (1 - 3 / 8), 5e-3 * (1 - 7 / 8)])
    assert all(0 < value < 1000 for _, value in scalars["charts/episodic_length"])  # never a placeholder 0
    for tag in DIAGNOSTIC_TAGS:
        assert len(scalars[tag]) == 2 and np.isfinite([value for _, value in scalars[tag]]).all(), tag
    frequencies = np.array([[value for _, value in scalars[f"diagnostics/action_{a}_frequency"]]
                            for a in range(3)])
    np.testing.assert_allclose(frequencies.sum(0), 1.0, rtol=1e-5)
    events = EventAccumulator(run_dir, size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    assert any("hyperparameters" in tag for tag in events.Tags()["tensors"])
    assert set(events.Tags()["histograms"]) == {f"histograms/{name}" for name in
                                                 ("logits", "log_ratio", "advantage", "value")}
    assert len(events.Histograms("histograms/logits")) == 2  # every tenth of training (here: each)
    assert set(events.Tags()["images"]) == {"eval/play", "eval/behaviour", "charts/learning_curve"}
    for name, frames in (("play.gif", 2), ("behaviour.png", 1), ("learning_curve.png", 1)):
        with Image.open(os.path.join(run_dir, name)) as image:  # a valid image, decoded to the end
            image.load()
            assert getattr(image, "n_frames", 1) >= frames and min(image.size) > 100, name

    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["env_id"] == "Breakout-MinAtar" and summary["seed"] == 3
    assert summary["total_timesteps"] == 4096 and summary["global_step"] == 4096
    for protocol in (summary["eval"], summary["eval"]["sticky_0.1"]):
        for mode in ("sampled", "greedy"):
            numbers = protocol[mode]
            assert numbers["min"] <= numbers["mean"] <= numbers["max"]
            assert 1 <= numbers["distinct_episodes"] <= 8
            assert sum(numbers["return_counts"].values()) == 8
            assert sum(numbers["ball_lost"]["bricks_left"].values()) == numbers["terminated"]
    assert summary["eval"]["greedy"]["distinct_episodes"] <= 2  # a deterministic game: one per ball start
    assert summary["eval_episodes"] == 8
    for key in ("compile_seconds", "train_seconds", "sps", "wall_seconds"):
        assert summary[key] > 0
    assert summary["args"]["num_envs"] == 16 and summary["args"]["batch_size"] == 2048
    assert summary["args"]["num_devices"] == 2  # the data-parallel path ran (conftest.py: 2 devices)
    assert summary["model"] == os.path.join("runs", os.path.basename(run_dir), "model.safetensors")


def test_same_seed_and_arguments_replay_the_run_bit_for_bit(tiny_run, tmp_path):
    _, first_dir = tiny_run
    result = run_in_process(tmp_path, *TINY)
    assert result.returncode == 0, result.stderr
    second_dir = only_run_dir(tmp_path)
    first, second = read_scalars(first_dir), read_scalars(second_dir)
    del first["charts/SPS"], second["charts/SPS"]  # wall-clock speed, the one thing that may differ
    assert first == second
    assert read_summary(first_dir)["eval"] == read_summary(second_dir)["eval"]


def test_diagnostics_observe_training_without_changing_it(tiny_run, tmp_path):
    _, with_dir = tiny_run
    result = run_in_process(tmp_path, *TINY, "--no-diagnostics")
    assert result.returncode == 0, result.stderr
    without_dir = only_run_dir(tmp_path)
    with_, without = read_scalars(with_dir), read_scalars(without_dir)
    assert not any(tag.startswith("diagnostics/") for tag in without)
    for tag in without:
        if tag != "charts/SPS":
            assert without[tag] == with_[tag], tag


def test_a_saved_model_evaluates_to_the_training_runs_own_evaluation(tiny_run, tmp_path):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "8", "--seed", "3",
                        "--exp-name", "reloaded")
    assert result.returncode == 0, result.stderr
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["status"] == "completed" and summary["load_model"] == model
    assert summary["eval"] == read_summary(train_dir)["eval"]
    assert "model" not in summary  # evaluating a model never writes another one


def test_a_saved_model_brings_its_network_arguments_with_it(tmp_path):
    # A model of another width, activation, convolution and game evaluates without its flags: the
    # header gives them.
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "16", "--activation", "relu", "--env-id", "Asterix-MinAtar",
                                    "--conv-channels", "2"])
    env, env_params = ppo.make_env(args.env_id, 0.0)
    obs = jnp.zeros((1, *env.observation_space(env_params).shape))
    params = ppo.make_network(env.num_actions, args.hidden_sizes, args.activation,
                              args.layer_norm, args.conv_channels).init(jax.random.key(0), obs)
    model = str(tmp_path / "asterix.safetensors")
    model_file.save_model(model, params, network_args(args), {})
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "4", "--hidden-sizes", "16")
    assert result.returncode == 0, result.stderr
    saved = read_summary(only_run_dir(tmp_path))["args"]
    assert (saved["env_id"], saved["hidden_sizes"], saved["activation"], saved["conv_channels"]) == (
        "Asterix-MinAtar", [16], "relu", 2)


def test_a_run_with_a_convolution_trains_and_saves_it(tmp_path):
    result = run_in_process(tmp_path, *TINY, "--conv-channels", "2")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert read_summary(run_dir)["status"] == "completed"
    tensors, header = files.read_safetensors(os.path.join(run_dir, "model.safetensors"), "--load-model")
    assert tensors["conv/w"].shape == (3, 3, 4, 2) and json.loads(header["conv_channels"]) == 2


def test_a_model_file_from_before_the_convolution_evaluates_without_one(tmp_path):
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "16", "--conv-channels", "0"])
    older = str(tmp_path / "older.safetensors")
    header = {k: v for k, v in network_args(args).items() if k != "conv_channels"}
    model_file.save_model(older, tiny_network_params(args), header, {})
    result = run_in_process(tmp_path, "--load-model", older, "--eval-episodes", "4")
    assert result.returncode == 0, result.stderr
    assert read_summary(only_run_dir(tmp_path))["args"]["conv_channels"] == 0


def test_plot_curves_overlays_runs_and_never_overwrites(tiny_run, tmp_path):
    _, run_dir = tiny_run
    plot = os.path.join(os.path.dirname(SCRIPT), "benchmarks", "plot_curves.py")
    out = tmp_path / "curves.png"
    command = [sys.executable, plot, run_dir, run_dir, "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    with Image.open(out) as image:
        image.load()
    written = out.read_bytes()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: --out {out} exists; choose another name"]
    assert out.read_bytes() == written


def test_saved_model_round_trips_with_the_network_arguments_in_its_header(tmp_path):
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4", "--activation", "relu",
                                    "--conv-channels", "0"])
    params = tiny_network_params(args)
    path = str(tmp_path / "model.safetensors")
    model_file.save_model(path, params, network_args(args), {"global_step": "123"})
    assert os.listdir(tmp_path) == ["model.safetensors"]  # the temporary file was renamed, not left
    loaded = model_file.load_model(path, network_args(args), params)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    # Another width, activation or game is refused, naming the flag and both values.
    for flags, message in [(["--hidden-sizes", "8", "8"], "--hidden-sizes 8 4, not 8 8"),
                           (["--hidden-sizes", "8", "4"], "--activation relu, not crelu"),
                           (["--hidden-sizes", "8", "4", "--activation", "relu",
                             "--env-id", "Asterix-MinAtar"], "--env-id Breakout-MinAtar, not Asterix-MinAtar")]:
        other = network_args(tyro.cli(ppo.Args, args=[*flags, "--conv-channels", "0"]))
        with pytest.raises(ValueError, match=message):
            model_file.load_model(path, other, params)
    # With a convolution, and without: the header says which.
    conv = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4", "--activation", "relu", "--conv-channels", "2"])
    conv_path = str(tmp_path / "conv.safetensors")
    model_file.save_model(conv_path, tiny_network_params(conv), network_args(conv), {})
    with pytest.raises(ValueError, match="--conv-channels 2, not 0"):
        model_file.load_model(conv_path, network_args(args), params, ppo.ADDED_ARGS)
    # A file saved before conv_channels existed has no convolution.
    older = str(tmp_path / "older.safetensors")
    model_file.save_model(older, params, {k: v for k, v in network_args(args).items() if k != "conv_channels"}, {})
    assert model_file.read_network_args(older, ppo.NETWORK_ARGS, ppo.ADDED_ARGS)["conv_channels"] == 0
    model_file.load_model(older, network_args(args), params, ppo.ADDED_ARGS)
    # A header that lies about the network: the tensors' shapes are checked too.
    other = ppo.make_network(3, (8, 5), "relu", False).init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))
    with pytest.raises(ValueError, match="does not hold the parameters of this network"):
        model_file.load_model(path, network_args(args), other)


def test_a_failed_save_leaves_neither_a_model_nor_a_temporary_file(tmp_path, monkeypatch):
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4"])
    def full_disk(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        model_file.save_model(str(tmp_path / "model.safetensors"), tiny_network_params(args), network_args(args),
                              {})
    assert os.listdir(tmp_path) == []


def damaged_copies(model: str, folder) -> dict[str, str]:
    """Copies of a saved model, damaged in the ways files get damaged."""
    with open(model, "rb") as f:
        data = f.read()
    header_length = int.from_bytes(data[:8], "little")
    with_nan = bytearray(data)
    with_nan[8 + header_length:8 + header_length + 4] = np.array([np.nan], np.float32).tobytes()
    damaged = {"truncated": data[: len(data) // 2], "header only": data[:8 + header_length],
               "garbage": b"not a model at all", "empty": b"", "a NaN weight": bytes(with_nan)}
    paths = {}
    for name, content in damaged.items():
        paths[name] = str(folder / f"{name.replace(' ', '_')}.safetensors")
        with open(paths[name], "wb") as f:
            f.write(content)
    return paths


def run_main(monkeypatch, capsys, cwd, *flags) -> tuple[int, list[str]]:
    """main() in this process, as `python ppo_breakout.py FLAGS` run in cwd: (exit status, stderr lines)."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["ppo_breakout.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        ppo.main()
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


def test_a_damaged_or_mismatched_model_is_refused_with_one_line(tiny_run, tmp_path, monkeypatch, capsys):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    folder = tmp_path / "files"
    folder.mkdir()
    cases = {name: ([path], "not a readable safetensors file")
             for name, path in damaged_copies(model, folder).items()}
    cases["a NaN weight"] = (cases["a NaN weight"][0], "holds non-finite parameters")
    cases["missing"] = ([str(folder / "nothing.safetensors")], "no such file")
    cases["a directory"] = ([str(folder)], f"--load-model {folder} is a directory, not a file")
    garbled = str(folder / "garbled.safetensors")
    tensors, header = files.read_safetensors(model, "--load-model")
    safetensors.numpy.save_file(tensors, garbled, header | {"hidden_sizes": "[64,"})
    cases["a garbled header"] = ([garbled], f"{garbled}: the header's hidden_sizes is not valid JSON ('[64,')")
    # A flag given explicitly that contradicts the header (one the header agrees with is fine).
    cases["other widths"] = ([model, "--hidden-sizes", "64", "32"], "--hidden-sizes 64 64, not 64 32")
    cases["other game"] = ([model, "--env-id", "Asterix-MinAtar", "--hidden-sizes", "64", "64"],
                           "--env-id Breakout-MinAtar, not Asterix-MinAtar")
    for name, (flags, message) in cases.items():
        status, err = run_main(monkeypatch, capsys, tmp_path, "--load-model", *flags)
        assert status == 2, name
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (name, err)
        assert not (tmp_path / "runs").exists(), name


BAD_INPUTS = [
    (["--num-envs", "0"], "--num-envs must be positive"),
    (["--num-steps", "-5"], "--num-steps must be positive"),
    (["--update-epochs", "0"], "--update-epochs must be positive"),
    (["--total-timesteps", "-1"], "--total-timesteps must be positive"),
    (["--num-minibatches", "7"], "does not divide into --num-minibatches 7"),
    (["--total-timesteps", "100"], "less than one batch"),
    (["--total-timesteps", "99999999999999"], "more than the optimizer can count"),
    (["--eval-episodes", "0"], "--eval-episodes must be positive"),
    (["--eval-episodes", "100000000"], "--eval-episodes 100000000 would need about"),
    (["--num-envs", "1000000", "--num-steps", "1000", "--total-timesteps", str(10**10)],
     "training would need about"),
    (["--hidden-sizes", "100000000"], "training would need about"),
    (["--env-id", "Breakout-Atari"], "unknown --env-id 'Breakout-Atari'"),
    (["--env-id", "Pendulum-v1"], "continuous actions"),
    (["--learning-rate", "0"], "--learning-rate must be a positive finite number"),
    (["--learning-rate", "inf"], "--learning-rate must be a positive finite number, got inf"),
    (["--learning-rate", "nan"], "--learning-rate must be a positive finite number, got nan"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be a positive finite number"),
    (["--ent-coef", "-0.1"], "--ent-coef must be a non-negative finite number"),
    (["--ent-coef", "inf"], "--ent-coef must be a non-negative finite number, got inf"),
    (["--vf-coef", "nan"], "--vf-coef must be a non-negative finite number, got nan"),
    (["--clip-coef", "0"], "--clip-coef must be in (0, 1]"),
    (["--clip-coef", "inf"], "--clip-coef must be in (0, 1]"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--gae-lambda", "nan"], "--gae-lambda must be in [0, 1]"),
    (["--seed", "-1"], "--seed must be in [0, 4294967295]"),
    (["--seed", str(2**32)], "--seed must be in [0, 4294967295]"),
    (["--hidden-sizes", "64", "0"], "--hidden-sizes must be one or more positive widths"),
    (["--hidden-sizes"], "--hidden-sizes must be one or more positive widths"),
    (["--conv-channels", "-1"], "--conv-channels must be 0 (none) or positive, got -1"),
    (["--conv-channels", "8", "--env-id", "CartPole-v1"],
     "--conv-channels needs a grid of observations (height, width, channels); CartPole-v1's are of shape (4,)"),
    (["--exp-name", "../../../escape"], "--exp-name must be a plain name"),
    (["--exp-name", "a/b"], "--exp-name must be a plain name"),
    (["--exp-name", ".."], "--exp-name must be a plain name"),
    (["--exp-name", ""], "--exp-name must be a plain name"),
    (["--exp-name", "x" * 101], "--exp-name must be a plain name"),
    (["--num-devices", "-1"], "--num-devices must be 0 (automatic) or positive"),
    (["--num-devices", "3"], "--num-devices 3 is more than the 2 devices JAX has"),
    (["--num-envs", "63", "--num-minibatches", "1", "--num-devices", "2"],
     "--num-devices 2 must divide both --num-envs 63"),
    (["--num-envs", "2", "--num-steps", "3", "--num-minibatches", "2", "--num-devices", "2"],
     "and the minibatch size 3"),
    (["--jax-cache-dir", __file__], "is not a directory"),
    # tyro's own parse errors, condensed to one line
    (["--num-envs", "abc"], "Error parsing --num-envs"),
    (["--activation", "tanh"], "invalid choice 'tanh' for argument '--activation'"),
    (["--no-such-flag", "1"], "Unrecognized options: --no-such-flag"),
    (["--seed"], "Missing value for argument '--seed'"),
]


@pytest.mark.parametrize("flags, message", BAD_INPUTS, ids=[" ".join(f)[:40] for f, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(flags, message, tmp_path, monkeypatch, capsys):
    status, err = run_main(monkeypatch, capsys, tmp_path, *flags)
    assert status == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_bad_input_from_the_command_line_exits_2_with_one_line(tmp_path):
    result = run_script(tmp_path, "--num-envs", "64", "--num-steps", "100", "--num-minibatches", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: the batch (num_envs * num_steps = 6400) does not divide into --num-minibatches 3"]
    assert os.listdir(tmp_path) == []


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_finite_parameters(tmp_path):
    # Adam steps of size 1e30 overflow the network within the first iteration.
    result = run_in_process(tmp_path, *TINY, "--learning-rate", "1e30", "--no-anneal-lr")
    assert result.returncode == 3
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: losses/") and "non-finite in iteration 1;" in line
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "non_finite" and summary["non_finite_iteration"] == 1
    assert summary["non_finite"] in line and "eval" not in summary
    assert "charts/SPS" in read_scalars(run_dir)  # the log was flushed and reads back
    args = tyro.cli(ppo.Args, args=TINY)
    saved = model_file.load_model(os.path.join(run_dir, "model.safetensors"), network_args(args), tiny_network_params(args))
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(saved))


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_cleanly_after_the_current_iteration(signum, status, tmp_path):
    total = 2048 * 10_000  # far longer than the test waits
    process = subprocess.Popen([sys.executable, SCRIPT, *TINY, "--total-timesteps", str(total)],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert "logging to" in process.stdout.readline()  # compiled; training starts
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()  # a no-op once it has exited; never leave a 20M-step run behind
    assert process.returncode == status, stderr
    assert "Traceback" not in stderr
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and 0 < summary["global_step"] < total
    # It stopped at the end of an iteration, and everything up to there was logged.
    assert len(read_scalars(run_dir)["charts/SPS"]) == summary["global_step"] // 2048
    args = tyro.cli(ppo.Args, args=TINY)
    model_file.load_model(os.path.join(run_dir, "model.safetensors"), network_args(args), tiny_network_params(args))


@pytest.mark.parametrize("activation, feature_factor, gain", [("relu", 1, np.sqrt(2)), ("crelu", 2, 1.0)])
def test_hidden_sizes_and_activation_set_the_shared_torso(activation, feature_factor, gain):
    # A CReLU layer of width w passes 2w features on, so each next layer reads twice as many inputs.
    # Its orthogonal init has gain 1 (CReLU keeps the norm), a ReLU layer's sqrt(2): unit columns x gain.
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "32", "16", "8", "--activation", activation])
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    params = network.init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))
    f = feature_factor
    shapes = [params[f"torso_{i}"]["w"].shape for i in range(3)]
    assert shapes == [(400, 32), (32 * f, 16), (16 * f, 8)]
    assert params["policy"]["w"].shape == (8 * f, 3) and params["value"]["w"].shape == (8 * f, 1)
    np.testing.assert_allclose(np.linalg.norm(params["torso_0"]["w"], axis=0), gain, rtol=1e-5)


@pytest.mark.parametrize("height, width", [(10, 10), (7, 9)])  # MinAtar's grid, and odd sides
def test_the_grid_convolution_is_one_3x3_filter_bank_at_every_cell_then_2x2_means(height, width):
    # Written out cell by cell: zero padding at the edges (the output keeps the grid's size before
    # pooling), ReLU, then the mean of each 2x2 block.
    conv = hk.without_apply_rng(hk.transform(lambda o: layers.conv_relu_pool(o, 3)))
    obs = jax.random.bernoulli(jax.random.key(0), 0.4, (2, height, width, 4)).astype(jnp.float32)
    params = conv.init(jax.random.key(1), obs)
    assert params["conv"]["w"].shape == (3, 3, 4, 3) and params["conv"]["b"].shape == (3,)
    # Random filters and biases (the biases start at 0), so that each channel's bias shows.
    params = {"conv": {"w": jax.random.normal(jax.random.key(2), (3, 3, 4, 3)),
                       "b": jax.random.normal(jax.random.key(3), (3,))}}
    w, b = (np.asarray(params["conv"][k], np.float64) for k in ("w", "b"))
    padded = np.pad(np.asarray(obs, np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    cells = np.zeros((2, height, width, 3))
    for y in range(height):
        for x in range(width):
            cells[:, y, x] = np.einsum("nijc,ijcf->nf", padded[:, y:y + 3, x:x + 3], w) + b
    rows, cols = height // 2, width // 2  # an odd last row or column is dropped
    expected = np.maximum(cells[:, :2 * rows, :2 * cols], 0).reshape(2, rows, 2, cols, 2, 3)
    expected = expected.mean(axis=(2, 4))
    np.testing.assert_allclose(conv.apply(params, obs), expected, rtol=1e-5, atol=1e-6)


def test_conv_channels_put_the_grid_convolution_before_the_torso():
    obs = jax.random.bernoulli(jax.random.key(0), 0.4, (2, 10, 10, 4)).astype(jnp.float32)
    network = ppo.make_network(3, (32, 16), "crelu", True, conv_channels=8)
    params = network.init(jax.random.key(1), obs)
    assert params["conv"]["w"].shape == (3, 3, 4, 8)
    assert params["torso_0"]["w"].shape == (5 * 5 * 8, 32)  # the pooled 5x5 grid of 8 channels
    conv = hk.without_apply_rng(hk.transform(lambda o: layers.conv_relu_pool(o, 8)))
    torso_input = conv.apply({"conv": params["conv"]}, obs).reshape(2, -1)
    pre_activation = torso_input @ params["torso_0"]["w"] + params["torso_0"]["b"]
    _, _, features = network.apply(params, obs, return_features=True)
    normed = (pre_activation - pre_activation.mean(-1, keepdims=True)) / jnp.sqrt(
        pre_activation.var(-1, keepdims=True) + 1e-5)  # LayerNorm at its initial scale 1, offset 0
    np.testing.assert_allclose(features[:, :32] - features[:, 32:64], normed, rtol=1e-4, atol=1e-4)
    assert "conv" not in ppo.make_network(3, (32, 16), "crelu", True).init(jax.random.key(1), obs)


def test_every_activation_the_cli_accepts_has_a_gain():
    assert set(typing.get_args(ppo.Args.__annotations__["activation"])) == set(ppo.ACTIVATIONS)


def test_crelu_passes_each_input_on_in_one_half():
    x = jnp.array([[-1.5, 0.0, 2.0]])
    np.testing.assert_array_equal(ppo.crelu(x), [[0.0, 0.0, 2.0, 1.5, 0.0, 0.0]])


def test_importing_the_script_changes_nothing_global():
    # Its start-up settings (one JAX device per core, the imports frozen out of the garbage
    # collector) belong to a run of the script, not to a process that imports it.
    code = ("import gc, os; n = gc.get_freeze_count(); import ppo_breakout; "
            "assert gc.isenabled() and gc.get_freeze_count() == n; "
            "assert 'JAX_NUM_CPU_DEVICES' not in os.environ; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_default_device_count_is_two_whatever_the_machine_has():
    # A seed is one run only on one device count: the default must not follow the core count.
    code = ("import ppo_breakout as p; print(p.fill_runtime_fields(p.Args()).num_devices, "
            "p.fill_runtime_fields(p.Args(num_envs=63, num_minibatches=1)).num_devices)")
    for devices in ("4", "8"):
        env = os.environ | {"JAX_NUM_CPU_DEVICES": devices}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        assert done.stdout.split() == ["2", "1"], done.stderr  # 63 environments do not split in two


def test_approx_kl_is_the_low_variance_k3_estimator_not_the_naive_one():
    # k3 = (r - 1) - log r over the minibatch's actions; the naive k1 = -log r has the same mean in
    # expectation but a far larger variance, and goes negative (http://joschu.net/blog/kl-approx.html).
    args, network, params, mb = loss_setup()
    noise = 0.5 * jax.random.normal(jax.random.key(1), mb.logits.shape)
    mb = mb._replace(logits=mb.logits + noise)  # the "old" policy differs from the current one
    _, info = ppo.ppo_loss(params, network, mb, args)
    metrics = ppo.loss_metrics(info, args.clip_coef)
    rows = np.arange(len(mb.action))
    new = np.asarray(jax.nn.log_softmax(network.apply(params, mb.obs)[0]), np.float64)[rows, mb.action]
    old = np.asarray(jax.nn.log_softmax(mb.logits), np.float64)[rows, mb.action]
    log_r = new - old
    np.testing.assert_allclose(metrics["approx_kl"], np.mean(np.expm1(log_r) - log_r), rtol=1e-4)
    assert abs(metrics["approx_kl"] - np.mean(-log_r)) > 0.05  # not k1
    assert metrics["approx_kl"] > 0


def test_the_compilation_cache_is_capped(tiny_run):
    # A search compiles a program per setting: without a cap the persistent cache grows without bound.
    assert jax.config.jax_compilation_cache_max_size == startup.CACHE_MAX_BYTES > 0


@pytest.mark.parametrize("layer_norm", [True, False])
def test_layer_norm_normalises_each_torso_layers_pre_activations_per_sample(layer_norm):
    network = ppo.make_network(3, (64, 32), "crelu", layer_norm)
    obs = jax.random.bernoulli(jax.random.key(0), 0.3, (16, 10, 10, 4)).astype(jnp.float32)
    params = network.init(jax.random.key(1), obs)
    params = jax.tree.map(lambda x: 3.0 * x, params)  # LayerNorm's scale too: 3, its offset 0
    _, _, features = network.apply(params, obs, return_features=True)
    for start, width in ((0, 64), (128, 32)):  # CReLU: [relu(x), relu(-x)] gives x back
        x = features[:, start:start + width] - features[:, start + width:start + 2 * width]
        normalised = np.allclose(x.mean(-1), 0.0, atol=1e-4) and np.allclose(x.std(-1), 3.0, rtol=1e-3)
        assert normalised == layer_norm


def test_a_games_row_fills_the_fields_the_command_line_leaves_unset():
    # Asterix trains with 2 epochs unless --update-epochs says otherwise; other games keep Args'.
    def parse(*argv):
        return cli.parse_args(ppo.Args, ppo.check_args, "", list(argv), ppo.take_saved_args)

    assert ppo.GAME_DEFAULTS["Asterix-MinAtar"] == {"update_epochs": 2}
    assert parse("--env-id", "Asterix-MinAtar").update_epochs == 2
    assert parse("--env-id", "Asterix-MinAtar", "--update-epochs", "4").update_epochs == 4
    assert parse("--env-id", "Breakout-MinAtar").update_epochs == 4
    assert parse().update_epochs == ppo.Args.update_epochs == 4

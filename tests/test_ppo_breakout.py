"""Tests of ppo_breakout.py's algorithm in the script's reading order (network, rollout, GAE,
losses, update, metrics, diagnostics), against plain-Python references, the libraries' functions
and a probe environment with known answers. Its data-parallel wiring and argument checks:
test_ppo_breakout_wiring.py; the script run as a user runs it: test_ppo_breakout_run.py."""

import dataclasses
import typing

import gymnax
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import rlax
import tyro
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ppo_breakout as ppo
from helpers import (
    always_action_one,
    assert_truncated_steps_carry_the_value_of_final_obs,
    probe_runner,
)
from probe_envs import ProbeEnv
from utils import layers, parallel


# --------------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------------
def test_crelu_passes_each_input_on_in_one_half():
    x = jnp.array([[-1.5, 0.0, 2.0]])
    np.testing.assert_array_equal(ppo.crelu(x), [[0.0, 0.0, 2.0, 1.5, 0.0, 0.0]])


def test_every_activation_the_cli_accepts_has_a_gain():
    assert set(typing.get_args(ppo.Args.__annotations__["activation"])) == set(ppo.ACTIVATIONS)


@pytest.mark.parametrize("activation, feature_factor, gain",
                         [("relu", 1, np.sqrt(2)), ("crelu", 2, 1.0)])
def test_hidden_sizes_and_activation_set_the_shared_torso(activation, feature_factor, gain):
    # A CReLU layer of width w passes 2w features on, so each next layer reads twice as many inputs.
    # Its orthogonal init has gain 1 (CReLU keeps the norm), a ReLU layer's sqrt(2): unit columns x
    # gain.
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "32", "16", "8", "--activation", activation])
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    params = network.init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))
    f = feature_factor
    shapes = [params[f"torso_{i}"]["w"].shape for i in range(3)]
    assert shapes == [(400, 32), (32 * f, 16), (16 * f, 8)]
    assert params["policy"]["w"].shape == (8 * f, 3) and params["value"]["w"].shape == (8 * f, 1)
    np.testing.assert_allclose(np.linalg.norm(params["torso_0"]["w"], axis=0), gain, rtol=1e-5)


@pytest.mark.parametrize("layer_norm", [True, False])
def test_layer_norm_normalises_each_torso_layers_pre_activations_per_sample(layer_norm):
    network = ppo.make_network(3, (64, 32), "crelu", layer_norm)
    obs = jax.random.bernoulli(jax.random.key(0), 0.3, (16, 10, 10, 4)).astype(jnp.float32)
    params = network.init(jax.random.key(1), obs)
    params = jax.tree.map(lambda x: 3.0 * x, params)  # LayerNorm's scale too: 3, its offset 0
    _, _, features = network.apply(params, obs, return_features=True)
    for start, width in ((0, 64), (128, 32)):  # CReLU: [relu(x), relu(-x)] gives x back
        x = features[:, start:start + width] - features[:, start + width:start + 2 * width]
        normalised = (np.allclose(x.mean(-1), 0.0, atol=1e-4)
                      and np.allclose(x.std(-1), 3.0, rtol=1e-3))
        assert normalised == layer_norm


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


# --------------------------------------------------------------------------------------------------
# Rollout: what each step stores, on a probe environment and on Breakout
# --------------------------------------------------------------------------------------------------
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
    mb = ppo.Batch(obs=obs, action=jax.random.randint(keys[2], (64,), 0, 3), logits=logits,
                   value=values, advantage=3.0 + 2.0 * jax.random.normal(keys[3], (64,)),
                   target=values + 1.0)
    return args, network, params, mb


def test_rollout_records_only_completed_episodes_and_the_pre_reset_value():
    # episodes of 2 or 3 steps, or 4 (truncated)
    env, env_params = ProbeEnv(), ProbeEnv().default_params
    network = hk.without_apply_rng(hk.transform(always_action_one))

    _, traj = ppo.collect_trajectories(probe_runner(jax.random.key(1)), env, env_params, network,
                                       num_steps=12)

    done = np.asarray(traj.terminated | traj.truncated)
    lengths, returns = np.asarray(traj.episode_length), np.asarray(traj.episode_return)
    assert np.all(lengths[~done] == 0) and np.all(returns[~done] == 0)
    assert set(lengths[done]) <= {2, 3, 4} and np.array_equal(returns[done], lengths[done])
    assert np.all(lengths[np.asarray(traj.truncated)] == 4)
    assert np.all(np.asarray(traj.terminated)[lengths == 4] == False)  # noqa: E712 (the time limit, not the game)
    assert (np.asarray(traj.terminated) & done).any()
    assert_truncated_steps_carry_the_value_of_final_obs(traj)
    # the next step starts from a reset
    assert np.all(np.asarray(traj.obs)[1:][done[:-1]][:, 0] == 0.0)
    # Each step stores v(o_t) of the observation acted on (the probe's value is its clock), not of
    # the next one, and the action sampled there.
    np.testing.assert_allclose(traj.value, np.asarray(traj.obs)[..., 0])
    assert np.all(np.asarray(traj.action) == 1) and np.all(np.asarray(traj.reward) == 1)


def test_rollout_records_which_torso_units_fired():
    args, network, params, mb = loss_setup(hidden_sizes=(8, 4), activation="relu")
    # three first-layer units never fire
    params["torso_0"]["b"] = params["torso_0"]["b"].at[:3].set(-100.0)
    env, env_params = ppo.make_env(args.env_id, 0.0)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(1), 4),
                                                            env_params)
    runner = ppo.RunnerState(train_state=ppo.TrainState(params, None), env_state=env_state, obs=obs,
                             episode_return=jnp.zeros(4), episode_length=jnp.zeros(4, jnp.int32),
                             key=jax.random.key(2))
    _, traj = ppo.collect_trajectories(runner, env, env_params, network, num_steps=5)
    _, _, features = jax.vmap(lambda o: network.apply(params, o, return_features=True))(traj.obs)
    assert features.shape == (5, 4, 12)  # 8 + 4 ReLU features of 4 environments at 5 steps
    np.testing.assert_array_equal(traj.active_units, np.asarray(features > 0).any(axis=1))
    assert not np.asarray(traj.active_units)[:, :3].any()


# --------------------------------------------------------------------------------------------------
# GAE with gymnax 1.0's terminated / truncated endings
# --------------------------------------------------------------------------------------------------
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
                                 final_values[:, env], terminated[:, env], truncated[:, env], gamma,
                                 lam)
        np.testing.assert_allclose(advantages[:, env], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, advantages + values, rtol=1e-6)
    # The truncated step bootstraps from v(final_obs): changing it changes that step's advantage.
    shifted_traj = traj._replace(final_value=traj.final_value + 1.0)
    shifted = ppo.calculate_gae(shifted_traj, jnp.asarray(last_value), gamma, lam)[0]
    assert np.isclose(shifted[4, 1] - advantages[4, 1], gamma, atol=1e-5)
    assert np.isclose(shifted[2, 0], advantages[2, 0])  # terminated: v(final_obs) is not used


# --------------------------------------------------------------------------------------------------
# Losses: the clipped surrogate in log space, the value loss, the whole loss
# --------------------------------------------------------------------------------------------------
def test_policy_loss_matches_rlax_fed_with_probability_ratios():
    key_new, key_old, key_act, key_adv = jax.random.split(jax.random.key(0), 4)
    logits = 3.0 * jax.random.normal(key_new, (512, 3))
    # some ratios fall outside the clip
    old_logits = logits + 0.3 * jax.random.normal(key_old, (512, 3))
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


def test_value_loss_clipping_is_pessimistic():
    targets, old = jnp.array([1.0, 1.0, -1.0]), jnp.array([0.5, 0.5, 0.5])
    # within the clip; up past it; down past it towards the target
    values = jnp.array([0.8, 2.0, -0.5])
    assert np.isclose(ppo.value_loss(values, old, targets, 0.2, clip_vloss=False),
                      0.5 * (0.04 + 1.0 + 0.25) / 3)
    # Clipped to old +- 0.2 = [0.3, 0.7]: max((0.8-1)^2, (0.7-1)^2) = 0.09; max(1, 0.09) = 1;
    # max((-0.5+1)^2, (0.3+1)^2) = 1.69.
    assert np.isclose(ppo.value_loss(values, old, targets, 0.2, clip_vloss=True),
                      0.5 * (0.09 + 1.0 + 1.69) / 3)


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

    def objective(p):
        return jnp.mean(mb.advantage * ppo.log_prob(network.apply(p, mb.obs)[0], mb.action))

    assert objective(sgd_step(params, network, mb, args)) > objective(params)
    # Only the value loss: a step brings the values towards the targets.
    args, network, params, mb = loss_setup(ent_coef=0.0)
    value_error = lambda p: float(jnp.mean(jnp.abs(network.apply(p, mb.obs)[1] - mb.target)))  # noqa: E731
    assert value_error(sgd_step(params, network, zero_advantages, args)) < value_error(params)


def test_loss_is_surrogate_minus_entropy_bonus_plus_value_loss():
    args, network, params, mb = loss_setup(ent_coef=0.03, vf_coef=0.7)
    loss, metrics = ppo.ppo_loss(params, network, mb, args)
    probs = jax.nn.softmax(network.apply(params, mb.obs)[0]).astype(np.float64)
    np.testing.assert_allclose(metrics["entropy"], np.mean(-np.sum(probs * np.log(probs), -1)),
                               rtol=1e-5)
    expected = metrics["policy_loss"] - 0.03 * metrics["entropy"] + 0.7 * metrics["value_loss"]
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert metrics["value_loss"] > 0 and metrics["entropy"] > 0  # both terms are really there


# --------------------------------------------------------------------------------------------------
# Update: the optimizer, a minibatch, an epoch, the update step learning a probe
# --------------------------------------------------------------------------------------------------
def test_optimizer_clips_the_global_norm_and_anneals_the_learning_rate_to_zero():
    args = ppo.fill_runtime_fields(ppo.Args(num_envs=8, num_steps=16, num_minibatches=2,
                                            update_epochs=2, total_timesteps=8 * 16 * 5,
                                            max_grad_norm=0.5))
    optimizer = ppo.make_optimizer(args)  # 5 iterations x 2 epochs x 2 minibatches = 20 updates
    params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    state = optimizer.init(params)
    grads = {"a": jnp.array([3.0, 0.0, 4.0]), "b": jnp.array([0.0, 0.1])}  # global norm ~5.001
    norm = np.sqrt(25.01)
    for update in range(1, 21):
        _, state = optimizer.update(grads, state, params)
        rate = optax.tree_utils.tree_get(state, "learning_rate",
                                         filtering=lambda _, v: isinstance(v, jax.Array))
        # the rate it used: linear
        np.testing.assert_allclose(rate, 5e-3 * (1 - (update - 1) / 20), atol=1e-9)
    # Adam's first moment holds the clipped gradient: scaled as a whole to norm 0.5, so the small
    # component keeps its share (clipping each element to +-0.5 would not).
    mu = optax.tree_utils.tree_get(state, "mu")
    np.testing.assert_allclose(mu["a"], np.array([3.0, 0.0, 4.0]) * 0.5 / norm * (1 - 0.9**20),
                               rtol=1e-4)
    np.testing.assert_allclose(mu["b"], np.array([0.0, 0.1]) * 0.5 / norm * (1 - 0.9**20),
                               rtol=1e-4)


def test_optimizer_keeps_the_rate_without_annealing_and_uses_adams_eps_of_1e5():
    args = ppo.fill_runtime_fields(ppo.Args(total_timesteps=20 * 64 * 128, num_minibatches=1,
                                            update_epochs=1, anneal_lr=False, num_devices=1))
    optimizer = ppo.make_optimizer(args)
    params = {"w": jnp.zeros(2)}
    state = optimizer.init(params)
    for _ in range(20):
        updates, state = optimizer.update({"w": jnp.array([1e-6, -1e-6])}, state, params)
        rate = optax.tree_utils.tree_get(state, "learning_rate",
                                         filtering=lambda _, v: isinstance(v, jax.Array))
        np.testing.assert_allclose(rate, 5e-3)
    # Adam's step is lr * m / (sqrt(v) + eps); with a gradient of 1e-6 and eps 1e-5 it is lr / 11,
    # where optax's default eps of 1e-8 would give nearly lr.
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
        train_state = ppo.TrainState(params, optimizer.init(params))
        (steps[ratio], _), info = ppo.update_minibatch(train_state, mb, network, optimizer,
                                                       ratio_args)
        clipfrac = ppo.loss_metrics(info, args.clip_coef)["clipfrac"]
        assert 0 < clipfrac < 1  # both sides of the clip are exercised
    for a, b in zip(jax.tree.leaves(steps["log"]), jax.tree.leaves(steps["direct"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    logits = network.apply(params, mb.obs)[0]
    direct = ppo.policy_loss(logits, mb.logits, mb.action, mb.advantage, 0.2, "direct")
    log_space = ppo.policy_loss(logits, mb.logits, mb.action, mb.advantage, 0.2, "log")
    np.testing.assert_allclose(direct[1], log_space[1], rtol=1e-4, atol=1e-5)
    # Where a probability underflows, the direct ratio is 0 / 0 and the log-space one is not.
    far = jnp.array([[-200.0, 0.0, 0.0]])
    action, advantage = jnp.array([0]), jnp.array([1.0])
    assert np.isnan(ppo.policy_loss(far, far - 1.0, action, advantage, 0.2, "direct")[0])
    assert np.isfinite(ppo.policy_loss(far, far - 1.0, action, advantage, 0.2, "log")[0])


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


def test_update_step_learns_the_probe_optimum_and_bootstraps_through_truncation():
    # Horizon 100 never comes: every episode is truncated at 4 steps, so nothing ever terminates
    # and the true value of every state under the optimal policy (always action 1) is
    # 1 / (1 - gamma) = 2.

    # Treating truncation as termination would instead teach values between 1 and 1.875.
    env = ProbeEnv(horizons=(100,))
    env_params = env.default_params
    args = ppo.fill_runtime_fields(ppo.Args(
        num_envs=16, num_steps=16, num_minibatches=4, update_epochs=4, gamma=0.5,
        learning_rate=3e-3, anneal_lr=False, total_timesteps=16 * 16 * 150, ent_coef=0.0,
        clip_vloss=False))
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


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------
def test_loss_metrics_average_every_epoch_and_minibatch():
    # The first gradient step sees the rollout's own parameters (ratio 1: nothing clipped); an Adam
    # step of size 1 then moves the policy so far that every later step clips everything. Over 2
    # epochs x 2 minibatches the mean clip fraction is therefore 3/4: 1 would mean only the last
    # step was reported, 0 only the first.

    args = ppo.fill_runtime_fields(ppo.Args(num_envs=8, num_steps=16, num_minibatches=2,
                                            update_epochs=2, learning_rate=1.0, anneal_lr=False,
                                            total_timesteps=128))
    env, env_params = gymnax.make(args.env_id)
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm)
    optimizer = ppo.make_optimizer(args)
    runner = ppo.init_runner(jax.random.key(0), env, env_params, network, optimizer, args.num_envs)
    _, metrics = jax.jit(ppo.make_update_step(args, env, env_params, network, optimizer))(runner)
    assert np.isclose(metrics["clipfrac"], 0.75, atol=0.02)


def test_approx_kl_is_the_low_variance_k3_estimator_not_the_naive_one():
    # k3 = (r - 1) - log r over the minibatch's actions; the naive k1 = -log r has the same mean in
    # expectation but a far larger variance, and goes negative (http://joschu.net/blog/kl-approx.html).
    args, network, params, mb = loss_setup()
    noise = 0.5 * jax.random.normal(jax.random.key(1), mb.logits.shape)
    mb = mb._replace(logits=mb.logits + noise)  # the "old" policy differs from the current one
    _, info = ppo.ppo_loss(params, network, mb, args)
    metrics = ppo.loss_metrics(info, args.clip_coef)
    rows = np.arange(len(mb.action))
    new_logits = network.apply(params, mb.obs)[0]
    new = np.asarray(jax.nn.log_softmax(new_logits), np.float64)[rows, mb.action]
    old = np.asarray(jax.nn.log_softmax(mb.logits), np.float64)[rows, mb.action]
    log_r = new - old
    np.testing.assert_allclose(metrics["approx_kl"], np.mean(np.expm1(log_r) - log_r), rtol=1e-4)
    assert abs(metrics["approx_kl"] - np.mean(-log_r)) > 0.05  # not k1
    assert metrics["approx_kl"] > 0


# --------------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------------
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
    # Units 0-3 fired on device 0's share, units 2-5 on device 1's; 6 and 7 on neither: 2 of 8
    # silent.
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
    single = jax.jit(ppo.training_diagnostics)(batch, active.any(axis=0), log_ratio)
    # The same, with the batch and log-ratios split over two devices as the data-parallel step
    # leaves them: XLA adds the reductions.
    mesh = parallel.make_mesh(2)
    sharded = jax.jit(ppo.training_diagnostics)(
        jax.device_put(batch, NamedSharding(mesh, P("envs"))), active.any(axis=0),
        jax.device_put(log_ratio, NamedSharding(mesh, P(None, None, "envs"))))
    for result in (single, sharded):
        for name, value in expected.items():
            np.testing.assert_allclose(result[name], value, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(result["action_frequency"], [0.5, 0.25, 0.25])
        for name, data in (("logits", b.logits), ("value", b.value), ("advantage", b.advantage)):
            h = result["histograms"][name]
            np.testing.assert_array_equal(h["counts"],
                                          np.histogram(data, np.asarray(h["edges"]))[0])
            np.testing.assert_allclose([h["edges"][0], h["edges"][-1]], [data.min(), data.max()],
                                       rtol=1e-6)

        # Every log-ratio of both devices, the 2.0 in the last bin.
        expected_counts = np.histogram(np.clip(log_ratio, -1, 0.999), np.linspace(-1, 1, 31))[0]
        np.testing.assert_array_equal(result["histograms"]["log_ratio"]["counts"], expected_counts)

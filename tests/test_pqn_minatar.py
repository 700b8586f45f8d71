"""Tests of pqn_minatar.py, in the order of its sections: the network, the rollout, the Q(lambda)
targets against a plain-Python loop (and against each known bug of public PQN targets), the loss,
the data-parallel step, learning known Q-values on a probe. The script run the way a user runs it:
test_pqn_minatar_run.py."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import pqn_minatar as pqn
from probe_envs import ProbeEnv
from utils import parallel


# ------------------------------------------------------------------------------------------------
# Network
# ------------------------------------------------------------------------------------------------
def reference_q_network(obs, conv_style):
    """q_network written with Haiku's own layers: the numbers each --conv-style must give."""
    if conv_style == "pooled":
        x = jax.nn.relu(hk.Conv2D(16, 3, padding="SAME", name="conv")(obs))
        x, eps = hk.avg_pool(x, (1, 2, 2, 1), (1, 2, 2, 1), padding="VALID"), 1e-5
    else:  # purejaxql's CNN: input / 255, unpadded conv, LayerNorm over channels (flax's eps)
        x, eps = hk.Conv2D(16, 3, padding="VALID", name="conv")(obs / 255.0), 1e-6
        x = jax.nn.relu(hk.LayerNorm(-1, True, True, eps=eps, name="conv_norm")(x))
    x = hk.Linear(128, name="torso_0")(x.reshape(obs.shape[0], -1))
    x = jax.nn.relu(hk.LayerNorm(-1, True, True, eps=eps, name="torso_norm_0")(x))
    return hk.Linear(5, name="q")(x)


@pytest.mark.parametrize("conv_style, features",
                         [("pooled", 5 * 5 * 16), ("purejaxql", 8 * 8 * 16)])
def test_q_network_computes_its_conv_styles_network(conv_style, features):
    obs = jax.random.bernoulli(jax.random.key(0), 0.3, (4, 10, 10, 4)).astype(jnp.float32)
    network = pqn.make_network(5, (128,), True, 16, conv_style)
    params = network.init(jax.random.key(1), obs)
    assert params["torso_0"]["w"].shape == (features, 128)
    # Random values in every parameter (LayerNorm starts at scale 1, offset 0), a small conv bias
    # beside the input's 1/255, so that each layer's constants show.
    keys = iter(jax.random.split(jax.random.key(2), 16))
    params = jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape), params)
    params["conv"]["b"] = params["conv"]["b"] * 0.01
    expected = hk.without_apply_rng(hk.transform(
        functools.partial(reference_q_network, conv_style=conv_style))).apply(params, obs)
    np.testing.assert_allclose(network.apply(params, obs), expected, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# Rollout
# ------------------------------------------------------------------------------------------------
def clock_q(obs):
    """Q = [-1, time / 10] on ProbeEnv's observations: argmax 1, and max Q tells which o it saw."""
    return jnp.stack([-jnp.ones(obs.shape[0]), obs[:, 0]], axis=-1)


def probe_runner(key: jax.Array, num_envs: int = 16) -> pqn.RunnerState:
    env = ProbeEnv()  # episodes terminate at 2 or 3 steps, or are truncated at 4
    reset_key, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs),
                                                            env.default_params)
    return pqn.RunnerState(pqn.TrainState({}, None), env_state, obs, jnp.zeros(num_envs),
                           jnp.zeros(num_envs, jnp.int32), jnp.zeros((), jnp.int32), key)


@functools.partial(jax.jit, static_argnames="num_envs")
def clock_rollout(key: jax.Array, epsilon: jax.Array, num_envs: int = 64) -> pqn.Transition:
    env, network = ProbeEnv(), hk.without_apply_rng(hk.transform(clock_q))
    return pqn.collect_trajectories(probe_runner(key, num_envs), env, env.default_params, network,
                                    num_steps=12, epsilon=epsilon)[1]


def test_rollout_stores_max_q_of_the_state_acted_on_and_of_final_obs_where_truncated():
    traj = clock_rollout(jax.random.key(1), 0.0)
    obs, truncated = np.asarray(traj.obs), np.asarray(traj.truncated)
    done = np.asarray(traj.terminated) | truncated
    # q_max is max Q(o_t) of the observation acted on (its clock), not of the next one.
    np.testing.assert_allclose(traj.q_max, obs[..., 0])
    # On truncated steps, max Q of the observation reached (time 4), not of the reset one (time 0).
    assert truncated.any() and np.all(np.asarray(traj.terminated)[truncated] == 0)
    np.testing.assert_allclose(np.asarray(traj.final_q_max)[truncated], 0.4, rtol=1e-6)
    assert np.all(np.asarray(traj.final_q_max)[~truncated] == 0.0)
    assert np.all(np.asarray(traj.action) == 1)  # epsilon 0: greedy
    lengths, returns = np.asarray(traj.episode_length), np.asarray(traj.episode_return)
    assert set(lengths[done]) <= {2, 3, 4} and np.all(lengths[~done] == 0)
    np.testing.assert_array_equal(returns[done], lengths[done])  # reward 1 a step, all action 1


def test_rollout_explores_with_probability_epsilon():
    traj = clock_rollout(jax.random.key(2), 0.4)
    # A random action is the greedy one half the time (2 actions): P(action 0) = 0.4 / 2.
    assert abs(float((np.asarray(traj.action) == 0).mean()) - 0.2) < 0.05


def test_epsilon_decays_linearly_over_the_exploration_fraction_then_stays():
    args = pqn.fill_runtime_fields(pqn.Args(total_timesteps=4096 * 100, exploration_fraction=0.2))
    epsilon = pqn.epsilon_schedule(args)
    np.testing.assert_allclose([epsilon(i) for i in (0, 10, 20, 50, 99)],
                               [1.0, 0.505, 0.01, 0.01, 0.01], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Q(lambda) targets
# ------------------------------------------------------------------------------------------------
def reference_q_lambda(reward, q_max, final_q_max, terminated, truncated, last_q_max, gamma, lam):
    """Peng's Q(lambda) return written out, one environment and one step at a time."""
    num_steps, num_envs = reward.shape
    targets = np.zeros((num_steps, num_envs))
    for n in range(num_envs):
        next_return = last_q_max[n]
        for t in reversed(range(num_steps)):
            next_q_max = q_max[t + 1, n] if t + 1 < num_steps else last_q_max[n]
            if terminated[t, n]:
                targets[t, n] = reward[t, n]
            elif truncated[t, n]:
                targets[t, n] = reward[t, n] + gamma * final_q_max[t, n]
            else:
                targets[t, n] = reward[t, n] + gamma * ((1 - lam) * next_q_max + lam * next_return)
            next_return = targets[t, n]
    return targets


def q_lambda_case() -> tuple[pqn.Transition, jax.Array]:
    """8 steps of 4 environments: one with no episode end; one terminated at step 2 and truncated
    at 5; one truncated on the rollout's last step; one terminated on the step before the last,
    after a step both terminated and truncated (the termination wins)."""
    num_steps, num_envs = 8, 4
    terminated = np.zeros((num_steps, num_envs), bool)
    truncated = np.zeros((num_steps, num_envs), bool)
    terminated[2, 1] = truncated[5, 1] = truncated[7, 2] = terminated[6, 3] = True
    terminated[3, 3] = truncated[3, 3] = True
    keys = jax.random.split(jax.random.key(0), 4)
    traj = pqn.Transition(
        obs=None, action=None, reward=jax.random.uniform(keys[0], (num_steps, num_envs)),
        terminated=jnp.asarray(terminated), truncated=jnp.asarray(truncated),
        q_max=jax.random.uniform(keys[1], (num_steps, num_envs), minval=1.0, maxval=5.0),
        final_q_max=jnp.where(truncated, jax.random.uniform(keys[2], truncated.shape, minval=5.0,
                                                            maxval=9.0), 0.0),
        episode_return=None, episode_length=None)
    return traj, jax.random.uniform(keys[3], (num_envs,), minval=10.0, maxval=20.0)


def reference_of(traj: pqn.Transition, last_q_max: jax.Array, gamma: float, lam: float):
    arrays = [np.asarray(x, np.float64) for x in (traj.reward, traj.q_max, traj.final_q_max)]
    return reference_q_lambda(*arrays, np.asarray(traj.terminated), np.asarray(traj.truncated),
                              np.asarray(last_q_max, np.float64), gamma, lam)


@pytest.mark.parametrize("lam", [0.0, 0.65, 1.0])
def test_q_lambda_targets_match_a_plain_python_loop(lam):
    traj, last_q_max = q_lambda_case()
    targets = pqn.q_lambda_targets(traj, last_q_max, 0.9, lam)
    np.testing.assert_allclose(targets, reference_of(traj, last_q_max, 0.9, lam), rtol=1e-5)


def cleanrl_494(traj, last_q_max):
    """No done mask: the return runs on through every episode end."""
    no_end = jnp.zeros_like(traj.terminated)
    return traj._replace(terminated=no_end, truncated=no_end), last_q_max


def purejaxql_12(traj, last_q_max):
    """The step before the last bootstraps from max Q of the rollout's next observation, not of
    the last observation."""
    return traj._replace(q_max=traj.q_max.at[-1].set(last_q_max)), last_q_max


def rejax_34(traj, last_q_max):
    """Q cached at the state acted on: every step bootstraps from max Q(o_t), not Q(o_{t+1})."""
    shifted = jnp.concatenate([jnp.zeros_like(traj.q_max[:1]), traj.q_max[:-1]])
    return traj._replace(q_max=shifted), traj.q_max[-1]


@pytest.mark.parametrize("bug", [cleanrl_494, purejaxql_12, rejax_34])
def test_the_sequences_tell_each_known_bug_apart(bug):
    # The test above passes only for code the reference agrees with: these are the three ways
    # public PQN targets went wrong, fed to the same code, and each must disagree with it.
    traj, last_q_max = q_lambda_case()
    buggy = pqn.q_lambda_targets(*bug(traj, last_q_max), 0.9, 0.65)
    assert not np.allclose(buggy, reference_of(traj, last_q_max, 0.9, 0.65), rtol=1e-3)


def test_the_iteration_bootstraps_the_last_step_from_the_observation_the_rollout_ended_on(
        monkeypatch):
    # q_lambda_targets, watched: the iteration must hand it max Q of runner.obs after the scan
    # (o_T), not of the last observation acted on (o_{T-1}). The clock network's Q tells them apart.
    seen = {}

    def watched(traj, last_q_max, gamma, q_lambda):
        seen.update(traj=traj, last_q_max=last_q_max)
        return q_lambda_targets(traj, last_q_max, gamma, q_lambda)

    q_lambda_targets = pqn.q_lambda_targets
    monkeypatch.setattr(pqn, "q_lambda_targets", watched)
    args = pqn.fill_runtime_fields(pqn.Args(num_envs=8, num_steps=5, num_minibatches=2,
                                            update_epochs=1, total_timesteps=40, conv_channels=0))
    network = hk.without_apply_rng(hk.transform(clock_q))
    optimizer = optax.sgd(0.0)  # the clock has no parameters to train
    iteration = pqn.make_pqn_iteration(args, ProbeEnv(), ProbeEnv().default_params, network,
                                       optimizer)
    runner = probe_runner(jax.random.key(3), args.num_envs)
    runner, _ = iteration(runner._replace(train_state=pqn.TrainState({}, optimizer.init({}))))
    ended_on = np.asarray(runner.obs)[:, 0]
    assert not np.allclose(ended_on, np.asarray(seen["traj"].obs)[-1, :, 0])
    np.testing.assert_allclose(seen["last_q_max"], ended_on)


# ------------------------------------------------------------------------------------------------
# Loss and the data-parallel step
# ------------------------------------------------------------------------------------------------
def random_batch(n: int, key: jax.Array) -> pqn.Batch:
    keys = jax.random.split(key, 3)
    return pqn.Batch(obs=jax.random.bernoulli(keys[0], 0.3, (n, 8)).astype(jnp.float32),
                     action=jax.random.randint(keys[1], (n,), 0, 3),
                     target=jax.random.normal(keys[2], (n,)))


def test_td_loss_is_half_the_mean_squared_error_of_the_actions_taken():
    network = pqn.make_network(3, (32,), True)
    mb = random_batch(16, jax.random.key(0))
    params = network.init(jax.random.key(1), mb.obs)
    loss, info = jax.jit(pqn.td_loss, static_argnums=1)(params, network, mb)
    q = np.asarray(network.apply(params, mb.obs), np.float64)
    q_taken = q[np.arange(16), np.asarray(mb.action)]
    np.testing.assert_allclose(loss, 0.5 * np.mean((q_taken - np.asarray(mb.target)) ** 2),
                               rtol=1e-5)
    np.testing.assert_allclose(info["q_values"], q_taken.mean(), rtol=1e-5)
    # Its gradient is that of the same error with the target held fixed: -(G - Q(o, a)) dQ/dθ
    # averaged, so nothing flows through the bootstrap (a loss of the same value whose target
    # moves with the parameters has another gradient).
    grads = jax.grad(lambda p: pqn.td_loss(p, network, mb)[0])(params)

    def q_taken_of(p):
        return jnp.take_along_axis(network.apply(p, mb.obs), mb.action[:, None], axis=-1)[:, 0]

    _, pullback = jax.vjp(q_taken_of, params)
    (fixed,) = pullback(-(mb.target - q_taken_of(params)) / 16)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(fixed)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_the_greedy_policy_plays_the_best_action_of_a_known_network():
    # A network whose Q-values are known: zero weights but the head's bias, so Q(o) is the bias
    # for every observation and the best action is its argmax. Greedy play takes it; epsilon-greedy
    # at --eval-epsilon 0.05 mostly does (0.05 x 2/3 of its actions are another one).
    args = pqn.Args(env_id="Breakout-MinAtar")
    env, env_params = pqn.make_env(args.env_id, args.sticky_action_prob)
    agent = pqn.make_agent(args, env, env_params)
    obs = jnp.stack([env.reset(jax.random.key(i), env_params)[0] for i in range(64)])
    params = jax.tree.map(jnp.zeros_like, agent.network.init(jax.random.key(0), obs))
    params["q"]["b"] = jnp.array([0.1, 0.7, -0.4])
    greedy = jax.jit(agent.act)(params, obs, jax.random.key(2), True)
    assert (np.asarray(greedy) == 1).all()
    sampled = np.asarray(jax.jit(agent.act)(params, obs.repeat(32, 0), jax.random.key(3), False))
    assert 0.9 < (sampled == 1).mean() < 1


def test_data_parallel_epoch_equals_the_single_device_epoch_on_the_whole_minibatch():
    # Two devices, each with half of a minibatch, must take exactly the step one device takes on
    # all of it: a sum of the gradients, or a gradient not shared, would not.
    assert len(jax.devices()) >= 2  # conftest.py asks for two CPU devices
    network = pqn.make_network(3, (32,), True)
    mb = random_batch(64, jax.random.key(0))
    params = network.init(jax.random.key(1), mb.obs)
    optimizer = optax.sgd(1.0)  # an update linear in the gradient: a factor off shows
    train_state = pqn.TrainState(params, optimizer.init(params))
    epoch = functools.partial(pqn.update_epoch, network=network, num_minibatches=1)
    key = jax.random.key(2)  # one minibatch: the order within it does not change the step
    (single, _), _ = jax.jit(functools.partial(epoch, optimizer=optimizer))(train_state, key, mb)
    step = jax.shard_map(functools.partial(epoch, optimizer=parallel.with_mean_gradient(optimizer)),
                         mesh=parallel.make_mesh(2), in_specs=(P(), P(), P("envs")),
                         out_specs=(P(), P()), check_vma=False)
    (shared, _), _ = jax.jit(step)(train_state, key, mb)
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), single, params)
    assert min(jax.tree.leaves(moved)) > 1e-4  # a real step
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(shared)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Learning known Q-values
# ------------------------------------------------------------------------------------------------
class KnownQEnv(ProbeEnv):
    """ProbeEnv (reward 1 for action 1, 0 for action 0) whose observation also shows the
    episode's horizon, so that each state's Q-values are known. With gamma 0.5:
    horizon 1, one step: Q = [0, 1], the reward, and the action matters;
    horizon 2, two steps: Q = [0.5, 1.5] then [0, 1], the second reward discounted once;
    horizon 100, truncated after 4 steps: Q = [1, 2] at every step (1 / (1 - gamma) for action 1),
    only if truncation bootstraps; as termination it would fall to [0, 1] on the last step."""

    def __init__(self):
        super().__init__(horizons=(1, 2, 100))

    def get_obs(self, state, params=None, key=None) -> jax.Array:
        return jnp.array([state.time / 10.0, state.horizon / 100.0], jnp.float32)


KNOWN_Q = {(0, 1): [0.0, 1.0], (0, 2): [0.5, 1.5], (1, 2): [0.0, 1.0],
           **{(t, 100): [1.0, 2.0] for t in range(4)}}


def test_the_update_learns_known_q_values_on_a_probe():
    # On two devices, as the script runs: each with half of the environments, the same parameters.
    env = KnownQEnv()
    args = pqn.fill_runtime_fields(pqn.Args(
        num_envs=32, num_steps=8, num_minibatches=4, update_epochs=2, gamma=0.5,
        learning_rate=1e-2, total_timesteps=32 * 8 * 100, hidden_sizes=(32,), conv_channels=0,
        exploration_fraction=0.2, epsilon_end=0.1, num_devices=2))
    network = pqn.make_network(2, args.hidden_sizes, args.layer_norm)
    optimizer = pqn.make_optimizer(args)
    mesh = parallel.make_mesh(2)
    runner = jax.device_put(pqn.init_runner(jax.random.key(0), env, env.default_params, network,
                                            optimizer, args.num_envs),
                            parallel.shardings(mesh, pqn.RUNNER_SPECS))
    update_step = jax.jit(pqn.make_parallel_update_step(args, env, env.default_params, network,
                                                        optimizer, mesh))
    for _ in range(args.num_iterations):  # one at a time, as main's loop: two-device programs
        runner, _ = jax.block_until_ready(update_step(runner))  # queued up can deadlock XLA:CPU
    for leaf in jax.tree.leaves(runner.train_state.params):
        first, second = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        np.testing.assert_array_equal(first, second)
    states = jnp.array([[t / 10.0, horizon / 100.0] for t, horizon in KNOWN_Q])
    q = network.apply(runner.train_state.params, states)
    np.testing.assert_allclose(q, np.array(list(KNOWN_Q.values())), atol=0.1)

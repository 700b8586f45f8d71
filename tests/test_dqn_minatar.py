"""Tests of dqn_minatar.py, in the order of its sections: the network, the rollout and the replay
buffer (what sampling may return), the n-step windows and the Double DQN target against plain-Python
loops, the target network's schedule, learning known Q-values on a probe, then what `make_agent`
hands over, the state through a checkpoint, and the argument checks."""

import functools
import os
import re

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import rlax

import dqn_minatar as dqn
from helpers import GAMES, random_history
from probe_envs import ProbeEnv
from utils import checkpoint, contract
from utils.env import make_env
from utils.files import read_safetensors


# ------------------------------------------------------------------------------------------------
# Network
# ------------------------------------------------------------------------------------------------
def test_q_network_reads_uint8_grids_as_the_float_ones():
    obs = jax.random.bernoulli(jax.random.key(0), 0.3, (4, 10, 10, 4))
    network = dqn.make_network(5, (128,), False, 16)
    params = network.init(jax.random.key(1), obs.astype(jnp.float32))
    assert params["torso_0"]["w"].shape == (5 * 5 * 16, 128)  # conv, 2x2 pooling, as PQN's
    np.testing.assert_array_equal(network.apply(params, obs.astype(jnp.uint8)),
                                  network.apply(params, obs.astype(jnp.float32)))


def reference_q_network(obs, conv_style):
    """q_network written with Haiku's own layers: the numbers each --conv-style must give."""
    if conv_style == "pooled":
        x = jax.nn.relu(hk.Conv2D(16, 3, padding="SAME", name="conv")(obs))
        x = hk.avg_pool(x, (1, 2, 2, 1), (1, 2, 2, 1), padding="VALID")
    else:  # MinAtar's DQN: unpadded, no pooling
        x = jax.nn.relu(hk.Conv2D(16, 3, padding="VALID", name="conv")(obs))
    x = jax.nn.relu(hk.Linear(128, name="torso_0")(x.reshape(obs.shape[0], -1)))
    return hk.Linear(5, name="q")(x)


@pytest.mark.parametrize("conv_style, features", [("pooled", 5 * 5 * 16), ("minatar", 8 * 8 * 16)])
def test_q_network_computes_its_conv_styles_network(conv_style, features):
    obs = jax.random.bernoulli(jax.random.key(0), 0.3, (4, 10, 10, 4)).astype(jnp.float32)
    network = dqn.make_network(5, (128,), False, 16, conv_style)
    params = network.init(jax.random.key(1), obs)
    assert params["torso_0"]["w"].shape == (features, 128)
    keys = iter(jax.random.split(jax.random.key(2), 16))  # random values in every parameter
    params = jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape), params)
    expected = hk.without_apply_rng(hk.transform(
        functools.partial(reference_q_network, conv_style=conv_style))).apply(params, obs)
    np.testing.assert_allclose(network.apply(params, obs), expected, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# Rollout and replay buffer
# ------------------------------------------------------------------------------------------------
def clock_q(obs):
    """Q = [-1, time / 10] on ProbeEnv's observations: argmax 1."""
    return jnp.stack([-jnp.ones(obs.shape[0]), obs[:, 0]], axis=-1)


def probe_args(**changes) -> dqn.Args:
    """Small settings for ProbeEnv (2 actions, observations of 2 floats)."""
    fields = dict(num_envs=4, num_steps=6, buffer_size=40, batch_size=8, replay_ratio=0.5,
                  n_step=2, learning_starts=8, target_update_period=10, epsilon_decay_steps=40,
                  hidden_sizes=(16,), conv_channels=0, total_timesteps=240)
    return dqn.fill_runtime_fields(dqn.Args(**(fields | changes)))


def probe_setup(args: dqn.Args, network=None, optimizer=None, seed=0):
    """ProbeEnv, a network (clock_q's by default: no parameters), and the initial state."""
    env = ProbeEnv()
    network = network or hk.without_apply_rng(hk.transform(clock_q))
    optimizer = optimizer or optax.sgd(0.0)
    buffer = dqn.make_buffer(args)
    runner = dqn.init_runner(jax.random.key(seed), env, env.default_params, network, optimizer,
                             buffer, args.num_envs)
    return env, network, optimizer, buffer, runner


def test_the_iteration_writes_each_environments_steps_in_order_into_its_own_row():
    # 4 environments x 6 steps into a buffer of 4 rows x 10: the second iteration wraps around.
    # Chunks of 2 steps of each environment, each followed by 1 gradient step.
    args = probe_args(replay_ratio=0.125)
    assert dqn.interleaving(args) == (3, 2, 1)
    env, network, optimizer, buffer, runner = probe_setup(args)
    iteration = jax.jit(dqn.make_dqn_iteration(args, env, env.default_params, network, optimizer,
                                               buffer))
    runner, _ = iteration(runner)
    runner, chunks = iteration(runner)
    state = runner.buffer_state
    assert int(state.current_index) == 2 and bool(state.is_full)
    exp = jax.tree.map(np.asarray, state.experience)
    order = (2 + np.arange(10)) % 10  # each row's steps, oldest first
    clock, next_clock = exp.obs[:, order, 0], exp.next_obs[:, order, 0]
    done = (exp.terminated | exp.truncated)[:, order]
    # Each step's next_obs is the clock one tick on, also where the episode ended (the observation
    # before the reset, gymnax's final_observation); the next step starts from it or from a reset.
    np.testing.assert_allclose(next_clock, clock + 0.1, atol=1e-6)
    np.testing.assert_allclose(clock[:, 1:], np.where(done[:, :-1], 0.0, next_clock[:, :-1]),
                               atol=1e-6)
    assert done.any() and exp.truncated.any()
    # The second iteration's episode ends are those of each row's last 6 steps.
    assert int(chunks.ended.done.sum()) == int(done[:, -6:].sum())


def test_at_epsilon_0_every_environment_takes_the_action_of_highest_q():
    # clock_q's best action is 1 in every state; epsilon 0 draws no random action.
    args = probe_args()
    env, network, _, _, runner = probe_setup(args)
    collect = jax.jit(lambda runner: dqn.collect_transitions(
        runner, env, env.default_params, network, 12, lambda steps: 0.0, dqn.AS_IS))
    _, (transitions, _, epsilon) = collect(runner)
    assert (np.asarray(epsilon) == 0).all()
    assert (np.asarray(transitions.action) == 1).all()


def test_an_iteration_interleaves_the_replay_ratios_gradient_steps_with_its_steps():
    # The defaults: 128 chunks of one step of the 32 environments, each chunk followed by 8
    # gradient steps (docs/dqn_minatar.md): 1,024 an iteration, 0.25 per environment step.
    assert dqn.interleaving(dqn.Args()) == (128, 1, 8)
    # ProbeEnv's settings: chunks of 1 step of 4 environments, 2 gradient steps each; the warm-up
    # skips the chunks whose clock is below learning_starts (8): 22 gradient steps in 2 iterations,
    # replay_ratio x the 44 environment steps of the chunks past it.
    args = probe_args()
    assert dqn.interleaving(args) == (6, 1, 2)
    env, network, optimizer, buffer, runner = probe_setup(args)
    step = jax.jit(dqn.make_update_step(args, env, env.default_params, network, optimizer, buffer))
    logged = []
    for _ in range(2):
        runner, metrics = step(runner)
        logged.append(int(metrics["gradient_steps"]))
    past_warm_up = sum(clock >= args.learning_starts for clock in range(4, 49, 4))
    assert logged == [10, 12] and sum(logged) == args.replay_ratio * 4 * past_warm_up


def test_epsilon_is_1_through_the_warm_up_then_decays_linearly_then_stays():
    epsilon = dqn.epsilon_schedule(dqn.Args(learning_starts=1000, epsilon_decay_steps=2000,
                                            epsilon_end=0.01))
    np.testing.assert_allclose([epsilon(s) for s in (0, 999, 1000, 2000, 3000, 5000)],
                               [1.0, 1.0, 1.0, 0.505, 0.01, 0.01], rtol=1e-6)


@pytest.mark.parametrize("anneal", [False, True])
def test_anneal_lr_takes_the_step_size_linearly_to_0_over_all_gradient_steps(anneal):
    args = dqn.Args(learning_rate=1e-3, adam_eps=1e-12, anneal_lr=anneal)
    args.num_iterations, args.gradient_steps_per_iteration = 2, 5  # 10 gradient steps in all
    optimizer = dqn.make_optimizer(args)
    params, grads = jnp.zeros(3), jnp.ones(3)
    opt_state, steps = optimizer.init(params), []
    for _ in range(12):  # Adam's step for a constant gradient is the learning rate itself
        updates, opt_state = optimizer.update(grads, opt_state, params)
        steps.append(-float(updates[0]))
    expected = [1e-3 * max(0.0, 1 - k / 10) if anneal else 1e-3 for k in range(12)]
    np.testing.assert_allclose(steps, expected, rtol=1e-4, atol=1e-9)


def test_minatar_observations_are_0_or_1_so_the_buffer_keeps_them_exactly_as_bits():
    for game in GAMES:
        env, env_params = make_env(game, 0.0)

        @jax.jit
        def random_play(key):
            obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, 8),
                                                                env_params)

            def step(carry, key):
                state, _ = carry
                actions = jax.random.randint(key, (8,), 0, env.action_space(env_params).n)
                obs, state, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                    jax.random.split(key, 8), state, actions, env_params)
                return (state, obs), obs

            return jax.lax.scan(step, (state, obs), jax.random.split(key, 200))[1]

        obs = np.asarray(random_play(jax.random.key(0)))
        assert set(np.unique(obs)) <= {0.0, 1.0}, game
        assert obs.any(), game
        codec = dqn.grid_codec(obs.shape[-3:])
        stored = np.asarray(codec.encode(obs))
        # One flat axis of bytes, each holding 8 of the grid's cells and channels.
        num_bytes = -(-obs[0, 0].size // 8)
        assert stored.dtype == np.uint8 and stored.shape == (*obs.shape[:-3], num_bytes), game
        np.testing.assert_array_equal(codec.decode(stored), obs, err_msg=game)


def marked_steps(num_envs: int, num_steps: int, first: int = 0) -> dqn.Transition:
    """Steps (num_envs, num_steps) whose reward marks where they were written: 1000 * env + time
    + 1, so that an unwritten slot (0) shows."""
    marks = (1000 * np.arange(num_envs)[:, None] + first + np.arange(num_steps)[None] + 1)
    zeros = jnp.zeros((num_envs, num_steps))
    return dqn.Transition(obs=zeros[..., None], action=zeros.astype(jnp.int32),
                          reward=jnp.asarray(marks, jnp.float32), terminated=zeros.astype(bool),
                          truncated=zeros.astype(bool), next_obs=zeros[..., None])


@pytest.mark.parametrize("added", [3, 4, 7, 10, 13, 25])  # before the wrap-around, and after
def test_sampling_returns_only_written_windows_of_one_environment_in_time_order(added):
    # 3 environments, 10 steps each kept, windows of 3; steps are added 4 at a time (the last
    # chunk shorter), so the write head does not line up with the end of the rows.
    args = dqn.Args(num_envs=3, buffer_size=30, batch_size=4096, n_step=3)
    buffer = dqn.make_buffer(args)
    state = buffer.init(jax.tree.map(lambda x: x[0, 0], marked_steps(1, 1)))
    for first in range(0, added, 4):
        state = buffer.add(state, marked_steps(3, min(4, added - first), first))
    rows, slots = dqn.window_indices(state, jax.random.key(added), args.batch_size, args.n_step)
    marks = np.asarray(state.experience.reward, np.int64)[np.asarray(rows)[:, None],
                                                          np.asarray(slots)]
    assert np.all(marks > 0)  # never a slot that was never written
    env, time = marks // 1000, marks % 1000 - 1
    assert np.all(env == env[:, :1])  # one environment's row
    np.testing.assert_array_equal(time, time[:, :1] + np.arange(3))  # consecutive steps
    assert time.min() >= max(0, added - 10) and time.max() <= added - 1  # among those kept
    # ... and every window that is whole in the buffer can come up.
    assert len(set(map(tuple, marks[:, 0:1].tolist()))) == 3 * (min(added, 10) - 2)


def filled_buffer(history: dqn.Transition, args: dqn.Args, chunk: int = 5):
    buffer = dqn.make_buffer(args)
    state = buffer.init(jax.tree.map(lambda x: x[0, 0], history))
    for first in range(0, history.reward.shape[1], chunk):
        state = buffer.add(state, jax.tree.map(lambda x: x[:, first:first + chunk], history))
    return buffer, state


@pytest.mark.parametrize("num_steps", [3, 9, 60])  # barely sampleable, part-filled, wrapped
def test_the_batches_are_flashbaxs_windows_key_for_key(num_steps):
    # sample_batch gathers only what the target reads; flashbax's sample gathers whole windows.
    # The same key must give the same windows, and so the same batch, bit for bit.
    args = dqn.Args(num_envs=3, buffer_size=48, batch_size=256, n_step=3)
    history = random_history(dqn.Transition, 3, num_steps, seed=num_steps)
    buffer, state = filled_buffer(history, args)
    for seed in range(3):
        key = jax.random.key(seed)
        windows = buffer.sample(state, key).experience
        reward, discount, last = jax.vmap(dqn.n_step_return, in_axes=(0, 0, 0, None))(
            windows.reward, windows.terminated, windows.truncated, 0.9)
        expected = dqn.Batch(obs=windows.obs[:, 0], action=windows.action[:, 0], reward=reward,
                             discount=discount,
                             next_obs=windows.next_obs[jnp.arange(args.batch_size), last])
        batch = dqn.sample_batch(state, key, args.batch_size, args.n_step, 0.9, dqn.AS_IS)
        for field, want, got in zip(dqn.Batch._fields, expected, batch):
            np.testing.assert_array_equal(got, want, err_msg=field)
        assert len(set(np.asarray(batch.obs[:, 0]).tolist())) > min(num_steps - 2, 10)


# ------------------------------------------------------------------------------------------------
# n-step windows and the Double DQN target
# ------------------------------------------------------------------------------------------------
def reference_n_step(reward, terminated, truncated, start, n, gamma):
    """The n-step sample of the window from `start` in one environment's history, step by step:
    (discounted rewards, bootstrap discount, index of the step whose next_obs it bootstraps
    from)."""
    rewards = 0.0
    for j in range(n):
        t = start + j
        rewards += gamma ** j * reward[t]
        if terminated[t]:
            return rewards, 0.0, t
        if truncated[t]:
            return rewards, gamma ** (j + 1), t
    return rewards, gamma ** n, start + n - 1


def test_n_step_windows_match_a_plain_python_loop_across_episode_ends_and_the_wrap_around():
    # 2 environments x 60 steps, random rewards, terminations and truncations (some steps both),
    # into rows of 16 steps: the buffer wraps around three times. next_obs marks its step.
    num_envs, num_steps, n, gamma = 2, 60, 4, 0.9
    history = random_history(dqn.Transition, num_envs, num_steps)
    reward, terminated, truncated = (np.asarray(x) for x in history[2:5])
    args = dqn.Args(num_envs=num_envs, buffer_size=32, batch_size=512, n_step=n)
    _, state = filled_buffer(history, args)
    batch = jax.jit(dqn.sample_batch, static_argnums=(2, 3, 4, 5))(
        state, jax.random.key(1), args.batch_size, n, gamma, dqn.AS_IS)
    starts = np.asarray(batch.obs[:, 0]).astype(int)
    expected = [reference_n_step(reward[s // num_steps], terminated[s // num_steps],
                                 truncated[s // num_steps], s % num_steps, n, gamma)
                for s in starts]
    rewards, discounts, boot = (np.array(column) for column in zip(*expected))
    np.testing.assert_allclose(batch.reward, rewards, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch.discount, discounts, rtol=1e-6)
    # the next_obs of the step the window was cut at (where a termination leaves it unused, too)
    np.testing.assert_array_equal(np.asarray(batch.next_obs[:, 0]),
                                  (starts // num_steps) * num_steps + boot + 0.5)
    # The sample holds windows of every kind: cut by a termination, by a truncation, and whole.
    cut_at = boot - starts % num_steps
    assert (discounts == 0).any() and ((discounts > 0) & (cut_at < n - 1)).any()
    assert (cut_at == n - 1).any() and len(set(starts)) > 20


def double_dqn_case(seed: int = 0):
    """A network of 4 actions, different online and target parameters, and a batch whose
    discounts include 0 (terminated) and gamma^k for k < n."""
    network = dqn.make_network(4, (32,), False, 16)
    keys = jax.random.split(jax.random.key(seed), 8)
    obs = jax.random.bernoulli(keys[0], 0.3, (64, 10, 10, 4)).astype(jnp.uint8)
    params = network.init(keys[1], obs)
    target_params = network.init(keys[2], obs)
    mb = dqn.Batch(obs=obs, action=jax.random.randint(keys[3], (64,), 0, 4),
                   reward=jax.random.normal(keys[4], (64,)),
                   discount=jax.random.choice(keys[5], jnp.array([0.0, 0.9, 0.81, 0.729]), (64,)),
                   next_obs=jax.random.bernoulli(keys[6], 0.3, (64, 10, 10, 4)).astype(jnp.uint8))
    return network, params, target_params, mb


def reference_double_dqn_targets(network, params, target_params, mb):
    """r + discount * Q_target(s', argmax_a Q_online(s', a)), sample by sample."""
    q_online = np.asarray(network.apply(params, mb.next_obs), np.float64)
    q_target = np.asarray(network.apply(target_params, mb.next_obs), np.float64)
    reward, discount = np.asarray(mb.reward, np.float64), np.asarray(mb.discount, np.float64)
    return np.array([reward[i] + discount[i] * q_target[i, np.argmax(q_online[i])]
                     for i in range(len(reward))])


@pytest.mark.parametrize("loss", ["huber", "l2"])
def test_td_loss_is_the_loss_of_the_double_dqn_td_errors_and_trains_only_q_of_the_action(loss):
    network, params, target_params, mb = double_dqn_case()
    targets = reference_double_dqn_targets(network, params, target_params, mb)
    q_online = np.asarray(network.apply(params, mb.next_obs))
    q_target = np.asarray(network.apply(target_params, mb.next_obs))
    assert (q_online.argmax(1) != q_target.argmax(1)).mean() > 0.3  # the case tells them apart
    value, info = jax.jit(dqn.td_loss, static_argnums=(2, 4))(params, target_params, network, mb,
                                                              loss)
    q_taken = np.asarray(network.apply(params, mb.obs))[np.arange(64), np.asarray(mb.action)]
    td = targets - q_taken
    assert np.abs(td).max() > 1  # Huber's linear part is reached
    expected = np.where(np.abs(td) <= 1, 0.5 * td ** 2, np.abs(td) - 0.5) if loss == "huber" \
        else 0.5 * td ** 2
    np.testing.assert_allclose(value, expected.mean(), rtol=1e-5)
    np.testing.assert_allclose(info["q_values"], q_taken.mean(), rtol=1e-5)

    # The gradient is that of the loss with the targets held fixed: none flows through them.
    def fixed_target_loss(p):
        q = network.apply(p, mb.obs)[jnp.arange(64), mb.action]
        errors = jnp.asarray(targets, jnp.float32) - q
        return (rlax.huber_loss(errors, 1.0) if loss == "huber" else rlax.l2_loss(errors)).mean()

    grads = jax.grad(dqn.td_loss, has_aux=True)(params, target_params, network, mb, loss)[0]
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(fixed_target_loss)(params))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_double_q_td_error_is_rlaxs_to_the_bit_and_its_gradient_no_scatter():
    # rlax.double_q_learning's TD errors and their gradients, to the bit: the one-hot picks only
    # add exact zeros.
    network, params, target_params, mb = double_dqn_case()
    q_tm1 = network.apply(params, mb.obs)
    q_t_selector = network.apply(params, mb.next_obs)
    q_t_value = network.apply(target_params, mb.next_obs)

    def smooth_sum_of(td_error):  # a function of the errors whose gradient tells each apart
        return lambda q_tm1, q_t_value: jnp.sum(jnp.sin(jax.vmap(td_error)(
            q_tm1, mb.action, mb.reward, mb.discount, q_t_value, q_t_selector)))

    ours, rlaxs = smooth_sum_of(dqn.double_q_td_error), smooth_sum_of(rlax.double_q_learning)
    np.testing.assert_array_equal(ours(q_tm1, q_t_value), rlaxs(q_tm1, q_t_value))
    for a, b in zip(jax.grad(ours, (0, 1))(q_tm1, q_t_value),
                    jax.grad(rlaxs, (0, 1))(q_tm1, q_t_value)):
        np.testing.assert_array_equal(a, b)  # q_t_value's: 0, the target's gradient stopped
    # The gradient step holds no scatter (an indexed pick's gradient, slow on a TPU).
    optimizer = optax.adam(1e-3)
    step = functools.partial(dqn.gradient_step, network=network, optimizer=optimizer,
                             loss="huber")
    train_state = dqn.TrainState(params, target_params, optimizer.init(params))
    assert "scatter" not in jax.jit(step).lower(train_state, mb).as_text()


def test_an_accelerator_computes_the_cpus_loss_and_gradients_its_own_way(monkeypatch):
    # Off a CPU the convolution is XLA's and the online network takes o_t and o_{t+k} in one
    # pass: the same function, so the same loss and gradients up to rounding.
    network, params, target_params, mb = double_dqn_case()

    def loss_and_grads():
        grad = jax.jit(jax.grad(dqn.td_loss, has_aux=True), static_argnums=(2, 4))
        return grad(params, target_params, network, mb, "huber"), grad.lower(
            params, target_params, network, mb, "huber").as_text()

    (cpu, cpu_info), cpu_program = loss_and_grads()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    (accelerator, accelerator_info), accelerator_program = loss_and_grads()
    assert "convolution" not in cpu_program and "convolution" in accelerator_program
    # two online passes and the target's, against one online pass (over both batches) and the
    # target's: the input layer's product is taken three times, or twice
    assert cpu_program.count("dot_general") > accelerator_program.count("dot_general")
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6), cpu,
                 accelerator)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5), cpu_info,
                 accelerator_info)


# ------------------------------------------------------------------------------------------------
# The target network
# ------------------------------------------------------------------------------------------------
def test_update_target_fires_when_the_clock_crosses_a_multiple_of_the_period():
    # The clock goes 6 steps at a time and the period is 10: it lands on a multiple only every
    # 30 steps, which `steps % period == 0` would wait for.
    online, target = {"w": jnp.ones(3)}, {"w": jnp.zeros(3)}
    fired = []
    for steps in range(6, 96, 6):
        state = dqn.update_target(dqn.TrainState(online, target, None), jnp.asarray(steps - 6),
                                  jnp.asarray(steps), 10, 1.0)
        fired.append(bool(state.target_params["w"][0] == 1.0))
    assert [s for s, f in zip(range(6, 96, 6), fired) if f] == [12, 24, 30, 42, 54, 60, 72, 84, 90]
    # tau < 1 moves the target part of the way (optax.incremental_update).
    state = dqn.update_target(dqn.TrainState(online, target, None), jnp.asarray(6), jnp.asarray(12),
                              10, 0.25)
    np.testing.assert_allclose(state.target_params["w"], 0.25)


def test_the_target_network_changes_on_its_schedule_and_only_then():
    # Iterations of 4 environments x 1 step (the clock goes 4 at a time), 2 gradient steps each,
    # learning from step 16; the target is copied when the clock crosses a multiple of 10 (at 12
    # too, while the online network has not moved yet).
    args = probe_args(num_steps=1, learning_starts=16)
    network = dqn.make_network(2, (16,), False)
    env, network, optimizer, buffer, runner = probe_setup(args, network, optax.adam(1e-2))
    step = jax.jit(dqn.make_update_step(args, env, env.default_params, network, optimizer,
                                        buffer))
    copied_at = []
    for _ in range(16):
        before = runner
        runner, metrics = step(runner)
        steps = int(runner.env_steps)
        same = lambda a, b: all(np.array_equal(x, y)  # noqa: E731
                                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        assert (int(metrics["gradient_steps"]) > 0) == (steps >= 16)
        if steps >= 16:  # the online network moves
            assert not same(runner.train_state.params, before.train_state.params)
        if same(runner.train_state.target_params, before.train_state.target_params):
            continue
        assert same(runner.train_state.target_params, runner.train_state.params)  # a copy
        copied_at.append(steps)
    assert copied_at == [20, 32, 40, 52, 60]  # 20 lands on a multiple, 32 crosses 30, ...


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
    # 2-step windows: the windows of the two-step episodes end inside, those of the truncated
    # ones are cut at the truncation, and both must still come out at the known values. The
    # returns are uncorrected for exploration (as in Dopamine's Rainbow), off by at most
    # gamma * epsilon / 2 = 0.025 here; a buffer of 64 iterations keeps enough of the rare action 0.
    env = KnownQEnv()
    args = probe_args(num_envs=8, num_steps=8, buffer_size=4096, batch_size=64, replay_ratio=0.5,
                      learning_starts=256, target_update_period=64, epsilon_decay_steps=2048,
                      epsilon_end=0.1, gamma=0.5, learning_rate=2e-3, hidden_sizes=(32,),
                      layer_norm=True, total_timesteps=64 * 150)
    network = dqn.make_network(2, args.hidden_sizes, args.layer_norm)
    optimizer = dqn.make_optimizer(args)
    buffer = dqn.make_buffer(args)
    runner = dqn.init_runner(jax.random.key(0), env, env.default_params, network, optimizer,
                             buffer, args.num_envs)
    step = jax.jit(dqn.make_update_step(args, env, env.default_params, network, optimizer,
                                        buffer))
    for _ in range(args.num_iterations):
        runner, metrics = step(runner)
    assert metrics["finite"] and float(metrics["epsilon"]) == pytest.approx(0.1)
    states = jnp.array([[t / 10.0, horizon / 100.0] for t, horizon in KNOWN_Q])
    q = network.apply(runner.train_state.params, states)
    np.testing.assert_allclose(q, np.array(list(KNOWN_Q.values())), atol=0.1)


# ------------------------------------------------------------------------------------------------
# What make_agent hands over, and the argument checks
# ------------------------------------------------------------------------------------------------
def tiny_breakout_agent() -> tuple[dqn.Args, contract.Agent]:
    args = dqn.fill_runtime_fields(dqn.Args(
        num_envs=4, num_steps=8, buffer_size=256, batch_size=8, learning_starts=32,
        target_update_period=64, hidden_sizes=(16,), conv_channels=4, total_timesteps=32 * 4))
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    return args, dqn.make_agent(args, env, env_params)


def test_make_agent_trains_on_breakout_and_reports_the_contracts_metrics():
    args, agent = tiny_breakout_agent()
    assert dqn.check_args(args) is None and args.gradient_steps_per_iteration == 8
    assert isinstance(agent, contract.Agent) and agent.parallel_update_step is None
    state = jax.jit(agent.init)(jax.random.key(1))
    # Breakout's 10x10x4 grid packed to 50 bytes, along one axis.
    assert state.buffer_state.experience.obs.shape == (4, 64, 50)
    assert state.buffer_state.experience.obs.dtype == jnp.uint8
    step = jax.jit(agent.update_step)
    for _ in range(args.num_iterations):
        state, metrics = step(state)
    assert set(metrics) >= {"episodes", "episode_return_sum", "episode_length_sum", "finite",
                            "td_loss", "q_values", "epsilon"}
    assert bool(metrics["finite"]) and int(metrics["gradient_steps"]) == 8
    assert set(dqn.iteration_scalars(metrics)) == {"losses/td_loss", "losses/q_values",
                                                  "charts/epsilon"}
    # The same specs tree as the state, and the policy: argmax Q, or epsilon-greedy.
    jax.tree.map(lambda spec, x: None, agent.state_specs, state,
                 is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    params = agent.params(state)
    obs = state.obs.repeat(256, axis=0)
    act = jax.jit(agent.act)
    greedy = act(params, obs, jax.random.key(2), True)
    np.testing.assert_array_equal(greedy, agent.network.apply(params, obs).argmax(-1))
    sampled = act(params, obs, jax.random.key(2), False)
    assert 0 < float((sampled != greedy).mean()) < 0.1  # 0.05 x 2/3 of the time


def test_seeds_side_by_side_train_as_each_seed_alone():
    # The harness's way on an accelerator: the update step vmapped over seeds' states, where the
    # learning cond becomes a select. Through the warm-up (32 steps) and past it, each seed's
    # buffer is the one it fills alone, and its network the same to float32's rounding.
    _, agent = tiny_breakout_agent()
    keys = jax.random.split(jax.random.key(0), 2)
    alone = [jax.jit(agent.init)(key) for key in keys]
    together = jax.jit(jax.vmap(agent.init))(keys)
    step, steps = jax.jit(agent.update_step), jax.jit(jax.vmap(agent.update_step))
    for _ in range(3):
        alone = [step(state)[0] for state in alone]
        together, metrics = steps(together)
    assert metrics["gradient_steps"].tolist() == [8, 8]
    for i, state in enumerate(alone):
        seed_i = jax.tree.map(lambda x: x[i], together)  # noqa: B023
        for a, b in zip(jax.tree.leaves(state.buffer_state), jax.tree.leaves(seed_i.buffer_state)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(jax.tree.leaves(state.train_state), jax.tree.leaves(seed_i.train_state)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not np.array_equal(together.obs[0], together.obs[1])  # the seeds do differ


def compiled_branches(hlo: str) -> list[str]:
    """The signatures of the computations that the program's conditionals branch into."""
    names = re.findall(r"(?:true_computation|false_computation)=%?([\w.-]+)", hlo)
    for group in re.findall(r"branch_computations=\{([^}]*)\}", hlo):
        names += [name.strip().lstrip("%") for name in group.split(",")]
    return [line for line in hlo.splitlines()
            if any(line.lstrip().startswith((f"%{name} (", f"{name} (")) for name in names)]


def test_the_compiled_update_step_neither_copies_the_buffer_nor_branches_with_it():
    # On a TPU the buffer handed to a conditional's branch was copied whole every chunk. No branch
    # of the compiled step takes a field of the buffer, and it copies no observations (the CPU's
    # compiler, the same program; it does copy one field of 4 x 64 flags, where it fuses the
    # chunk's write to the buffer with the read of its batches).
    args, agent = tiny_breakout_agent()
    state = jax.eval_shape(agent.init, jax.random.key(0))
    hlo = jax.jit(agent.update_step, donate_argnums=0).lower(state).compile().as_text()
    names = {"uint8": "u8", "float32": "f32", "int32": "s32", "bool": "pred"}
    experience = state.buffer_state.experience
    fields = {f"{names[str(x.dtype)]}[{','.join(map(str, x.shape))}]"
              for x in jax.tree.leaves(experience)}
    observations = f"u8[{','.join(map(str, experience.obs.shape))}]"
    assert observations == "u8[4,64,50]" and observations in fields
    branches = compiled_branches(hlo)
    assert len(branches) >= 2  # the learning cond's, and the target network's
    for field in fields:
        assert not any(field in line for line in branches), field
    assert not re.search(rf"= {re.escape(observations)}\S* copy\(", hlo)


def test_the_training_state_survives_a_checkpoint_bit_for_bit(tmp_path):
    # The whole state (buffer, target network, typed key, clock) through utils/checkpoint.py's
    # file and back: training on from it is training on from the original.
    args = probe_args()
    network = dqn.make_network(2, (16,), False)
    env, network, optimizer, buffer, runner = probe_setup(args, network, optax.adam(1e-2))
    step = jax.jit(dqn.make_update_step(args, env, env.default_params, network, optimizer,
                                        buffer))
    for _ in range(3):
        runner, _ = step(runner)
    path = os.path.join(tmp_path, "state.safetensors")
    checkpoint.write_state(path, {"state": runner}, {})
    tensors, header = read_safetensors(path, "--resume")
    assert "state.buffer_state.experience.next_obs" in tensors
    restored = checkpoint.restore(path, tensors, header, "state", runner)
    raw = lambda x: jax.random.key_data(x) if checkpoint.is_key(x) else x  # noqa: E731
    for a, b in zip(jax.tree.leaves(step(runner)), jax.tree.leaves(step(restored))):
        np.testing.assert_array_equal(raw(a), raw(b))


BAD_ARGS = [
    (dict(replay_ratio=0.3), "must be a whole number of gradient steps"),
    (dict(buffer_size=1000, num_envs=48), "must be a multiple of --num-envs 48"),
    (dict(learning_starts=50), "--learning-starts must be at least num_envs x n_step = 96"),
    (dict(gamma=1.5), "--gamma must be in [0, 1], got 1.5"),
    (dict(tau=0.0), "--tau must be in (0, 1], got 0.0"),
    (dict(num_devices=2), "this script runs on one device"),
    (dict(env_id="CartPole-v1"), "--conv-channels needs a grid"),
]


@pytest.mark.parametrize("changes, message", BAD_ARGS, ids=[str(c) for c, _ in BAD_ARGS])
def test_check_args_says_what_is_wrong(changes, message):
    assert message in dqn.check_args(dqn.Args(**changes))
    assert dqn.check_args(dqn.Args()) is None

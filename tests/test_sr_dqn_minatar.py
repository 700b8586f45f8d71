"""Tests of sr_dqn_minatar.py's functions against references: BBF's anneal of n and gamma, the
annealed n-step window, the replay buffer and its batches (flashbax's rows and windows, cut to each
step's n), the reset (shrink and perturb, fresh layers, fresh optimizer), its schedule, the EMA
target, AdamW's decay, and the network that acts. Its runs: test_sr_dqn_minatar_run.py."""

import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sr_dqn_minatar as sr
from helpers import random_history
from utils.env import make_env


def test_n_and_gamma_anneal_as_bbfs_schedule():
    # BBF: n(x) = round(10 * 0.3 ** (x / 10k)), 1 - gamma(x) = 0.03 * 0.1 ** (x / 10k), then flat.
    args = sr.Args()
    since = jnp.array([0, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000, 8_000, 9_000, 10_000,
                       50_000])
    n, gamma = sr.n_and_gamma(args, since)
    assert n.tolist() == [10, 9, 8, 7, 6, 5, 5, 4, 4, 3, 3, 3]
    np.testing.assert_allclose(np.asarray(gamma)[[0, 5, 10, 11]],
                               [0.97, 1 - 0.03 * 0.1 ** 0.5, 0.997, 0.997], rtol=1e-6)
    args.anneal_steps = 0  # no anneal: the final values throughout
    n, gamma = sr.n_and_gamma(args, jnp.array([0, 5]))
    assert n.tolist() == [3, 3] and np.allclose(gamma, 0.997)


def reference_n_step(reward, terminated, truncated, n, gamma):
    """One window's n-step sample, step by step: (return, bootstrap discount, last step used)."""
    total = 0.0
    for j in range(n):
        total += gamma ** j * reward[j]
        if terminated[j]:
            return total, 0.0, j
        if truncated[j]:
            return total, gamma ** (j + 1), j
    return total, gamma ** n, n - 1


@pytest.mark.parametrize("n", [1, 3, 6, 10])
def test_the_annealed_window_uses_its_first_n_steps_and_stops_at_an_episode_end(n):
    rng = np.random.default_rng(n)
    for _ in range(50):
        reward = rng.uniform(-1, 1, 10).astype(np.float32)
        terminated, truncated = rng.random(10) < 0.1, rng.random(10) < 0.1
        got = sr.n_step_return(jnp.asarray(reward), jnp.asarray(terminated),
                               jnp.asarray(truncated), jnp.asarray(n), jnp.asarray(0.95))
        want = reference_n_step(reward, terminated, truncated, n, 0.95)
        np.testing.assert_allclose(got[:2], want[:2], rtol=1e-5, atol=1e-6)
        assert int(got[2]) == want[2]


def flashbax_buffer(args):
    """The trajectory buffer whose rows and windows sr_dqn_minatar's replay buffer keeps: the
    reference its batches are held to."""
    return fbx.make_trajectory_buffer(
        add_batch_size=args.num_envs, sample_batch_size=args.batch_size,
        sample_sequence_length=sr.max_n(args), period=1, min_length_time_axis=sr.max_n(args),
        max_length_time_axis=args.buffer_size // args.num_envs)


def filled(args, num_steps, seed=0, per_add=5):
    """The script's buffer and flashbax's, each with the same random history added, per_add steps
    of every row at a time."""
    history = random_history(sr.Transition, args.num_envs, num_steps, seed=seed)
    buffers = (sr.make_buffer(args), flashbax_buffer(args))
    states = [buffer.init(jax.tree.map(lambda x: x[0, 0], history)) for buffer in buffers]
    for first in range(0, num_steps, per_add):
        part = jax.tree.map(lambda x: x[:, first:first + per_add], history)
        states = [buffer.add(state, part) for buffer, state in zip(buffers, states)]
    return states


@pytest.mark.parametrize("backend", ["cpu", "tpu"])  # window_steps' two forms
@pytest.mark.parametrize("num_steps", [10, 13, 40])  # barely sampleable, part-filled, wrapped
@pytest.mark.parametrize("n", [3, 10])
def test_the_batches_are_flashbaxs_windows_cut_to_this_steps_n(num_steps, n, backend, monkeypatch):
    # sample_batch draws the windows of the longest n (10) as flashbax's sample does, key for key,
    # and gathers only what the target reads: the first n steps' return, cut at an episode end,
    # and the next_obs of the step it stops at.
    monkeypatch.setattr(sr.jax, "default_backend", lambda: backend)
    args = sr.Args(num_envs=3, buffer_size=48, batch_size=256)
    state, reference = filled(args, num_steps, seed=num_steps)
    assert bool(sr.make_buffer(args).can_sample(state)) == bool(
        flashbax_buffer(args).can_sample(reference))
    for seed in range(2):
        key = jax.random.key(seed)
        windows = jax.device_get(flashbax_buffer(args).sample(reference, key).experience)
        batch = sr.sample_batch(state, key, jnp.asarray(n), jnp.asarray(0.9), args.batch_size,
                                sr.max_n(args), sr.AS_IS)
        expected = [reference_n_step(*(x[i] for x in windows[2:5]), n, 0.9)
                    for i in range(args.batch_size)]
        rewards, discounts, last = (np.array(column) for column in zip(*expected))
        np.testing.assert_array_equal(batch.obs, windows.obs[:, 0])
        np.testing.assert_array_equal(batch.action, windows.action[:, 0])
        np.testing.assert_allclose(batch.reward, rewards, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(batch.discount, discounts, rtol=1e-6)
        np.testing.assert_array_equal(batch.next_obs,
                                      windows.next_obs[np.arange(args.batch_size), last])
        # every window that is whole in the buffer can come up: 3 rows x (kept - 9) starts
        kept = min(num_steps, args.buffer_size // args.num_envs)
        assert len(set(np.asarray(batch.obs[:, 0]).tolist())) == 3 * (kept - 9)


def test_the_buffer_keeps_flashbaxs_rows_and_write_head_however_the_steps_come():
    # Added one step at a time or many (a whole row at once, which wraps), the buffer holds each
    # row's latest steps where flashbax's does, and the same write head.
    args = sr.Args(num_envs=3, buffer_size=48)
    for per_add, num_steps in ((1, 21), (7, 35), (16, 40)):
        state, reference = filled(args, num_steps, seed=per_add, per_add=per_add)
        assert int(state.index) == int(reference.current_index)
        assert bool(state.full) == bool(reference.is_full)
        for field in ("obs", "next_obs", "action"):
            np.testing.assert_array_equal(getattr(state, field).reshape(3, 16, -1),
                                          getattr(reference.experience, field).reshape(3, 16, -1))


@pytest.mark.parametrize("blocked", [True, False])  # a TPU's form, a CPU's
@pytest.mark.parametrize("length", [10, 40, 70])  # blocks shorter than a row, and longer
@pytest.mark.parametrize("n", [1, 3, 10, 33])
def test_a_windows_steps_are_its_rows_wrapping_around_the_rows_end(n, length, blocked):
    # window_steps reads each window out of two blocks of steps, or step by step; either must give
    # each step exactly as indexing the rows does, from every start of every row, the windows that
    # wrap around the row's end included, with the episode ends as booleans, after the rows were
    # written over more than once.
    if n > length:
        return
    args = sr.Args(num_envs=3, buffer_size=3 * length, n_step_start=n, n_step=1)
    state, reference = filled(args, 2 * length + 7, seed=length, per_add=length // 3 + 1)
    rows, starts = (jnp.array(a).ravel() for a in np.meshgrid(np.arange(3), np.arange(length)))
    slots = (starts[:, None] + jnp.arange(n)) % length
    got = sr.window_steps(state, rows, slots, blocked)
    stored = reference.experience
    for got_field, field in zip(got, (stored.reward, stored.terminated, stored.truncated)):
        assert got_field.dtype == field.dtype
        np.testing.assert_array_equal(got_field, field[rows[:, None], slots])


def tiny_state(seed=0):
    network = sr.make_network(4, (16,), False, 8)
    obs = jnp.zeros((2, 10, 10, 4))
    args = sr.Args(learning_rate=1e-3)
    optimizer = sr.make_optimizer(args)
    keys = jax.random.split(jax.random.key(seed), 2)
    params, target = network.init(keys[0], obs), network.init(keys[1], obs)
    opt_state = optimizer.init(params)
    opt_state = optimizer.update(jax.tree.map(jnp.ones_like, params), opt_state, params)[1]
    zero = jnp.zeros((), jnp.int32)
    state = sr.TrainState(params, target, opt_state, zero + 700, zero + 300, zero + 1)
    return network, optimizer, obs, state


def test_a_reset_shrinks_and_perturbs_the_convolution_and_starts_the_rest_afresh():
    network, optimizer, obs, state = tiny_state()
    fresh = sr.fresh_networks(jax.random.key(7), network, obs)
    after = sr.reset(state, fresh, optimizer, shrink=0.5)
    for new, old, fresh in ((after.params, state.params, fresh[0]),
                            (after.target_params, state.target_params, fresh[1])):
        assert set(new) == {"conv", "torso_0", "q"}
        for name in ("w", "b"):
            np.testing.assert_allclose(new["conv"][name],
                                       0.5 * old["conv"][name] + 0.5 * fresh["conv"][name])
        for layer in ("torso_0", "q"):
            jax.tree.map(np.testing.assert_array_equal, new[layer], fresh[layer])
    # The two networks start from fresh initialisations of their own.
    assert not np.array_equal(after.params["q"]["w"], after.target_params["q"]["w"])
    # AdamW starts over: its moments and step count are those of a fresh optimizer.
    jax.tree.map(np.testing.assert_array_equal, after.opt_state, optimizer.init(after.params))
    assert int(after.since_reset) == 0 and int(after.resets) == 2 and int(after.steps) == 700


def test_resets_come_every_period_and_not_where_less_than_a_period_would_follow():
    due = [int(s) for s in range(0, 3000, 32)
           if sr.reset_due(jnp.asarray(s), jnp.asarray(s + 32), 500, 2600)]
    # the chunks in which the clock passes 500, 1000, 1500 and 2000; 2500 leaves less than a
    # period before the run's 2,600 gradient steps end
    assert due == [480, 992, 1472, 1984]
    assert not sr.reset_due(jnp.asarray(0), jnp.asarray(10_000), 0, 10_000)  # period 0: never


def test_the_target_takes_an_ema_step_and_the_online_network_adamws_step():
    network, optimizer, obs, state = tiny_state()
    batch = sr.Batch(obs=jnp.ones((8, 10, 10, 4), jnp.uint8), action=jnp.arange(8) % 4,
                     reward=jnp.ones(8), discount=jnp.full(8, 0.9),
                     next_obs=jnp.zeros((8, 10, 10, 4), jnp.uint8))
    after, _ = sr.gradient_step(state, batch, network, optimizer, "huber", tau=0.25)
    jax.tree.map(lambda t, p, old: np.testing.assert_allclose(t, 0.25 * p + 0.75 * old,
                                                              rtol=1e-6, atol=1e-7),
                 after.target_params, after.params, state.target_params)
    assert int(after.steps) == 701 and int(after.since_reset) == 301


def test_adamw_decays_the_weights_and_not_the_biases():
    args = sr.Args(learning_rate=0.1, weight_decay=0.5)
    optimizer = sr.make_optimizer(args)
    params = {"layer": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = optimizer.update(zeros, optimizer.init(params), params)
    np.testing.assert_allclose(updates["layer"]["w"], -0.1 * 0.5 * jnp.ones((2, 2)))
    np.testing.assert_array_equal(updates["layer"]["b"], jnp.zeros(2))


def test_the_target_network_acts_and_is_what_a_run_evaluates_and_saves_unless_told_otherwise():
    _, _, _, state = tiny_state()
    assert sr.acting_params(state, True) is state.target_params
    assert sr.acting_params(state, False) is state.params
    env, env_params = make_env("Breakout-MinAtar", 0.1)
    for act_with_target in (True, False):
        args = sr.fill_runtime_fields(sr.Args(act_with_target=act_with_target))
        agent = sr.make_agent(args, env, env_params)
        runner = sr.RunnerState(state, None, None, None, None, None, None, None)
        assert agent.params(runner) is (state.target_params if act_with_target else state.params)


def test_seeds_side_by_side_train_as_each_seed_alone_through_their_resets():
    # The harness's way on an accelerator: the update step vmapped over seeds' states, where the
    # learning and reset conds become selects. Each seed's buffer is the one it fills alone, its
    # clock and resets the same, its networks the same to float32's rounding.
    args = sr.fill_runtime_fields(sr.Args(
        num_envs=4, num_steps=8, buffer_size=256, batch_size=8, learning_starts=32,
        n_step_start=4, n_step=2, anneal_steps=32, reset_period=64, hidden_sizes=(16,),
        conv_channels=4, total_timesteps=32 * 6))
    assert sr.check_args(args) is None
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    agent = sr.make_agent(args, env, env_params)
    keys = jax.random.split(jax.random.key(0), 2)
    alone = [jax.jit(agent.init)(key) for key in keys]
    together = jax.jit(jax.vmap(agent.init))(keys)
    step, steps = jax.jit(agent.update_step), jax.jit(jax.vmap(agent.update_step))
    for _ in range(args.num_iterations):
        alone = [step(state)[0] for state in alone]
        together, metrics = steps(together)
    assert metrics["resets"].tolist() == [4, 4]  # at 64, 128, 192 and 256 of 320 gradient steps
    for i, state in enumerate(alone):
        seed_i = jax.tree.map(lambda x: x[i], together)  # noqa: B023
        for a, b in zip(jax.tree.leaves(state.buffer_state), jax.tree.leaves(seed_i.buffer_state)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(jax.tree.leaves(state.train_state), jax.tree.leaves(seed_i.train_state)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(together.obs[0], together.obs[1])  # the seeds do differ

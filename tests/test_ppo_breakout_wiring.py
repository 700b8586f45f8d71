"""Tests of ppo_breakout.py's wiring around its algorithm, in the script's reading order: the
data-parallel update (on two devices the rollout, an epoch and the update step compute what they
compute on one), the argument checks, and importing the script. The algorithm's pieces:
test_ppo_breakout.py; the script run as a user runs it: test_ppo_breakout_run.py."""

import functools
import os
import subprocess
import sys

import gymnax
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import ppo_breakout as ppo
from helpers import (
    ROOT,
    always_action_one,
    assert_truncated_steps_carry_the_value_of_final_obs,
    probe_runner,
)
from probe_envs import ProbeEnv
from utils import parallel, training


# --------------------------------------------------------------------------------------------------
# Data parallel: on two devices (conftest.py gives JAX's CPU backend two) the rollout, an epoch
# and the update step compute what they compute on one
# --------------------------------------------------------------------------------------------------
def test_rollout_value_of_final_obs_per_device_and_under_vmap():
    # The rollout's lax.cond on "some environment was truncated" decides per device under shard_map
    # (the script) and becomes a select under vmap (tools/tune.py). Either way a truncated step
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

    on_devices = jax.jit(jax.shard_map(rollout, mesh=parallel.make_mesh(2),
                                       in_specs=(ppo.RUNNER_SPECS,), out_specs=P(None, "envs"),
                                       check_vma=False))
    check(on_devices(probe_runner(jax.random.key(1), num_envs)),
          lambda x: (x[:, :num_envs // 2], x[:, num_envs // 2:]))

    runners = jax.vmap(probe_runner, in_axes=(0, None))(jax.random.split(jax.random.key(2), 2),
                                                        num_envs)
    check(jax.jit(jax.vmap(rollout))(runners), lambda x: (x[0], x[1]))


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
    runner = jax.jit(functools.partial(ppo.init_runner, env=env, env_params=env_params,
                                       network=network, optimizer=optimizer,
                                       num_envs=args.num_envs),

                     out_shardings=parallel.shardings(mesh, ppo.RUNNER_SPECS))(jax.random.key(0))
    update_step = jax.jit(ppo.make_parallel_update_step(args, env, env_params, network, optimizer,
                                                        mesh))
    start = runner.train_state.params
    for _ in range(args.num_iterations):
        runner, metrics = update_step(runner)
    for leaf, first in zip(jax.tree.leaves(runner.train_state.params), jax.tree.leaves(start)):
        shards = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        assert len(shards) == 2
        np.testing.assert_array_equal(shards[0], shards[1])
        assert not np.allclose(shards[0], np.asarray(first))  # they moved
    assert runner.obs.sharding.spec == P("envs")


# --------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------
def test_a_games_row_fills_the_fields_the_command_line_leaves_unset():
    # Asterix trains with 2 epochs unless --update-epochs says otherwise; other games keep Args'.
    def parse(*argv):
        return training.parse_args(ppo, list(argv))

    assert ppo.GAME_DEFAULTS["Asterix-MinAtar"] == {"update_epochs": 2}
    assert parse("--env-id", "Asterix-MinAtar").update_epochs == 2
    assert parse("--env-id", "Asterix-MinAtar", "--update-epochs", "4").update_epochs == 4
    assert parse("--env-id", "Breakout-MinAtar").update_epochs == 4
    assert parse().update_epochs == ppo.Args.update_epochs == 4


@pytest.mark.parametrize("devices", [1, 4, 8])
def test_the_default_device_count_is_two_whatever_the_machine_has(devices, monkeypatch):
    # A seed is one run only on one device count: the default must not follow the core count. JAX's
    # device list stands in for the machine's (a script's start-up gives JAX one device per core).
    monkeypatch.setattr(jax, "devices", lambda *_: [jax.local_devices()[0]] * devices)
    assert ppo.fill_runtime_fields(ppo.Args()).num_devices == min(devices, 2)
    # 63 environments do not split in two
    assert ppo.fill_runtime_fields(ppo.Args(num_envs=63, num_minibatches=1)).num_devices == 1


# --------------------------------------------------------------------------------------------------
# Importing the script
# --------------------------------------------------------------------------------------------------
def test_importing_the_script_changes_nothing_global():
    # Its start-up settings (one JAX device per core, the imports frozen out of the garbage
    # collector) belong to a run of the script, not to a process that imports it.
    code = ("import gc, os; n = gc.get_freeze_count(); import ppo_breakout; "
            "assert gc.isenabled() and gc.get_freeze_count() == n; "
            "assert 'JAX_NUM_CPU_DEVICES' not in os.environ; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True)

    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr

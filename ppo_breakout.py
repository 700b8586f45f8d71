"""PPO actor-critic for Gymnax's MinAtar games (Breakout by default), in JAX with Haiku, RLax and
Optax.

One jitted `update_step` is a whole PPO iteration: a `lax.scan` rollout of vmapped environments,
GAE, and `update_epochs` x `num_minibatches` gradient steps on the clipped surrogate loss, its ratio
formed from log-probabilities (see loss_stability.py). The Python loop around it only logs; at the
end the final policy is evaluated, drawn and saved.

Read it top to bottom: arguments, environment, network, rollout, GAE, loss, update, metrics. Then
come the machinery a learner may skip: the devices, the checks of the arguments, the training
loop's logging, checkpoints and main's phases.

Run:  python ppo_breakout.py --total-timesteps 1000000
Docs: docs/ppo_breakout.md
"""

import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import re
import sys
import time
from typing import Any, Literal, NamedTuple

# Start-up, as a script only (a process importing this file keeps its own settings):
# - JAX's CPU backend gets one device per core and at least two, for the data-parallel update; it
#   must be set before JAX starts, and importing gymnax starts it;
# - the garbage collector is off while the imports load, and their ~650k objects are then frozen
#   out of its later passes (the __main__ block at the end; docs/ppo_breakout.md: Speed).
if __name__ == "__main__":
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(max(cores or 1, 2)))
    gc.disable()

import gymnax
import haiku as hk
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import rlax
from flax import struct
from gymnax.environments import spaces
from gymnax.wrappers.purerl import GymnaxWrapper
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import checkpoint, cli, diagnostics, evaluation, visualize


@dataclasses.dataclass
class Args:
    exp_name: str = "ppo"
    """the name of this experiment (part of the run directory's name)"""
    seed: int = 1
    """seed of the experiment (network init, environments, minibatch order, evaluation)"""
    env_id: str = "Breakout-MinAtar"
    """the id of the gymnax environment (any with discrete actions; MinAtar games are drawn best)"""
    total_timesteps: int = 1_000_000
    """total environment steps of training"""
    learning_rate: float = 5e-3
    """the learning rate of the Adam optimizer"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over training"""
    num_envs: int = 64
    """the number of parallel environments"""
    num_steps: int = 128
    """the number of steps run in each environment per rollout"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.9
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 16
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 4
    """the number of passes over each rollout (2 for Asterix: GAME_DEFAULTS)"""
    norm_adv: bool = True
    """normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """the clipping coefficient of the surrogate objective (and of the value loss)"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's value estimates, as in the PPO2 implementation"""
    ent_coef: float = 0.01
    """the coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """the coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum global norm of the gradient"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """the widths of the torso's hidden layers, shared by the policy and value heads"""
    activation: Literal["crelu", "relu"] = "crelu"
    """the torso's activation: crelu passes [relu(x), relu(-x)] on, twice the layer's width"""
    layer_norm: bool = True
    """normalize each torso layer's pre-activations (LayerNorm, as PQN does): it keeps long runs
    from collapsing (docs/tuning.md)"""
    conv_channels: int = 8
    """channels of a 3x3 convolution over the grid before the torso, then 2x2 average pooling (0:
    none; an environment whose observations are not a grid gets none unless this is given)"""
    ratio: Literal["log", "direct"] = "log"
    """PPO's probability ratio: log, exp(log pi - log pi_old); direct, pi / pi_old as the paper
    writes it"""
    sticky_action_prob: float = 0.1
    """probability that the game repeats its previous action in training, as in MinAtar (0 for
    gymnax's games as they are)"""
    diagnostics: bool = True
    """log the diagnostics/ scalars and histograms/ of each iteration's rollout and update"""
    eval_episodes: int = 256
    """the number of complete episodes the final policy is evaluated on, per protocol and policy"""
    num_devices: int = 0
    """devices the environments are split across (0: two, or one where JAX has one or the batch
    does not split in two); a seed replays the same run only with the same count"""
    jax_cache_dir: str = "~/.cache/jax-ppo"
    """JAX's persistent compilation cache, so a rerun skips compiling; at most 1 GiB, in a
    directory no uncapped JAX program writes to ("" turns it off)"""
    save_model: bool = True
    """save the final parameters to model.safetensors in the run directory"""
    load_model: str = ""
    """evaluate this model.safetensors instead of training (its header gives --env-id,
    --hidden-sizes, --activation and --layer-norm)"""
    checkpoint_every: int = 5
    """write the whole training state to the run directory's checkpoint.safetensors every this many
    iterations and when the run stops (0: never)"""
    resume: str = ""
    """continue the run in this run directory from its checkpoint, with its arguments: only
    --checkpoint-every, --jax-cache-dir and --num-devices may change (another device count continues
    the run, not bit for bit)"""

    # filled at runtime
    batch_size: int = dataclasses.field(init=False, default=0)
    """the rollout size, num_envs * num_steps"""
    minibatch_size: int = dataclasses.field(init=False, default=0)
    """the minibatch size, batch_size // num_minibatches"""
    num_iterations: int = dataclasses.field(init=False, default=0)
    """the number of PPO iterations, total_timesteps // batch_size"""


# Per-game defaults, only where the evidence shows that one setting cannot serve every game (as
# rl-zoo3 keeps hyperparameters per environment); a flag on the command line wins over its row.
# Evidence: docs/tuning.md, "Cheap changes, and a replication".
GAME_DEFAULTS = {
    # 2 epochs on Asterix: +3.2 [+0.1, +6.8] at 5M steps (8 seeds), +4.3 [-0.4, +9.6] at 10M (10
    # seeds). On Breakout at 1M they cost 2.4 [0.0, 4.8] (8 seeds): 4 stay the default.
    "Asterix-MinAtar": {"update_epochs": 2},
}


# --------------------------------------------------------------------------------------------------
# Environment: gymnax, with MinAtar's sticky actions
# --------------------------------------------------------------------------------------------------
@struct.dataclass
class StickyParams:
    env_params: Any
    sticky_action_prob: float | jax.Array


@struct.dataclass
class StickyState:
    env_state: Any
    last_action: jax.Array  # the action the environment executed last


class StickyActions(GymnaxWrapper):
    """MinAtar's sticky actions (Young & Tian 2019): with probability `sticky_action_prob` the game
    repeats the action it executed last, carried over into the next episode as in MinAtar. The
    probability is traced (one compiled evaluation serves both protocols) and the draw has its own
    key, so at probability 0 the game sees exactly the keys it sees unwrapped."""

    def reset(self, key: jax.Array, params: StickyParams):
        obs, env_state = self._env.reset(key, params.env_params)
        return obs, StickyState(env_state=env_state, last_action=jnp.zeros((), jnp.int32))

    def step(self, key: jax.Array, state: StickyState, action: jax.Array, params: StickyParams):
        if not (isinstance(params.sticky_action_prob, float) and params.sticky_action_prob == 0.0):
            repeat = jax.random.bernoulli(jax.random.fold_in(key, 1), params.sticky_action_prob)
            action = jnp.where(repeat, state.last_action, action)
        obs, env_state, reward, terminated, truncated, info = self._env.step(
            key, state.env_state, action, params.env_params)
        state = StickyState(env_state=env_state, last_action=action)
        return obs, state, reward, terminated, truncated, info


def make_env(env_id: str, sticky_action_prob: float) -> tuple[StickyActions, StickyParams]:
    env, env_params = gymnax.make(env_id)
    return StickyActions(env), StickyParams(env_params, sticky_action_prob)


# --------------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------------
def crelu(x: jax.Array) -> jax.Array:
    """Concatenated ReLU, [relu(x), relu(-x)]: every unit passes its input on, in one half or the
    other."""
    return jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)


# Each activation with its layers' orthogonal-init gain: ReLU zeroes about half its input, hence
# sqrt(2).
ACTIVATIONS = {"crelu": (crelu, 1.0), "relu": (jax.nn.relu, np.sqrt(2))}


def grid_convolution(obs: jax.Array, channels: int) -> jax.Array:
    """The same 3x3 filters at every cell of the grid (PQN and pgx put a convolution over MinAtar's
    grid: docs/tuning.md), ReLU, then the mean of each 2x2 block: (N, H, W, C) -> (N, H // 2,
    W // 2, channels).

    The numbers of hk.Conv2D (zero padding) and hk.avg_pool, with the same parameters, computed as
    one matrix product per 2x2 block: its 4x4 window of the padded grid times the filters placed at
    the block's four cells. XLA's CPU convolution is slow at this size: this trains about 5x faster
    (docs/tuning.md).
    """
    n, height, width, c = obs.shape
    rows, cols = height // 2, width // 2
    with hk.name_scope("conv"):
        w = hk.get_parameter("w", (3, 3, c, channels), init=hk.initializers.Orthogonal(np.sqrt(2)))
        b = hk.get_parameter("b", (channels,), init=jnp.zeros)
    # The filters at the block's cells (u, v) in its 4x4 window: (4 * 4 * c, 2 * 2 * channels).
    w4 = jnp.stack([jnp.pad(w, ((u, 1 - u), (v, 1 - v), (0, 0), (0, 0)))
                    for u in (0, 1) for v in (0, 1)], axis=-2).reshape(16 * c, 4 * channels)
    # Each block's window: rows 2i..2i+3 and columns 2j..2j+3 of the padded grid. Cut by hand:
    # lax.conv_general_dilated_patches is a convolution too, and its gradient is 2x slower here.
    padded = jnp.pad(obs, ((0, 0), (1, 1), (1, 1), (0, 0)))[:, :2 * rows + 2, :2 * cols + 2]
    pairs = padded.reshape(n, rows + 1, 2, cols + 1, 2, c)
    pairs = jnp.concatenate([pairs[:, :-1], pairs[:, 1:]], axis=2)  # (n, rows, 4, cols + 1, 2, c)
    windows = jnp.concatenate([pairs[:, :, :, :-1], pairs[:, :, :, 1:]], axis=4)
    windows = windows.transpose(0, 1, 3, 2, 4, 5).reshape(n, rows, cols, 16 * c)
    cells = jax.nn.relu(windows @ w4 + jnp.tile(b, 4))
    return cells.reshape(n, rows, cols, 4, channels).mean(axis=3)


def actor_critic(obs: jax.Array, num_actions: int, hidden_sizes: tuple[int, ...], activation: str,
                 layer_norm: bool, conv_channels: int = 0, return_features: bool = False):
    """(action logits, state values) of a batch of observations, and the torso's features if
    asked: a convolution over the grid (if conv_channels), then one MLP torso, shared by the policy
    and value heads (why: docs/tuning.md)."""
    # Orthogonal init (Engstrom et al. 2020): 0.01 on the policy head, so the first policy is near
    # uniform.
    act, gain = ACTIVATIONS[activation]
    x = grid_convolution(obs, conv_channels) if conv_channels else obs
    x = x.reshape(obs.shape[0], -1)
    features = []
    for i, width in enumerate(hidden_sizes):
        x = hk.Linear(width, w_init=hk.initializers.Orthogonal(scale=gain), name=f"torso_{i}")(x)
        if layer_norm:
            x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True,
                             name=f"torso_norm_{i}")(x)
        x = act(x)
        features.append(x)
    logits = hk.Linear(num_actions, w_init=hk.initializers.Orthogonal(scale=0.01), name="policy")(x)
    value = hk.Linear(1, w_init=hk.initializers.Orthogonal(scale=1.0), name="value")(x)[:, 0]
    if return_features:
        return logits, value, jnp.concatenate(features, axis=-1)
    return logits, value


def make_network(num_actions: int, hidden_sizes: tuple[int, ...], activation: str,
                 layer_norm: bool, conv_channels: int = 0) -> hk.Transformed:
    return hk.without_apply_rng(hk.transform(functools.partial(
        actor_critic, num_actions=num_actions, hidden_sizes=hidden_sizes, activation=activation,
        layer_norm=layer_norm, conv_channels=conv_channels)))


# --------------------------------------------------------------------------------------------------
# Containers for the state that flows through jit and scan
# --------------------------------------------------------------------------------------------------
class TrainState(NamedTuple):
    params: hk.Params
    opt_state: optax.OptState


class RunnerState(NamedTuple):
    train_state: TrainState  # the parameters and optimizer state, which the update changes
    env_state: Any  # batched environment state, one entry per environment
    obs: jax.Array  # (num_envs, *obs_shape) current observation of each environment
    episode_return: jax.Array  # (num_envs,) return of each environment's episode so far
    episode_length: jax.Array  # (num_envs,) length of each environment's episode so far
    key: jax.Array


class Transition(NamedTuple):
    obs: jax.Array  # o_t
    action: jax.Array  # a_t
    logits: jax.Array  # policy logits at o_t when a_t was sampled (the "old" policy of the update)
    value: jax.Array  # v(o_t) when a_t was sampled
    reward: jax.Array  # r_{t+1}
    terminated: jax.Array  # the episode ended for good: no future value
    truncated: jax.Array  # the time limit cut the episode: the future value is v(final_obs)
    final_value: jax.Array  # v(final_obs) where truncated, else 0 (final_obs: o_{t+1} before reset)
    episode_return: jax.Array  # return of the episode that ended at this step (0 if none ended)
    episode_length: jax.Array  # length of the episode that ended at this step (0 if none ended)
    active_units: jax.Array  # (num_features,) torso features that fired in some environment


class Batch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    logits: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array  # lambda-return, the value target


# --------------------------------------------------------------------------------------------------
# Rollout, GAE, losses, update
# --------------------------------------------------------------------------------------------------
def collect_trajectories(runner: RunnerState, env, env_params, network: hk.Transformed,
                         num_steps: int) -> tuple[RunnerState, Transition]:
    """Steps all environments `num_steps` times with the current policy (a `lax.scan` over time)."""
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(runner: RunnerState, _) -> tuple[RunnerState, Transition]:
        key, action_key, step_key = jax.random.split(runner.key, 3)
        params = runner.train_state.params
        logits, value, features = network.apply(params, runner.obs, return_features=True)
        action = jax.random.categorical(action_key, logits)
        obs, env_state, reward, terminated, truncated, info = vmap_step(
            jax.random.split(step_key, runner.obs.shape[0]), runner.env_state, action, env_params)
        done = terminated | truncated
        # GAE bootstraps truncated steps from v(final_obs); the time limit is rare, so that forward
        # pass runs only on steps where some environment hit it.
        final_value = jax.lax.cond(
            truncated.any(),
            lambda: jnp.where(truncated, network.apply(params, info["final_observation"])[1], 0.0),
            lambda: jnp.zeros_like(value))
        episode_return = runner.episode_return + reward
        episode_length = runner.episode_length + 1
        transition = Transition(
            obs=runner.obs, action=action, logits=logits, value=value, reward=reward,
            terminated=terminated, truncated=truncated, final_value=final_value,
            episode_return=jnp.where(done, episode_return, 0.0),
            episode_length=jnp.where(done, episode_length, 0),
            active_units=(features > 0).any(axis=0))
        runner = runner._replace(env_state=env_state, obs=obs, key=key,
                                 episode_return=jnp.where(done, 0.0, episode_return),
                                 episode_length=jnp.where(done, 0, episode_length))
        return runner, transition

    return jax.lax.scan(env_step, runner, None, length=num_steps)


def calculate_gae(traj: Transition, last_value: jax.Array, gamma: float,
                  gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and lambda-returns, (num_steps, num_envs) each. A terminated step's future is
    worth 0; a truncated one's is v(final_obs), folded into its reward with the discount cut there,
    so rlax's GAE sees both as an ordinary episode end (Pardo et al. 2018, "Time Limits in RL")."""
    bootstrap = traj.truncated & ~traj.terminated
    r_t = traj.reward + gamma * jnp.where(bootstrap, traj.final_value, 0.0)
    discount_t = gamma * (1.0 - (traj.terminated | traj.truncated))
    values = jnp.concatenate([traj.value, last_value[None]], axis=0)
    gae = jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(1, 1, None, 1),
                   out_axes=1)  # over the environments
    advantages = gae(r_t, discount_t, gae_lambda, values)
    return advantages, advantages + traj.value


def log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """log pi(a|s) through log_softmax, which subtracts max(logits) before exponentiating."""
    return jnp.take_along_axis(jax.nn.log_softmax(logits), actions[..., None], axis=-1)[..., 0]


def policy_loss(logits: jax.Array, old_logits: jax.Array, actions: jax.Array, advantages: jax.Array,
                clip_coef: float, ratio: str = "log") -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate loss, and the log-ratio. The ratio pi/pi_old is formed in log space:
    as a division of probabilities it turns 0/0 once logits are far apart (ratio="direct" does
    that)."""
    if ratio == "log":
        log_ratio = log_prob(logits, actions) - log_prob(old_logits, actions)
        prob_ratio = jnp.exp(log_ratio)
    else:
        pick = lambda p: jnp.take_along_axis(p, actions[..., None], axis=-1)[..., 0]  # noqa: E731
        prob_ratio = pick(jax.nn.softmax(logits)) / pick(jax.nn.softmax(old_logits))
        log_ratio = jnp.log(prob_ratio)
    return rlax.clipped_surrogate_pg_loss(prob_ratio, advantages, clip_coef), log_ratio


def value_loss(values: jax.Array, old_values: jax.Array, targets: jax.Array,
               clip_coef: float, clip_vloss: bool) -> jax.Array:
    """Half mean squared error, optionally pessimistic over a clipped update (as PPO2 does)."""
    squared_error = jnp.square(values - targets)
    if clip_vloss:
        clipped = old_values + jnp.clip(values - old_values, -clip_coef, clip_coef)
        squared_error = jnp.maximum(squared_error, jnp.square(clipped - targets))
    return 0.5 * squared_error.mean()


def ppo_loss(params: hk.Params, network: hk.Transformed, mb: Batch,
             args: Args) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's loss on a minibatch: clipped surrogate - entropy bonus + value loss. Its terms and the
    log-ratios come back for the iteration's metrics."""
    logits, values = network.apply(params, mb.obs)
    pg_loss, log_ratio = policy_loss(logits, mb.logits, mb.action, mb.advantage, args.clip_coef,
                                     args.ratio)
    v_loss = value_loss(values, mb.value, mb.target, args.clip_coef, args.clip_vloss)
    entropy = -jnp.sum(jax.nn.softmax(logits) * jax.nn.log_softmax(logits), axis=-1).mean()
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    return loss, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
                  "log_ratio": log_ratio}


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """Adam behind global-norm clipping, its learning rate annealed linearly to 0 over all updates
    (`inject_hyperparams` keeps the current rate in the state, for logging)."""
    num_updates = args.num_iterations * args.update_epochs * args.num_minibatches
    learning_rate = args.learning_rate
    if args.anneal_lr:
        learning_rate = optax.linear_schedule(args.learning_rate, 0.0, num_updates)
    adam = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate, eps=1e-5)
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adam)


def init_runner(key: jax.Array, env, env_params, network: hk.Transformed,
                optimizer: optax.GradientTransformation, num_envs: int) -> RunnerState:
    key, init_key, reset_key = jax.random.split(key, 3)
    reset_keys = jax.random.split(reset_key, num_envs)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, env_params)
    params = network.init(init_key, obs)
    return RunnerState(train_state=TrainState(params, optimizer.init(params)),
                       env_state=env_state, obs=obs, episode_return=jnp.zeros(num_envs),
                       episode_length=jnp.zeros(num_envs, jnp.int32), key=key)


class Iteration(NamedTuple):
    """What an iteration's metrics are computed from."""
    traj: Transition  # the rollout, (num_steps, num_envs, ...)
    batch: Batch  # the update's batch, (num_steps * num_envs, ...)
    infos: dict[str, jax.Array]  # each gradient step's terms, (update_epochs, num_minibatches, ...)


def minibatch_moments(advantages: jax.Array) -> tuple[jax.Array, jax.Array]:
    """E[x] and E[x^2] of each minibatch's advantages (each row of `advantages`)."""
    return advantages.mean(axis=-1), jnp.square(advantages).mean(axis=-1)


def normalize_advantages(advantages: jax.Array, moments) -> jax.Array:
    """Each row (a minibatch's advantages) shifted and scaled to mean 0 and standard deviation 1."""
    mean, mean_sq = moments(advantages)
    std = jnp.sqrt(jnp.maximum(mean_sq - jnp.square(mean), 0.0))
    return (advantages - mean[:, None]) / (std[:, None] + 1e-8)


def update_minibatch(train_state: TrainState, mb: Batch, network: hk.Transformed,
                     optimizer: optax.GradientTransformation, args: Args):
    """One gradient step on a minibatch; its loss terms and gradient norm come back."""
    grads, info = jax.grad(ppo_loss, has_aux=True)(train_state.params, network, mb, args)
    info["grad_norm"] = optax.tree.norm(grads)  # before clipping
    updates, opt_state = optimizer.update(grads, train_state.opt_state, train_state.params)
    return TrainState(optax.apply_updates(train_state.params, updates), opt_state), info


def update_epoch(train_state: TrainState, key: jax.Array, batch: Batch, network: hk.Transformed,
                 optimizer: optax.GradientTransformation, args: Args, moments=minibatch_moments):
    """One pass over the batch in a fresh random order: a gradient step per minibatch."""
    # The permutation is cut into minibatches of row indices; each step gathers its rows, so no
    # shuffled copy of the batch is made.
    num_rows = batch.action.shape[0]
    order = jax.random.permutation(key, num_rows).reshape(args.num_minibatches, -1)
    advantages = batch.advantage[order]  # (num_minibatches, minibatch_size)
    if args.norm_adv:  # every minibatch by its own moments, all in one go
        advantages = normalize_advantages(advantages, moments)

    def minibatch_step(train_state: TrainState, minibatch: tuple[jax.Array, jax.Array]):
        rows, mb_advantage = minibatch
        mb = jax.tree.map(lambda x: x[rows], batch)._replace(advantage=mb_advantage)
        return update_minibatch(train_state, mb, network, optimizer, args)

    return jax.lax.scan(minibatch_step, train_state, (order, advantages))


def make_ppo_iteration(args: Args, env, env_params, network: hk.Transformed,
                       optimizer: optax.GradientTransformation, moments=minibatch_moments):
    """The function that runs one PPO iteration on a RunnerState: rollout, GAE, and the epochs of
    minibatch steps. It returns the new RunnerState and what the metrics need."""
    epoch = functools.partial(update_epoch, network=network, optimizer=optimizer, args=args,
                              moments=moments)

    def ppo_iteration(runner: RunnerState) -> tuple[RunnerState, Iteration]:
        next_key, rollout_key, epochs_key = jax.random.split(runner.key, 3)
        runner, traj = collect_trajectories(runner._replace(key=rollout_key), env, env_params,
                                            network, args.num_steps)
        _, last_value = network.apply(runner.train_state.params, runner.obs)
        advantages, targets = calculate_gae(traj, last_value, args.gamma, args.gae_lambda)
        flatten = lambda x: x.reshape(-1, *x.shape[2:])  # (T, N, ...) -> (T * N, ...)  # noqa: E731
        batch = jax.tree.map(flatten, Batch(obs=traj.obs, action=traj.action, logits=traj.logits,
                                            value=traj.value, advantage=advantages, target=targets))
        epoch_keys = jax.random.split(epochs_key, args.update_epochs)
        train_state, infos = jax.lax.scan(functools.partial(epoch, batch=batch),
                                          runner.train_state, epoch_keys)
        return runner._replace(train_state=train_state, key=next_key), Iteration(traj, batch, infos)

    return ppo_iteration


def make_update_step(args: Args, env, env_params, network: hk.Transformed,
                     optimizer: optax.GradientTransformation):
    """One PPO iteration and its metrics, on one device; the caller jits it."""
    ppo_iteration = make_ppo_iteration(args, env, env_params, network, optimizer)

    def update_step(runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        runner, iteration = ppo_iteration(runner)
        return runner, iteration_metrics(args, iteration, runner.train_state)

    return update_step


# --------------------------------------------------------------------------------------------------
# Metrics: what an iteration logs, from its rollout, batch and the update's per-minibatch terms
# --------------------------------------------------------------------------------------------------
def loss_metrics(infos: dict[str, jax.Array], clip_coef: float) -> dict[str, jax.Array]:
    """Means over epochs x minibatches of the loss terms and gradient norm, with the approximate KL
    and the fraction of clipped ratios over all samples."""
    metrics = {name: value.mean() for name, value in infos.items() if name != "log_ratio"}
    log_ratio = infos["log_ratio"]
    ratio = jnp.exp(log_ratio)
    # The low-variance KL estimator k3 = (r - 1) - log r (http://joschu.net/blog/kl-approx.html).
    metrics["approx_kl"] = jnp.mean((ratio - 1.0) - log_ratio)
    metrics["clipfrac"] = jnp.mean(jnp.abs(ratio - 1.0) > clip_coef)
    return metrics


def explained_variance(values: jax.Array, targets: jax.Array) -> jax.Array:
    """1 - Var[target - value] / Var[target]: 1 is a perfect critic, 0 one that predicts the
    mean."""
    return 1.0 - jnp.var(targets - values) / jnp.var(targets)


def episode_metrics(traj: Transition) -> dict[str, jax.Array]:
    """How many episodes ended in the rollout, and their summed returns and lengths."""
    done = traj.terminated | traj.truncated
    return {"episodes": done.sum(), "episode_return_sum": traj.episode_return.sum(),
            "episode_length_sum": traj.episode_length.sum()}


def all_finite(params: hk.Params, losses: dict[str, jax.Array]) -> jax.Array:
    """One flag for the host's non-finite guard: every parameter, loss term and gradient norm."""
    leaves = jax.tree.leaves(params) + list(losses.values())
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def iteration_metrics(args: Args, iteration: Iteration,
                      train_state: TrainState) -> dict[str, jax.Array]:
    """Everything an iteration logs, from its rollout, batch and loss terms."""
    traj, batch, infos = iteration
    losses = loss_metrics(infos, args.clip_coef)
    metrics = losses | episode_metrics(traj)
    metrics["explained_variance"] = explained_variance(batch.value, batch.target)
    metrics["learning_rate"] = optax.tree_utils.tree_get(  # the rate of the last update
        train_state.opt_state, "learning_rate", filtering=lambda _, x: isinstance(x, jax.Array))
    metrics["finite"] = all_finite(train_state.params, losses)
    if args.diagnostics:
        active_units = traj.active_units.any(axis=0)
        metrics |= diagnostics.training_diagnostics(batch, active_units, infos["log_ratio"])
    return metrics


# --------------------------------------------------------------------------------------------------
# Data parallel: the iteration on each device's share of the environments
# --------------------------------------------------------------------------------------------------
# The environments (and all that comes from them) are split along the mesh's "envs" axis; the
# parameters, optimizer state and key are replicated.
RUNNER_SPECS = RunnerState(train_state=TrainState(P(), P()), env_state=P("envs"), obs=P("envs"),
                           episode_return=P("envs"), episode_length=P("envs"), key=P())
# The devices' iterations, put together along the axes that hold the environments (the rollout's
# second, the batch's rows); the loss terms and which units fired are stacked by device, in front,
# so that flattening them keeps each device's values in one block.
ITERATION_SPECS = Iteration(
    traj=Transition(**{name: P(None, "envs") for name in Transition._fields}
                    | {"active_units": P("envs")}),
    batch=P("envs"), infos=P("envs"))


def make_mesh(num_devices: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:num_devices]), ("envs",))


def make_runner_shardings(mesh: Mesh) -> RunnerState:
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), RUNNER_SPECS, is_leaf=is_spec)


def with_mean_gradient(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer`, stepping with the mean of the devices' gradients (one collective for the whole
    gradient), so that every device takes the same step and the parameters stay replicated."""
    def update(grads, state, params=None):
        flat, unravel = jax.flatten_util.ravel_pytree(grads)
        return optimizer.update(unravel(jax.lax.pmean(flat, "envs")), state, params)

    return optax.GradientTransformation(optimizer.init, update)


def moments_over_devices(advantages: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`minibatch_moments` of the whole minibatches, every device holding a share of each (one
    collective an epoch)."""
    return tuple(jax.lax.pmean(jnp.stack(minibatch_moments(advantages)), "envs"))


def make_parallel_update_step(args: Args, env, env_params, network: hk.Transformed,
                              optimizer: optax.GradientTransformation, mesh: Mesh):
    """`make_update_step`'s step over the devices of the mesh, jitted. Under `jax.shard_map` each
    device runs the one-device iteration on its share of the environments, with its own key (its
    own actions and minibatch order), the whole minibatch's advantage moments and the devices'
    mean gradient: each step is the one-device step on the whole minibatch. The metrics are then
    computed on the devices' iterations put together, XLA adding the reductions."""
    ppo_iteration = make_ppo_iteration(args, env, env_params, network,
                                       with_mean_gradient(optimizer), moments_over_devices)

    def device_iteration(runner: RunnerState) -> tuple[RunnerState, Iteration]:
        shared_key, own_key = jax.random.split(runner.key)
        own_key = jax.random.fold_in(own_key, jax.lax.axis_index("envs"))
        runner, iteration = ppo_iteration(runner._replace(key=own_key))
        return runner._replace(key=shared_key), iteration

    # check_vma=False: with the check on, JAX would itself sum the replicated parameters' gradient
    # over the devices, on top of with_mean_gradient's mean. A test checks they stay replicated.
    iterate = jax.shard_map(device_iteration, mesh=mesh, in_specs=(RUNNER_SPECS,),
                            out_specs=(RUNNER_SPECS, ITERATION_SPECS), check_vma=False)

    def update_step(runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        runner, iteration = iterate(runner)
        return runner, iteration_metrics(args, iteration, runner.train_state)

    return jax.jit(update_step)


# --------------------------------------------------------------------------------------------------
# Arguments: checked before anything is compiled or written
# --------------------------------------------------------------------------------------------------
def check_args(args: Args) -> str | None:
    """What is wrong with `args`, or None; runs before anything is compiled or written."""
    flag = cli.flag
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                 "eval_episodes"):
        if getattr(args, name) <= 0:
            return f"{flag(name)} must be positive, got {getattr(args, name)}"
    if not 0 <= args.seed < 2**32:  # jax.random.key takes a 32-bit seed
        return f"--seed must be in [0, {2**32 - 1}], got {args.seed}"
    # `not x > 0` rather than `x <= 0`: NaN fails every comparison; math.isfinite turns away inf.
    for name in ("learning_rate", "max_grad_norm"):
        if not (getattr(args, name) > 0 and math.isfinite(getattr(args, name))):
            return f"{flag(name)} must be a positive finite number, got {getattr(args, name)}"
    for name in ("ent_coef", "vf_coef"):
        if not (getattr(args, name) >= 0 and math.isfinite(getattr(args, name))):
            return f"{flag(name)} must be a non-negative finite number, got {getattr(args, name)}"
    for name in ("gamma", "gae_lambda"):
        if not 0 <= getattr(args, name) <= 1:
            return f"{flag(name)} must be in [0, 1], got {getattr(args, name)}"
    if not 0 < args.clip_coef <= 1:
        return f"--clip-coef must be in (0, 1], got {args.clip_coef}"
    if not 0 <= args.sticky_action_prob < 1:
        return f"--sticky-action-prob must be in [0, 1), got {args.sticky_action_prob}"
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        return f"--hidden-sizes must be one or more positive widths, got {args.hidden_sizes}"
    if args.conv_channels < 0:
        return f"--conv-channels must be 0 (none) or positive, got {args.conv_channels}"
    plain_name = re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", args.exp_name)
    if not plain_name or ".." in args.exp_name:
        return (f"--exp-name must be a plain name of letters, digits, '_', '-' and '.' (no path, "
                f"no '..', at most 100 characters), got {args.exp_name!r}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        return (f"the batch (num_envs * num_steps = {batch_size}) does not divide into "
                f"--num-minibatches {args.num_minibatches}")
    if args.total_timesteps < batch_size:
        return (f"--total-timesteps {args.total_timesteps} is less than one batch "
                f"(num_envs * num_steps = {batch_size})")
    num_updates = args.total_timesteps // batch_size * args.update_epochs * args.num_minibatches
    if num_updates >= 2**31:  # optax counts gradient steps (schedule, Adam's bias fix) in int32
        return (f"{num_updates:,} gradient steps (--total-timesteps / batch x --update-epochs x "
                f"--num-minibatches) is more than the optimizer can count ({2**31 - 1:,})")
    if args.num_devices < 0:
        return f"--num-devices must be 0 (automatic) or positive, got {args.num_devices}"
    if args.num_devices > len(jax.devices()):
        return (f"--num-devices {args.num_devices} is more than the {len(jax.devices())} devices "
                f"JAX has")
    minibatch_size = batch_size // args.num_minibatches
    if args.num_devices and (args.num_envs % args.num_devices or minibatch_size % args.num_devices):
        return (f"--num-devices {args.num_devices} must divide both --num-envs {args.num_envs} and "
                f"the minibatch size {batch_size // args.num_minibatches}")
    cache_dir = os.path.expanduser(args.jax_cache_dir)
    if args.jax_cache_dir and os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        return f"--jax-cache-dir {args.jax_cache_dir} exists and is not a directory"
    if args.checkpoint_every < 0:
        return f"--checkpoint-every must be 0 (never) or positive, got {args.checkpoint_every}"
    if args.env_id not in gymnax.registered_envs:
        return f"unknown --env-id {args.env_id!r}; gymnax has: {', '.join(gymnax.registered_envs)}"
    env, env_params = gymnax.make(args.env_id)
    if not isinstance(env.action_space(env_params), spaces.Discrete):
        return f"--env-id {args.env_id} has continuous actions; this script handles discrete ones"
    obs_shape = env.observation_space(env_params).shape
    if args.conv_channels and not is_grid(obs_shape):
        return (f"--conv-channels needs a grid of observations (height, width, channels); "
                f"{args.env_id}'s are of shape {obs_shape}")
    training, evaluation = estimate_memory_bytes(args, env, env_params)
    available = cli.available_memory_bytes()
    if training > available:
        return (f"training would need about {training / 2**30:,.1f} GiB of memory (--num-envs x "
                f"--num-steps, --hidden-sizes) and {available / 2**30:,.1f} GiB are available")
    if evaluation > available:
        return (f"--eval-episodes {args.eval_episodes} would need about "
                f"{evaluation / 2**30:,.1f} GiB of memory to play all episodes at once and "
                f"{available / 2**30:,.1f} GiB are available")
    return None


def take_saved_args(args: Args, given: set[str]) -> str | None:
    """--load-model takes the network's arguments from the model file's header, --resume all the
    run's arguments from its checkpoint; a flag given explicitly must agree. Otherwise the game's
    row of GAME_DEFAULTS fills the fields not given. An error, or None."""
    try:
        if args.resume and args.load_model:
            return "--resume continues training and --load-model only evaluates: give one of them"
        if args.load_model:
            saved = checkpoint.read_network_args(args.load_model, NETWORK_ARGS, ADDED_ARGS)
            return cli.adopt(args, saved, given, f"{args.load_model} was trained")
        if args.resume:
            saved = read_checkpoint_args(args.resume)
            return cli.adopt(args, saved, given, f"{args.resume} was run", RESUME_MAY_CHANGE)
    except ValueError as e:
        return str(e)
    for name, value in GAME_DEFAULTS.get(args.env_id, {}).items():
        if name not in given:
            setattr(args, name, value)
    if "conv_channels" not in given and args.env_id in gymnax.registered_envs:  # else: check_args
        env, env_params = gymnax.make(args.env_id)
        if not is_grid(env.observation_space(env_params).shape):
            args.conv_channels = 0  # the default convolution needs a grid (CartPole's is a vector)
    return None


def is_grid(obs_shape: tuple[int, ...]) -> bool:
    """Whether observations of this shape are a grid (height, width, channels) for the convolution."""
    return len(obs_shape) == 3 and min(obs_shape[:2]) >= 2


def estimate_memory_bytes(args: Args, env, env_params) -> tuple[int, int]:
    """Generous estimates of the peak memory of (training, evaluation): a few copies of what the
    rollout, a minibatch step and the evaluation's episodes hold at once."""
    # Traced, not run: nothing compiles.
    obs, state = jax.eval_shape(lambda: env.reset(jax.random.key(0), env_params))

    def nbytes(tree) -> int:
        return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))

    torso_input = math.prod(obs.shape)
    if args.conv_channels:  # the torso reads the convolution's pooled grid
        torso_input = obs.shape[0] // 2 * (obs.shape[1] // 2) * args.conv_channels
    layer_inputs = [torso_input] + [2 * width for width in args.hidden_sizes]  # CReLU: 2x
    num_params = sum(i * o for i, o in zip(layer_inputs, [*args.hidden_sizes, env.num_actions + 1]))
    if args.conv_channels:  # its filters, and its output over the whole grid
        num_params += 9 * obs.shape[-1] * args.conv_channels
        layer_inputs.append(math.prod(obs.shape[:2]) * args.conv_channels)
    features = 4 * sum(layer_inputs)  # bytes per sample
    sample = nbytes(obs) + 4 * (env.num_actions + 8)
    rollout = args.num_envs * args.num_steps * sample + args.num_envs * (nbytes(state) + features)
    minibatch = args.num_envs * args.num_steps // args.num_minibatches * features
    training = 4 * (rollout + minibatch + 8 * num_params)
    return training, 2 * args.eval_episodes * (2 * nbytes(obs) + nbytes(state) + features)


def fill_runtime_fields(args: Args) -> Args:
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if not args.num_devices:  # two wherever JAX has two: then a seed is one run on any CPU count
        fits = args.num_envs % 2 == 0 and args.minibatch_size % 2 == 0
        args.num_devices = 2 if fits and len(jax.devices()) >= 2 else 1
    return args


# --------------------------------------------------------------------------------------------------
# Main: set up, compile, train (the loop only logs), evaluate, save
# --------------------------------------------------------------------------------------------------
LOSS_METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac",
                "explained_variance")
CACHE_MAX_BYTES = 2**30  # a search compiles a program per setting: the cache must not fill the disk
# The arguments that rebuild the network, in a model file's header; ADDED_ARGS: the fields added
# since model files and search studies were first saved, with the value they had before.
NETWORK_ARGS = ("env_id", "hidden_sizes", "activation", "layer_norm", "conv_channels")
ADDED_ARGS = {"conv_channels": 0}


class History(NamedTuple):
    """The learning curve: the mean return of the training episodes that ended in each iteration."""
    steps: list
    seconds: list
    returns: list


class Progress(NamedTuple):
    """How far training is: with the RunnerState, what a checkpoint holds."""
    iteration: int
    history: History
    train_seconds: float


class TrainResult(NamedTuple):
    runner: RunnerState  # the state to keep: after a non-finite value, the one before it
    status: str  # "completed", "interrupted" or "non_finite"
    progress: Progress
    non_finite: str | None  # the first metric found non-finite


def train(args: Args, update_step, runner: RunnerState, writer: checkpoint.RunLog,
          stop: cli.StopSignals, start: Progress, save_checkpoint=None):
    """Runs and logs the iterations after `start`; stops early on a signal or a non-finite value;
    calls save_checkpoint(runner, progress) every --checkpoint-every iterations."""
    every_tenth = max(1, args.num_iterations // 10)
    history = start.history
    recent_return = history.returns[-1] if history.returns else float("nan")
    elapsed = start.train_seconds
    train_start = time.time() - elapsed  # a resumed run's clock goes on from its checkpoint
    for iteration in range(start.iteration + 1, args.num_iterations + 1):
        previous = runner
        runner, metrics = update_step(runner)
        metrics = jax.device_get(metrics)  # the one host transfer per iteration
        global_step = iteration * args.batch_size
        elapsed = time.time() - train_start
        scalars = {"charts/SPS": global_step / elapsed,
                   "charts/learning_rate": metrics["learning_rate"]}
        if metrics["episodes"] > 0:  # only episodes that ended, never placeholders
            recent_return = metrics["episode_return_sum"] / metrics["episodes"]
            scalars["charts/episodic_return"] = recent_return
            scalars["charts/episodic_length"] = metrics["episode_length_sum"] / metrics["episodes"]
            history.steps.append(global_step)
            history.seconds.append(elapsed)
            history.returns.append(float(recent_return))
        scalars |= {f"losses/{name}": metrics[name] for name in LOSS_METRICS}
        if args.diagnostics:
            scalars |= {f"diagnostics/{name}": metrics[name] for name in diagnostics.DIAGNOSTICS}
            frequencies = enumerate(metrics["action_frequency"])
            scalars |= {f"diagnostics/action_{a}_frequency": f for a, f in frequencies}
        # What is not finite stays out of TensorBoard: the guard below reports it.
        finite = {tag: v for tag, v in scalars.items() if np.isfinite(v)}
        visualize.log_scalars(writer, finite, global_step)
        tenth = iteration % every_tenth == 0 or iteration == args.num_iterations
        if args.diagnostics and (tenth or iteration == 1):
            visualize.log_histograms(writer, metrics["histograms"], global_step)
        if not metrics["finite"]:
            bad = [f"losses/{name}" for name in LOSS_METRICS if not np.isfinite(metrics[name])]
            if not np.isfinite(metrics["grad_norm"]):
                bad.append("diagnostics/grad_norm")
            progress = Progress(iteration - 1, history, elapsed)
            return TrainResult(previous, "non_finite", progress, (bad + ["the parameters"])[0])
        if tenth:
            print(f"step {global_step:>9,} | SPS {global_step / elapsed:>8,.0f} | "
                  f"episodic return {recent_return:6.2f}")
        if save_checkpoint and iteration % args.checkpoint_every == 0:
            save_checkpoint(runner, Progress(iteration, history, elapsed))
        if stop.received:
            return TrainResult(runner, "interrupted", Progress(iteration, history, elapsed), None)
    return TrainResult(runner, "completed", Progress(args.num_iterations, history, elapsed), None)


# --------------------------------------------------------------------------------------------------
# Checkpoints: the whole training state, so that a resumed run is the run that would have been
# --------------------------------------------------------------------------------------------------
CHECKPOINT = "checkpoint.safetensors"
CHECKPOINT_FORMAT = "ppo_breakout checkpoint 1"
RESUME_MAY_CHANGE = ("checkpoint_every", "jax_cache_dir", "num_devices")  # they change no result


def code_version() -> str:
    """A digest of the code that decides what is trained, logged and evaluated."""
    here = os.path.dirname(os.path.abspath(__file__))
    return checkpoint.source_digest(__file__, *(os.path.join(here, "utils", name)
                                                for name in ("evaluation.py", "diagnostics.py")))


def save_checkpoint(run_dir: str, args: Args, writer: checkpoint.RunLog, runner: RunnerState,
                    progress: Progress) -> None:
    """Writes the runner, progress and arguments to the run directory's checkpoint, in the
    background, once the log up to here is on disk."""
    step = progress.iteration * args.batch_size
    kept = sum(s <= step for s in progress.history.steps)  # a non-finite stop: the state before it
    history = History(*(np.array(column[:kept], dtype) for column, dtype in
                        zip(progress.history, (np.int64, np.float64, np.float64))))
    saved_args = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
                  if f.init and f.name != "resume"}
    header = {"format": CHECKPOINT_FORMAT, "code": code_version(), "iteration": progress.iteration,
              "train_seconds": progress.train_seconds, "args": saved_args}
    writer.save_state(os.path.join(run_dir, CHECKPOINT), {"runner": runner, "history": history},
                      {name: json.dumps(value) for name, value in header.items()}, step)


def read_checkpoint(run_dir: str) -> tuple[str, dict, dict]:
    """(path, tensors, header) of `run_dir`'s checkpoint if this code can resume it, else
    ValueError."""
    path = os.path.join(run_dir, CHECKPOINT)
    if not os.path.isdir(run_dir):
        raise ValueError(f"--resume {run_dir}: no such run directory")
    status = None  # a run killed outright has no summary.json
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(os.path.join(run_dir, "summary.json")) as f:
            status = json.load(f)["status"]
    if status == "completed":
        raise ValueError(f"--resume {run_dir}: that run completed; nothing to resume")
    if not os.path.exists(path):
        raise ValueError(f"--resume {run_dir} has no {CHECKPOINT} (it ran with "
                         f"--checkpoint-every 0, or stopped before its first)")
    tensors, header = checkpoint.read_safetensors(path, "--resume")
    if header.get("format") != json.dumps(CHECKPOINT_FORMAT):
        raise ValueError(f"{path} is not a checkpoint of this script")
    if checkpoint.header_value(path, header, "code") != code_version():
        raise ValueError(f"{path} was written by another version of ppo_breakout.py or utils/; "
                         f"resume it with the code that wrote it")
    return path, tensors, header


def read_checkpoint_args(run_dir: str) -> dict:
    path, _, header = read_checkpoint(run_dir)
    return checkpoint.header_value(path, header, "args")


def load_checkpoint(run_dir: str, like: RunnerState,
                    shardings: RunnerState) -> tuple[RunnerState, Progress]:
    """The runner (placed on `shardings`) and Progress of `run_dir`'s checkpoint; `like` gives the
    runner's structure, shapes and dtypes."""
    path, tensors, header = read_checkpoint(run_dir)
    runner = jax.device_put(checkpoint.restore(path, tensors, header, "runner", like), shardings)
    if any(f"history.{name}" not in tensors for name in History._fields):
        raise ValueError(f"{path} has no learning curve: it is not a checkpoint of this script")
    history = History(*(tensors[f"history.{name}"].tolist() for name in History._fields))
    checkpoint.remove_partial_writes(run_dir)  # of a run killed while writing a checkpoint
    return runner, Progress(checkpoint.header_value(path, header, "iteration"), history,
                            checkpoint.header_value(path, header, "train_seconds"))


# --------------------------------------------------------------------------------------------------
# Main's phases: set up, compile, train, evaluate, save
# --------------------------------------------------------------------------------------------------
class Training(NamedTuple):
    """What the train phase starts from: the compiled update, the runner and how far it is."""
    update_step: Any
    runner: RunnerState
    start: Progress


def configure_jax(args: Args) -> None:
    if args.jax_cache_dir:  # every program, also those under JAX's 1 s default (the key splits)
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(args.jax_cache_dir))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)  # oldest go first


def load_params(args: Args, env, env_params, network: hk.Transformed, key: jax.Array) -> hk.Params:
    """The parameters of --load-model, checked against the network's shapes."""
    obs = jax.eval_shape(env.reset, key, env_params)[0]
    like = jax.ShapeDtypeStruct((1, *obs.shape), obs.dtype)
    shapes = jax.eval_shape(network.init, key, like)
    network_args = {name: getattr(args, name) for name in NETWORK_ARGS}
    return cli.or_exit(checkpoint.load_model, args.load_model, network_args, shapes,
                       ADDED_ARGS)


def compile_training(args: Args, env, env_params, network: hk.Transformed,
                     key: jax.Array) -> Training:
    """The update compiled for --num-devices, and the runner it starts from: a fresh one, or the
    checkpoint's of --resume."""
    optimizer = make_optimizer(args)
    mesh = make_mesh(args.num_devices)
    init = jax.jit(functools.partial(init_runner, env=env, env_params=env_params,
                                     network=network, optimizer=optimizer,
                                     num_envs=args.num_envs),
                   out_shardings=make_runner_shardings(mesh))
    if args.resume:  # read before anything is written
        like = jax.eval_shape(init, key)
        runner, start = cli.or_exit(load_checkpoint, args.resume, like,
                                    make_runner_shardings(mesh))
    else:
        runner = init(key)
        start = Progress(0, History([], [], []), 0.0)
    update_step = make_parallel_update_step(args, env, env_params, network, optimizer, mesh)
    return Training(update_step.lower(runner).compile(), runner, start)


def open_log(run_dir: str, args: Args, start: Progress) -> checkpoint.RunLog:
    """The run's TensorBoard log; a resumed one starts where the checkpoint stopped, and
    TensorBoard drops what was logged after it."""
    start_step = start.iteration * args.batch_size
    purge_step = start_step + 1 if args.resume else None
    writer = checkpoint.RunLog(run_dir, start_step, purge_step)
    if not args.resume:
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n"
                        + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    return writer


def run_training(args: Args, training: Training, writer: checkpoint.RunLog, run_dir: str,
                 stop: cli.StopSignals, compile_seconds: float) -> tuple[TrainResult, dict]:
    """Trains, checkpointing as it goes; the result and summary.json's training fields."""
    start_step = training.start.iteration * args.batch_size
    resumed = f"; resumed at step {start_step:,}" if args.resume else ""
    print(f"{args.env_id}: {args.num_iterations} iterations of {args.batch_size} steps on "
          f"{args.num_devices} device(s); compiled in {compile_seconds:.1f}s; "
          f"logging to {run_dir}{resumed}")
    save = None
    if args.checkpoint_every:
        save = functools.partial(save_checkpoint, run_dir, args, writer)
    result = train(args, training.update_step, training.runner, writer, stop, training.start, save)
    if save:  # the state it stopped in (after a non-finite value, the last finite one)
        save(result.runner, result.progress)
    iterations = result.progress.iteration
    seconds = result.progress.train_seconds
    step = iterations * args.batch_size
    fields = {"status": result.status, "global_step": step, "iterations": iterations,
              "train_seconds": seconds, "sps": step / seconds if step else 0.0}
    if args.resume:
        fields["resumed_at_step"] = start_step
    if result.status == "non_finite":
        print(f"error: {result.non_finite} is non-finite in iteration {iterations + 1}; stopped "
              f"and saved the parameters from before it (step {step:,})", file=sys.stderr)
        fields.update(non_finite=result.non_finite, non_finite_iteration=iterations + 1)
    elif result.status == "interrupted":
        print(f"interrupted at step {step:,}", file=sys.stderr)
    return result, fields


def evaluate_and_draw(args: Args, play, params: hk.Params, history: History,
                      writer: checkpoint.RunLog, run_dir: str, step: int) -> dict:
    """Plays the final evaluations and draws them and the learning curve; summary.json's `eval`.
    The devices play the sampled pair while the host draws the learning curve (a call waits for a
    device that is still busy, so the greedy pair is queued after the drawing)."""
    title = f"{args.env_id}, seed {args.seed}"
    results = {"sampled": play(params, "sampled")}
    if history.steps:
        figure = visualize.learning_curve_figure(*history, title)
        visualize.write_picture(writer, run_dir, "learning_curve.png", "charts/learning_curve",
                                visualize.figure_to_png(figure), step)
    results["greedy"] = play(params, "greedy")
    return visualize.report_evaluations(results, writer, run_dir, step, f"{title}, step {step:,}",
                                        args.env_id)


def save_model(run_dir: str, args: Args, params: hk.Params, step: int) -> str:
    path = os.path.join(run_dir, "model.safetensors")
    network_args = {name: getattr(args, name) for name in NETWORK_ARGS}
    checkpoint.save_model(path, params, network_args,
                          {"global_step": str(step), "args": json.dumps(vars(args))})
    return path


def main() -> None:
    # Set up: arguments, JAX, the environment, the network and the keys.
    wall_start = time.time()
    args = cli.parse_args(Args, check_args, __doc__.split("\n\n")[0], take_saved=take_saved_args)
    configure_jax(args)
    fill_runtime_fields(args)
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    network = make_network(env.action_space(env_params).n, args.hidden_sizes, args.activation,
                           args.layer_norm, args.conv_channels)
    runner_key, eval_key = jax.random.split(jax.random.key(args.seed))

    # Compile ahead of time, before the run directory exists and before the clock for SPS starts.
    compile_start = time.time()
    training = None
    if args.load_model:
        params = load_params(args, env, env_params, network, runner_key)
    else:
        training = compile_training(args, env, env_params, network, runner_key)
        params = training.runner.train_state.params
    play = evaluation.compile_final_evaluation(
        env, args.env_id, env_params, lambda p, o: network.apply(p, o)[0], args.eval_episodes,
        args.num_devices, eval_key, params)
    compile_seconds = time.time() - compile_start

    run_dir = args.resume or cli.make_run_dir(f"{args.env_id}__{args.exp_name}__{args.seed}")
    start = training.start if training else Progress(0, History([], [], []), 0.0)
    writer = open_log(run_dir, args, start)
    summary = cli.RunSummary(run_dir, args, wall_start, env_id=args.env_id, seed=args.seed,
                             total_timesteps=args.total_timesteps, compile_seconds=compile_seconds)
    # summary.json says how the run ended, whatever happens from here on.
    with summary, contextlib.closing(writer), cli.StopSignals() as stop:
        # Train.
        history = start.history
        if training:
            result, fields = run_training(args, training, writer, run_dir, stop, compile_seconds)
            summary.update(fields)
            params = result.runner.train_state.params
            history = result.progress.history
        else:
            print(f"{args.env_id}: evaluating {args.load_model}; compiled in "
                  f"{compile_seconds:.1f}s; logging to {run_dir}")
            summary.update(status="completed", global_step=0, load_model=args.load_model)

        # Evaluate.
        if summary["status"] == "completed":
            eval_start = time.time()
            summary["eval"] = evaluate_and_draw(args, play, params, history, writer, run_dir,
                                                summary["global_step"])
            summary.update(eval_episodes=args.eval_episodes, eval_seconds=time.time() - eval_start)

        # Save.
        if args.save_model and training:
            summary["model"] = save_model(run_dir, args, params, summary["global_step"])
        if stop.received:
            summary["status"] = "interrupted"
    print(f"summary: {os.path.join(run_dir, 'summary.json')}")
    if stop.received:
        sys.exit(128 + stop.received)
    sys.exit(3 if summary["status"] == "non_finite" else 0)


if __name__ == "__main__":
    gc.freeze()  # the imports' objects, out of later collections (see the start-up block above)
    gc.enable()
    main()

"""Scaled-replay DQN: DQN that replays each sample many times and keeps learning by resetting its
network, for Gymnax's MinAtar games (Breakout by default), in JAX with Haiku, RLax and Optax. Its
recipe is the model-free part of SR-SPR (D'Oro et al., ICLR 2023) and BBF (Schwarzer et al., ICML
2023), for the 1M-step regime: several gradient steps per environment step, periodic resets (the
layers after the convolution re-initialised, the convolution moved halfway to a fresh
initialisation, the optimizer's moments reset), n-step returns and a discount annealed after each
reset, an EMA target network that also acts, and AdamW.

Vectorised environments act epsilon-greedily (with the target network) and write every
transition to a replay buffer in the training state; gradient steps on uniformly sampled windows
are interleaved with the environment steps at a set replay ratio. One jitted `update_step` is a
whole iteration: `num_steps` steps of every environment, cut into chunks of a `lax.scan` rollout,
its transitions added to the buffer, then the chunk's gradient steps, then a reset if one is due.

Read it top to bottom: arguments, network, rollout, buffer, the annealed n-step Double DQN target,
loss, update, the reset, metrics and the argument checks, then `make_agent`, what the shared run
loop in utils/training.py trains. dqn_minatar.py is the agent it grew from (one replay ratio, no
resets, a copied target, Adam, the online network acting, a fixed n and discount). Its replay
buffer keeps flashbax's rows and windows but is written here, laid out for a TPU (Replay), and
the batches are drawn as dqn_minatar.py draws them, so that this file reads alone.

Run:  python sr_dqn_minatar.py --total-timesteps 1000000
Docs: docs/sr_dqn_minatar.md
"""

import dataclasses
import functools
import math
import sys
from typing import Any, Callable, Literal, NamedTuple

if __name__ == "__main__":  # before JAX starts: its CPU devices, and a faster start-up
    from utils import startup

    startup.before_imports()

import distrax
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax
from jax.sharding import PartitionSpec as P

from utils import cli, contract, layers, startup, training
from utils.env import check_grid, default_conv_channels, make_env


@dataclasses.dataclass
class Args(contract.RunArgs):
    learning_rate: float = 1e-4
    """the learning rate of AdamW (BBF's)"""
    adam_eps: float = 1.5e-4
    """AdamW's epsilon (BBF's)"""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay, on weights, not biases (BBF's; 0 for Adam)"""
    num_envs: int = 32
    """the number of parallel environments"""
    num_steps: int = 128
    """the number of steps run in each environment per iteration (one update step), among which
    the iteration's gradient steps are spread evenly"""
    buffer_size: int = 1_000_000
    """the replay buffer's capacity in transitions, over all environments (1M: a 1M-step run
    forgets nothing, as BBF's 200k buffer at 100k steps)"""
    batch_size: int = 32
    """the number of windows each gradient step samples from the buffer, uniformly and with
    replacement"""
    replay_ratio: float = 2.0
    """gradient steps per environment step (BBF's released setting: 2; its headline runs: 8)"""
    n_step_start: int = 10
    """the number of rewards in each target right after a reset, fewer where the episode ends;
    annealed to n_step over anneal_steps gradient steps (BBF's)"""
    n_step: int = 3
    """the number of rewards in each target once annealed (BBF's)"""
    gamma_start: float = 0.97
    """the discount right after a reset, annealed to gamma over anneal_steps (BBF's)"""
    gamma: float = 0.997
    """the discount once annealed (BBF's)"""
    anneal_steps: int = 10_000
    """gradient steps after each reset (and after the first) over which n and gamma anneal,
    exponentially, as BBF's (0: none, n_step and gamma throughout)"""
    reset_period: int = 40_000
    """gradient steps between resets (SR-SPR's and BBF's); a reset is skipped where less than a
    period of training would follow it (0: never reset)"""
    shrink: float = 0.5
    """at a reset, the convolution becomes shrink * itself + (1 - shrink) * a fresh
    initialisation (BBF's 0.5; SR-SPR's 0.8); the layers after it start afresh"""
    learning_starts: int = 5_000
    """environment steps of uniformly random actions that fill the buffer before learning starts
    (MinAtar's DQN)"""
    tau: float = 0.005
    """the target network's step after every gradient step, target <- tau * online + (1 - tau) *
    target (BBF's)"""
    act_with_target: bool = True
    """act, and evaluate, with the target network (SR-SPR's and BBF's), not the online one"""
    epsilon_end: float = 0.01
    """the exploration probability epsilon once it has decayed from 1 (Dopamine's)"""
    epsilon_decay_steps: int = 250_000
    """environment steps after learning_starts over which epsilon decays linearly to epsilon_end
    (Dopamine's)"""
    loss: Literal["huber", "l2"] = "huber"
    """the loss of the TD error: Huber with delta 1 (MinAtar's DQN) or half its square"""
    hidden_sizes: tuple[int, ...] = (256,)
    """the widths of the Q-network's hidden layers (dqn_minatar.py's)"""
    layer_norm: bool = False
    """normalize each hidden layer's pre-activations (LayerNorm)"""
    conv_channels: int = 32
    """channels of a 3x3 convolution over the grid before the hidden layers (0: none; then a reset
    starts the whole network afresh)"""
    conv_style: Literal["pooled", "minatar"] = "pooled"
    """the convolution: "pooled" (zero padding, ReLU, 2x2 average pooling: the project's) or
    "minatar" (no padding, ReLU, no pooling: MinAtar's own DQN)"""
    eval_epsilon: float = 0.05
    """epsilon of the "sampled" final evaluation; the "greedy" one takes argmax Q. 0.05 is the
    evaluation epsilon of Nature's DQN and CleanRL's DQN"""


# --------------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------------
def q_network(obs: jax.Array, num_actions: int, hidden_sizes: tuple[int, ...], layer_norm: bool,
              conv_channels: int = 0, conv_style: str = "pooled") -> jax.Array:
    """Q-values, (batch, num_actions): a convolution over the grid (if conv_channels), then
    Linear -> (LayerNorm) -> ReLU per hidden layer, then a linear head with one output per action:
    pqn_minatar.py's network family."""
    x = obs.astype(jnp.float32)  # the buffer gives MinAtar's 0/1 grids back as uint8
    if conv_channels and conv_style == "pooled":
        # = hk.Conv2D -> ReLU -> hk.avg_pool(2x2), as matrix products where XLA's convolution is
        # slow (a CPU), as XLA's convolution elsewhere
        x = layers.conv_relu_pool(x, conv_channels, xla_conv=jax.default_backend() != "cpu")
    elif conv_channels:
        x = jax.nn.relu(layers.conv_valid(x, conv_channels))  # = hk.Conv2D(padding="VALID")
    x = x.reshape(obs.shape[0], -1)
    for i, width in enumerate(hidden_sizes):
        x = hk.Linear(width, w_init=hk.initializers.VarianceScaling(2.0), name=f"torso_{i}")(x)
        if layer_norm:
            x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True,
                             name=f"torso_norm_{i}")(x)
        x = jax.nn.relu(x)
    return hk.Linear(num_actions, w_init=hk.initializers.VarianceScaling(1.0), name="q")(x)


def make_network(num_actions: int, hidden_sizes: tuple[int, ...], layer_norm: bool,
                 conv_channels: int = 0, conv_style: str = "pooled") -> hk.Transformed:
    """q_network as a pure (init, apply) pair; it draws no random numbers when applied."""
    return hk.without_apply_rng(hk.transform(functools.partial(
        q_network, num_actions=num_actions, hidden_sizes=hidden_sizes, layer_norm=layer_norm,
        conv_channels=conv_channels, conv_style=conv_style)))


# --------------------------------------------------------------------------------------------------
# Containers for the state that flows through jit and scan
# --------------------------------------------------------------------------------------------------
class TrainState(NamedTuple):
    params: hk.Params  # the online network, which the gradient steps change
    target_params: hk.Params  # the target network: an EMA of the online one; it acts
    opt_state: optax.OptState
    steps: jax.Array  # gradient steps so far: the reset schedule's clock
    since_reset: jax.Array  # gradient steps since the last reset (or the first): n's and gamma's
    resets: jax.Array  # resets so far


class Transition(NamedTuple):
    """One environment's step, as the replay buffer stores it. next_obs is stored, not read off
    the next step: after an auto-reset that is the next episode's first observation, and a
    truncated step bootstraps from the last one of its own (flashbax issue #3)."""
    obs: jax.Array  # o_t (as ObsCodec.encode stores it)
    action: jax.Array  # a_t
    reward: jax.Array  # r_{t+1}
    terminated: jax.Array  # the episode ended for good: no future value
    truncated: jax.Array  # the time limit cut the episode: the future is worth Q(next_obs)
    next_obs: jax.Array  # o_{t+1}: where the episode ended, the observation before the reset


class ObsCodec(NamedTuple):
    """How the buffer stores observations: `encode` before writing, `decode` after sampling."""
    encode: Callable[[jax.Array], jax.Array]
    decode: Callable[[jax.Array], jax.Array]


AS_IS = ObsCodec(encode=lambda obs: obs, decode=lambda stored: stored)


def grid_codec(shape: tuple[int, ...]) -> ObsCodec:
    """MinAtar's observations are grids of 0 and 1 in float32: each is kept as its bits packed
    along one flat axis of bytes (Breakout's 10x10x4 grid: 50 bytes, about 1/32 of float32's),
    unpacked to uint8 0/1 grids. One wide trailing axis, since a TPU tiles an array by its last
    two axes, and (10, 10, 1) bytes are padded many times over."""
    size = math.prod(shape)
    return ObsCodec(
        encode=lambda obs: jnp.packbits(obs.reshape(*obs.shape[:-len(shape)], size).astype(bool),
                                        axis=-1),
        decode=lambda stored: jnp.unpackbits(stored, axis=-1, count=size).reshape(
            *stored.shape[:-1], *shape))


class Replay(NamedTuple):
    """The replay buffer: the last buffer_size // num_envs steps of each environment, a row of
    consecutive steps per environment, written and overwritten as flashbax's trajectory buffer
    writes its rows (one slot of every row per step), but laid out for a TPU: there a buffer
    written in flashbax's (envs, time, ...) fields and then gathered from is copied whole into
    another layout every chunk (speed/trace_step.py), and windows of steps gather slowly one step
    at a time (speed/sr_dqn_sample.py; docs/sr_dqn_minatar.md)."""
    obs: jax.Array  # (envs * length, ...) o_t as ObsCodec.encode stores it, at env * length + slot
    next_obs: jax.Array  # (envs * length, ...) o_{t+1}, likewise
    action: jax.Array  # (envs * length,) a_t, likewise
    blocks: jax.Array  # (envs, blocks, 3 * block) float32 rewards and episode ends (make_buffer)
    index: jax.Array  # the slot the next step goes to in every row
    full: jax.Array  # whether every slot holds a step


class RunnerState(NamedTuple):
    train_state: TrainState
    buffer_state: Replay  # the replay buffer
    env_state: Any  # batched environment state, one entry per environment
    obs: jax.Array  # (num_envs, *obs_shape) current observation of each environment
    episode_return: jax.Array  # (num_envs,) return of each environment's episode so far
    episode_length: jax.Array  # (num_envs,) length of each environment's episode so far
    env_steps: jax.Array  # environment steps so far, over all environments: the run's clock
    key: jax.Array


class EpisodeEnds(NamedTuple):
    """What a step tells the metrics about the episodes that ended on it (0 where none did)."""
    done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array


class Batch(NamedTuple):
    """n-step windows reduced to what the Double DQN target needs."""
    obs: jax.Array  # o_t, where the window starts
    action: jax.Array  # a_t
    reward: jax.Array  # the discounted rewards of the window's k steps in the episode
    discount: jax.Array  # gamma^k, or 0 where the episode terminated within the window
    next_obs: jax.Array  # o_{t+k}, which the target bootstraps from


class Chunk(NamedTuple):
    """What a chunk of an iteration (a rollout, then gradient steps) tells the metrics."""
    ended: EpisodeEnds  # (steps_per_chunk, num_envs)
    epsilon: jax.Array  # (steps_per_chunk,) the epsilon each step acted with
    learned: jax.Array  # whether the gradient steps ran (not during the warm-up)
    infos: dict[str, jax.Array]  # each gradient step's loss terms, (updates_per_chunk,)


# --------------------------------------------------------------------------------------------------
# Rollout and replay buffer
# --------------------------------------------------------------------------------------------------
def epsilon_schedule(args: Args) -> optax.Schedule:
    """Epsilon at each environment step: 1 (uniformly random actions) for the first
    learning_starts steps, then linear to epsilon_end over epsilon_decay_steps, then constant
    (Dopamine's `linearly_decaying_epsilon`)."""
    return optax.linear_schedule(1.0, args.epsilon_end, args.epsilon_decay_steps,
                                 transition_begin=args.learning_starts)


def acting_params(train_state: TrainState, act_with_target: bool) -> hk.Params:
    """The network that acts: the target one (an EMA of the online one, steadier at high replay
    ratios: SR-SPR, BBF), or the online one."""
    return train_state.target_params if act_with_target else train_state.params


def collect_transitions(runner: RunnerState, env, env_params, network: hk.Transformed,
                        num_steps: int, epsilon_at: optax.Schedule, codec: ObsCodec,
                        act_with_target: bool
                        ) -> tuple[RunnerState, tuple[Transition, EpisodeEnds, jax.Array]]:
    """Steps all environments `num_steps` times, epsilon-greedy in the acting network's Q-values
    (a `lax.scan` over time); each step's transitions (observations encoded for the buffer),
    episode ends and epsilon."""
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    num_envs = runner.obs.shape[0]

    def env_step(runner: RunnerState, _):
        key, action_key, step_key = jax.random.split(runner.key, 3)
        epsilon = epsilon_at(runner.env_steps)
        q_values = network.apply(acting_params(runner.train_state, act_with_target), runner.obs)
        action = distrax.EpsilonGreedy(q_values, epsilon).sample(seed=action_key)
        obs, env_state, reward, terminated, truncated, info = vmap_step(
            jax.random.split(step_key, num_envs), runner.env_state, action, env_params)
        # After an auto-reset `obs` is the next episode's first observation; a truncated step
        # bootstraps from the one its own episode reached, which gymnax keeps in the info.
        transition = Transition(
            obs=codec.encode(runner.obs), action=action, reward=reward.astype(jnp.float32),
            terminated=terminated, truncated=truncated,
            next_obs=codec.encode(info["final_observation"]))
        done = terminated | truncated
        episode_return = runner.episode_return + reward
        episode_length = runner.episode_length + 1
        ended = EpisodeEnds(done, jnp.where(done, episode_return, 0.0),
                            jnp.where(done, episode_length, 0))
        runner = runner._replace(env_state=env_state, obs=obs, key=key,
                                 episode_return=jnp.where(done, 0.0, episode_return),
                                 episode_length=jnp.where(done, 0, episode_length),
                                 env_steps=runner.env_steps + num_envs)
        return runner, (transition, ended, epsilon)

    return jax.lax.scan(env_step, runner, None, length=num_steps)


def max_n(args: Args) -> int:
    """The longest n-step window the run uses."""
    return max(args.n_step_start, args.n_step)


class ReplayBuffer(NamedTuple):
    """The buffer's pure functions, as flashbax names them: init(one_step) -> Replay,
    add(replay, transitions (envs, steps, ...)) -> Replay, can_sample(replay) -> bool."""
    init: Callable
    add: Callable
    can_sample: Callable


def row_length(replay: Replay) -> int:
    """The steps each environment's row of the buffer holds."""
    return replay.action.shape[0] // replay.blocks.shape[0]


def block_size(max_n: int) -> int:
    """Steps in a block of Replay.blocks: the multiple of 32 that holds the longest window."""
    return 32 * -(-max_n // 32)


def make_buffer(args: Args) -> ReplayBuffer:
    """The replay buffer, sampled as windows of n_step_start consecutive steps (the longest n) of
    one row, started uniformly among those that lie wholly between the oldest step kept and the
    write head (window_indices: flashbax's trajectory buffer's rule, >= 0.1.3, PR #50). The
    windows thus never mix environments; episode ends inside a window are n_step_return's to cut.
    A row's rewards and episode ends are kept in blocks of block_size steps, each field's steps
    side by side in a block (a TPU pads an array's last axis to 128: a last axis of the three
    fields would take 42 times their memory), a window read from the two blocks that hold it
    (window_steps). Position p of a row's blocks holds its slot p % length: the slots at the
    row's start repeat after its end, so that a window that wraps reads on."""
    num_envs, length = args.num_envs, args.buffer_size // args.num_envs
    size = block_size(max_n(args))
    num_blocks = length // size + 2  # the last window's second block lies past the row's end
    repeats = -(-num_blocks * size // length)  # copies of a slot in the blocks (past them: dropped)

    def init(one: Transition) -> Replay:
        rows = lambda x: jnp.zeros((num_envs * length, *x.shape), x.dtype)  # noqa: E731
        return Replay(obs=rows(one.obs), next_obs=rows(one.next_obs), action=rows(one.action),
                      blocks=jnp.zeros((num_envs, num_blocks, 3 * size), jnp.float32),
                      index=jnp.zeros((), jnp.int32), full=jnp.zeros((), bool))

    def add(replay: Replay, transitions: Transition) -> Replay:
        steps = transitions.reward.shape[1]
        slots = (replay.index + jnp.arange(steps)) % length  # (steps,)
        rows = (jnp.arange(num_envs)[:, None] * length + slots).ravel()  # (envs * steps,)
        flat = lambda x: x.reshape(num_envs * steps, *x.shape[2:])  # noqa: E731
        positions = slots[:, None] + length * jnp.arange(repeats)  # (steps, repeats)
        values = jnp.stack([transitions.reward, transitions.terminated, transitions.truncated],
                           axis=-1).astype(jnp.float32)  # (envs, steps, 3)
        blocks = replay.blocks.at[  # positions past the last block are dropped
            jnp.arange(num_envs)[:, None, None, None], (positions // size)[None, :, :, None],
            (jnp.arange(3) * size)[None, None, None, :] + (positions % size)[None, :, :, None]
        ].set(values[:, :, None, :], mode="drop")
        return Replay(obs=replay.obs.at[rows].set(flat(transitions.obs)),
                      next_obs=replay.next_obs.at[rows].set(flat(transitions.next_obs)),
                      action=replay.action.at[rows].set(flat(transitions.action)), blocks=blocks,
                      index=(replay.index + steps) % length,
                      full=replay.full | (replay.index + steps >= length))

    def can_sample(replay: Replay) -> jax.Array:
        return replay.full | (replay.index >= max_n(args))

    return ReplayBuffer(init, add, can_sample)


# --------------------------------------------------------------------------------------------------
# n-step Double DQN targets, loss, update
# --------------------------------------------------------------------------------------------------
def annealed(start: float, end: float, since_reset: jax.Array, anneal_steps: int) -> jax.Array:
    """BBF's exponential anneal from `start` to `end` over anneal_steps gradient steps after a
    reset: start * (end / start) ** fraction, then `end`."""
    if not anneal_steps:
        return jnp.full(jnp.shape(since_reset), end, jnp.float32)
    fraction = jnp.minimum(since_reset, anneal_steps) / anneal_steps
    return start * (end / start) ** fraction


def n_and_gamma(args: Args, since_reset: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The n-step horizon and discount `since_reset` gradient steps after a reset: n from
    n_step_start down to n_step (rounded), 1 - gamma from 1 - gamma_start down to 1 - gamma."""
    n = jnp.round(annealed(args.n_step_start, args.n_step, since_reset, args.anneal_steps))
    gamma = 1 - annealed(1 - args.gamma_start, 1 - args.gamma, since_reset, args.anneal_steps)
    return n.astype(jnp.int32), gamma


def n_step_return(reward: jax.Array, terminated: jax.Array, truncated: jax.Array, n: jax.Array,
                  gamma: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A window of consecutive steps' rewards and episode ends, (max_n,), as one n-step sample:
    the return of its first k steps, k being n or fewer where an episode ends inside (the window
    is cut after the first terminated or truncated step), discounted gamma^j; the bootstrap's
    discount, gamma^k, or 0 where the episode terminated; and k - 1, the step whose next_obs the
    target bootstraps from. Dopamine's `cumulative_gamma`, done per window."""
    # Written out: rlax's n-step returns run over a whole sequence and mark no truncation.
    steps = jnp.arange(reward.shape[0])
    done = terminated | truncated
    # used[j]: step j is among the first n and in the episode of step 0 (none ended before it).
    ended_before = jnp.concatenate([jnp.zeros(1, bool), done[:-1]])
    used = jnp.cumprod(~ended_before) * (steps < n)
    last = used.sum() - 1
    rewards = jnp.sum(used * gamma ** steps * reward)
    discount = jnp.where(terminated[last], 0.0, gamma ** (last + 1))
    return rewards, discount, last


def double_q_td_error(q_tm1: jax.Array, a_tm1: jax.Array, r_t: jax.Array, discount_t: jax.Array,
                      q_t_value: jax.Array, q_t_selector: jax.Array) -> jax.Array:
    """One transition's Double DQN TD error, `rlax.double_q_learning` written out: the online
    network's Q-values (q_t_selector) choose the next action, the target network's (q_t_value)
    value it, and no gradient flows through the target.
    The Q-values are picked by products with one-hot vectors, not by indexing: the gradient of an
    indexed pick is a scatter, which a TPU runs slowly. The products add exact zeros, so the
    numbers are the same (tests/test_dqn_minatar.py holds them to rlax's)."""
    num_actions = q_tm1.shape[-1]
    best_t = jax.nn.one_hot(jnp.argmax(q_t_selector), num_actions)
    target_tm1 = r_t + discount_t * jnp.sum(q_t_value * best_t)
    q_taken = jnp.sum(q_tm1 * jax.nn.one_hot(a_tm1, num_actions))
    return jax.lax.stop_gradient(target_tm1) - q_taken


def online_q_values(params: hk.Params, network: hk.Transformed, obs: jax.Array,
                    next_obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The online network's Q-values at o_t and at o_{t+k}: on an accelerator in one pass over
    both batches, which runs faster there than two passes; on a CPU in two, which run faster
    there (speed/dqn_step_variants.py)."""
    if jax.default_backend() == "cpu":
        return network.apply(params, obs), network.apply(params, next_obs)
    return tuple(jnp.split(network.apply(params, jnp.concatenate([obs, next_obs])), 2))


def td_loss(params: hk.Params, target_params: hk.Params, network: hk.Transformed, mb: Batch,
            loss: str) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The mean loss of the Double DQN TD errors, and the mean Q-value of the actions taken, for
    the metrics."""
    q_tm1, q_t_selector = online_q_values(params, network, mb.obs, mb.next_obs)
    q_t_value = network.apply(target_params, mb.next_obs)
    td_error = jax.vmap(double_q_td_error)(q_tm1, mb.action, mb.reward, mb.discount, q_t_value,
                                           q_t_selector)
    losses = rlax.huber_loss(td_error, 1.0) if loss == "huber" else rlax.l2_loss(td_error)
    q_taken = jnp.take_along_axis(q_tm1, mb.action[:, None], axis=-1)[:, 0]
    return losses.mean(), {"td_loss": losses.mean(), "q_values": q_taken.mean()}


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """AdamW, its weight decay on the weights and not the biases or norms' scales (BBF's)."""
    return optax.adamw(args.learning_rate, eps=args.adam_eps, weight_decay=args.weight_decay,
                       mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))


def window_indices(replay: Replay, key: jax.Array, batch_size: int, n: int
                   ) -> tuple[jax.Array, jax.Array]:
    """Where `batch_size` windows of n consecutive steps lie in the buffer, drawn as flashbax's
    trajectory buffer draws them (its `sample`, with period 1): a start uniformly among those whose
    window lies wholly between the oldest step kept and the write head, and a row uniformly. The
    row of each window, (batch_size,), and its steps' slots in the row, (batch_size, n)."""
    num_rows, length = replay.blocks.shape[0], row_length(replay)
    filled = jnp.where(replay.full, length, replay.index)
    oldest = jnp.where(replay.full, replay.index, 0)
    num_starts = jnp.maximum(filled - n + 1, 0)
    key, start_key = jax.random.split(key)
    _, row_key = jax.random.split(key)
    start = (oldest + jax.random.randint(start_key, (batch_size,), 0, num_starts)) % length
    rows = jax.random.randint(row_key, (batch_size,), 0, num_rows)
    return rows, (start[:, None] + jnp.arange(n)) % length


def window_steps(replay: Replay, rows: jax.Array, slots: jax.Array, blocked: bool
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each window's steps, its row's `slots` (batch, n) (consecutive, wrapping around the row's
    end): rewards, terminated and truncated, each (batch, n). A TPU gathers index by index, so
    there (`blocked`) the two blocks that hold a window are gathered and its steps picked out of
    them by a mask (exact: a value plus zeros); a CPU gathers the 3n single steps faster
    (speed/sr_dqn_sample.py; docs/sr_dqn_minatar.md)."""
    size = replay.blocks.shape[2] // 3
    n, starts = slots.shape[1], slots[:, 0]
    if blocked:
        two = replay.blocks[rows[:, None], starts[:, None] // size + jnp.arange(2)]
        two = two.reshape(len(rows), 2, 3, size).transpose(0, 2, 1, 3)  # (batch, 3, 2, size)
        two = two.reshape(len(rows), 3, 2 * size)
        picked = jnp.arange(2 * size) == (starts[:, None] % size + jnp.arange(n))[..., None]
        reward, terminated, truncated = (  # each (batch, n)
            jnp.where(picked, two[:, f, None], 0).sum(axis=2) for f in range(3))
    else:  # slot s of a row is at position s of its blocks
        reward, terminated, truncated = (
            replay.blocks[rows[:, None], slots // size, f * size + slots % size] for f in range(3))
    return reward, terminated > 0, truncated > 0


def sample_batch(replay: Replay, key: jax.Array, n: jax.Array, gamma: jax.Array, batch_size: int,
                 max_n: int, codec: ObsCodec) -> Batch:
    """A batch of n-step samples (this gradient step's n and gamma) from windows of max_n steps
    drawn uniformly from the buffer, observations unpacked for the network. The windows are those
    of flashbax's trajectory buffer's `sample`, key for key, but only what the target reads is
    gathered: each window's rewards and episode ends, and its observations where its return starts
    and stops (flashbax gathers every field at every step of the window, and a TPU gathers
    slowly)."""
    rows, slots = window_indices(replay, key, batch_size, max_n)
    reward, discount, last = jax.vmap(n_step_return, in_axes=(0, 0, 0, None, None))(
        *window_steps(replay, rows, slots, blocked=jax.default_backend() != "cpu"), n, gamma)
    first = rows * row_length(replay) + slots[:, 0]
    stop = rows * row_length(replay) + jnp.take_along_axis(slots, last[:, None], axis=1)[:, 0]
    return Batch(obs=codec.decode(replay.obs[first]), action=replay.action[first],
                 reward=reward, discount=discount, next_obs=codec.decode(replay.next_obs[stop]))


def gradient_step(train_state: TrainState, mb: Batch, network: hk.Transformed,
                  optimizer: optax.GradientTransformation, loss: str, tau: float
                  ) -> tuple[TrainState, dict[str, jax.Array]]:
    """One gradient step of the online network on a batch (AdamW's), then the target network's
    EMA step toward it."""
    grads, info = jax.grad(td_loss, has_aux=True)(train_state.params, train_state.target_params,
                                                  network, mb, loss)
    updates, opt_state = optimizer.update(grads, train_state.opt_state, train_state.params)
    params = optax.apply_updates(train_state.params, updates)
    target_params = optax.incremental_update(params, train_state.target_params, tau)
    return train_state._replace(params=params, target_params=target_params, opt_state=opt_state,
                                steps=train_state.steps + 1,
                                since_reset=train_state.since_reset + 1), info


def shrink_and_perturb(params: hk.Params, fresh: hk.Params, shrink: float) -> hk.Params:
    """The reset of one network: the convolution moved to shrink * itself + (1 - shrink) * its
    fresh initialisation (SR-SPR's "shrink and perturb"), every layer after it the fresh one
    (BBF's: later layers start over, the early features are kept in part)."""
    return {name: (jax.tree.map(lambda old, new: shrink * old + (1 - shrink) * new,
                                layer, fresh[name]) if name == "conv" else fresh[name])
            for name, layer in params.items()}


def fresh_networks(key: jax.Array, network: hk.Transformed, obs: jax.Array
                   ) -> tuple[hk.Params, hk.Params]:
    """Two fresh initialisations, the online network's and the target's, for a reset."""
    online_key, target_key = jax.random.split(key)
    return network.init(online_key, obs), network.init(target_key, obs)


def reset(train_state: TrainState, fresh: tuple[hk.Params, hk.Params],
          optimizer: optax.GradientTransformation, shrink: float) -> TrainState:
    """Both networks reset against fresh initialisations of their own (BBF's), the optimizer's
    moments and step count started anew, and the anneal of n and gamma restarted."""
    params = shrink_and_perturb(train_state.params, fresh[0], shrink)
    target_params = shrink_and_perturb(train_state.target_params, fresh[1], shrink)
    return train_state._replace(params=params, target_params=target_params,
                                opt_state=optimizer.init(params),
                                since_reset=jnp.zeros_like(train_state.since_reset),
                                resets=train_state.resets + 1)


def reset_due(steps_before: jax.Array, steps: jax.Array, period: int, total: int) -> jax.Array:
    """Whether the gradient-step clock crossed a multiple of `period` between the two counts, and
    a whole period of training still follows that multiple (BBF's rule: no reset the network
    cannot recover from); never where the period is 0."""
    if not period:
        return jnp.zeros((), bool)
    at = steps // period * period
    return (at > steps_before) & (at + period <= total)


def interleaving(args: Args) -> tuple[int, int, int]:
    """How an iteration interleaves environment and gradient steps, as evenly as whole numbers
    allow: (chunks, steps of every environment per chunk, gradient steps per chunk)."""
    gradient_steps = round(args.replay_ratio * args.num_envs * args.num_steps)
    num_chunks = math.gcd(args.num_steps, gradient_steps)
    return num_chunks, args.num_steps // num_chunks, gradient_steps // num_chunks


def total_gradient_steps(args: Args) -> int:
    """The gradient steps a run takes, as the reset schedule counts them: the replay ratio's share
    of the steps after the warm-up (to within a chunk's)."""
    trained = args.total_timesteps // args.steps_per_iteration * args.steps_per_iteration
    return int(args.replay_ratio * max(trained - args.learning_starts, 0))


def make_sr_dqn_iteration(args: Args, env, env_params, network: hk.Transformed,
                          optimizer: optax.GradientTransformation, buffer,
                          codec: ObsCodec = AS_IS):
    """The function that runs one iteration on a RunnerState: a `lax.scan` over chunks, each a
    rollout whose transitions go to the buffer, then (once learning has started) its gradient
    steps, each with its n and gamma and followed by the target's EMA step, then a reset if one
    is due. It returns the new RunnerState and the chunks' Chunk."""
    num_chunks, steps_per_chunk, updates_per_chunk = interleaving(args)
    epsilon_at = epsilon_schedule(args)
    sample = functools.partial(sample_batch, batch_size=args.batch_size, max_n=max_n(args),
                               codec=codec)
    step = functools.partial(gradient_step, network=network, optimizer=optimizer, loss=args.loss,
                             tau=args.tau)
    total = total_gradient_steps(args)

    def chunk(runner: RunnerState, fresh) -> tuple[RunnerState, Chunk]:
        runner, (transitions, ended, epsilon) = collect_transitions(
            runner, env, env_params, network, steps_per_chunk, epsilon_at, codec,
            args.act_with_target)
        # The buffer's rows are the environments: (time, envs, ...) -> (envs, time, ...).
        transitions = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), transitions)
        buffer_state = buffer.add(runner.buffer_state, transitions)
        key, learn_key = jax.random.split(runner.key)
        learn_keys = jax.random.split(learn_key, updates_per_chunk)

        # The chunk's batches, all drawn at once from the buffer, each with the n and gamma of
        # its gradient step. Drawn in the warm-up too, and not used: were the buffer an operand
        # of the cond below, a TPU would copy it whole every chunk.
        before = runner.train_state
        n, gamma = n_and_gamma(args, before.since_reset + jnp.arange(updates_per_chunk))
        batches = jax.vmap(sample, in_axes=(None, 0, 0, 0))(buffer_state, learn_keys, n, gamma)

        def learn():
            return jax.lax.scan(step, before, batches)

        def wait():  # the warm-up: no gradient step before learning_starts
            no_infos = {"td_loss": jnp.zeros(updates_per_chunk),
                        "q_values": jnp.zeros(updates_per_chunk)}
            return before, no_infos

        learned = (runner.env_steps >= args.learning_starts) & buffer.can_sample(buffer_state)
        train_state, infos = jax.lax.cond(learned, learn, wait)
        train_state = jax.lax.cond(
            reset_due(before.steps, train_state.steps, args.reset_period, total),
            lambda: reset(train_state, fresh, optimizer, args.shrink),
            lambda: train_state)
        runner = runner._replace(train_state=train_state, buffer_state=buffer_state, key=key)
        return runner, Chunk(ended, epsilon, learned, infos)

    def sr_dqn_iteration(runner: RunnerState) -> tuple[RunnerState, Chunk]:
        # A reset's fresh networks, drawn once an iteration (not in every chunk: seeds trained side
        # by side compute both sides of the chunk's cond). An iteration holds at most one reset
        # where the period is at least its gradient steps (check_args).
        key, fresh_key = jax.random.split(runner.key)
        fresh = fresh_networks(fresh_key, network, runner.obs)
        return jax.lax.scan(lambda runner, _: chunk(runner, fresh), runner._replace(key=key), None,
                            length=num_chunks)

    return sr_dqn_iteration


def init_runner(key: jax.Array, env, env_params, network: hk.Transformed,
                optimizer: optax.GradientTransformation, buffer, num_envs: int,
                codec: ObsCodec = AS_IS) -> RunnerState:
    """The state before the first iteration: environments reset, network and optimizer
    initialised, the target network a copy of the online one, the buffer empty (observations as
    `codec` stores them), counters at 0 (the anneal of n and gamma starts with the first gradient
    step)."""
    key, init_key, reset_key = jax.random.split(key, 3)
    reset_keys = jax.random.split(reset_key, num_envs)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, env_params)
    params = network.init(init_key, obs)
    stored = codec.encode(obs[0])
    one_step = Transition(obs=stored, action=jnp.zeros((), jnp.int32), reward=jnp.zeros(()),
                          terminated=jnp.zeros((), bool), truncated=jnp.zeros((), bool),
                          next_obs=stored)
    zero = jnp.zeros((), jnp.int32)
    return RunnerState(train_state=TrainState(params, params, optimizer.init(params), zero, zero,
                                              zero),
                       buffer_state=buffer.init(one_step), env_state=env_state, obs=obs,
                       episode_return=jnp.zeros(num_envs),
                       episode_length=jnp.zeros(num_envs, jnp.int32),
                       env_steps=jnp.zeros((), jnp.int32), key=key)


def make_update_step(args: Args, env, env_params, network: hk.Transformed,
                     optimizer: optax.GradientTransformation, buffer, codec: ObsCodec = AS_IS):
    """One iteration and its metrics on one device, for the caller to jit."""
    sr_dqn_iteration = make_sr_dqn_iteration(args, env, env_params, network, optimizer, buffer,
                                             codec)

    def update_step(runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        runner, chunks = sr_dqn_iteration(runner)
        return runner, iteration_metrics(chunks, runner.train_state, args)

    return update_step


# --------------------------------------------------------------------------------------------------
# Metrics: what an iteration logs, from its chunks
# --------------------------------------------------------------------------------------------------
def all_finite(params: hk.Params, losses: dict[str, jax.Array]) -> jax.Array:
    """One flag for the training loop's check that training is still finite: every parameter and
    loss term."""
    leaves = jax.tree.leaves(params) + list(losses.values())
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def iteration_metrics(chunks: Chunk, train_state: TrainState, args: Args) -> dict[str, jax.Array]:
    """Everything an iteration logs: the episodes that ended, the loss terms' means over the
    gradient steps that ran (0 during the warm-up), the last epsilon, the n and gamma the next
    gradient step uses, the resets so far and the finite flag."""
    ran = jnp.broadcast_to(chunks.learned[:, None], chunks.infos["td_loss"].shape)
    losses = {name: jnp.sum(jnp.where(ran, value, 0.0)) / jnp.maximum(ran.sum(), 1)
              for name, value in chunks.infos.items()}
    metrics = losses | {"episodes": chunks.ended.done.sum(),
                        "episode_return_sum": chunks.ended.episode_return.sum(),
                        "episode_length_sum": chunks.ended.episode_length.sum(),
                        "gradient_steps": ran.sum(), "epsilon": chunks.epsilon[-1, -1],
                        "resets": train_state.resets}
    metrics["n_step"], metrics["gamma"] = n_and_gamma(args, train_state.since_reset)
    metrics["finite"] = all_finite(train_state.params, losses)
    return metrics


def iteration_scalars(metrics: dict) -> dict[str, float]:
    """The iteration's TensorBoard scalars, besides charts/SPS and the episodes' (utils/training.py
    logs those for every script)."""
    return {"losses/td_loss": metrics["td_loss"], "losses/q_values": metrics["q_values"],
            "charts/epsilon": metrics["epsilon"], "charts/n_step": metrics["n_step"],
            "charts/gamma": metrics["gamma"], "charts/resets": metrics["resets"]}


def first_non_finite(metrics: dict) -> str:
    """What the training loop names when training stops being finite: a loss term, else the
    parameters."""
    bad = [f"losses/{name}" for name in ("td_loss", "q_values") if not np.isfinite(metrics[name])]
    return (bad + ["the parameters"])[0]


# --------------------------------------------------------------------------------------------------
# Arguments and what the script hands to the shared machinery (utils/contract.py)
# --------------------------------------------------------------------------------------------------
HEADLINE_POLICY = "greedy"
# The arguments that rebuild the network, in a model file's header.
NETWORK_ARGS = ("env_id", "hidden_sizes", "conv_channels", "conv_style", "layer_norm")
# The state's layout on a mesh: the environments' rows (their states and buffer rows) split, all
# else replicated. One device runs this script (no data-parallel version): the layout is that of
# a one-device mesh, kept for one.
RUNNER_SPECS = RunnerState(
    train_state=TrainState(P(), P(), P(), P(), P(), P()),
    buffer_state=Replay(obs=P("envs"), next_obs=P("envs"), action=P("envs"), blocks=P("envs"),
                        index=P(), full=P()),
    env_state=P("envs"), obs=P("envs"), episode_return=P("envs"), episode_length=P("envs"),
    env_steps=P(), key=P())


def fill_defaults(args: Args, given: set[str]) -> None:
    """An environment whose observations are not a grid gets no convolution unless one is
    given."""
    if "conv_channels" not in given:
        args.conv_channels = default_conv_channels(args.env_id, args.conv_channels)


def check_args(args: Args) -> str | None:
    """What is wrong with the script's own arguments, or None (utils/cli.py checks the shared
    ones); runs before anything is compiled or written."""
    error = cli.check_numbers(
        args, positive=("num_envs", "num_steps", "buffer_size", "batch_size", "n_step",
                        "n_step_start", "epsilon_decay_steps"),
        positive_finite=("learning_rate", "adam_eps", "replay_ratio"),
        non_negative_finite=("learning_starts", "weight_decay", "anneal_steps", "reset_period"),
        unit_interval=("gamma", "gamma_start", "shrink", "epsilon_end", "eval_epsilon"))
    if error:
        return error
    if not 0 < args.tau <= 1:
        return f"--tau must be in (0, 1], got {args.tau}"
    if args.gamma == 1 or args.gamma_start == 1:
        return "--gamma and --gamma-start must be below 1 (their anneal works on 1 - gamma)"
    for name in ("total_timesteps", "learning_starts", "epsilon_decay_steps", "anneal_steps",
                 "reset_period"):  # counted on int32 clocks
        if getattr(args, name) >= 2**31:
            return f"{cli.flag(name)} must be less than 2**31, got {getattr(args, name)}"
    if args.num_devices > 1:
        return f"--num-devices {args.num_devices}: this script runs on one device"
    steps_per_iteration = args.num_envs * args.num_steps
    gradient_steps = args.replay_ratio * steps_per_iteration
    if gradient_steps < 1 or abs(gradient_steps - round(gradient_steps)) > 1e-6:
        return (f"--replay-ratio {args.replay_ratio} x the iteration's {steps_per_iteration} "
                f"steps (num_envs x num_steps) must be a whole number of gradient steps")
    if args.total_timesteps < steps_per_iteration:
        return (f"--total-timesteps {args.total_timesteps} is less than one iteration "
                f"(num_envs * num_steps = {steps_per_iteration})")
    trained = args.total_timesteps // steps_per_iteration * steps_per_iteration  # whole iterations
    if gradient_steps * trained / steps_per_iteration >= 2**31:  # optax counts them in int32
        return (f"--replay-ratio {args.replay_ratio} over {trained:,} steps is more gradient "
                f"steps than the optimizer can count ({2**31 - 1:,})")
    if args.learning_starts > trained:
        return (f"--learning-starts {args.learning_starts} leaves no gradient step in the run's "
                f"{trained:,} steps")
    if args.buffer_size % args.num_envs:
        return f"--buffer-size {args.buffer_size} must be a multiple of --num-envs {args.num_envs}"
    if args.buffer_size // args.num_envs < max(max_n(args), interleaving(args)[1]):
        return (f"--buffer-size {args.buffer_size} must hold at least the longest n-step window "
                f"({max_n(args)}) and one chunk's steps of each of the --num-envs {args.num_envs} "
                f"environments")
    if args.learning_starts < args.num_envs * max_n(args):
        return (f"--learning-starts must be at least num_envs x the longest n-step window = "
                f"{args.num_envs * max_n(args)}, so that every row of the buffer holds a window")
    if 0 < args.reset_period < gradient_steps:
        return (f"--reset-period {args.reset_period} is shorter than an iteration's "
                f"{round(gradient_steps)} gradient steps: at most one reset fits in an iteration")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        return f"--hidden-sizes must be one or more positive widths, got {args.hidden_sizes}"
    if args.conv_channels < 0:
        return f"--conv-channels must be 0 (none) or positive, got {args.conv_channels}"
    return check_grid(args.env_id, args.conv_channels)


def fill_runtime_fields(args: Args) -> Args:
    args.steps_per_iteration = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // args.steps_per_iteration
    args.num_devices = 1
    return args


def make_agent(args: Args, env, env_params) -> contract.Agent:
    """The network, optimizer, initial state, update step and policy that the shared machinery
    trains, checkpoints and evaluates."""
    network = make_network(env.action_space(env_params).n, args.hidden_sizes, args.layer_norm,
                           args.conv_channels, args.conv_style)
    optimizer = make_optimizer(args)
    buffer = make_buffer(args)
    # MinAtar's grids are kept packed to bits (tests/test_dqn_minatar.py checks that every game's
    # observations are 0 or 1); other games' as they are.
    obs_shape = env.observation_space(env_params).shape
    codec = grid_codec(obs_shape) if args.env_id.endswith("-MinAtar") else AS_IS

    def act(params: hk.Params, obs: jax.Array, key: jax.Array, greedy: jax.Array) -> jax.Array:
        """argmax Q where greedy, else epsilon-greedy at eval_epsilon."""
        q_values = network.apply(params, obs)
        sampled = distrax.EpsilonGreedy(q_values, args.eval_epsilon).sample(seed=key)
        return jnp.where(greedy, q_values.argmax(axis=-1), sampled)

    return contract.Agent(
        network=network, optimizer=optimizer,
        init=functools.partial(init_runner, env=env, env_params=env_params, network=network,
                               optimizer=optimizer, buffer=buffer, num_envs=args.num_envs,
                               codec=codec),
        update_step=make_update_step(args, env, env_params, network, optimizer, buffer, codec),
        parallel_update_step=None, state_specs=RUNNER_SPECS,
        params=lambda runner: acting_params(runner.train_state, args.act_with_target), act=act)


# --------------------------------------------------------------------------------------------------
# Main: the agent handed to the run, then the training loop
# --------------------------------------------------------------------------------------------------
def main() -> None:
    args = training.parse_args(sys.modules[__name__])
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    agent = make_agent(args, env, env_params)
    # Compiled ahead of time; then the run's directory, log, checkpoints and summary.json.
    with training.Run(sys.modules[__name__], args, agent, env, env_params) as run:
        runner = run.state  # fresh, or --resume's (None with --load-model: no training)
        for iteration in run.iterations():  # none more after Ctrl-C or a non-finite iteration
            runner, metrics = run.update_step(runner)  # queued on the device, in the old memory
            # On a GPU or TPU read one iteration late: the host logs the last while this one runs.
            run.log_iteration(iteration, metrics, iteration_scalars, first_non_finite)
            run.end_iteration(iteration, runner)  # what a checkpoint or --eval-every needs of it
        run.finish(runner)  # the last iteration read; the last checkpoint
        run.evaluate(runner)  # both protocols, both policies: summary.json, play.gif, pictures
        run.save_model(runner)  # model.safetensors
    sys.exit(run.exit_code)


if __name__ == "__main__":
    startup.after_imports()
    main()

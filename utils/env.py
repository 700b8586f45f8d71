"""The environment every script trains on: a gymnax environment with MinAtar's sticky actions, and
what the scripts ask of it (a discrete action set; a grid of observations for the convolution)."""

from typing import Any

import gymnax
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import spaces
from gymnax.wrappers.purerl import GymnaxWrapper


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
    probability is traced (one compiled evaluation serves both protocols) and the game is stepped
    with the key it would get unwrapped, so at probability 0 it plays exactly as unwrapped.

    The draw's key, fold_in(key, 1), is under JAX's default PRNG the same key as split(key)[1],
    the one gymnax resets an ended episode with: the repeat drawn on an episode's last step and the
    next episode's random start share their bits. Every recorded result was made with this draw."""

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


# gymnax 1.0.1's Seaquest keeps each kind of entity in a buffer of 100 rows and tests every pair of
# rows for collisions each step, which makes its step 25-130 times another game's
# (speed/env_step.py). No more than 30 of a kind are ever alive: an enemy spawns at most once a step
# and leaves the board within 29 steps at the fastest speed the game ramps to; a sub fires once in
# 11 steps and its torpedo lives 10, and a new sub waits 10 before it fires; the player's torpedoes
# (one in 6 steps) and divers (one in 31) are fewer. In 32 rows the game plays as in 100, bit for
# bit (tests/test_utils_env.py plays its fastest regime both ways).
SEAQUEST_ROWS = 32


def set_seaquest_rows(rows: int) -> None:
    """Seaquest's entity buffers hold `rows` rows from here on (gymnax's own: 100). gymnax reads the
    size from module globals when a step is traced: programs traced before keep theirs."""
    from gymnax.environments.minatar import seaquest, seaquest_helpers
    seaquest.MAX_ENTITIES = seaquest_helpers.MAX_ENTITIES = rows


def make_env(env_id: str, sticky_action_prob: float) -> tuple[StickyActions, StickyParams]:
    if env_id == "Seaquest-MinAtar":
        set_seaquest_rows(SEAQUEST_ROWS)
    env, env_params = gymnax.make(env_id)
    return StickyActions(env), StickyParams(env_params, sticky_action_prob)


def is_grid(obs_shape: tuple[int, ...]) -> bool:
    """Whether observations of this shape are a grid (height, width, channels) for the
    convolution."""
    return len(obs_shape) == 3 and min(obs_shape[:2]) >= 2


def check_env_id(env_id: str) -> str | None:
    """What keeps a script from training on `env_id` (unknown, continuous actions), or None."""
    if env_id not in gymnax.registered_envs:
        return f"unknown --env-id {env_id!r}; gymnax has: {', '.join(gymnax.registered_envs)}"
    env, env_params = gymnax.make(env_id)
    if not isinstance(env.action_space(env_params), spaces.Discrete):
        return f"--env-id {env_id} has continuous actions; this script handles discrete ones"
    return None


def check_grid(env_id: str, conv_channels: int) -> str | None:
    """Where a convolution is asked of observations that are not a grid: what is wrong, or None."""
    env, env_params = gymnax.make(env_id)
    obs_shape = env.observation_space(env_params).shape
    if conv_channels and not is_grid(obs_shape):
        return (f"--conv-channels needs a grid of observations (height, width, channels); "
                f"{env_id}'s are of shape {obs_shape}")
    return None


def default_conv_channels(env_id: str, conv_channels: int) -> int:
    """`conv_channels`, or 0 where the environment's observations are not a grid (CartPole's are a
    vector): the default convolution needs a grid."""
    if env_id not in gymnax.registered_envs:  # check_env_id says what is wrong
        return conv_channels
    env, env_params = gymnax.make(env_id)
    return conv_channels if is_grid(env.observation_space(env_params).shape) else 0

"""A tiny gymnax environment whose answers are known, for the evaluation and learning tests."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment, spaces


@struct.dataclass
class ProbeState(environment.EnvState):
    # the step at which the episode terminates (if the time limit does not come first)
    horizon: jax.Array



@struct.dataclass
class ProbeParams(environment.EnvParams):
    max_steps_in_episode: int = 4


class ProbeEnv(environment.Environment[ProbeState, ProbeParams]):
    """Reward 1 for action 1, 0 for action 0. Reset draws a horizon from `horizons`: the episode
    terminates at that step, or is truncated at `max_steps_in_episode` if that comes first.

    The observation is [time / 10, 1]: it changes every step, so the observation before an
    auto-reset (`info["final_observation"]`) differs from the reset one.
    """

    def __init__(self, horizons: tuple[int, ...] = (2, 3, 6)):
        super().__init__()
        self.horizons = jnp.array(horizons)

    @property
    def default_params(self) -> ProbeParams:
        return ProbeParams()

    def step_env(self, key, state: ProbeState, action, params: ProbeParams):
        state = state.replace(time=state.time + 1)
        reward = (action == 1).astype(jnp.float32)
        terminated = state.time >= state.horizon
        return self.get_obs(state), state, reward, terminated, {}

    def reset_env(self, key, params: ProbeParams):
        state = ProbeState(time=0, horizon=jax.random.choice(key, self.horizons))
        return self.get_obs(state), state

    def get_obs(self, state: ProbeState, params=None, key=None) -> jax.Array:
        return jnp.array([state.time / 10.0, 1.0], jnp.float32)

    def action_space(self, params: Any = None) -> spaces.Discrete:
        return spaces.Discrete(2)

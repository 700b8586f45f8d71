"""Run complete episodes of a discrete-action policy in a gymnax environment.

`evaluate` plays `num_episodes` episodes side by side (one environment each, under `vmap`) inside one
`jax.lax.while_loop`, and stops when every episode has ended. An episode ends when the environment says
`terminated` or `truncated` (e.g. Breakout-MinAtar's 1000-step limit): both count as finished. gymnax
auto-resets an environment the step it ends, so each episode's return and length are frozen at that step
and whatever the reset environment does afterwards is ignored.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class EvalResult(NamedTuple):
    returns: jax.Array  # (num_episodes,) undiscounted return of each episode
    lengths: jax.Array  # (num_episodes,) steps in each episode
    finished: jax.Array  # (num_episodes,) True where the episode ended before `max_steps`


class _EvalCarry(NamedTuple):
    key: jax.Array
    obs: jax.Array
    env_state: Any
    returns: jax.Array
    lengths: jax.Array
    finished: jax.Array
    t: jax.Array


@functools.partial(jax.jit, static_argnames=("env", "policy_apply", "num_episodes", "max_steps"))
def evaluate(
    key: jax.Array,
    policy_params: Any,
    greedy: jax.Array | bool,
    *,
    env: Any,
    env_params: Any,
    policy_apply: Callable[[Any, jax.Array], jax.Array],
    num_episodes: int,
    max_steps: int,
) -> EvalResult:
    """Plays `num_episodes` episodes with the policy whose logits are `policy_apply(params, obs_batch)`.

    `greedy` picks the arg-max action instead of sampling; it is traced, so sampled and greedy
    evaluation share one compiled program. The loop stops once all episodes have ended or after
    `max_steps` steps; episodes still running then are reported with `finished=False`.
    """
    vmap_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    key, reset_key = jax.random.split(key)
    obs, env_state = vmap_reset(jax.random.split(reset_key, num_episodes), env_params)

    def still_running(carry: _EvalCarry) -> jax.Array:
        return jnp.logical_and(carry.t < max_steps, jnp.logical_not(jnp.all(carry.finished)))

    def step(carry: _EvalCarry) -> _EvalCarry:
        key, action_key, step_key = jax.random.split(carry.key, 3)
        logits = policy_apply(policy_params, carry.obs)
        action = jnp.where(
            greedy, jnp.argmax(logits, axis=-1), jax.random.categorical(action_key, logits)
        )
        obs, env_state, reward, terminated, truncated, _ = vmap_step(
            jax.random.split(step_key, num_episodes), carry.env_state, action, env_params
        )
        running = jnp.logical_not(carry.finished)
        return _EvalCarry(
            key=key,
            obs=obs,
            env_state=env_state,
            returns=carry.returns + jnp.where(running, reward, 0.0),
            lengths=carry.lengths + running.astype(jnp.int32),
            finished=carry.finished | terminated | truncated,
            t=carry.t + 1,
        )

    init = _EvalCarry(
        key=key,
        obs=obs,
        env_state=env_state,
        returns=jnp.zeros(num_episodes, jnp.float32),
        lengths=jnp.zeros(num_episodes, jnp.int32),
        finished=jnp.zeros(num_episodes, bool),
        t=jnp.zeros((), jnp.int32),
    )
    final = jax.lax.while_loop(still_running, step, init)
    return EvalResult(returns=final.returns, lengths=final.lengths, finished=final.finished)

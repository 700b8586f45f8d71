"""A minimal script that keeps utils/contract.py and nothing more: a linear softmax policy, trained
by REINFORCE on rollouts of vectorised environments (CartPole by default). It is the contract's test
(tests/test_utils_training.py, tests/test_utils_contract.py): training, checkpoints and --resume,
--load-model, the many-seed harness, the search and the results table take it with no edit to a
shared file. It does not have to learn much.

Run:  python tests/tiny_pg.py --total-timesteps 20000
"""

import dataclasses
import functools
import os
import sys
from typing import Any, NamedTuple

# A script in the project's root imports utils/ as it is; this one lives in tests/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    from utils import startup

    startup.before_imports()

import haiku as hk
import jax
import jax.numpy as jnp
import optax

from utils import cli, startup, training
from utils.contract import Agent, RunArgs
from utils.env import make_env


@dataclasses.dataclass
class Args(RunArgs):
    env_id: str = "CartPole-v1"
    """the id of the gymnax environment"""
    learning_rate: float = 1e-2
    """the learning rate of the Adam optimizer"""
    num_envs: int = 8
    """the number of parallel environments"""
    num_steps: int = 64
    """the number of steps run in each environment per rollout"""
    gamma: float = 0.99
    """the discount factor"""


class State(NamedTuple):
    params: hk.Params
    opt_state: optax.OptState
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    key: jax.Array


def policy(obs: jax.Array, num_actions: int) -> jax.Array:
    return hk.Linear(num_actions, w_init=jnp.zeros, name="policy")(obs.reshape(obs.shape[0], -1))


def init_state(key, env, env_params, network, optimizer, num_envs: int) -> State:
    key, init_key, reset_key = jax.random.split(key, 3)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs),
                                                            env_params)
    params = network.init(init_key, obs)
    zeros = jnp.zeros(num_envs)
    return State(params, optimizer.init(params), env_state, obs, zeros, zeros.astype(jnp.int32),
                 key)


def make_update_step(args: Args, env, env_params, network, optimizer):
    def env_step(state: State, _):
        key, action_key, step_key = jax.random.split(state.key, 3)
        logits = network.apply(state.params, state.obs)
        action = jax.random.categorical(action_key, logits)
        obs, env_state, reward, terminated, truncated, _ = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(jax.random.split(step_key, args.num_envs),
                                               state.env_state, action, env_params)
        done = terminated | truncated
        episode_return, episode_length = state.episode_return + reward, state.episode_length + 1
        ended = (done, jnp.where(done, episode_return, 0.0), jnp.where(done, episode_length, 0))
        state = state._replace(env_state=env_state, obs=obs, key=key,
                               episode_return=jnp.where(done, 0.0, episode_return),
                               episode_length=jnp.where(done, 0, episode_length))
        return state, (state.obs, action, reward, done, *ended)

    def update_step(state: State):
        start_obs = state.obs
        state, (next_obs, action, reward, done, ended, ended_return, ended_length) = jax.lax.scan(
            env_step, state, None, length=args.num_steps)
        obs = jnp.concatenate([start_obs[None], next_obs[:-1]])

        def discounted(future, step):  # the return to go, cut at each episode's end
            reward_t, done_t = step
            future = reward_t + args.gamma * future * (1.0 - done_t)
            return future, future

        _, returns = jax.lax.scan(discounted, jnp.zeros(args.num_envs), (reward, done),
                                  reverse=True)
        advantage = (returns - returns.mean()) / (returns.std() + 1e-8)

        def loss_fn(params):
            logits = jax.vmap(network.apply, in_axes=(None, 0))(params, obs)
            log_p = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
            return -(log_p * advantage).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state)
        params = optax.apply_updates(state.params, updates)
        finite = jnp.isfinite(loss) & jnp.all(jnp.stack(
            [jnp.isfinite(x).all() for x in jax.tree.leaves(params)]))
        metrics = {"episodes": ended.sum(), "episode_return_sum": ended_return.sum(),
                   "episode_length_sum": ended_length.sum(), "finite": finite, "loss": loss}
        return state._replace(params=params, opt_state=opt_state), metrics

    return update_step


def act(network, params, obs, key, greedy):
    logits = network.apply(params, obs)
    return jnp.where(greedy, jnp.argmax(logits, -1), jax.random.categorical(key, logits))


NETWORK_ARGS = ("env_id",)
HEADLINE_POLICY = "sampled"
SEARCH_SPACE = {"learning_rate": (1e-3, 1e-1, "log"), "num_steps": [32, 64]}


def check_args(args: Args) -> str | None:
    return cli.check_numbers(args, positive=("num_envs", "num_steps"),
                             positive_finite=("learning_rate",), unit_interval=("gamma",))


def fill_runtime_fields(args: Args) -> Args:
    args.steps_per_iteration = args.num_envs * args.num_steps  # the machinery fills the rest
    return args


def make_agent(args: Args, env, env_params) -> Agent:
    network = hk.without_apply_rng(hk.transform(functools.partial(
        policy, num_actions=env.action_space(env_params).n)))
    optimizer = optax.adam(args.learning_rate)
    return Agent(
        network=network, optimizer=optimizer,
        init=functools.partial(init_state, env=env, env_params=env_params, network=network,
                               optimizer=optimizer, num_envs=args.num_envs),
        update_step=make_update_step(args, env, env_params, network, optimizer),
        parallel_update_step=None, state_specs=None, params=lambda state: state.params,
        act=functools.partial(act, network))


def main() -> None:
    args = training.parse_args(sys.modules[__name__])
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    agent = make_agent(args, env, env_params)
    with training.Run(sys.modules[__name__], args, agent, env, env_params) as run:
        state = run.state
        for iteration in run.iterations():
            state, metrics = run.update_step(state)
            run.log_iteration(iteration, metrics, lambda m: {"losses/loss": m["loss"]},
                              lambda m: "losses/loss")
            run.end_iteration(iteration, state)
        run.finish(state)
        run.evaluate(state)
        run.save_model(state)
    sys.exit(run.exit_code)


if __name__ == "__main__":
    startup.after_imports()
    main()

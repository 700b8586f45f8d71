"""PPO actor-critic for Gymnax's MinAtar Breakout, in JAX with Haiku, RLax and Optax.

One jitted `update_step` does a whole PPO iteration: a `lax.scan` rollout of vmapped gymnax environments,
GAE, and `update_epochs` x `num_minibatches` gradient steps on the clipped surrogate loss, whose
probability ratio is computed from log-probabilities (the log-sum-exp trick, see `loss_stability.py`).
It runs data parallel under `jax.shard_map`, one device per CPU core: each device steps its share of
the environments and the devices average their gradients. The Python loop around it only logs. At the
end the final policy is evaluated on complete episodes.

Run:  python ppo_breakout.py --total-timesteps 1000000
Help: python ppo_breakout.py --help
Docs: README.md ("ppo_breakout.py")
"""

import dataclasses
import functools
import gc
import json
import os
import sys
import time
from typing import Any, Literal, NamedTuple

# JAX's CPU backend is a single device unless told otherwise; one device per core lets the
# data-parallel update use every core. It must be set before JAX starts, and importing gymnax starts it.
num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(num_cores or 1))

import gymnax
import haiku as hk
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import rlax
import tyro
from gymnax.environments import spaces
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboardX import SummaryWriter

from utils.evaluation import evaluate


@dataclasses.dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run directory's name)"""
    seed: int = 1
    """seed of the experiment (network init, environments, minibatch order, evaluation)"""
    env_id: str = "Breakout-MinAtar"
    """the id of the gymnax environment: any MinAtar game (Breakout-, Asterix-, Freeway-, SpaceInvaders-,
    Seaquest-MinAtar) or another gymnax environment with discrete actions"""
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
    """the number of passes over each rollout"""
    norm_adv: bool = True
    """normalize advantages within each minibatch"""
    clip_coef: float = 0.2
    """the clipping coefficient of the surrogate objective"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's value estimates, as in the PPO2 implementation"""
    ent_coef: float = 0.01
    """the coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """the coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum global norm of the gradient"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """the widths of the hidden layers of the torso that the policy and value heads share"""
    activation: Literal["crelu", "relu"] = "crelu"
    """the torso's activation: crelu passes [relu(x), relu(-x)] on, twice the layer's width"""
    eval_episodes: int = 256
    """the number of complete episodes the final policy is evaluated on"""
    num_devices: int = 0
    """the number of devices the environments are split across, each running its share of the rollout
    and of every minibatch (data parallel); on a CPU, JAX runs one device per core. 0 picks the most,
    up to 8, that divide both num_envs and the minibatch size. A seed reproduces for the same count"""
    jax_cache_dir: str = "~/.cache/jax"
    """JAX's persistent compilation cache: a rerun with the same shapes and hyperparameters (another
    seed, say) loads the compiled programs instead of compiling them again; "" turns it off"""

    # filled at runtime
    batch_size: int = dataclasses.field(init=False, default=0)
    """the rollout size, num_envs * num_steps"""
    minibatch_size: int = dataclasses.field(init=False, default=0)
    """the minibatch size, batch_size // num_minibatches"""
    num_iterations: int = dataclasses.field(init=False, default=0)
    """the number of PPO iterations, total_timesteps // batch_size"""


def find_arg_error(args: Args) -> str | None:
    """Returns what is wrong with `args`, or None. Runs before anything is compiled or written."""
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                 "eval_episodes"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        if not getattr(args, name) > 0:
            return f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}"
    for name in ("ent_coef", "vf_coef"):
        if not getattr(args, name) >= 0:
            return f"--{name.replace('_', '-')} must be non-negative, got {getattr(args, name)}"
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        return f"--hidden-sizes must be one or more positive widths, got {args.hidden_sizes}"
    for name in ("gamma", "gae_lambda"):
        if not 0 <= getattr(args, name) <= 1:
            return f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}"
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        return (f"the batch (num_envs * num_steps = {batch_size}) does not divide into "
                f"--num-minibatches {args.num_minibatches}")
    if args.total_timesteps < batch_size:
        return (f"--total-timesteps {args.total_timesteps} is less than one batch "
                f"(num_envs * num_steps = {batch_size})")
    if args.num_devices < 0:
        return f"--num-devices must be 0 (automatic) or positive, got {args.num_devices}"
    num_available = len(jax.devices())
    if args.num_devices > num_available:
        return f"--num-devices {args.num_devices} is more than the {num_available} devices JAX has"
    minibatch_size = batch_size // args.num_minibatches
    if args.num_devices and (args.num_envs % args.num_devices or minibatch_size % args.num_devices):
        return (f"--num-devices {args.num_devices} must divide both --num-envs {args.num_envs} and "
                f"the minibatch size {minibatch_size}")
    if args.env_id not in gymnax.registered_envs:
        return f"unknown --env-id {args.env_id!r}; gymnax has: {', '.join(gymnax.registered_envs)}"
    env, env_params = gymnax.make(args.env_id)
    if not isinstance(env.action_space(env_params), spaces.Discrete):
        return f"--env-id {args.env_id} has continuous actions; this script handles discrete ones"
    return None


def fill_runtime_fields(args: Args) -> Args:
    """Fills the fields derived from the others: sizes, iterations, and the device count if it is 0."""
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    args.num_devices = args.num_devices or max(  # at most 8: only 1 and 2 were measured
        n for n in range(1, min(len(jax.devices()), 8) + 1)
        if args.num_envs % n == 0 and args.minibatch_size % n == 0)
    return args


# ---------------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------------
def crelu(x: jax.Array) -> jax.Array:
    """Concatenated ReLU, [relu(x), relu(-x)]: every unit passes its input on, one half or the other."""
    return jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)


# Each torso activation with the gain of its layers' orthogonal init, which keeps a layer's output
# norm near its input's: ReLU zeroes about half its input, hence sqrt(2); CReLU passes all of it on.
ACTIVATIONS = {"crelu": (crelu, 1.0), "relu": (jax.nn.relu, np.sqrt(2))}


def actor_critic(obs: jax.Array, num_actions: int, hidden_sizes: tuple[int, ...],
                 activation: str) -> tuple[jax.Array, jax.Array]:
    """Maps a batch of observations to (action logits, state values).

    One MLP (64-64 by default) on the flattened 10x10xC grid, shared by a policy head and a value
    head. Chosen by measurement on a 2-core CPU (docs/tuning.md): two separate MLPs learned worse
    and made a whole iteration 1.3x slower; cutting the value loss's gradient out of the torso
    learned much worse; a small conv net learned no better at about 3x the cost per gradient step;
    a 32-32 torso learned clearly worse. With ReLU, width in the first layer helped (128-64) but
    trained 1.6x slower, and many first-layer units of some 64-64 runs were silent on every
    observation. CReLU (Shang et al. 2016; against lost plasticity in RL, Abbas et al. 2023,
    arXiv:2303.07507) has no unit silent on every input and passes twice the features on, for 15%
    more multiply-adds: over 40 seeds it scored 41.9 and 37.9 on two machines, against ReLU's 31.8
    on both, and trains ~15% slower. CReLU in one layer only did not help, a narrower 56-56
    CReLU torso scored 36.8, and wider ones (96-96, 128-64) not clearly higher.
    """
    x = obs.reshape(obs.shape[0], -1)
    # Orthogonal init (Engstrom et al. 2020, "Implementation Matters"): the activation's gain on the
    # torso, 0.01 on the policy head so the first policy is near uniform, 1 on the value head.
    act, gain = ACTIVATIONS[activation]
    torso = hk.nets.MLP(list(hidden_sizes), w_init=hk.initializers.Orthogonal(scale=gain),
                        activation=act, activate_final=True, name="torso")(x)
    logits = hk.Linear(num_actions, w_init=hk.initializers.Orthogonal(scale=0.01), name="policy")(torso)
    value = hk.Linear(1, w_init=hk.initializers.Orthogonal(scale=1.0), name="value")(torso)
    return logits, value[:, 0]


def make_network(num_actions: int, hidden_sizes: tuple[int, ...], activation: str) -> hk.Transformed:
    """`actor_critic` as Haiku's pure (init, apply) pair; apply takes no random key."""
    return hk.without_apply_rng(hk.transform(functools.partial(
        actor_critic, num_actions=num_actions, hidden_sizes=hidden_sizes, activation=activation)))


# ---------------------------------------------------------------------------------------------------
# Containers for the state that flows through jit and scan
# ---------------------------------------------------------------------------------------------------
class RunnerState(NamedTuple):
    params: hk.Params
    opt_state: optax.OptState
    env_state: Any  # batched gymnax state, one entry per environment
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
    final_value: jax.Array  # v(final_obs) where truncated, else 0; final_obs is o_{t+1} before auto-reset
    episode_return: jax.Array  # return of the episode that ended at this step (0 if none ended)
    episode_length: jax.Array  # length of the episode that ended at this step (0 if none ended)


class Batch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    logits: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array  # lambda-return, the value target


# ---------------------------------------------------------------------------------------------------
# Pure functions: rollout, GAE, loss, update
# ---------------------------------------------------------------------------------------------------
def collect_trajectories(runner: RunnerState, env, env_params, network: hk.Transformed,
                         num_steps: int) -> tuple[RunnerState, Transition]:
    """Steps all environments `num_steps` times with the current policy (a `lax.scan` over time).

    Each step also records v(final_obs) for the environments the time limit cut, with the same
    parameters, for GAE to bootstrap from.
    """
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(runner: RunnerState, _) -> tuple[RunnerState, Transition]:
        key, action_key, step_key = jax.random.split(runner.key, 3)
        logits, value = network.apply(runner.params, runner.obs)
        action = jax.random.categorical(action_key, logits)
        step_keys = jax.random.split(step_key, runner.obs.shape[0])
        obs, env_state, reward, terminated, truncated, info = vmap_step(
            step_keys, runner.env_state, action, env_params)
        done = terminated | truncated
        # Only truncated steps bootstrap from v(final_obs), and the time limit (1000 steps in Breakout)
        # is rare, so this forward pass runs only on steps where one of this device's environments hit
        # it. Under vmap (benchmarks/tune.py) the predicate is batched and the cond becomes a select.
        final_value = jax.lax.cond(
            truncated.any(),
            lambda: jnp.where(truncated, network.apply(runner.params, info["final_observation"])[1], 0.0),
            lambda: jnp.zeros_like(value))
        episode_return = runner.episode_return + reward
        episode_length = runner.episode_length + 1
        transition = Transition(
            obs=runner.obs, action=action, logits=logits, value=value, reward=reward,
            terminated=terminated, truncated=truncated, final_value=final_value,
            episode_return=jnp.where(done, episode_return, 0.0),
            episode_length=jnp.where(done, episode_length, 0),
        )
        runner = runner._replace(
            env_state=env_state, obs=obs, key=key,
            episode_return=jnp.where(done, 0.0, episode_return),
            episode_length=jnp.where(done, 0, episode_length),
        )
        return runner, transition

    return jax.lax.scan(env_step, runner, None, length=num_steps)


def calculate_gae(traj: Transition, last_value: jax.Array, gamma: float,
                  gae_lambda: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and lambda-returns, (num_steps, num_envs) each, with gymnax 1.0's two endings.

    `last_value` is v(o_T) after the rollout. On a terminated step the future is worth 0. On a
    truncated step the episode did not end, the clock did: the future is worth v(final_obs)
    (`traj.final_value`), the observation the agent reached, not the reset observation that replaced
    it. Folding gamma * v(final_obs) into the reward and cutting the discount there lets rlax's GAE
    see both cases as an ordinary episode end (Pardo et al. 2018, "Time Limits in RL").
    """
    bootstrap = traj.truncated & ~traj.terminated
    r_t = traj.reward + gamma * jnp.where(bootstrap, traj.final_value, 0.0)
    discount_t = gamma * (1.0 - (traj.terminated | traj.truncated))
    values = jnp.concatenate([traj.value, last_value[None]], axis=0)
    # rlax works on one stream of time; vmap it over the environment axis.
    gae = jax.vmap(rlax.truncated_generalized_advantage_estimation,
                   in_axes=(1, 1, None, 1), out_axes=1)
    advantages = gae(r_t, discount_t, gae_lambda, values)
    return advantages, advantages + traj.value


def log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """log pi(a|s) through log_softmax, which subtracts max(logits) before exponentiating."""
    return jnp.take_along_axis(jax.nn.log_softmax(logits), actions[..., None], axis=-1)[..., 0]


def policy_loss(logits: jax.Array, old_logits: jax.Array, actions: jax.Array,
                advantages: jax.Array, clip_coef: float) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate loss, with the probability ratio formed in log space.

    pi/pi_old as a division underflows to 0/0 once logits are large and negative; the difference of
    log-softmaxes stays finite (see loss_stability.py). Returns (loss, log_ratio).
    """
    log_ratio = log_prob(logits, actions) - log_prob(old_logits, actions)
    loss = rlax.clipped_surrogate_pg_loss(jnp.exp(log_ratio), advantages, clip_coef)
    return loss, log_ratio


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
    logits, values = network.apply(params, mb.obs)
    pg_loss, log_ratio = policy_loss(logits, mb.logits, mb.action, mb.advantage, args.clip_coef)
    v_loss = value_loss(values, mb.value, mb.target, args.clip_coef, args.clip_vloss)
    entropy = -jnp.sum(jax.nn.softmax(logits) * jax.nn.log_softmax(logits), axis=-1).mean()
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    ratio = jnp.exp(log_ratio)
    metrics = {
        "policy_loss": pg_loss,
        "value_loss": v_loss,
        "entropy": entropy,
        # The low-variance KL estimator k3 = (r - 1) - log r (http://joschu.net/blog/kl-approx.html).
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clipfrac": jnp.mean(jnp.abs(ratio - 1.0) > args.clip_coef),
    }
    return loss, metrics


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """Adam behind global-norm clipping, its learning rate annealed linearly to 0 over all updates.

    `inject_hyperparams` keeps the current learning rate in the optimizer state, so the jitted update
    can report it without the host re-evaluating the schedule.
    """
    if args.anneal_lr:
        num_updates = args.num_iterations * args.update_epochs * args.num_minibatches
        learning_rate = optax.linear_schedule(args.learning_rate, 0.0, num_updates)
    else:
        learning_rate = args.learning_rate
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm),
                       optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate, eps=1e-5))


def init_runner(key: jax.Array, env, env_params, network: hk.Transformed,
                optimizer: optax.GradientTransformation, num_envs: int) -> RunnerState:
    """Fresh environments, network parameters and optimizer state."""
    key, init_key, reset_key = jax.random.split(key, 3)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), env_params)
    params = network.init(init_key, obs)
    return RunnerState(params=params, opt_state=optimizer.init(params), env_state=env_state, obs=obs,
                       episode_return=jnp.zeros(num_envs), episode_length=jnp.zeros(num_envs, jnp.int32),
                       key=key)


def mean_over_devices(x, axis_name: str | None):
    """The mean of `x` over the devices along `axis_name`; `x` itself when there is no such axis."""
    return x if axis_name is None else jax.lax.pmean(x, axis_name)


def update_minibatch(train_state: tuple[hk.Params, optax.OptState], mb: Batch, network: hk.Transformed,
                     optimizer: optax.GradientTransformation, args: Args, axis_name: str | None = None):
    """One gradient step on a minibatch, or on this device's shard of it when under `axis_name`.

    The devices average their gradients (and the advantage statistics), so the step equals the one
    a single device would take on the whole minibatch. Each cross-device mean is a rendezvous of all
    devices, so each carries as much as it can: both moments of the advantages in one, then the
    whole gradient flattened into one vector rather than one mean per parameter array.
    """
    params, opt_state = train_state
    if args.norm_adv:
        mean, mean_sq = mean_over_devices(
            jnp.stack([mb.advantage.mean(), jnp.square(mb.advantage).mean()]), axis_name)
        std = jnp.sqrt(jnp.maximum(mean_sq - jnp.square(mean), 0.0))
        mb = mb._replace(advantage=(mb.advantage - mean) / (std + 1e-8))
    grads, metrics = jax.grad(ppo_loss, has_aux=True)(params, network, mb, args)
    flat_grads, unravel = jax.flatten_util.ravel_pytree(grads)
    grads = unravel(mean_over_devices(flat_grads, axis_name))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), metrics


def make_update_step(args: Args, env, env_params, network: hk.Transformed,
                     optimizer: optax.GradientTransformation, axis_name: str | None = None):
    """Builds the function that runs one PPO iteration; the caller jits it.

    With `axis_name`, the function is one device's share of a data-parallel iteration, run under
    `jax.shard_map` over that mesh axis: each device steps its own slice of the environments and
    takes its slice of every minibatch, and `update_minibatch` averages over the devices, so all of
    them hold the same parameters throughout. Each device shuffles its own share, so a minibatch holds
    exactly minibatch_size / num_devices samples of each device's environments (a stratified draw).
    Without `axis_name`, the same function runs on one device. Sizes are read from the arrays, so
    they are per device.
    """
    def sum_over_devices(x):
        return x if axis_name is None else jax.lax.psum(x, axis_name)

    def variance_over_devices(x):
        mean = mean_over_devices(x.mean(), axis_name)
        return mean_over_devices(jnp.square(x - mean).mean(), axis_name)

    def update_epoch(train_state, key: jax.Array, batch: Batch):
        # A fresh permutation every epoch, cut into num_minibatches minibatches of indices. Each step
        # gathers its own rows, so the shuffled batch is never copied whole.
        batch_size = batch.action.shape[0]
        order = jax.random.permutation(key, batch_size).reshape(args.num_minibatches, -1)

        def minibatch_step(train_state, mb_indices: jax.Array):
            mb = jax.tree.map(lambda x: x[mb_indices], batch)
            return update_minibatch(train_state, mb, network, optimizer, args, axis_name)

        return jax.lax.scan(minibatch_step, train_state, order)

    def update_step(runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        next_key, rollout_key, epochs_key = jax.random.split(runner.key, 3)
        if axis_name is not None:  # each device its own actions, env randomness and minibatch order
            device = jax.lax.axis_index(axis_name)
            rollout_key = jax.random.fold_in(rollout_key, device)
            epochs_key = jax.random.fold_in(epochs_key, device)
        runner, traj = collect_trajectories(runner._replace(key=rollout_key), env, env_params, network,
                                            args.num_steps)

        _, last_value = network.apply(runner.params, runner.obs)
        advantages, targets = calculate_gae(traj, last_value, args.gamma, args.gae_lambda)

        flatten = lambda x: x.reshape(-1, *x.shape[2:])  # (T, N, ...) -> (T * N, ...)
        batch = jax.tree.map(flatten, Batch(obs=traj.obs, action=traj.action, logits=traj.logits,
                                            value=traj.value, advantage=advantages, target=targets))
        (params, opt_state), loss_metrics = jax.lax.scan(
            functools.partial(update_epoch, batch=batch), (runner.params, runner.opt_state),
            jax.random.split(epochs_key, args.update_epochs))
        runner = runner._replace(params=params, opt_state=opt_state, key=next_key)

        done = traj.terminated | traj.truncated
        # over epochs x minibatches, and devices
        metrics = {name: mean_over_devices(value.mean(), axis_name) for name, value in loss_metrics.items()}
        metrics["learning_rate"] = optax.tree_utils.tree_get(  # the rate of the last update
            opt_state, "learning_rate", filtering=lambda _, value: isinstance(value, jax.Array))
        metrics["explained_variance"] = (1.0 - variance_over_devices(batch.target - batch.value)
                                         / variance_over_devices(batch.target))
        metrics["episodes"] = sum_over_devices(done.sum())
        metrics["episode_return_sum"] = sum_over_devices(traj.episode_return.sum())
        metrics["episode_length_sum"] = sum_over_devices(traj.episode_length.sum())
        return runner, metrics

    return update_step


# Data parallel over a 1-D mesh of devices: the environments (and all that comes from them) are split
# along the "data" axis; parameters, optimizer state and the key are replicated.
RUNNER_SPECS = RunnerState(params=P(), opt_state=P(), env_state=P("data"), obs=P("data"),
                           episode_return=P("data"), episode_length=P("data"), key=P())


def make_runner_shardings(mesh: Mesh) -> RunnerState:
    """RUNNER_SPECS placed on `mesh`: where init_runner's output must live for the parallel step."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), RUNNER_SPECS,
                        is_leaf=lambda x: isinstance(x, P))


def make_parallel_update_step(args: Args, env, env_params, network: hk.Transformed,
                              optimizer: optax.GradientTransformation, mesh: Mesh):
    """`update_step` run by every device of `mesh` on its share of a runner laid out as RUNNER_SPECS."""
    # check_vma=False: with the check on, JAX would itself sum the gradient of the replicated
    # parameters over the devices, on top of the explicit average in update_minibatch. The price is
    # that outputs declared replicated (P()) are not checked to be; a test checks the parameters.
    return jax.jit(jax.shard_map(
        make_update_step(args, env, env_params, network, optimizer, axis_name="data"),
        mesh=mesh, in_specs=(RUNNER_SPECS,), out_specs=(RUNNER_SPECS, P()), check_vma=False))


# ---------------------------------------------------------------------------------------------------
# Main: set up, train (the loop only logs), evaluate, summarize
# ---------------------------------------------------------------------------------------------------
def main() -> None:
    wall_start = time.time()
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = find_arg_error(args)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    env, env_params = gymnax.make(args.env_id)
    if args.jax_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(args.jax_cache_dir))
    fill_runtime_fields(args)

    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)
    try:
        os.makedirs(run_dir)  # never into an existing run's directory
    except FileExistsError:
        print(f"error: {run_dir} already exists; start again in a second or change --exp-name",
              file=sys.stderr)
        sys.exit(1)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{name}|{value}|" for name, value in vars(args).items()))

    network = make_network(env.action_space(env_params).n, args.hidden_sizes, args.activation)
    optimizer = make_optimizer(args)

    mesh = Mesh(np.array(jax.devices()[:args.num_devices]), ("data",))
    runner_shardings = make_runner_shardings(mesh)

    runner_key, eval_key = jax.random.split(jax.random.key(args.seed))
    # Everything is compiled ahead of time, so compile time is measured apart and the training loop
    # never waits on XLA. Sampled and greedy evaluation share one program: `greedy` is an input.
    compile_start = time.time()
    runner = jax.jit(functools.partial(init_runner, env=env, env_params=env_params, network=network,
                                       optimizer=optimizer, num_envs=args.num_envs),
                     out_shardings=runner_shardings)(runner_key)
    update_step = make_parallel_update_step(args, env, env_params, network, optimizer, mesh)
    update_step = update_step.lower(runner).compile()
    evaluate_policy = evaluate.lower(
        eval_key, runner.params, False, env=env, env_params=env_params,
        policy_apply=lambda p, o: network.apply(p, o)[0], num_episodes=args.eval_episodes,
        max_steps=env_params.max_steps_in_episode + 1).compile()
    compile_seconds = time.time() - compile_start
    print(f"{args.env_id}: {args.num_iterations} iterations of {args.batch_size} steps on "
          f"{args.num_devices} device(s); compiled in {compile_seconds:.1f}s; logging to {run_dir}")

    progress_every = max(1, args.num_iterations // 10)
    recent_return = float("nan")
    train_start = time.time()
    for iteration in range(1, args.num_iterations + 1):
        runner, metrics = update_step(runner)
        metrics = jax.device_get(metrics)  # the one host transfer per iteration
        global_step = iteration * args.batch_size
        sps = global_step / (time.time() - train_start)
        if metrics["episodes"] > 0:  # only episodes that ended, never placeholders
            recent_return = metrics["episode_return_sum"] / metrics["episodes"]
            writer.add_scalar("charts/episodic_return", recent_return, global_step)
            writer.add_scalar("charts/episodic_length",
                              metrics["episode_length_sum"] / metrics["episodes"], global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("charts/learning_rate", metrics["learning_rate"], global_step)
        for name in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac",
                     "explained_variance"):
            writer.add_scalar(f"losses/{name}", metrics[name], global_step)
        if iteration % progress_every == 0 or iteration == args.num_iterations:
            print(f"step {global_step:>9,} | SPS {sps:>8,.0f} | episodic return {recent_return:6.2f}")
    train_seconds = time.time() - train_start

    # Evaluate the final policy on complete episodes: sampled actions (the policy PPO trained) and
    # greedy actions.
    eval_start = time.time()
    evaluation = {}
    for mode, greedy in (("sampled", False), ("greedy", True)):
        result = jax.device_get(evaluate_policy(eval_key, runner.params, greedy, env_params=env_params))
        assert result.finished.all(), "an evaluation episode outran the environment's time limit"
        returns = result.returns
        evaluation[mode] = {"mean": float(returns.mean()), "std": float(returns.std()),
                            "min": float(returns.min()), "max": float(returns.max()),
                            "mean_length": float(result.lengths.mean())}
        writer.add_scalar(f"eval/{mode}_return", returns.mean(), global_step)
        print(f"eval ({mode:>7}, {args.eval_episodes} episodes): "
              f"return {returns.mean():.2f} ± {returns.std():.2f}")
    eval_seconds = time.time() - eval_start
    writer.close()

    summary = {
        "env_id": args.env_id, "seed": args.seed, "total_timesteps": args.total_timesteps,
        "global_step": global_step,
        "eval_episodes": args.eval_episodes, "eval": evaluation,
        "compile_seconds": compile_seconds, "train_seconds": train_seconds,
        "eval_seconds": eval_seconds, "sps": global_step / train_seconds,
        "wall_seconds": time.time() - wall_start, "args": vars(args),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"summary: {os.path.join(run_dir, 'summary.json')}")
    # Python's exit-time garbage collection walks every object the imports made (gymnax alone pulls in
    # matplotlib, seaborn and scipy), which is slow; frozen objects are skipped.
    gc.freeze()


if __name__ == "__main__":
    main()

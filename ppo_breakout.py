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

import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import io
import itertools
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
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
import safetensors
import safetensors.numpy
import tyro
from flax import struct
from gymnax.environments import spaces
from gymnax.wrappers.purerl import GymnaxWrapper
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboardX import SummaryWriter

from utils import visualize
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
    ratio: Literal["log", "direct"] = "log"
    """how PPO's probability ratio is formed: log, exp(log pi - log pi_old) from log-softmaxes; or
    direct, softmax probabilities divided as the paper writes it (see loss_stability.py)"""
    sticky_action_prob: float = 0.0
    """the probability that the game repeats its previous action instead of the chosen one, in
    training (MinAtar's protocol uses 0.1; the final evaluation always reports both 0 and 0.1)"""
    diagnostics: bool = True
    """log the diagnostics/ group (gradient norm, logit gap, log-ratio range, advantage statistics, value
    error, silent units, action frequencies) and histograms of logits, log-ratios, advantages and values"""
    eval_episodes: int = 256
    """the number of complete episodes the final policy is evaluated on, per protocol"""
    num_devices: int = 0
    """the number of devices the environments are split across, each running its share of the rollout
    and of every minibatch (data parallel); on a CPU, JAX runs one device per core. 0 picks the most,
    up to 8, that divide both num_envs and the minibatch size. A seed reproduces for the same count"""
    jax_cache_dir: str = "~/.cache/jax"
    """JAX's persistent compilation cache: a rerun with the same shapes and hyperparameters (another
    seed, say) loads the compiled programs instead of compiling them again; "" turns it off"""
    save_model: bool = True
    """save the final parameters to model.safetensors in the run directory"""
    load_model: str = ""
    """evaluate this model.safetensors instead of training (--env-id, --hidden-sizes and --activation
    must be those it was trained with)"""

    # filled at runtime
    batch_size: int = dataclasses.field(init=False, default=0)
    """the rollout size, num_envs * num_steps"""
    minibatch_size: int = dataclasses.field(init=False, default=0)
    """the minibatch size, batch_size // num_minibatches"""
    num_iterations: int = dataclasses.field(init=False, default=0)
    """the number of PPO iterations, total_timesteps // batch_size"""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


MAX_SEED = 2**32 - 1  # jax.random.key takes a 32-bit seed without folding
MAX_UPDATES = 2**31 - 1  # optax counts gradient steps (schedule, Adam's bias correction) in int32


def available_memory_bytes() -> int:
    """Memory the OS can give this process now (MemAvailable), or all of it where that is unknown."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            return int(next(line for line in f if line.startswith("MemAvailable")).split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def estimate_memory_bytes(args: Args, env, env_params) -> tuple[int, int]:
    """Generous estimates of the peak memory of (training, evaluation): a few copies of what the
    rollout, the minibatch step and the evaluation's episodes hold at once."""
    obs, state = jax.eval_shape(env.reset, jax.random.key(0), env_params)
    nbytes = lambda tree: sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    layer_inputs = [math.prod(obs.shape)] + [2 * width for width in args.hidden_sizes]  # CReLU: 2x
    num_params = sum(i * o for i, o in zip(layer_inputs, [*args.hidden_sizes, env.num_actions + 1]))
    features = 4 * sum(layer_inputs)  # float32 activations of one sample
    sample = nbytes(obs) + 4 * (env.num_actions + 8)  # one Transition
    training = 4 * (args.num_envs * args.num_steps * sample + args.num_envs * (nbytes(state) + features)
                    + args.num_envs * args.num_steps // args.num_minibatches * features + 8 * num_params)
    evaluation = 2 * args.eval_episodes * (2 * nbytes(obs) + nbytes(state) + features)
    return training, evaluation


def find_arg_error(args: Args) -> str | None:
    """Returns what is wrong with `args`, or None. Runs before anything is compiled or written."""
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                 "eval_episodes"):
        if getattr(args, name) <= 0:
            return f"{flag(name)} must be positive, got {getattr(args, name)}"
    if not 0 <= args.seed <= MAX_SEED:
        return f"--seed must be in [0, {MAX_SEED}], got {args.seed}"
    # `not x > 0` rather than `x <= 0`: NaN fails every comparison; math.isfinite turns away inf.
    for name in ("learning_rate", "max_grad_norm"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            return f"{flag(name)} must be a positive finite number, got {value}"
    for name in ("ent_coef", "vf_coef"):
        value = getattr(args, name)
        if not (value >= 0 and math.isfinite(value)):
            return f"{flag(name)} must be a non-negative finite number, got {value}"
    if not 0 <= args.sticky_action_prob < 1:
        return f"--sticky-action-prob must be in [0, 1), got {args.sticky_action_prob}"
    for name, low, high in (("gamma", 0, 1), ("gae_lambda", 0, 1), ("clip_coef", 0, 1)):
        value = getattr(args, name)
        if not (low < value <= high if name == "clip_coef" else low <= value <= high):
            interval = "(0, 1]" if name == "clip_coef" else "[0, 1]"
            return f"{flag(name)} must be in {interval}, got {value}"
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        return f"--hidden-sizes must be one or more positive widths, got {args.hidden_sizes}"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", args.exp_name) or ".." in args.exp_name:
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
    if num_updates > MAX_UPDATES:
        return (f"{num_updates:,} gradient steps (--total-timesteps / batch x --update-epochs x "
                f"--num-minibatches) is more than the optimizer can count ({MAX_UPDATES:,})")
    if args.num_devices < 0:
        return f"--num-devices must be 0 (automatic) or positive, got {args.num_devices}"
    num_available = len(jax.devices())
    if args.num_devices > num_available:
        return f"--num-devices {args.num_devices} is more than the {num_available} devices JAX has"
    minibatch_size = batch_size // args.num_minibatches
    if args.num_devices and (args.num_envs % args.num_devices or minibatch_size % args.num_devices):
        return (f"--num-devices {args.num_devices} must divide both --num-envs {args.num_envs} and "
                f"the minibatch size {minibatch_size}")
    cache_dir = os.path.expanduser(args.jax_cache_dir)
    if args.jax_cache_dir and os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        return f"--jax-cache-dir {args.jax_cache_dir} exists and is not a directory"
    if args.load_model and not os.path.isfile(args.load_model):
        return f"--load-model {args.load_model}: no such file"
    if args.env_id not in gymnax.registered_envs:
        return f"unknown --env-id {args.env_id!r}; gymnax has: {', '.join(gymnax.registered_envs)}"
    env, env_params = gymnax.make(args.env_id)
    if not isinstance(env.action_space(env_params), spaces.Discrete):
        return f"--env-id {args.env_id} has continuous actions; this script handles discrete ones"
    training, evaluation = estimate_memory_bytes(args, env, env_params)
    available = available_memory_bytes()
    if training > available:
        return (f"training would need about {training / 2**30:,.1f} GiB of memory (--num-envs x "
                f"--num-steps, --hidden-sizes) and {available / 2**30:,.1f} GiB are available")
    if evaluation > available:
        return (f"--eval-episodes {args.eval_episodes} would need about {evaluation / 2**30:,.1f} GiB "
                f"of memory to play all episodes at once and {available / 2**30:,.1f} GiB are available")
    return None


def parse_args(argv: list[str] | None = None) -> Args:
    """The command line as Args, or exit status 2 with one `error:` line (tyro's own parse errors too)."""
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0])
    except SystemExit as exit_:
        if exit_.code:  # tyro's boxed message: a title line, then the message up to a rule
            rule = set("─-╰╯")
            body = [line.strip().strip("│").strip() for line in messages.getvalue().splitlines()[1:]]
            body = list(itertools.dropwhile(lambda line: not line or set(line) <= rule, body))
            message = itertools.takewhile(lambda line: line and not set(line) <= rule, body)
            print(f"error: {' '.join(message)}", file=sys.stderr)
        raise
    error = find_arg_error(args)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    return args


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
# Environment: gymnax, with MinAtar's sticky actions
# ---------------------------------------------------------------------------------------------------
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
    executes its previous action instead of the chosen one; the last action carries over into the
    next episode, as in MinAtar. Unlike gymnax's StickyActionWrapper, the probability is a traced
    parameter, so one compiled evaluation serves both protocols, and the draw uses its own key
    (fold_in), so at probability 0 the game sees exactly the keys it sees unwrapped."""

    def reset(self, key: jax.Array, params: StickyParams):
        obs, env_state = self._env.reset(key, params.env_params)
        return obs, StickyState(env_state=env_state, last_action=jnp.zeros((), jnp.int32))

    def step(self, key: jax.Array, state: StickyState, action: jax.Array, params: StickyParams):
        if not (isinstance(params.sticky_action_prob, float) and params.sticky_action_prob == 0.0):
            repeat = jax.random.bernoulli(jax.random.fold_in(key, 1), params.sticky_action_prob)
            action = jnp.where(repeat, state.last_action, action)
        obs, env_state, reward, terminated, truncated, info = self._env.step(
            key, state.env_state, action, params.env_params)
        return obs, StickyState(env_state=env_state, last_action=action), reward, terminated, truncated, info


def make_env(env_id: str, sticky_action_prob: float) -> tuple[StickyActions, StickyParams]:
    env, env_params = gymnax.make(env_id)
    return StickyActions(env), StickyParams(env_params, sticky_action_prob)


# ---------------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------------
def crelu(x: jax.Array) -> jax.Array:
    """Concatenated ReLU, [relu(x), relu(-x)]: every unit passes its input on, one half or the other."""
    return jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)


# Each torso activation with the gain of its layers' orthogonal init, which keeps a layer's output
# norm near its input's: ReLU zeroes about half its input, hence sqrt(2); CReLU passes all of it on.
ACTIVATIONS = {"crelu": (crelu, 1.0), "relu": (jax.nn.relu, np.sqrt(2))}


def actor_critic(obs: jax.Array, num_actions: int, hidden_sizes: tuple[int, ...], activation: str,
                 return_features: bool = False):
    """Maps a batch of observations to (action logits, state values), and the torso's features if asked.

    One MLP torso (64-64 CReLU by default) on the flattened 10x10xC grid, shared by a policy head and a
    value head; why this network: docs/tuning.md.
    """
    # Orthogonal init (Engstrom et al. 2020, "Implementation Matters"): the activation's gain on the
    # torso, 0.01 on the policy head so the first policy is near uniform, 1 on the value head.
    act, gain = ACTIVATIONS[activation]
    x = obs.reshape(obs.shape[0], -1)
    features = []
    for i, width in enumerate(hidden_sizes):
        x = act(hk.Linear(width, w_init=hk.initializers.Orthogonal(scale=gain), name=f"torso_{i}")(x))
        features.append(x)
    logits = hk.Linear(num_actions, w_init=hk.initializers.Orthogonal(scale=0.01), name="policy")(x)
    value = hk.Linear(1, w_init=hk.initializers.Orthogonal(scale=1.0), name="value")(x)[:, 0]
    return (logits, value, jnp.concatenate(features, axis=-1)) if return_features else (logits, value)


def make_network(num_actions: int, hidden_sizes: tuple[int, ...], activation: str) -> hk.Transformed:
    """`actor_critic` as Haiku's pure (init, apply) pair; apply takes no random key, and
    `apply(params, obs, return_features=True)` adds the torso's features."""
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


def policy_loss(logits: jax.Array, old_logits: jax.Array, actions: jax.Array, advantages: jax.Array,
                clip_coef: float, ratio: str = "log") -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate loss; returns (loss, log_ratio).

    The ratio pi/pi_old is formed in log space by default: as a division of probabilities it turns
    0/0 once logits are large and negative, while the difference of log-softmaxes stays finite (see
    loss_stability.py). `ratio="direct"` divides the probabilities, for comparison.
    """
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
    logits, values, features = network.apply(params, mb.obs, return_features=True)
    pg_loss, log_ratio = policy_loss(logits, mb.logits, mb.action, mb.advantage, args.clip_coef, args.ratio)
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
        "log_ratio_min": log_ratio.min(),
        "log_ratio_max": log_ratio.max(),
    }
    if args.diagnostics:  # a histogram with fixed edges, so the minibatches' counts add up
        metrics["log_ratio_counts"] = bin_counts(log_ratio, -LOG_RATIO_RANGE, LOG_RATIO_RANGE)
        metrics["active_units"] = (features > 0).any(axis=0)
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


def max_over_devices(x, axis_name: str | None):
    return x if axis_name is None else jax.lax.pmax(x, axis_name)


def sum_over_devices(x, axis_name: str | None):
    return x if axis_name is None else jax.lax.psum(x, axis_name)


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
    flat_grads = mean_over_devices(flat_grads, axis_name)
    metrics["grad_norm"] = jnp.linalg.norm(flat_grads)  # before clipping
    grads = unravel(flat_grads)
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
        update_stats = {name: loss_metrics.pop(name) for name in
                        ("log_ratio_min", "log_ratio_max", "log_ratio_counts", "active_units") if name in loss_metrics}
        # Means over epochs x minibatches, and over devices in one reduction with the moments that
        # explained variance needs (Var = E[x^2] - E[x]^2, as for the advantages).
        error = batch.target - batch.value
        means = mean_over_devices(jnp.stack([value.mean() for value in loss_metrics.values()] + [
            error.mean(), jnp.square(error).mean(), batch.target.mean(), jnp.square(batch.target).mean()]), axis_name)
        metrics = dict(zip(loss_metrics, means))
        error_mean, error_sq, target_mean, target_sq = means[-4:]
        metrics["explained_variance"] = 1.0 - (error_sq - error_mean**2) / (target_sq - target_mean**2)
        metrics["learning_rate"] = optax.tree_utils.tree_get(  # the rate of the last update
            opt_state, "learning_rate", filtering=lambda _, value: isinstance(value, jax.Array))
        metrics["episodes"], metrics["episode_length_sum"] = sum_over_devices(
            jnp.stack([done.sum(), traj.episode_length.sum()]), axis_name)
        metrics["episode_return_sum"] = sum_over_devices(traj.episode_return.sum(), axis_name)
        # One flag for the host's non-finite guard: every loss term, gradient norm and parameter.
        metrics["finite"] = (jnp.isfinite(jax.flatten_util.ravel_pytree(params)[0]).all()
                             & jnp.all(jnp.stack([jnp.isfinite(v).all() for v in loss_metrics.values()])))
        if args.diagnostics:
            metrics.update(training_diagnostics(batch, update_stats, axis_name))
        return runner, metrics

    return update_step


# ---------------------------------------------------------------------------------------------------
# Training diagnostics (--diagnostics): summaries computed inside the jitted step
# ---------------------------------------------------------------------------------------------------
HISTOGRAM_BINS = 30
LOG_RATIO_RANGE = 1.0  # log-ratio histograms span [-1, 1]; values beyond count in the end bins


def bin_counts(x: jax.Array, low: jax.Array | float, high: jax.Array | float) -> jax.Array:
    """How many values of `x` fall in each of HISTOGRAM_BINS equal bins over [low, high], values
    outside in the end bins. One comparison per bin: on a CPU far cheaper than jnp.histogram's search."""
    bins = jnp.clip(jnp.floor((x.ravel() - low) / (high - low) * HISTOGRAM_BINS), 0, HISTOGRAM_BINS - 1)
    return (bins.astype(jnp.int32)[:, None] == jnp.arange(HISTOGRAM_BINS)).sum(0)


def training_diagnostics(batch: Batch, update_stats: dict[str, jax.Array], axis_name: str | None) -> dict:
    """What the rollout looked like to the network: scalars for the diagnostics/ tags and histograms.

    The logit gap (largest minus smallest logit of a state) is what loss_stability.py sweeps. Silent
    units are torso features that were zero on every observation of the iteration's minibatches.
    `update_stats` holds the loss's per-step log-ratio range and counts and the units that fired.
    Each cross-device reduction carries everything of its kind: one max, one sum, one mean.
    """
    data = {"logits": batch.logits, "advantage": batch.advantage, "value": batch.value}
    maxima = max_over_devices(jnp.concatenate([
        jnp.stack([m for x in data.values() for m in (-x.min(), x.max())]),  # each histogram's range
        jnp.stack([(batch.logits.max(-1) - batch.logits.min(-1)).max(), -update_stats["log_ratio_min"].min(),
                   update_stats["log_ratio_max"].max()]),
        update_stats["active_units"].any(axis=(0, 1)).astype(jnp.float32)]), axis_name)
    edges = {name: jnp.linspace(-maxima[2 * i], jnp.maximum(maxima[2 * i + 1], 1e-6 - maxima[2 * i]),
                                HISTOGRAM_BINS + 1) for i, name in enumerate(data)}
    counts = [bin_counts(x, edges[name][0], edges[name][-1]) for name, x in data.items()]
    num_actions = batch.logits.shape[-1]
    sums = sum_over_devices(jnp.concatenate(
        counts + [update_stats["log_ratio_counts"].sum((0, 1)), jnp.bincount(batch.action, length=num_actions)]),
        axis_name)
    means = mean_over_devices(jnp.stack([batch.advantage.mean(), jnp.square(batch.advantage).mean(),
                                         jnp.square(batch.target - batch.value).mean()]), axis_name)
    edges["log_ratio"] = jnp.linspace(-LOG_RATIO_RANGE, LOG_RATIO_RANGE, HISTOGRAM_BINS + 1)
    histograms = {name: {"counts": sums[i * HISTOGRAM_BINS:(i + 1) * HISTOGRAM_BINS], "edges": edges[name]}
                  for i, name in enumerate(edges)}
    action_counts = sums[4 * HISTOGRAM_BINS:]
    return {
        "logit_gap_max": maxima[6], "log_ratio_min": -maxima[7], "log_ratio_max": maxima[8],
        "advantage_mean": means[0], "advantage_std": jnp.sqrt(jnp.maximum(means[1] - jnp.square(means[0]), 0.0)),
        "value_error": jnp.sqrt(means[2]), "silent_units": 1.0 - maxima[9:].mean(),
        "action_frequency": action_counts / action_counts.sum(), "histograms": histograms,
    }


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
# Checkpoints: the parameters in safetensors, with the arguments that rebuild the network in its header
# ---------------------------------------------------------------------------------------------------
NETWORK_ARGS = ("env_id", "hidden_sizes", "activation")


def save_model(path: str, params: hk.Params, args: Args, global_step: int) -> None:
    """Writes `params` to `path` atomically: a temporary file in the same directory, then a rename."""
    tensors = {f"{module}/{name}": np.asarray(value)
               for module, leaves in params.items() for name, value in leaves.items()}
    metadata = {name: json.dumps(getattr(args, name)) for name in NETWORK_ARGS}
    metadata.update(global_step=str(global_step), args=json.dumps(vars(args)))
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path) or ".", suffix=".tmp", delete=False) as f:
        f.write(safetensors.numpy.save(tensors, metadata))
        f.flush()
        os.fsync(f.fileno())
    umask = os.umask(0o022)  # the temporary file is private (0600); give the model the usual mode
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)
    os.replace(f.name, path)


def load_model(path: str, args: Args, expected: hk.Params) -> hk.Params:
    """The parameters saved at `path`, checked against this run's network (`expected` holds their
    shapes); raises ValueError saying what is wrong."""
    try:
        with safetensors.safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors reports a truncated or garbled file in several ways
        raise ValueError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]})")
    for name in NETWORK_ARGS:
        if name not in metadata:
            raise ValueError(f"{path} has no {name} in its header: it was not saved by this script")
        saved, wanted = json.loads(metadata[name]), json.loads(json.dumps(getattr(args, name)))
        if saved != wanted:
            show = lambda v: " ".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
            raise ValueError(f"{path} was trained with {flag(name)} {show(saved)}, not {show(wanted)}; "
                             f"pass the arguments it was trained with")
    shapes = {f"{module}/{name}": (tuple(x.shape), np.dtype(x.dtype))
              for module, leaves in expected.items() for name, x in leaves.items()}
    if {name: (t.shape, t.dtype) for name, t in tensors.items()} != shapes:
        raise ValueError(f"{path} does not hold the parameters of this network")
    if not all(np.isfinite(t).all() for t in tensors.values()):
        raise ValueError(f"{path} holds non-finite parameters")
    params = {}
    for key, value in tensors.items():
        module, name = key.rsplit("/", 1)
        params.setdefault(module, {})[name] = jnp.asarray(value)
    return params


# ---------------------------------------------------------------------------------------------------
# Main: set up, compile, train (the loop only logs), evaluate, save
# ---------------------------------------------------------------------------------------------------
class StopSignals:
    """While active, SIGINT (Ctrl-C) and SIGTERM ask the run to stop at the next safe point, the end
    of the current iteration; a second signal acts at once."""

    def __enter__(self):
        self.received = None
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        self.received = signum
        self.__exit__()

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def make_run_dir(args: Args) -> str:
    """A new runs/{env_id}__{exp_name}__{seed}__{unix time}; never an existing run's directory."""
    base = os.path.join("runs", f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    for attempt in range(100):
        run_dir = base + (f"_{attempt}" if attempt else "")
        with contextlib.suppress(FileExistsError):
            os.makedirs(run_dir)
            return run_dir
    raise FileExistsError(f"{base} and 99 more like it exist")


LOSS_METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")
DIAGNOSTICS = ("grad_norm", "logit_gap_max", "log_ratio_min", "log_ratio_max", "advantage_mean",
               "advantage_std", "value_error", "silent_units")


def log_iteration(writer: SummaryWriter, metrics: dict, global_step: int, histograms: bool) -> None:
    """The iteration's losses/ and diagnostics/ scalars, and its histograms where asked; values that
    are not finite are left out (the non-finite guard reports them)."""
    scalars = {f"losses/{name}": metrics[name] for name in LOSS_METRICS}
    if "silent_units" in metrics:
        scalars.update({f"diagnostics/{name}": metrics[name] for name in DIAGNOSTICS})
        scalars.update({f"diagnostics/action_{a}_frequency": f for a, f in enumerate(metrics["action_frequency"])})
    for tag, value in scalars.items():
        if np.isfinite(value):
            writer.add_scalar(tag, value, global_step)
    if histograms and "histograms" in metrics:
        for name, h in metrics["histograms"].items():
            centres = (h["edges"][1:] + h["edges"][:-1]) / 2
            if h["counts"].sum() > 0 and np.isfinite(h["edges"]).all():
                writer.add_histogram_raw(
                    f"histograms/{name}", min=h["edges"][0], max=h["edges"][-1], num=h["counts"].sum(),
                    sum=(centres * h["counts"]).sum(), sum_squares=(centres**2 * h["counts"]).sum(),
                    bucket_limits=h["edges"][1:].tolist(), bucket_counts=h["counts"].tolist(),
                    global_step=global_step)


class History(NamedTuple):
    """Mean return of the training episodes that ended in each iteration, for the learning curve."""
    steps: list
    seconds: list
    returns: list


def train(args: Args, update_step, runner: RunnerState, writer: SummaryWriter, stop: StopSignals):
    """Runs the PPO iterations and logs each; stops early on a signal or a non-finite value.

    Returns the runner to keep (on a non-finite value, the one from before that iteration), the
    status, the iterations done, what went non-finite where that happened, and the History.
    """
    every_tenth = max(1, args.num_iterations // 10)
    history = History([], [], [])
    recent_return = float("nan")
    train_start = time.time()
    for iteration in range(1, args.num_iterations + 1):
        previous = runner
        runner, metrics = update_step(runner)
        metrics = jax.device_get(metrics)  # the one host transfer per iteration
        global_step = iteration * args.batch_size
        elapsed = time.time() - train_start
        if metrics["episodes"] > 0:  # only episodes that ended, never placeholders
            recent_return = metrics["episode_return_sum"] / metrics["episodes"]
            writer.add_scalar("charts/episodic_return", recent_return, global_step)
            writer.add_scalar("charts/episodic_length",
                              metrics["episode_length_sum"] / metrics["episodes"], global_step)
            history.steps.append(global_step)
            history.seconds.append(elapsed)
            history.returns.append(float(recent_return))
        writer.add_scalar("charts/SPS", global_step / elapsed, global_step)
        writer.add_scalar("charts/learning_rate", metrics["learning_rate"], global_step)
        tenth = iteration % every_tenth == 0 or iteration == args.num_iterations
        log_iteration(writer, metrics, global_step, histograms=tenth or iteration == 1)
        if not metrics["finite"]:
            bad = next((f"losses/{name}" for name in LOSS_METRICS if not np.isfinite(metrics[name])),
                       "diagnostics/grad_norm" if not np.isfinite(metrics["grad_norm"]) else "the parameters")
            return previous, "non_finite", iteration - 1, bad, history
        if tenth:
            print(f"step {global_step:>9,} | SPS {global_step / elapsed:>8,.0f} | "
                  f"episodic return {recent_return:6.2f}")
        if stop.received:
            return runner, "interrupted", iteration, None, history
    return runner, "completed", args.num_iterations, None, history


# The final evaluations: both protocols, whatever --sticky-action-prob trained with, gymnax's (no sticky
# actions, as in gymnax's published baselines) and MinAtar's (sticky actions with probability 0.1), each
# with sampled actions (the policy PPO trained) and greedy ones.
EVALUATIONS = [("", "sampled"), ("", "greedy"), ("sticky_0.1", "sampled"), ("sticky_0.1", "greedy")]


def make_evaluate_policies(env: StickyActions, env_params: StickyParams, network: hk.Transformed,
                           args: Args) -> tuple[Callable, Mesh]:
    """One program for all EVALUATIONS, split over as many devices as divide their number; each device
    plays its evaluations one after another, so each gives the numbers it gives alone."""
    num_devices = max(n for n in (1, 2, 4) if n <= args.num_devices and len(EVALUATIONS) % n == 0)
    mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
    greedy = jnp.array([mode == "greedy" for _, mode in EVALUATIONS])
    sticky = jnp.array([0.1 if protocol else 0.0 for protocol, _ in EVALUATIONS])

    def evaluate_share(key, params, greedy, sticky):
        return jax.lax.map(lambda config: evaluate(
            key, params, config[0], env=env, env_params=env_params.replace(sticky_action_prob=config[1]),
            policy_apply=lambda p, o: network.apply(p, o)[0], num_episodes=args.eval_episodes,
            max_steps=env_params.env_params.max_steps_in_episode + 1, num_recorded=min(8, args.eval_episodes)),
            (greedy, sticky))

    evaluate_split = jax.shard_map(evaluate_share, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                                   out_specs=P("data"), check_vma=False)
    return jax.jit(lambda key, params: evaluate_split(key, params, greedy, sticky)), mesh


def report_evaluations(results, args: Args, writer: SummaryWriter, run_dir: str, global_step: int) -> dict:
    """Prints, logs and draws (play.gif, behaviour.png) the EVALUATIONS' results; returns summary.json's
    `eval`: the sticky-0 results at its top level, the others under their protocol."""
    breakout = args.env_id == "Breakout-MinAtar"
    evaluation, labelled = {}, {}
    fetched = jax.device_get(results)
    for i, (protocol, mode) in enumerate(EVALUATIONS):
        result = jax.tree.map(lambda x: x[i], fetched)
        assert result.finished.all(), "an evaluation episode outran the environment's time limit"
        labelled[f"{mode}, {protocol.replace('_', ' ')}" if protocol else mode] = result
        numbers = evaluation.setdefault(protocol, {})[mode] = visualize.behaviour_numbers(result, breakout)
        tag = f"eval/{protocol}/{mode}" if protocol else f"eval/{mode}"
        writer.add_scalar(f"{tag}_return", numbers["mean"], global_step)
        writer.add_scalar(f"{tag}_distinct_episodes", numbers["distinct_episodes"], global_step)
        print(f"eval ({mode:>7}{', ' + protocol.replace('_', ' ') if protocol else ''}, "
              f"{args.eval_episodes} episodes): return {numbers['mean']:.2f} ± {numbers['std']:.2f}, "
              f"{numbers['distinct_episodes']} distinct")
    # The GIF is encoded in a thread (Pillow's encoder releases the GIL) while matplotlib draws.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        gif = pool.submit(visualize.play_gif_of, labelled["sampled"], labelled["sampled, sticky 0.1"], breakout)
        pictures = {"behaviour.png": visualize.figure_to_png(visualize.behaviour_figure(
            labelled, breakout, f"{args.env_id}, seed {args.seed}, step {global_step:,}"))}
        if gif.result() is not None:
            pictures["play.gif"] = gif.result()
    for name, data in pictures.items():
        with open(os.path.join(run_dir, name), "wb") as f:
            f.write(data)
        visualize.log_encoded_image(writer, f"eval/{name.split('.')[0]}", data, global_step)
    return {**evaluation.pop(""), **evaluation}


def write_learning_curve(history: History, args: Args, writer: SummaryWriter, run_dir: str,
                         global_step: int) -> None:
    if history.steps:
        curve = visualize.figure_to_png(visualize.learning_curve_figure(
            *history, f"{args.env_id}, seed {args.seed}"))
        with open(os.path.join(run_dir, "learning_curve.png"), "wb") as f:
            f.write(curve)
        visualize.log_encoded_image(writer, "charts/learning_curve", curve, global_step)


def main() -> None:
    wall_start = time.time()
    args = parse_args()
    env, env_params = make_env(args.env_id, args.sticky_action_prob)
    network = make_network(env.action_space(env_params).n, args.hidden_sizes, args.activation)
    runner_key, eval_key = jax.random.split(jax.random.key(args.seed))
    loaded_params = None
    if args.load_model:
        obs = jax.eval_shape(env.reset, runner_key, env_params)[0]
        try:
            loaded_params = load_model(args.load_model, args, jax.eval_shape(
                network.init, runner_key, jax.ShapeDtypeStruct((1, *obs.shape), obs.dtype)))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    if args.jax_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(args.jax_cache_dir))
    fill_runtime_fields(args)

    # Compile ahead of time, before the run directory exists and before the clock for SPS starts.
    # One evaluation program serves both protocols and both policies: `greedy` and the sticky-action
    # probability are inputs.
    compile_start = time.time()
    if loaded_params is None:
        optimizer = make_optimizer(args)
        mesh = Mesh(np.array(jax.devices()[:args.num_devices]), ("data",))
        runner = jax.jit(functools.partial(init_runner, env=env, env_params=env_params, network=network,
                                           optimizer=optimizer, num_envs=args.num_envs),
                         out_shardings=make_runner_shardings(mesh))(runner_key)
        update_step = make_parallel_update_step(args, env, env_params, network, optimizer, mesh)
        update_step = update_step.lower(runner).compile()
        params = runner.params
    else:
        params = loaded_params
    evaluate_policies, eval_mesh = make_evaluate_policies(env, env_params, network, args)
    eval_params = lambda p: jax.device_put(p, NamedSharding(eval_mesh, P()))  # noqa: E731
    evaluate_policies = evaluate_policies.lower(eval_key, eval_params(params)).compile()
    compile_seconds = time.time() - compile_start

    run_dir = make_run_dir(args)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{name}|{value}|" for name, value in vars(args).items()))
    model_path = os.path.join(run_dir, "model.safetensors")
    summary = {"status": "failed", "env_id": args.env_id, "seed": args.seed,
               "total_timesteps": args.total_timesteps, "compile_seconds": compile_seconds}
    exit_code = 0
    try:
        with StopSignals() as stop:
            if loaded_params is None:
                print(f"{args.env_id}: {args.num_iterations} iterations of {args.batch_size} steps on "
                      f"{args.num_devices} device(s); compiled in {compile_seconds:.1f}s; logging to {run_dir}")
                train_start = time.time()
                runner, status, iterations, non_finite, history = train(args, update_step, runner, writer, stop)
                params, global_step = runner.params, iterations * args.batch_size
                summary.update(train_seconds=time.time() - train_start, iterations=iterations)
                summary["sps"] = global_step / summary["train_seconds"] if global_step else 0.0
            else:
                print(f"{args.env_id}: evaluating {args.load_model}; compiled in {compile_seconds:.1f}s; "
                      f"logging to {run_dir}")
                status, non_finite, global_step = "completed", None, 0
                summary["load_model"] = args.load_model
            summary.update(status=status, global_step=global_step)
            if status == "non_finite":
                print(f"error: {non_finite} is non-finite in iteration {iterations + 1}; stopped and saved "
                      f"the parameters from before it (step {global_step:,})", file=sys.stderr)
                summary.update(non_finite=non_finite, non_finite_iteration=iterations + 1)
                exit_code = 3
            elif status == "interrupted":
                print(f"interrupted at step {global_step:,}", file=sys.stderr)
            eval_start = time.time()
            if status == "completed":
                results = evaluate_policies(eval_key, eval_params(params))  # runs while the host goes on
            if loaded_params is None:  # drawn while the evaluations run
                write_learning_curve(history, args, writer, run_dir, global_step)
            if status == "completed":
                summary.update(eval_episodes=args.eval_episodes,
                               eval=report_evaluations(results, args, writer, run_dir, global_step))
                summary["eval_seconds"] = time.time() - eval_start
            if args.save_model and loaded_params is None:
                save_model(model_path, params, args, global_step)
                summary["model"] = model_path
            if stop.received:
                summary["status"] = "interrupted"
                exit_code = 128 + stop.received
    except BaseException as e:  # after the run directory exists, say in it what happened
        summary.update(status="interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
                       error=f"{type(e).__name__}: {e}")
        raise
    finally:
        writer.close()
        summary.update(wall_seconds=time.time() - wall_start, args=vars(args))
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    print(f"summary: {os.path.join(run_dir, 'summary.json')}")
    # Python's exit-time garbage collection walks every object the imports made (gymnax alone pulls in
    # matplotlib, seaborn and scipy), which is slow; frozen objects are skipped.
    gc.freeze()
    sys.exit(exit_code)


if __name__ == "__main__":
    main()

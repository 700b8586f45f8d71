"""PPO actor-critic for Gymnax's MinAtar games (Breakout by default), in JAX with Haiku, RLax and
Optax.

One jitted `update_step` is a whole PPO iteration: a `lax.scan` rollout of vmapped environments,
GAE, and `update_epochs` x `num_minibatches` gradient steps on the clipped surrogate loss, its ratio
formed from log-probabilities (see loss_stability.py). The Python loop around it only logs; at the
end the final policy is evaluated, drawn and saved.

Read it top to bottom: arguments, network, rollout, GAE, loss, update, metrics, then `make_agent`
(what the shared run compiles, checkpoints and evaluates: utils/contract.py) and `main` with its
training loop. What every script shares (the environment wrapper, checkpoints, logging, model
files, evaluation, pictures) is in utils/.

Run:  python ppo_breakout.py --total-timesteps 1000000
Docs: docs/ppo_breakout.md
"""

import dataclasses
import functools
import sys
from typing import Any, Literal, NamedTuple

if __name__ == "__main__":  # before JAX starts: its CPU devices, and a faster start-up
    from utils import startup

    startup.before_imports()

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from utils import cli, parallel, startup, training
from utils.contract import Agent, RunArgs
from utils.env import check_grid, default_conv_channels, make_env
from utils.layers import conv_relu_pool


@dataclasses.dataclass
class Args(RunArgs):
    """PPO's hyperparameters, on the fields every script shares (utils/contract.py: seed, game,
    budget, devices, evaluation, checkpoints, saving)."""

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
    diagnostics: bool = True
    """log the diagnostics/ scalars and histograms/ of each iteration's rollout and update"""

    # filled at runtime
    batch_size: int = dataclasses.field(init=False, default=0)
    """the rollout size, num_envs * num_steps"""
    minibatch_size: int = dataclasses.field(init=False, default=0)
    """the minibatch size, batch_size // num_minibatches"""


# Per-game defaults, only where the evidence shows that one setting cannot serve every game (as in
# rl-zoo3); a flag on the command line wins over its row. Evidence: docs/tuning.md.
GAME_DEFAULTS = {
    "Asterix-MinAtar": {"update_epochs": 2},  # better on Asterix, worse on Breakout
}


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


def actor_critic(obs: jax.Array, num_actions: int, hidden_sizes: tuple[int, ...], activation: str,
                 layer_norm: bool, conv_channels: int = 0, return_features: bool = False):
    """(action logits, state values) of a batch of observations, and the torso's features if
    asked: a convolution over the grid (if conv_channels), then one MLP torso, shared by the policy
    and value heads (why: docs/tuning.md)."""
    # Orthogonal init (Engstrom et al. 2020): 0.01 on the policy head, so the first policy is near
    # uniform.
    act, gain = ACTIVATIONS[activation]
    x = obs
    if conv_channels:  # = hk.Conv2D(conv_channels, 3) -> ReLU -> hk.avg_pool(2x2), faster on CPU
        x = conv_relu_pool(obs, conv_channels)
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
        metrics |= training_diagnostics(batch, active_units, infos["log_ratio"])
    return metrics


def iteration_scalars(args: Args, metrics: dict) -> dict[str, float]:
    """The iteration's TensorBoard scalars, besides charts/SPS and the episodes' (the run's
    bookkeeping logs those)."""
    scalars = {"charts/learning_rate": metrics["learning_rate"]}
    scalars |= {f"losses/{name}": metrics[name] for name in LOSS_METRICS}
    if args.diagnostics:
        scalars |= {f"diagnostics/{name}": metrics[name] for name in DIAGNOSTICS}
        frequencies = enumerate(metrics["action_frequency"])
        scalars |= {f"diagnostics/action_{a}_frequency": f for a, f in frequencies}
    return scalars


def first_non_finite(metrics: dict) -> str:
    """What the non-finite guard names: a loss term, else the gradient norm, else the
    parameters."""
    bad = [f"losses/{name}" for name in LOSS_METRICS if not np.isfinite(metrics[name])]
    if not np.isfinite(metrics["grad_norm"]):
        bad.append("diagnostics/grad_norm")
    return (bad + ["the parameters"])[0]


LOSS_METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac",
                "explained_variance")


# --------------------------------------------------------------------------------------------------
# Diagnostics (--diagnostics): summaries of each iteration's rollout and update, computed inside the
# jitted step so that only a few numbers and fixed-bin histograms reach the host
# --------------------------------------------------------------------------------------------------
HISTOGRAM_BINS = 30
LOG_RATIO_RANGE = 1.0  # log-ratio histograms span [-1, 1]; values beyond count in the end bins
DIAGNOSTICS = ("grad_norm", "logit_gap_max", "log_ratio_min", "log_ratio_max", "advantage_mean",
               "advantage_std", "value_error", "silent_units")


def bin_counts(x: jax.Array, low: jax.Array | float, high: jax.Array | float) -> jax.Array:
    """Counts of `x` in HISTOGRAM_BINS equal bins over [low, high], values outside in the end bins
    (one comparison per bin: on a CPU far cheaper than jnp.histogram's search)."""
    bins = jnp.floor((x.ravel() - low) / (high - low) * HISTOGRAM_BINS)
    bins = jnp.clip(bins, 0, HISTOGRAM_BINS - 1).astype(jnp.int32)
    return (bins[:, None] == jnp.arange(HISTOGRAM_BINS)).sum(0)


def training_diagnostics(batch, active_units: jax.Array, log_ratio: jax.Array) -> dict:
    """The diagnostics/ scalars and histograms of one iteration: the logit gap (what
    loss_stability.py sweeps), the log-ratio range, advantage and value statistics, torso units
    silent on the whole rollout, action frequencies. `batch` is the update's Batch, `active_units`
    which torso features fired on some observation of the rollout, `log_ratio` the update's
    log-ratios of every minibatch step."""
    spread = {"logits": batch.logits, "advantage": batch.advantage, "value": batch.value}
    edges = {name: (x.min(), jnp.maximum(x.max(), x.min() + 1e-6)) for name, x in spread.items()}
    edges["log_ratio"] = (-LOG_RATIO_RANGE, LOG_RATIO_RANGE)
    data = spread | {"log_ratio": log_ratio}
    histograms = {name: {"counts": bin_counts(data[name], *edges[name]),
                         "edges": jnp.linspace(*edges[name], HISTOGRAM_BINS + 1)} for name in edges}
    actions = jnp.bincount(batch.action, length=batch.logits.shape[-1])
    return {"logit_gap_max": (batch.logits.max(-1) - batch.logits.min(-1)).max(),
            "log_ratio_min": log_ratio.min(), "log_ratio_max": log_ratio.max(),
            "advantage_mean": batch.advantage.mean(), "advantage_std": batch.advantage.std(),
            "value_error": jnp.sqrt(jnp.square(batch.target - batch.value).mean()),
            "silent_units": 1.0 - active_units.mean(),
            "action_frequency": actions / actions.sum(),
            "histograms": histograms}


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


def moments_over_devices(advantages: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`minibatch_moments` of the whole minibatches, every device holding a share of each (one
    collective an epoch)."""
    return tuple(jax.lax.pmean(jnp.stack(minibatch_moments(advantages)), "envs"))


def make_parallel_update_step(args: Args, env, env_params, network: hk.Transformed,
                              optimizer: optax.GradientTransformation, mesh: Mesh):
    """`make_update_step`'s step over the devices of the mesh. Under `jax.shard_map` each
    device runs the one-device iteration on its share of the environments, with its own key (its
    own actions and minibatch order), the whole minibatch's advantage moments and the devices'
    mean gradient: each step is the one-device step on the whole minibatch. The metrics are then
    computed on the devices' iterations put together, XLA adding the reductions."""
    ppo_iteration = make_ppo_iteration(args, env, env_params, network,
                                       parallel.with_mean_gradient(optimizer),
                                       moments_over_devices)

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

    return update_step  # jitted by the run, which donates it the state


# --------------------------------------------------------------------------------------------------
# Arguments: checked before anything is compiled or written
# --------------------------------------------------------------------------------------------------
# The arguments that rebuild the network, in a model file's header; ADDED_ARGS: the fields added
# since model files and search studies were first saved, with the value they had before.
NETWORK_ARGS = ("env_id", "hidden_sizes", "activation", "layer_norm", "conv_channels")
ADDED_ARGS = {"conv_channels": 0}


def fill_defaults(args: Args, given: set[str]) -> None:
    """An environment whose observations are not a grid gets no convolution unless one is given
    (the run applies the game's row of GAME_DEFAULTS before)."""
    if "conv_channels" not in given:
        args.conv_channels = default_conv_channels(args.env_id, args.conv_channels)


def check_args(args: Args) -> str | None:
    """What is wrong with PPO's own arguments, or None (utils/cli.py checks the shared ones)."""
    error = cli.check_numbers(
        args, positive_finite=("learning_rate", "max_grad_norm"),
        non_negative_finite=("ent_coef", "vf_coef"), unit_interval=("gamma", "gae_lambda"))
    if error:
        return error
    if not 0 < args.clip_coef <= 1:
        return f"--clip-coef must be in (0, 1], got {args.clip_coef}"
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        return f"--hidden-sizes must be one or more positive widths, got {args.hidden_sizes}"
    if args.conv_channels < 0:
        return f"--conv-channels must be 0 (none) or positive, got {args.conv_channels}"
    return (cli.check_rollout(args, "num_minibatches", "update_epochs")
            or check_grid(args.env_id, args.conv_channels))


def fill_runtime_fields(args: Args) -> Args:
    args.batch_size = args.steps_per_iteration = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    args.num_devices = cli.default_num_devices(args.num_devices, args.num_envs,
                                               args.minibatch_size)
    return args


# What the machinery needs besides make_agent (utils/contract.py): the policy the results report;
# the fields that only add logging, off in the many-seed harness; the metrics whose extremes its
# --stability records; the search's space (tools/search.py: a list is a choice, (low, high)
# a uniform float, "log" after them log-uniform, a range integers, one range per torso layer).
HEADLINE_POLICY = "sampled"
QUIET_ARGS = {"diagnostics": False}
STABILITY_METRICS = {"logit_gap_max": "max", "log_ratio_min": "min", "log_ratio_max": "max"}
SEARCH_SPACE = {
    "learning_rate": (1e-3, 2e-2, "log"), "anneal_lr": [True, False], "num_envs": [32, 64, 128],
    "num_steps": [64, 128, 256], "gamma": (0.97, 0.999), "gae_lambda": (0.8, 0.99),
    "num_minibatches": [4, 8, 16, 32, 64], "update_epochs": range(2, 7),
    "norm_adv": [True, False], "clip_coef": (0.1, 0.3), "clip_vloss": [True, False],
    "ent_coef": (1e-3, 5e-2, "log"), "vf_coef": (0.25, 1.0), "max_grad_norm": (0.25, 2.0, "log"),
    "hidden_sizes": (range(32, 129, 32), range(32, 97, 32)), "activation": ["crelu", "relu"],
}


# --------------------------------------------------------------------------------------------------
# Main: the agent handed to the run, then the training loop
# --------------------------------------------------------------------------------------------------
def act(network: hk.Transformed, params: hk.Params, obs: jax.Array, key: jax.Array,
        greedy: jax.Array) -> jax.Array:
    """The policy's actions: sampled from its logits, or their argmax where `greedy`."""
    logits, _ = network.apply(params, obs)
    return jnp.where(greedy, jnp.argmax(logits, axis=-1), jax.random.categorical(key, logits))


def make_agent(args: Args, env, env_params) -> Agent:
    """The network, optimizer, initial state, update step and policy that the run compiles,
    checkpoints, evaluates and saves (utils/training.py)."""
    network = make_network(env.action_space(env_params).n, args.hidden_sizes, args.activation,
                           args.layer_norm, args.conv_channels)
    optimizer = make_optimizer(args)
    parts = (args, env, env_params, network, optimizer)
    return Agent(
        network=network, optimizer=optimizer,
        init=functools.partial(init_runner, env=env, env_params=env_params, network=network,
                               optimizer=optimizer, num_envs=args.num_envs),
        update_step=make_update_step(*parts),
        parallel_update_step=functools.partial(make_parallel_update_step, *parts),
        state_specs=RUNNER_SPECS, params=lambda runner: runner.train_state.params,
        act=functools.partial(act, network))


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
            run.log_iteration(iteration, metrics, functools.partial(iteration_scalars, args),
                              first_non_finite)
            run.end_iteration(iteration, runner)  # what a checkpoint or --eval-every needs of it
        run.finish(runner)  # the last iteration read; the last checkpoint
        run.evaluate(runner)  # both protocols, both policies: summary.json, play.gif, pictures
        run.save_model(runner)  # model.safetensors
    sys.exit(run.exit_code)


if __name__ == "__main__":
    startup.after_imports()
    main()

"""PQN, parallelised Q-learning (Gallici et al., "Simplifying Deep Temporal Difference Learning",
ICLR 2025), for Gymnax's MinAtar games (Breakout by default), in JAX with Haiku, RLax and Optax.

No replay buffer and no target network: many environments step at once under an epsilon-greedy
policy, and LayerNorm in the Q-network keeps learning stable. One jitted `update_step` is a whole
iteration: a `lax.scan` rollout of vmapped environments, Peng's Q(lambda) targets from
`rlax.lambda_returns`, computed once, and `update_epochs` x `num_minibatches` gradient steps on
the squared TD error. The Python loop around it only logs; at the end the final Q-network is
evaluated (greedy and epsilon-greedy), drawn and saved.

Read it top to bottom: arguments, network, rollout, Q(lambda) targets, loss, update, metrics, the
data-parallel iteration and the argument checks, then `make_agent` (what the shared run compiles,
checkpoints and evaluates: utils/contract.py) and `main` with its training loop. What every
script shares (the environment wrapper, checkpoints, logging, model files, evaluation, pictures) is
in utils/.

Run:  python pqn_minatar.py --total-timesteps 1000000
Docs: docs/pqn_minatar.md
"""

import dataclasses
import functools
import sys
from typing import Any, Literal, NamedTuple

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
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from utils import cli, layers, parallel, startup, training
from utils.contract import Agent, RunArgs
from utils.env import check_grid, default_conv_channels, make_env


@dataclasses.dataclass
class Args(RunArgs):
    """PQN's hyperparameters, on the fields every script shares (utils/contract.py: seed, game,
    budget, devices, evaluation, checkpoints, saving)."""

    learning_rate: float = 5e-4
    """the learning rate of the RAdam optimizer, decayed linearly to 0 over training"""
    num_envs: int = 128
    """the number of parallel environments"""
    num_steps: int = 32
    """the number of steps run in each environment per rollout"""
    gamma: float = 0.99
    """the discount factor"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) targets (0: one-step Q-learning; 1: Monte Carlo returns)"""
    num_minibatches: int = 32
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 2
    """the number of passes over each rollout"""
    max_grad_norm: float = 10.0
    """the maximum global norm of the gradient"""
    epsilon_start: float = 1.0
    """the exploration probability epsilon at the start of training"""
    epsilon_end: float = 0.01
    """epsilon once it has decayed (purejaxql's is 0.05: docs/pqn_minatar.md compares the two)"""
    exploration_fraction: float = 0.1
    """the fraction of the iterations over which epsilon decays linearly, in (0, 1]"""
    hidden_sizes: tuple[int, ...] = (128,)
    """the widths of the Q-network's hidden layers"""
    layer_norm: bool = True
    """normalize each hidden layer's pre-activations (LayerNorm): what lets PQN learn without a
    target network"""
    conv_channels: int = 16
    """channels of a 3x3 convolution over the grid before the hidden layers (0: none; an
    environment whose observations are not a grid gets none unless given)"""
    conv_style: Literal["pooled", "purejaxql"] = "pooled"
    """pooled: zero-padded convolution, ReLU, 2x2 average pooling (5x5 cells of features on
    MinAtar); purejaxql: its network's, the input divided by 255, an unpadded convolution, LayerNorm
    (with --layer-norm), ReLU (8x8 cells), and flax's LayerNorm epsilon 1e-6 in every layer"""
    eval_epsilon: float = 0.05
    """epsilon of the "sampled" final evaluation; the "greedy" one takes argmax Q. 0.05 is the
    evaluation epsilon of Nature's DQN and CleanRL's DQN"""

    # filled at runtime
    batch_size: int = dataclasses.field(init=False, default=0)
    """the rollout size, num_envs * num_steps"""
    minibatch_size: int = dataclasses.field(init=False, default=0)
    """the minibatch size, batch_size // num_minibatches"""


# --------------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------------
def q_network(obs: jax.Array, num_actions: int, hidden_sizes: tuple[int, ...], layer_norm: bool,
              conv_channels: int = 0, conv_style: str = "pooled") -> jax.Array:
    """Q-values, (batch, num_actions): a convolution over the grid (if conv_channels, in
    `conv_style`), then Linear -> LayerNorm -> ReLU per hidden layer, then a linear head with one
    output per action."""
    # He initialisation on the hidden layers and LeCun's on the head, as purejaxql's flax network.
    norm_eps = 1e-6 if conv_style == "purejaxql" else 1e-5  # flax's default; Haiku's
    x = obs
    if conv_channels and conv_style == "pooled":
        x = layers.conv_relu_pool(obs, conv_channels)  # = hk.Conv2D -> ReLU -> hk.avg_pool(2x2)
    elif conv_channels:  # = x / 255 -> hk.Conv2D(padding="VALID") -> LayerNorm -> ReLU
        x = layers.conv_valid(obs / 255.0, conv_channels)
        if layer_norm:
            x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=norm_eps,
                             name="conv_norm")(x)
        x = jax.nn.relu(x)
    x = x.reshape(obs.shape[0], -1)
    for i, width in enumerate(hidden_sizes):
        x = hk.Linear(width, w_init=hk.initializers.VarianceScaling(2.0), name=f"torso_{i}")(x)
        if layer_norm:
            x = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=norm_eps,
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
    params: hk.Params
    opt_state: optax.OptState


class RunnerState(NamedTuple):
    train_state: TrainState  # the parameters and optimizer state, which the update changes
    env_state: Any  # batched environment state, one entry per environment
    obs: jax.Array  # (num_envs, *obs_shape) current observation of each environment
    episode_return: jax.Array  # (num_envs,) return of each environment's episode so far
    episode_length: jax.Array  # (num_envs,) length of each environment's episode so far
    iteration: jax.Array  # iterations done so far, which set epsilon
    key: jax.Array


class Transition(NamedTuple):
    obs: jax.Array  # o_t
    action: jax.Array  # a_t, epsilon-greedy in Q(o_t)
    reward: jax.Array  # r_{t+1}
    terminated: jax.Array  # the episode ended for good: no future value
    truncated: jax.Array  # the time limit cut the episode: the future is max Q(final_obs)
    q_max: jax.Array  # max_a Q(o_t, a), from the forward pass that chose a_t
    final_q_max: jax.Array  # max_a Q(final_obs, a) where truncated, else 0 (o_{t+1} before reset)
    episode_return: jax.Array  # return of the episode that ended at this step (0 if none ended)
    episode_length: jax.Array  # length of the episode that ended at this step (0 if none ended)


class Batch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    target: jax.Array  # the Q(lambda) return of (obs, action)


class Iteration(NamedTuple):
    """What an iteration's metrics are computed from."""
    traj: Transition  # the rollout, (num_steps, num_envs, ...)
    infos: dict[str, jax.Array]  # each gradient step's terms, (update_epochs, num_minibatches)
    epsilon: jax.Array  # the rollout's epsilon


# --------------------------------------------------------------------------------------------------
# Rollout, Q(lambda) targets, loss, update
# --------------------------------------------------------------------------------------------------
def collect_trajectories(runner: RunnerState, env, env_params, network: hk.Transformed,
                         num_steps: int, epsilon: jax.Array) -> tuple[RunnerState, Transition]:
    """Steps all environments `num_steps` times, epsilon-greedy in the current Q-values (a
    `lax.scan` over time)."""
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(runner: RunnerState, _) -> tuple[RunnerState, Transition]:
        key, action_key, step_key = jax.random.split(runner.key, 3)
        params = runner.train_state.params
        q_values = network.apply(params, runner.obs)
        action = distrax.EpsilonGreedy(q_values, epsilon).sample(seed=action_key)
        obs, env_state, reward, terminated, truncated, info = vmap_step(
            jax.random.split(step_key, runner.obs.shape[0]), runner.env_state, action, env_params)
        done = terminated | truncated
        # A truncated step bootstraps from max Q(final_obs); the time limit is rare, so that
        # forward pass runs only on steps where some environment hit it.
        final_q_max = jax.lax.cond(
            truncated.any(),
            lambda: jnp.where(truncated,
                              network.apply(params, info["final_observation"]).max(axis=-1), 0.0),
            lambda: jnp.zeros_like(reward))
        episode_return = runner.episode_return + reward
        episode_length = runner.episode_length + 1
        transition = Transition(
            obs=runner.obs, action=action, reward=reward, terminated=terminated,
            truncated=truncated, q_max=q_values.max(axis=-1), final_q_max=final_q_max,
            episode_return=jnp.where(done, episode_return, 0.0),
            episode_length=jnp.where(done, episode_length, 0))
        runner = runner._replace(env_state=env_state, obs=obs, key=key,
                                 episode_return=jnp.where(done, 0.0, episode_return),
                                 episode_length=jnp.where(done, 0, episode_length))
        return runner, transition

    return jax.lax.scan(env_step, runner, None, length=num_steps)


def q_lambda_targets(traj: Transition, last_q_max: jax.Array, gamma: float,
                     q_lambda: float) -> jax.Array:
    """Peng's Q(lambda) returns, (num_steps, num_envs): G_t = r_{t+1} + gamma [(1 - lambda)
    max_a Q(o_{t+1}, a) + lambda G_{t+1}], the rollout's last step bootstrapping from max Q of the
    observation it ended on (`last_q_max`). A terminated step's future is worth 0; a truncated
    one's is max Q(final_obs), folded into its reward with the discount cut there, so that lambda
    carries nothing across an episode's end (Pardo et al. 2018, "Time Limits in RL")."""
    bootstrap = traj.truncated & ~traj.terminated
    r_t = traj.reward + gamma * jnp.where(bootstrap, traj.final_q_max, 0.0)
    discount_t = gamma * (1.0 - (traj.terminated | traj.truncated))
    # v_t = max Q(o_{t+1}): the next step's own q_max; after the last step, that of runner.obs.
    v_t = jnp.concatenate([traj.q_max[1:], last_q_max[None]], axis=0)
    lambda_returns = jax.vmap(rlax.lambda_returns, in_axes=(1, 1, 1, None),
                              out_axes=1)  # over the environments
    return lambda_returns(r_t, discount_t, v_t, q_lambda)


def td_loss(params: hk.Params, network: hk.Transformed,
            mb: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Half the mean squared TD error of Q(o, a) against the Q(lambda) target (fixed data: no
    gradient flows into it), and the mean Q-value of the actions taken, for the metrics."""
    q_taken = jnp.take_along_axis(network.apply(params, mb.obs), mb.action[:, None], axis=-1)[:, 0]
    loss = rlax.l2_loss(q_taken - mb.target).mean()
    return loss, {"td_loss": loss, "q_values": q_taken.mean()}


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """RAdam behind global-norm clipping, its learning rate decayed linearly to 0 over all updates
    (`inject_hyperparams` keeps the current rate in the state, for logging)."""
    num_updates = args.num_iterations * args.update_epochs * args.num_minibatches
    learning_rate = optax.linear_schedule(args.learning_rate, 0.0, num_updates)
    radam = optax.inject_hyperparams(optax.radam)(learning_rate=learning_rate)
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), radam)


def epsilon_schedule(args: Args) -> optax.Schedule:
    """Epsilon of each iteration: linear from epsilon_start to epsilon_end over the first
    exploration_fraction of the iterations, then constant."""
    decay_iterations = max(1, round(args.exploration_fraction * args.num_iterations))
    return optax.linear_schedule(args.epsilon_start, args.epsilon_end, decay_iterations)


def init_runner(key: jax.Array, env, env_params, network: hk.Transformed,
                optimizer: optax.GradientTransformation, num_envs: int) -> RunnerState:
    """The state before the first iteration: environments reset, network and optimizer
    initialised, episode counters at zero."""
    key, init_key, reset_key = jax.random.split(key, 3)
    reset_keys = jax.random.split(reset_key, num_envs)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, env_params)
    params = network.init(init_key, obs)
    return RunnerState(train_state=TrainState(params, optimizer.init(params)),
                       env_state=env_state, obs=obs, episode_return=jnp.zeros(num_envs),
                       episode_length=jnp.zeros(num_envs, jnp.int32),
                       iteration=jnp.zeros((), jnp.int32), key=key)


def update_minibatch(train_state: TrainState, mb: Batch, network: hk.Transformed,
                     optimizer: optax.GradientTransformation):
    """One gradient step on a minibatch; its loss terms come back."""
    grads, info = jax.grad(td_loss, has_aux=True)(train_state.params, network, mb)
    updates, opt_state = optimizer.update(grads, train_state.opt_state, train_state.params)
    return TrainState(optax.apply_updates(train_state.params, updates), opt_state), info


def update_epoch(train_state: TrainState, key: jax.Array, batch: Batch, network: hk.Transformed,
                 optimizer: optax.GradientTransformation, num_minibatches: int):
    """One pass over the batch in a fresh random order: a gradient step per minibatch."""
    # The permutation is cut into minibatches of row indices; each step gathers its rows, so no
    # shuffled copy of the batch is made.
    order = jax.random.permutation(key, batch.action.shape[0]).reshape(num_minibatches, -1)

    def minibatch_step(train_state: TrainState, rows: jax.Array):
        mb = jax.tree.map(lambda x: x[rows], batch)
        return update_minibatch(train_state, mb, network, optimizer)

    return jax.lax.scan(minibatch_step, train_state, order)


def make_pqn_iteration(args: Args, env, env_params, network: hk.Transformed,
                       optimizer: optax.GradientTransformation):
    """The function that runs one PQN iteration on a RunnerState: rollout, Q(lambda) targets, and
    the epochs of minibatch steps. It returns the new RunnerState and what the metrics need."""
    epoch = functools.partial(update_epoch, network=network, optimizer=optimizer,
                              num_minibatches=args.num_minibatches)
    epsilon_at = epsilon_schedule(args)

    def pqn_iteration(runner: RunnerState) -> tuple[RunnerState, Iteration]:
        next_key, rollout_key, epochs_key = jax.random.split(runner.key, 3)
        epsilon = epsilon_at(runner.iteration)
        runner, traj = collect_trajectories(runner._replace(key=rollout_key), env, env_params,
                                            network, args.num_steps, epsilon)
        # The targets come from the parameters that collected the rollout (no update has happened
        # yet) and stay fixed through the epochs, as in purejaxql: a target network that lasts one
        # iteration. Every v_t is thus from one network, including the last step's.
        last_q_max = network.apply(runner.train_state.params, runner.obs).max(axis=-1)
        targets = q_lambda_targets(traj, last_q_max, args.gamma, args.q_lambda)
        flatten = lambda x: x.reshape(-1, *x.shape[2:])  # (T, N, ...) -> (T * N, ...)  # noqa: E731
        batch = jax.tree.map(flatten, Batch(obs=traj.obs, action=traj.action, target=targets))
        epoch_keys = jax.random.split(epochs_key, args.update_epochs)
        train_state, infos = jax.lax.scan(functools.partial(epoch, batch=batch),
                                          runner.train_state, epoch_keys)
        runner = runner._replace(train_state=train_state, iteration=runner.iteration + 1,
                                 key=next_key)
        return runner, Iteration(traj, infos, epsilon)

    return pqn_iteration


def make_update_step(args: Args, env, env_params, network: hk.Transformed,
                     optimizer: optax.GradientTransformation):
    """One PQN iteration and its metrics on one device, for the caller to jit: what a run on one
    device and the many-seed harness (tools/tune.py) train with. On more devices the run
    takes the data-parallel version below, this iteration on each device's share of the
    environments."""
    pqn_iteration = make_pqn_iteration(args, env, env_params, network, optimizer)

    def update_step(runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        runner, iteration = pqn_iteration(runner)
        return runner, iteration_metrics(iteration, runner.train_state)

    return update_step


# --------------------------------------------------------------------------------------------------
# Metrics: what an iteration logs, from its rollout and the update's per-minibatch terms
# --------------------------------------------------------------------------------------------------
def episode_metrics(traj: Transition) -> dict[str, jax.Array]:
    """How many episodes ended in the rollout, and their summed returns and lengths."""
    done = traj.terminated | traj.truncated
    return {"episodes": done.sum(), "episode_return_sum": traj.episode_return.sum(),
            "episode_length_sum": traj.episode_length.sum()}


def all_finite(params: hk.Params, losses: dict[str, jax.Array]) -> jax.Array:
    """One flag for the training loop's check that training is still finite: every parameter and
    loss term."""
    leaves = jax.tree.leaves(params) + list(losses.values())
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def iteration_metrics(iteration: Iteration, train_state: TrainState) -> dict[str, jax.Array]:
    """Everything an iteration logs: the loss terms' means over epochs x minibatches, the
    episodes that ended, epsilon, the learning rate and the finite flag."""
    losses = {name: value.mean() for name, value in iteration.infos.items()}
    metrics = losses | episode_metrics(iteration.traj)
    metrics["epsilon"] = iteration.epsilon
    metrics["learning_rate"] = optax.tree_utils.tree_get(  # the rate of the last update
        train_state.opt_state, "learning_rate", filtering=lambda _, x: isinstance(x, jax.Array))
    metrics["finite"] = all_finite(train_state.params, losses)
    return metrics


def iteration_scalars(metrics: dict) -> dict[str, float]:
    """The iteration's TensorBoard scalars, besides charts/SPS and the episodes' (utils/training.py
    logs those for every script)."""
    return {"losses/td_loss": metrics["td_loss"], "losses/q_values": metrics["q_values"],
            "charts/epsilon": metrics["epsilon"], "charts/learning_rate": metrics["learning_rate"]}


def first_non_finite(metrics: dict) -> str:
    """What the training loop names when training stops being finite: a loss term, else the
    parameters."""
    bad = [f"losses/{name}" for name in ("td_loss", "q_values") if not np.isfinite(metrics[name])]
    return (bad + ["the parameters"])[0]


# --------------------------------------------------------------------------------------------------
# Data parallel: the iteration on each device's share of the environments
# --------------------------------------------------------------------------------------------------
# The environments (and all that comes from them) are split along the mesh's "envs" axis; the
# parameters, optimizer state, iteration count and key are replicated.
RUNNER_SPECS = RunnerState(train_state=TrainState(P(), P()), env_state=P("envs"), obs=P("envs"),
                           episode_return=P("envs"), episode_length=P("envs"), iteration=P(),
                           key=P())
# The devices' rollouts, put together along their environment axis; the loss terms stacked by
# device, in front; epsilon is the same on every device.
ITERATION_SPECS = Iteration(traj=P(None, "envs"), infos=P("envs"), epsilon=P())


def make_parallel_update_step(args: Args, env, env_params, network: hk.Transformed,
                              optimizer: optax.GradientTransformation, mesh: Mesh):
    """One PQN iteration and its metrics over the devices of the mesh. Under
    `jax.shard_map` each device runs the one-device iteration (`make_pqn_iteration`) on its share
    of the environments, with its own key (its own actions and minibatch order) and the devices'
    mean gradient: each step is the one-device step on the whole minibatch. The metrics are then
    computed on the devices' iterations put together, XLA adding the reductions."""
    pqn_iteration = make_pqn_iteration(args, env, env_params, network,
                                       parallel.with_mean_gradient(optimizer))

    def device_iteration(runner: RunnerState) -> tuple[RunnerState, Iteration]:
        shared_key, own_key = jax.random.split(runner.key)
        own_key = jax.random.fold_in(own_key, jax.lax.axis_index("envs"))
        runner, iteration = pqn_iteration(runner._replace(key=own_key))
        return runner._replace(key=shared_key), iteration

    # check_vma=False: with the check on, JAX would itself sum the replicated parameters' gradient
    # over the devices, on top of with_mean_gradient's mean.
    iterate = jax.shard_map(device_iteration, mesh=mesh, in_specs=(RUNNER_SPECS,),
                            out_specs=(RUNNER_SPECS, ITERATION_SPECS), check_vma=False)

    def update_step(runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        runner, iteration = iterate(runner)
        return runner, iteration_metrics(iteration, runner.train_state)

    return update_step  # jitted by the run, which donates it the state


# --------------------------------------------------------------------------------------------------
# Arguments: checked before anything is compiled or written
# --------------------------------------------------------------------------------------------------
# The arguments that rebuild the network, in a model file's header; ADDED_ARGS: the fields added
# since model files and search studies were first saved, with the value they had before.
NETWORK_ARGS = ("env_id", "hidden_sizes", "conv_channels", "conv_style", "layer_norm")
ADDED_ARGS = {"conv_style": "pooled"}


def fill_defaults(args: Args, given: set[str]) -> None:
    """An environment whose observations are not a grid gets no convolution unless one is
    given."""
    if "conv_channels" not in given:
        args.conv_channels = default_conv_channels(args.env_id, args.conv_channels)


def check_args(args: Args) -> str | None:
    """What is wrong with PQN's own arguments, or None (utils/cli.py checks the shared ones)."""
    error = cli.check_numbers(
        args, positive_finite=("learning_rate", "max_grad_norm"),
        unit_interval=("gamma", "q_lambda", "epsilon_start", "epsilon_end", "eval_epsilon"))
    if error:
        return error
    if args.epsilon_end > args.epsilon_start:
        return (f"--epsilon-end {args.epsilon_end} is above --epsilon-start {args.epsilon_start}: "
                "epsilon would rise as training goes")
    if not 0 < args.exploration_fraction <= 1:
        return f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}"
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


# What the machinery needs besides make_agent (utils/contract.py): the policy the results report
# (argmax Q, PQN's own test protocol); the search's space (tools/search.py), around
# purejaxql's MinAtar config (github.com/mttga/purejaxql, purejaxql/config/alg/pqn_minatar.yaml)
# with epsilon's floor at 0.01. Powers of two, so that every batch divides into every minibatch
# count and device count. LayerNorm stays on: it is what lets PQN learn without a target network.
HEADLINE_POLICY = "greedy"
SEARCH_SPACE = {
    "learning_rate": (1e-4, 2e-3, "log"), "num_envs": [64, 128, 256], "num_steps": [16, 32, 64],
    "gamma": (0.97, 0.995), "q_lambda": (0.3, 0.9), "num_minibatches": [8, 16, 32, 64],
    "update_epochs": range(1, 5), "max_grad_norm": (1.0, 20.0, "log"),
    "epsilon_end": (0.001, 0.1, "log"), "exploration_fraction": (0.05, 0.3),
    "hidden_sizes": (range(64, 257, 64),), "conv_channels": range(8, 33, 8),
}


# --------------------------------------------------------------------------------------------------
# Main: the agent handed to the run, then the training loop
# --------------------------------------------------------------------------------------------------
def act(network: hk.Transformed, eval_epsilon: float, params: hk.Params, obs: jax.Array,
        key: jax.Array, greedy: jax.Array) -> jax.Array:
    """argmax Q where `greedy`, else epsilon-greedy at --eval-epsilon."""
    q_values = network.apply(params, obs)
    sampled = distrax.EpsilonGreedy(q_values, eval_epsilon).sample(seed=key)
    return jnp.where(greedy, jnp.argmax(q_values, axis=-1), sampled)


def make_agent(args: Args, env, env_params) -> Agent:
    """The network, optimizer, initial state, update step and policy that the run compiles,
    checkpoints, evaluates and saves (utils/training.py)."""
    network = make_network(env.action_space(env_params).n, args.hidden_sizes, args.layer_norm,
                           args.conv_channels, args.conv_style)
    optimizer = make_optimizer(args)
    parts = (args, env, env_params, network, optimizer)
    return Agent(
        network=network, optimizer=optimizer,
        init=functools.partial(init_runner, env=env, env_params=env_params, network=network,
                               optimizer=optimizer, num_envs=args.num_envs),
        update_step=make_update_step(*parts),
        parallel_update_step=functools.partial(make_parallel_update_step, *parts),
        state_specs=RUNNER_SPECS, params=lambda runner: runner.train_state.params,
        act=functools.partial(act, network, args.eval_epsilon))


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

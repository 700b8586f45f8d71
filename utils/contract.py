"""The contract between an algorithm script and the shared machinery (utils/ and the tools).

A script that keeps it runs through training, checkpoints and `--resume`, `--load-model`, the
evaluation and its pictures, model files, the many-seed harness (tools/tune.py), the search
(tools/search.py) and the results tables, with no edit to a shared file. Nothing else about a
script is assumed.

What a script module defines:

- `Args`: a dataclass that extends `RunArgs` (below) with the script's hyperparameters alone, and
  fills the runtime field `steps_per_iteration` (and any of its own) in `fill_runtime_fields`.
- `fill_runtime_fields(args) -> args`: sets `args.steps_per_iteration` (environment steps one
  update step takes, over all environments) and whatever else the script derives. It may also set
  `num_iterations` and resolve `num_devices` (0: automatic); what it leaves, the machinery fills
  (`fill_runtime_fields` below): total_timesteps // steps_per_iteration iterations, and one device.
  A script whose make_agent hands over no `parallel_update_step` is refused more than one device
  with one `error:` line.
- `check_args(args) -> str | None`: what is wrong with the script's own hyperparameters, or None.
  The shared fields are checked by `utils.cli.check_run_args`, which calls it.
- `make_agent(args, env, env_params) -> Agent`: what the script hands over (below).
- `HEADLINE_POLICY`: "sampled" or "greedy", the policy its results report (PPO samples from its
  policy; the value-based scripts report their greedy policy). The GIF, the results tables and
  the harness use it; both are evaluated.
- `NETWORK_ARGS`: the Args fields that rebuild the network, which a model file's header records.
- Optional: `ADDED_ARGS` ({field: value} of fields added since files were first saved, with the
  value they had before), `GAME_DEFAULTS` ({env_id: {field: value}}, per-game rows that a run
  applies where the command line leaves the field; the harness applies none), `fill_defaults(args,
  given)` (fills what the command line leaves, after the game's row; `given`: the fields it sets),
  `SEARCH_SPACE` (the search's space, tools/search.py reads it), `QUIET_ARGS` ({field: value}
  of fields that only add logging: the harness trains with these values) and `STABILITY_METRICS`
  ({metric: "max" or "min"}: with the harness's --stability, each seed's extreme of each over all of
  training, from the update step's metrics, with QUIET_ARGS not applied).

What a script may call, the machinery's half of the contract (a change to any of it gets an entry
in CHANGELOG.md with its one-line migration):

- `utils.training.parse_args(script)`, and `utils.training.Run(script, args, agent, env,
  env_params)` as a context manager, of which: `state`, `iterations()`, `update_step(state)`,
  `log_iteration(iteration, metrics, scalars, first_non_finite)`, `end_iteration(iteration,
  state)`, `finish(state)`, `evaluate(state)`, `save_model(state)` and `exit_code`; the loop is
  tests/tiny_pg.py's `main`.
- `utils.startup.before_imports()` before JAX is imported, and `utils.startup.after_imports()`
  first in `if __name__ == "__main__":`.
- From this module: `RunArgs`, `Agent`, `fill_runtime_fields`, `NOT_RESULTS`.
- Helpers a script may use or not, whose signatures are kept as the rest: `utils.env` (`make_env`,
  `check_grid`, `default_conv_channels`), `utils.layers`, `utils.parallel` (`AXIS`,
  `with_mean_gradient`) and `utils.cli` (`flag`, `check_numbers`, `check_rollout`,
  `default_num_devices`).
Every other name in utils/ (the rest of `Run`'s methods, the logger, the checkpoint format, the
evaluation's internals) is the machinery's own and may change without an entry.

What the update step returns: `(state, metrics)`, the metrics a dict of arrays holding at least
`episodes`, `episode_return_sum` and `episode_length_sum` (of the training episodes that ended in
the step) and `finite` (False once a loss, gradient or parameter is not finite), and optionally
`histograms` ({name: {"counts", "edges"}}, logged on the first iteration and every tenth).
"""

import dataclasses
import os
from collections.abc import Callable
from typing import Any, NamedTuple


@dataclasses.dataclass
class RunArgs:
    """The fields every script shares, each with one default and one help text."""

    exp_name: str = ""
    """the name of this experiment, part of the run directory's name ("": the script's file name)"""
    seed: int = 1
    """seed of the experiment (network init, environments, exploration, evaluation)"""
    env_id: str = "Breakout-MinAtar"
    """the id of the gymnax environment (any with discrete actions; MinAtar games are drawn best)"""
    total_timesteps: int = 1_000_000
    """total environment steps of training"""
    sticky_action_prob: float = 0.1
    """probability that the game repeats its previous action in training, as in MinAtar (0 for
    gymnax's games as they are)"""
    num_devices: int = 0
    """devices the environments are split across: CPU devices on a CPU, chips on a GPU or TPU (0:
    on a CPU two where JAX has two or more and the work splits in two, else one; on a GPU or TPU
    one); a seed replays the same run only with the same count and kind of device"""
    eval_episodes: int = 256
    """the number of complete episodes the final policy is evaluated on, per protocol and policy"""
    eval_every: int = 0
    """also evaluate the policy as at the end (both protocols, both policies, --eval-episodes each)
    every this many iterations, logged under the final evaluation's eval/ tags (0: only at the end);
    the clock behind SPS stops while it plays"""
    checkpoint_every: int = 10
    """write the whole training state to the run directory's checkpoint.safetensors every this many
    iterations and when the run stops (0: never)"""
    resume: str = ""
    """continue the run in this run directory from its checkpoint, with its arguments: only
    --checkpoint-every, --eval-every, --jax-cache-dir and --num-devices may change (another device
    count continues the run, not bit for bit)"""
    load_model: str = ""
    """evaluate this model.safetensors instead of training (its header gives game and network)"""
    save_model: bool = True
    """save the final parameters to model.safetensors in the run directory"""
    jax_cache_dir: str = "~/.cache/jax-rl-baselines"
    """JAX's persistent compilation cache, so that a rerun skips compiling ("" turns it off)"""

    # filled at runtime
    steps_per_iteration: int = dataclasses.field(init=False, default=0)
    """environment steps per iteration (one update step), over all environments"""
    num_iterations: int = dataclasses.field(init=False, default=0)
    """the number of iterations, total_timesteps // steps_per_iteration"""


def fill_runtime_fields(script, args):
    """`args` with its runtime fields filled: the script's `fill_runtime_fields`, then what it may
    leave (the iterations, total_timesteps // steps_per_iteration; one device where it resolves
    none). ValueError where the script set no steps_per_iteration (its duty) or the budget is less
    than one iteration."""
    args.steps_per_iteration = args.num_iterations = 0  # what a fill before this one left
    script.fill_runtime_fields(args)
    name = os.path.basename(script.__file__)
    if args.steps_per_iteration <= 0:
        raise ValueError(f"{name}'s fill_runtime_fields must set args.steps_per_iteration, the "
                         f"environment steps of one update step (utils/contract.py); it is "
                         f"{args.steps_per_iteration}")
    args.num_iterations = args.num_iterations or args.total_timesteps // args.steps_per_iteration
    if args.num_iterations <= 0:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one iteration "
                         f"({args.steps_per_iteration} steps)")
    args.num_devices = args.num_devices or 1
    return args


# The fields that change no result: the harness leaves them out of what it compares, and --resume
# lets the command line change the ones in RESUME_MAY_CHANGE.
NOT_RESULTS = ("exp_name", "seed", "num_devices", "eval_every", "checkpoint_every", "resume",
               "load_model", "save_model", "jax_cache_dir")
RESUME_MAY_CHANGE = ("checkpoint_every", "eval_every", "jax_cache_dir", "num_devices")


class Agent(NamedTuple):
    """What a script hands to the machinery: its `make_agent(args, env, env_params)`.

    - `network`: the Haiku network whose parameters are saved (`network.init(key, obs_batch)`).
    - `optimizer`: the optax optimizer of the training state.
    - `init(key) -> state`: the whole training state before the first iteration (a pytree of
      arrays: parameters, optimizer state, environments, buffers, keys), from the run's key.
    - `update_step(state) -> (state, metrics)`: one iteration on one device, not jitted: the code
      a reader follows. The machinery jits it with the state donated (JAX's donate_argnums): the
      new state is written into the old one's memory, and the state handed in is gone after the
      call. A script's loop keeps only the state returned (`state, metrics =
      run.update_step(state)`) and uses anything of the old one (its parameters, say) before the
      step; the machinery keeps what it needs of it (copies on the device: the state a
      checkpoint writes, the parameters a non-finite stop saves). On the CPU a NumPy view of a
      state's array (`np.asarray`, `jax.device_get`) still alive at the step makes JAX skip the
      donation without a word: the step then allocates a second state. The loop hands the
      step's metrics, still on the device, to `run.log_iteration` with two functions of the
      metrics once read: the script's TensorBoard scalars and what it names where
      `metrics["finite"]` is False. On a GPU or TPU the run reads them one iteration late (the
      device runs the next step meanwhile); it stops the loop after a non-finite one; the loop
      hands its last state to `finish`, `evaluate` and `save_model` all the same (they know
      whether it is finite).
    - `parallel_update_step(mesh) -> update step` over the devices of `mesh` (its axis named
      utils.parallel.AXIS), under `jax.shard_map`, not jitted (the machinery jits and donates as
      above; the new state's specs must be `state_specs`, or it cannot take the old one's
      memory), computing what `update_step` computes; None where the script runs on one device
      only.
    - `state_specs`: the state's PartitionSpecs on that mesh (a pytree of the state's structure).
    - `params(state) -> params`: the network's parameters in the state.
    - `act(params, obs, key, greedy) -> actions`: the policy on a batch of observations; greedy
      takes the best action, otherwise the policy the script samples from at evaluation.
    """
    network: Any
    optimizer: Any
    init: Callable
    update_step: Callable
    parallel_update_step: Callable | None
    state_specs: Any
    params: Callable
    act: Callable

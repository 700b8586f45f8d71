"""What several test files share: the games, a probe policy for the script's rollout, and
ppo_breakout.py run the way a user runs it, with readers of what a run leaves (conftest.py's
`tiny_run` is one such run)."""

import contextlib
import glob
import io
import json
import os
import signal
import subprocess
import sys
import typing

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

import ppo_breakout as ppo
from probe_envs import ProbeEnv
from utils import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "ppo_breakout.py")
GAMES = ["Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar",
         "Seaquest-MinAtar"]


# --------------------------------------------------------------------------------------------------
# A policy with known answers on the probe environment, for the script's rollout
# --------------------------------------------------------------------------------------------------
def always_action_one(obs, return_features=False):
    """Action 1 with certainty; the value is the probe's clock, time / 10, so v(o) tells which o it
    saw."""
    logits, value = jnp.tile(jnp.array([-20.0, 20.0]), (obs.shape[0], 1)), obs[:, 0]
    return (logits, value, obs) if return_features else (logits, value)


def probe_runner(key: jax.Array, num_envs: int = 16) -> ppo.RunnerState:
    """Fresh ProbeEnv environments for `always_action_one`, which has no parameters to train."""
    env = ProbeEnv()
    reset_key, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs),
                                                            env.default_params)
    return ppo.RunnerState(train_state=ppo.TrainState({}, None), env_state=env_state, obs=obs,
                           episode_return=jnp.zeros(num_envs),
                           episode_length=jnp.zeros(num_envs, jnp.int32), key=key)


def assert_truncated_steps_carry_the_value_of_final_obs(traj: ppo.Transition):
    # v(final_obs) is the value of the observation reached (time 4 / 10), not of the reset one (time
    # 0), on truncated steps; every other step carries 0, as GAE does not read it there.
    truncated, final_value = np.asarray(traj.truncated), np.asarray(traj.final_value)
    assert truncated.any()
    np.testing.assert_allclose(final_value[truncated], 0.4, rtol=1e-6)
    assert np.all(final_value[~truncated] == 0.0)


# --------------------------------------------------------------------------------------------------
# The script run as a user runs it, and what a run leaves
# --------------------------------------------------------------------------------------------------
def network_args(args) -> dict:
    """What the script writes into a model file's header to rebuild the network."""
    return {name: getattr(args, name) for name in ppo.NETWORK_ARGS}


def random_history(transition: type, num_envs: int, num_steps: int, seed: int = 0):
    """A replay script's `transition` (obs, action, reward, terminated, truncated, next_obs) for
    num_envs x num_steps steps: random rewards, actions, terminations and truncations (some steps
    both); obs marks its step (env * num_steps + time) and next_obs the same plus 0.5, so that a
    sample shows where each of its observations came from."""
    rng = np.random.default_rng(seed)
    step_id = np.arange(num_envs * num_steps, dtype=np.float32).reshape(num_envs, num_steps)
    return transition(
        obs=jnp.asarray(step_id)[..., None],
        action=jnp.asarray(rng.integers(0, 6, (num_envs, num_steps)), jnp.int32),
        reward=jnp.asarray(rng.uniform(-1, 1, (num_envs, num_steps)), jnp.float32),
        terminated=jnp.asarray(rng.random((num_envs, num_steps)) < 0.12),
        truncated=jnp.asarray(rng.random((num_envs, num_steps)) < 0.12),
        next_obs=jnp.asarray(step_id + 0.5)[..., None])


def run_script(tmp_path, *flags, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout)


class Finished(typing.NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_main(script, cwd, *flags, timeout: float | None = None) -> Finished:
    """`script.main()` (an imported script module) in this process, as `python SCRIPT FLAGS` run in
    `cwd`: what the script does, where a mutation-testing tool can see which test ran which
    function (it cannot in a subprocess). With a `timeout` (seconds), a run still going then raises
    TimeoutError, as subprocess.run's timeout would: a loop that never ends fails the test."""
    out, err = io.StringIO(), io.StringIO()
    old_cwd, old_argv = os.getcwd(), sys.argv

    def ran_too_long(*_):
        raise TimeoutError(f"{os.path.basename(script.__file__)} ran past {timeout} s")

    old_alarm = signal.signal(signal.SIGALRM, ran_too_long) if timeout else None
    try:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        os.chdir(cwd)
        sys.argv = [os.path.basename(script.__file__), *flags]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                script.main()
                code = 0
            except SystemExit as exit_:
                code = exit_.code or 0
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_alarm)
        os.chdir(old_cwd)
        sys.argv = old_argv
    return Finished(code, out.getvalue(), err.getvalue())


def run_in_process(cwd, *flags) -> Finished:
    """ppo_breakout.main() in this process (run_main)."""
    return run_main(ppo, cwd, *flags)


TINY = ["--total-timesteps", "4096", "--num-envs", "16", "--num-steps", "128",
        "--num-minibatches", "4", "--update-epochs", "1", "--eval-episodes", "8", "--seed", "3"]


def only_run_dir(path) -> str:
    (run_dir,) = glob.glob(os.path.join(str(path), "runs", "*"))
    return run_dir


def read_summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def logged_events(logdir) -> list:
    """Every event on disk in `logdir`'s event files, in the order TensorBoard reads them."""
    files = sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*")))
    return [event for path in files for event in EventFileLoader(path).Load()]


def tiny_network_params(args: ppo.Args) -> hk.Params:
    """Freshly initialised parameters of the network `args` describes: the shapes a saved model
    must have."""
    network = ppo.make_network(3, args.hidden_sizes, args.activation, args.layer_norm,
                               args.conv_channels)

    return network.init(jax.random.key(0), jnp.zeros((1, 10, 10, 4)))


def what_a_run_ends_with(run_dir) -> dict:
    """Every tensor of model.safetensors and of the last checkpoint (a replay buffer among them;
    not the seconds of its learning curve) as bytes, every logged scalar but SPS, the evaluation:
    what a resumed run must end with, bit for bit, as the uninterrupted one."""
    tensors = {}
    for name in ("model.safetensors", checkpoint.CHECKPOINT):
        with open(os.path.join(run_dir, name), "rb") as f:
            tensors |= {f"{name}:{key}": (t.dtype, t.shape, t.tobytes())
                        for key, t in safetensors.numpy.load(f.read()).items()
                        if key != "history.seconds"}
    scalars = read_scalars(run_dir)
    del scalars["charts/SPS"]
    summary = read_summary(run_dir)
    return {"tensors": tensors, "scalars": scalars, "eval": summary["eval"],
            "status": summary["status"]}

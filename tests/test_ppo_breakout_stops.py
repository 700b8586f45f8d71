"""ppo_breakout.py run the way a user runs it, as it stops: bad input, a non-finite loss, signals;
and --resume: a run stopped by a signal, kill -9 or a kill in the middle of writing a checkpoint,
then resumed, ends as the run that was never interrupted, to the last bit; a checkpoint that cannot
be resumed is refused with one line, and nothing is overwritten. A run and what it leaves:
test_ppo_breakout_run.py."""

import contextlib
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.event_pb2 import SessionLog

import ppo_breakout as ppo
from helpers import (
    ROOT,
    SCRIPT,
    TINY,
    logged_events,
    network_args,
    only_run_dir,
    read_scalars,
    read_summary,
    run_in_process,
    run_script,
    tiny_network_params,
)
from utils import checkpoint, files
from utils import model as model_file

# --------------------------------------------------------------------------------------------------
# ppo_breakout.py ends cleanly: bad input, a non-finite loss, a signal
# --------------------------------------------------------------------------------------------------
BAD_INPUTS = [
    (["--num-envs", "0"], "--num-envs must be positive"),
    (["--num-steps", "-5"], "--num-steps must be positive"),
    (["--update-epochs", "0"], "--update-epochs must be positive"),
    (["--total-timesteps", "-1"], "--total-timesteps must be positive"),
    (["--num-minibatches", "7"], "does not divide into --num-minibatches 7"),
    (["--total-timesteps", "100"], "less than one batch"),
    (["--total-timesteps", "99999999999999"], "more than the optimizer can count"),
    (["--eval-episodes", "0"], "--eval-episodes must be positive"),
    (["--eval-episodes", "100000000"], "--eval-episodes 100000000 would need about"),
    (["--num-envs", "1000000", "--num-steps", "1000", "--total-timesteps", str(10**10)],
     "training would need about"),
    (["--hidden-sizes", "100000000"], "training would need about"),
    (["--env-id", "Breakout-Atari"], "unknown --env-id 'Breakout-Atari'"),
    (["--env-id", "Pendulum-v1"], "continuous actions"),
    (["--learning-rate", "0"], "--learning-rate must be a positive finite number"),
    (["--learning-rate", "inf"], "--learning-rate must be a positive finite number, got inf"),
    (["--learning-rate", "nan"], "--learning-rate must be a positive finite number, got nan"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be a positive finite number"),
    (["--ent-coef", "-0.1"], "--ent-coef must be a non-negative finite number"),
    (["--ent-coef", "inf"], "--ent-coef must be a non-negative finite number, got inf"),
    (["--vf-coef", "nan"], "--vf-coef must be a non-negative finite number, got nan"),
    (["--clip-coef", "0"], "--clip-coef must be in (0, 1]"),
    (["--clip-coef", "inf"], "--clip-coef must be in (0, 1]"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    (["--gae-lambda", "nan"], "--gae-lambda must be in [0, 1]"),
    (["--seed", "-1"], "--seed must be in [0, 4294967295]"),
    (["--seed", str(2**32)], "--seed must be in [0, 4294967295]"),
    (["--hidden-sizes", "64", "0"], "--hidden-sizes must be one or more positive widths"),
    (["--hidden-sizes"], "--hidden-sizes must be one or more positive widths"),
    (["--conv-channels", "-1"], "--conv-channels must be 0 (none) or positive, got -1"),
    (["--conv-channels", "8", "--env-id", "CartPole-v1"],
     "--conv-channels needs a grid of observations (height, width, channels); "
     "CartPole-v1's are of shape (4,)"),
    (["--exp-name", "../../../escape"], "--exp-name must be a plain name"),
    (["--exp-name", "a/b"], "--exp-name must be a plain name"),
    (["--exp-name", ".."], "--exp-name must be a plain name"),
    (["--exp-name", ""], "--exp-name must be a plain name"),
    (["--exp-name", "x" * 101], "--exp-name must be a plain name"),
    (["--num-devices", "-1"], "--num-devices must be 0 (automatic) or positive"),
    (["--num-devices", "3"], "--num-devices 3 is more than the 2 devices JAX has"),
    (["--num-envs", "63", "--num-minibatches", "1", "--num-devices", "2"],
     "--num-devices 2 must divide both --num-envs 63"),
    (["--num-envs", "2", "--num-steps", "3", "--num-minibatches", "2", "--num-devices", "2"],
     "and the minibatch size 3"),
    (["--jax-cache-dir", __file__], "is not a directory"),
    (["--eval-every", "-1"], "--eval-every must be 0 (only at the end) or positive, got -1"),
    # tyro's own parse errors, condensed to one line
    (["--num-envs", "abc"], "Error parsing --num-envs"),
    (["--activation", "tanh"], "invalid choice 'tanh' for argument '--activation'"),
    (["--no-such-flag", "1"], "Unrecognized options: --no-such-flag"),
    (["--seed"], "Missing value for argument '--seed'"),
]


@pytest.mark.parametrize("flags, message", BAD_INPUTS,
                         ids=[" ".join(f)[:40] for f, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(flags, message, tmp_path):
    result = run_in_process(tmp_path, *flags)
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_bad_input_from_the_command_line_exits_2_with_one_line(tmp_path):
    result = run_script(tmp_path, "--num-envs", "64", "--num-steps", "100",
                        "--num-minibatches", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: the batch (num_envs * num_steps = 6400) does not divide into --num-minibatches 3"]
    assert os.listdir(tmp_path) == []


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_finite_parameters(tmp_path):
    # Adam steps of size 1e30 overflow the network within the first iteration.
    result = run_in_process(tmp_path, *TINY, "--learning-rate", "1e30", "--no-anneal-lr")
    assert result.returncode == 3
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: losses/") and "non-finite in iteration 1;" in line
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "non_finite" and summary["non_finite_iteration"] == 1
    assert summary["non_finite"] in line and "eval" not in summary
    assert "charts/SPS" in read_scalars(run_dir)  # the log was flushed and reads back
    assert not os.path.exists(os.path.join(run_dir, "checkpoint.safetensors"))  # none is finite
    args = tyro.cli(ppo.Args, args=TINY)
    saved = model_file.load_model(os.path.join(run_dir, "model.safetensors"), network_args(args),
                                  tiny_network_params(args))
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(saved))


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_cleanly_after_the_current_iteration(signum, status, tmp_path):
    # The resume tests' run (below), whose programs the compilation cache holds once either has
    # run: 32 iterations, far longer than the signal takes to arrive
    total = 2048 * ITERATIONS
    process = subprocess.Popen([sys.executable, SCRIPT, *TINY, "--total-timesteps", str(total)],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert "logging to" in process.stdout.readline()  # compiled; training starts
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()  # a no-op once it has exited; never leave a run behind
    assert process.returncode == status, stderr
    assert "Traceback" not in stderr
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and 0 < summary["global_step"] < total
    # It stopped at the end of an iteration, and everything up to there was logged.
    assert len(read_scalars(run_dir)["charts/SPS"]) == summary["global_step"] // 2048
    args = tyro.cli(ppo.Args, args=TINY)
    model_file.load_model(os.path.join(run_dir, "model.safetensors"), network_args(args),
                          tiny_network_params(args))


# --------------------------------------------------------------------------------------------------
# ppo_breakout.py --resume: a run stopped, killed, or killed while writing a checkpoint
# --------------------------------------------------------------------------------------------------
# 32 iterations of 2048 steps, a checkpoint every 4: long enough to be killed in the middle.
ITERATIONS, EVERY = 32, 4
FLAGS = ["--total-timesteps", str(ITERATIONS * 2048), "--num-envs", "16", "--num-steps", "128",
         "--num-minibatches", "4", "--update-epochs", "1", "--eval-episodes", "8", "--seed", "5",
         "--checkpoint-every", str(EVERY)]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def main_in_process(cwd, *flags) -> tuple[int, list[str]]:
    """ppo_breakout.main() run in `cwd` as `python ppo_breakout.py FLAGS`: its exit status and
    stderr lines."""
    old_cwd, old_argv, err = os.getcwd(), sys.argv, io.StringIO()
    try:
        os.chdir(cwd)
        sys.argv = ["ppo_breakout.py", *flags]
        with pytest.raises(SystemExit) as exit_, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(err):
            ppo.main()
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
    return exit_.value.code, err.getvalue().strip().splitlines()


def start_script(cwd) -> subprocess.Popen:
    command = [sys.executable, os.path.join(ROOT, "ppo_breakout.py"), *FLAGS]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)



def checkpoint_iteration(run_dir) -> int:
    with safetensors.safe_open(os.path.join(run_dir, checkpoint.CHECKPOINT), "numpy") as f:
        return files.header_value("", f.metadata(), "iteration")


def what_a_run_ends_with(run_dir) -> dict:
    """Every tensor of model.safetensors and of the last checkpoint (but the seconds of its learning
    curve) as bytes, every logged scalar but SPS, and the evaluation."""
    tensors = {}
    for name in ("model.safetensors", checkpoint.CHECKPOINT):
        with open(os.path.join(run_dir, name), "rb") as f:
            tensors |= {f"{name}:{key}": t for key, t in safetensors.numpy.load(f.read()).items()
                        if key != "history.seconds"}
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
               for tag in events.Tags()["scalars"] if tag != "charts/SPS"}
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {"params": {name: (t.dtype, t.shape, t.tobytes()) for name, t in tensors.items()},
            "scalars": scalars, "eval": summary["eval"], "status": summary["status"]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    path = tmp_path_factory.mktemp("uninterrupted")
    assert main_in_process(path, *FLAGS) == (0, [])
    return only_run_dir(path)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped by SIGTERM as soon as it trains: it ends the iteration, writes a checkpoint."""
    path = tmp_path_factory.mktemp("interrupted")
    process = start_script(path)
    try:
        assert "logging to" in process.stdout.readline()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    return only_run_dir(path)


def resume_copy(run_dir, tmp_path, *flags) -> str:
    """Resumes a copy of `run_dir` (in tmp_path/runs/) and returns the copy's path."""
    copy = shutil.copytree(run_dir, tmp_path / "runs" / os.path.basename(run_dir))
    assert main_in_process(tmp_path, "--resume", str(copy), *flags) == (0, [])
    return str(copy)


def test_a_run_stopped_by_sigterm_resumes_to_the_uninterrupted_run_bit_for_bit(
        interrupted, uninterrupted, tmp_path):
    with open(os.path.join(interrupted, "summary.json")) as f:
        stopped_at = json.load(f)["global_step"]
    assert 0 < stopped_at < ITERATIONS * 2048
    assert checkpoint_iteration(interrupted) * 2048 == stopped_at  # where it stopped, not before
    resumed = resume_copy(interrupted, tmp_path)
    assert what_a_run_ends_with(resumed) == what_a_run_ends_with(uninterrupted)
    with open(os.path.join(resumed, "summary.json")) as f:
        summary = json.load(f)
    assert summary["resumed_at_step"] == stopped_at and summary["global_step"] == ITERATIONS * 2048


def test_a_run_killed_at_any_moment_resumes_from_its_last_checkpoint(uninterrupted, tmp_path):
    process = start_script(tmp_path)
    try:
        for line in process.stdout:  # a progress line every tenth of training
            if line.startswith("step") and int(line.split()[1].replace(",", "")) > 2 * EVERY * 2048:
                break
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        process.kill()
    run_dir = only_run_dir(tmp_path)
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))  # killed before the end
    resumed_at = checkpoint_iteration(run_dir)
    assert EVERY <= resumed_at < ITERATIONS
    # --checkpoint-every may change on resume: it changes no result.
    assert main_in_process(tmp_path, "--resume", run_dir, "--checkpoint-every", "5") == (0, [])
    assert what_a_run_ends_with(run_dir) == what_a_run_ends_with(uninterrupted)
    # TensorBoard is told to drop the killed run's steps after the checkpoint.
    starts = [e.step for e in logged_events(run_dir) if e.session_log.status == SessionLog.START]
    assert starts == [resumed_at * 2048 + 1]


# Kills the process with SIGKILL when it renames its second checkpoint into place: the temporary
# file is complete and synced, the rename never happens.
KILL_IN_SECOND_RENAME = """
import os, signal
real_replace, renames = os.replace, []
def replace(source, target):
    if target.endswith("checkpoint.safetensors"):
        renames.append(target)
        if len(renames) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(source, target)
os.replace = replace
"""


def test_a_kill_in_the_middle_of_writing_a_checkpoint_resumes_from_the_one_before(uninterrupted,
                                                                                   tmp_path):
    script = os.path.join(ROOT, "ppo_breakout.py")
    run_killed = f"import runpy, sys\nsys.path.insert(0, {ROOT!r})\nsys.argv = sys.argv[1:]\n" \
                 f"{KILL_IN_SECOND_RENAME}\nrunpy.run_path({script!r}, run_name='__main__')"
    process = subprocess.run([sys.executable, "-c", run_killed, script, *FLAGS], cwd=tmp_path,
                             capture_output=True, text=True, env=ENV, timeout=300)
    assert process.returncode == -signal.SIGKILL, process.stderr
    run_dir = only_run_dir(tmp_path)
    left = [name for name in os.listdir(run_dir) if name.endswith(".tmp")]
    assert len(left) == 1  # the checkpoint being written when the process died, not yet renamed
    assert os.path.getsize(os.path.join(run_dir, left[0])) > 0
    assert checkpoint_iteration(run_dir) == EVERY  # the first checkpoint, whole
    assert main_in_process(tmp_path, "--resume", run_dir) == (0, [])
    assert what_a_run_ends_with(run_dir) == what_a_run_ends_with(uninterrupted)
    assert not [name for name in os.listdir(run_dir) if name.endswith(".tmp")]  # cleaned up


def rewrite_header(path: str, **values) -> None:
    tensors, header = files.read_safetensors(path, "")
    safetensors.numpy.save_file(tensors, path, header | values)


def damage(run_dir: str, case: str) -> None:
    """Damages a run directory's checkpoint the way `case` says."""
    path = os.path.join(run_dir, checkpoint.CHECKPOINT)
    if case == "truncated":
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
    elif case == "no checkpoint":
        os.remove(path)
    elif case == "garbled arguments":
        rewrite_header(path, args='{"seed": 5,')
    elif case == "another version":
        rewrite_header(path, code=json.dumps("0" * 64))
    elif case == "another network":  # the arguments say 32 units; the tensors hold 64
        _, header = files.read_safetensors(path, "")
        args = json.loads(header["args"]) | {"hidden_sizes": [32, 32]}
        rewrite_header(path, args=json.dumps(args))
    elif case == "no key":
        tensors, header = files.read_safetensors(path, "")
        del tensors["runner.key"]
        safetensors.numpy.save_file(tensors, path, header)


BAD_RESUMES = [
    ("completed", [], "that run completed; nothing to resume"),
    ("missing", [], "no such run directory"),
    ("no checkpoint", [], "has no checkpoint.safetensors"),
    ("truncated", [], "is not a readable safetensors file"),
    ("garbled arguments", [], "the header's args is not valid JSON"),
    ("another version", [], "was written by another version of ppo_breakout.py or utils/"),
    ("another network", [],
     "does not hold runner.train_state.params['policy']['w'] as float32[64, 3]"),
    ("no key", [], "does not hold runner.key"),
    ("other widths", ["--hidden-sizes", "32", "32"],
     "was run with --hidden-sizes 64 64, not 32 32"),
    ("other steps", ["--total-timesteps=1000000"],
     f"was run with --total-timesteps {ITERATIONS * 2048}, not 1000000"),
    ("a model too", ["--load-model", "x.safetensors"],
     "--resume continues training and --load-model only evaluates"),
    ("negative interval", ["--checkpoint-every", "-1"],
     "--checkpoint-every must be 0 (never) or positive"),
]


@pytest.mark.parametrize("case, flags, message", BAD_RESUMES, ids=[c for c, _, _ in BAD_RESUMES])
def test_a_run_that_cannot_be_resumed_is_refused_with_one_line_and_nothing_changes(
        case, flags, message, interrupted, uninterrupted, tmp_path):
    source = uninterrupted if case == "completed" else interrupted
    run_dir = shutil.copytree(source, tmp_path / "run")
    damage(str(run_dir), case)
    if case == "missing":
        shutil.rmtree(run_dir)

    def contents() -> dict:
        files = glob.glob(f"{tmp_path}/**", recursive=True)
        return {path: open(path, "rb").read() for path in files if os.path.isfile(path)}
    before = contents()
    status, err = main_in_process(tmp_path, "--resume", str(run_dir), *flags)
    assert status == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert contents() == before

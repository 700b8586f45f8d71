"""dqn_minatar.py run the way a user runs it, in this process with tiny flags: what a run leaves,
a saved model played back, bad input, and a stopped run resumed bit for bit with its replay buffer.
The script's functions: test_dqn_minatar.py."""

import os
import signal

import pytest

import dqn_minatar as dqn
from helpers import only_run_dir, read_scalars, read_summary, run_main, what_a_run_ends_with
from utils import training

# 3 iterations of 16 x 32 steps, a checkpoint after each; the first is all warm-up (no gradient
# step before 768 steps), the buffer (64 steps a row) is full after the second and wraps around.
TINY = ["--total-timesteps", "1536", "--num-envs", "16", "--num-steps", "32", "--buffer-size",
        "1024", "--batch-size", "8", "--learning-starts", "768", "--target-update-period", "256",
        "--epsilon-decay-steps", "512", "--eval-episodes", "8", "--seed", "3",
        "--checkpoint-every", "1"]
TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/epsilon",
        "losses/td_loss", "losses/q_values", "eval/sampled_return", "eval/greedy_return",
        "eval/sticky_0.1/sampled_return", "eval/sticky_0.1/greedy_return"]


def run_in_process(cwd, *flags):
    """dqn_minatar.main() in this process, as `python dqn_minatar.py FLAGS` run in `cwd`."""
    return run_main(dqn, cwd, *flags)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny training run, never interrupted, shared by the tests that read what it leaves."""
    path = tmp_path_factory.mktemp("tiny")
    result = run_in_process(path, *TINY)
    assert result.returncode == 0, result.stderr
    return result, only_run_dir(path)


def test_the_script_trains_logs_evaluates_and_saves(tiny_run):
    result, run_dir = tiny_run
    assert "eval (sampled, 8 episodes)" in result.stdout and "eval ( greedy" in result.stdout
    assert os.path.basename(run_dir).startswith("Breakout-MinAtar__dqn_minatar__3__")
    assert os.path.exists(os.path.join(run_dir, "model.safetensors"))
    assert os.path.exists(os.path.join(run_dir, "play.gif"))
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["global_step"] == 1536
    assert summary["policy"] == "greedy" and summary["args"]["num_devices"] == 1
    for protocol in (summary["eval"], summary["eval"]["sticky_0.1"]):
        for mode in ("sampled", "greedy"):
            assert sum(protocol[mode]["return_counts"].values()) == 8
    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert tag in scalars, tag
    # The warm-up iteration takes no gradient step: its losses read 0, the later ones do not.
    losses = scalars["losses/td_loss"]
    assert [step for step, _ in losses] == [512, 1024, 1536]
    assert losses[0][1] == 0 and losses[1][1] > 0 and losses[2][1] > 0
    # Epsilon is 1 through the warm-up, then reaches --epsilon-end 512 steps after it.
    epsilon = [value for _, value in scalars["charts/epsilon"]]
    assert epsilon[0] == 1.0 and epsilon[2] == pytest.approx(dqn.Args().epsilon_end)


def test_a_saved_model_evaluates_to_the_training_runs_own_evaluation(tiny_run, tmp_path):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "8", "--seed", "3")
    assert result.returncode == 0, result.stderr
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["status"] == "completed" and summary["load_model"] == model
    assert summary["eval"] == read_summary(train_dir)["eval"]


BAD_INPUTS = [
    (["--replay-ratio", "0.3"], "must be a whole number of gradient steps"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
    (["--num-devices", "2"], "this script runs on one device"),
    (["--buffer-size", "1000"], "must be a multiple of --num-envs 32"),
    (["--learning-starts", "10"], "--learning-starts must be at least num_envs x n_step = 96"),
    (["--load-model", "nothing.safetensors"], "no such file"),
    (["--resume", "runs/nothing"], "--resume runs/nothing: no such run directory"),
    (["--n-step", "abc"], "Error parsing --n-step"),
    (["--replay-ratio", "1e9"], "more gradient steps than the optimizer can count"),
    (["--learning-starts", "3000000000"], "--learning-starts must be less than 2**31"),
    (["--target-update-period", "3000000000"], "--target-update-period must be less than 2**31"),
    (["--epsilon-decay-steps", "3000000000"], "--epsilon-decay-steps must be less than 2**31"),
    (["--learning-starts", "100000", "--total-timesteps", "8192"],
     "--learning-starts 100000 leaves no gradient step in the run's 8,192 steps"),
    (["--target-update-period", "10000000"], "the target network would never follow"),
]


@pytest.mark.parametrize("flags, message", BAD_INPUTS,
                         ids=[" ".join(flags)[:40] for flags, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(flags, message, tmp_path):
    result = run_in_process(tmp_path, *flags)
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_a_stopped_run_resumes_to_the_uninterrupted_run_bit_for_bit(tiny_run, tmp_path,
                                                                    monkeypatch):
    # SIGTERM after the second iteration, the buffer part-filled and training under way: the run
    # writes a checkpoint, exits 143, and --resume ends where the uninterrupted run ends.
    end_iteration = training.Run.end_iteration

    def signal_after_second(run, iteration, state):
        end_iteration(run, iteration, state)
        if iteration == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "end_iteration", signal_after_second)
        stopped = run_in_process(tmp_path, *TINY)
    assert stopped.returncode == 143, stopped.stderr
    run_dir = only_run_dir(tmp_path)
    assert read_summary(run_dir)["global_step"] == 1024
    resumed = run_in_process(tmp_path, "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert read_summary(run_dir)["resumed_at_step"] == 1024
    ends = what_a_run_ends_with(run_dir)
    assert any("buffer_state.experience.obs" in key for key in ends["tensors"])
    assert ends == what_a_run_ends_with(tiny_run[1])

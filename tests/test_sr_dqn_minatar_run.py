"""sr_dqn_minatar.py run the way a user runs it, in this process with tiny flags: what a run
leaves, a saved model played back, bad input, and a stopped run resumed bit for bit with its
replay buffer and its reset schedule. The script's functions: test_sr_dqn_minatar.py."""

import os
import signal

import pytest
import safetensors.numpy

import sr_dqn_minatar as sr
from helpers import only_run_dir, read_scalars, read_summary, run_main, what_a_run_ends_with
from utils import checkpoint, training

# 6 iterations of 16 x 16 steps at 2 gradient steps per step (512 an iteration), a checkpoint
# after each; learning starts at 768 steps, so the run takes about 1,536 gradient steps. Resets
# every 512: at 512 (iteration 4) and 1,024 (iteration 5); none at 1,536, with no whole period
# after it.
TINY = ["--total-timesteps", "1536", "--num-envs", "16", "--num-steps", "16", "--buffer-size",
        "1024", "--batch-size", "8", "--learning-starts", "768", "--reset-period", "512",
        "--anneal-steps", "256", "--n-step-start", "4", "--n-step", "2", "--epsilon-decay-steps",
        "512", "--eval-episodes", "8", "--seed", "3", "--checkpoint-every", "1"]
TAGS = ["charts/episodic_return", "charts/SPS", "charts/epsilon", "charts/n_step", "charts/gamma",
        "charts/resets", "losses/td_loss", "losses/q_values", "eval/sampled_return",
        "eval/greedy_return"]


def run_in_process(cwd, *flags):
    """sr_dqn_minatar.main() in this process, as `python sr_dqn_minatar.py FLAGS` in `cwd`."""
    return run_main(sr, cwd, *flags)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny training run, never interrupted, shared by the tests that read what it leaves."""
    path = tmp_path_factory.mktemp("tiny")
    result = run_in_process(path, *TINY)
    assert result.returncode == 0, result.stderr
    return result, only_run_dir(path)


def test_the_script_trains_resets_logs_evaluates_and_saves(tiny_run):
    result, run_dir = tiny_run
    assert os.path.basename(run_dir).startswith("Breakout-MinAtar__sr_dqn_minatar__3__")
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["global_step"] == 1536
    assert summary["policy"] == "greedy"
    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert tag in scalars, tag
    assert [value for _, value in scalars["charts/resets"]] == [0, 0, 0, 1, 2, 2]
    # n anneals from 4 to 2 over 256 gradient steps after each reset: 4 through the warm-up, and
    # 32 gradient steps after each reset (iterations 4 and 5 end so); 2 by the end of iteration
    # 6, 544 gradient steps after the second.
    assert [value for _, value in scalars["charts/n_step"]] == [4, 4, 4, 4, 4, 2]
    state = safetensors.numpy.load_file(os.path.join(run_dir, checkpoint.CHECKPOINT))
    assert state["runner.train_state.resets"] == 2
    # Learning starts with the chunk (16 steps, 32 gradient steps) that reaches 768 steps.
    assert state["runner.train_state.steps"] == 2 * (1536 - 768) + 32
    assert state["runner.train_state.since_reset"] == 2 * (1536 - 768) + 32 - 1024


def test_a_saved_model_evaluates_to_the_training_runs_own_evaluation(tiny_run, tmp_path):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "8", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert read_summary(only_run_dir(tmp_path))["eval"] == read_summary(train_dir)["eval"]


BAD_INPUTS = [
    (["--replay-ratio", "0.3"], "must be a whole number of gradient steps"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
    (["--gamma", "1"], "--gamma and --gamma-start must be below 1"),
    (["--shrink", "2"], "--shrink must be in [0, 1], got 2.0"),
    (["--reset-period", "-1"], "--reset-period must be"),
    (["--tau", "0"], "--tau must be in (0, 1], got 0.0"),
    (["--num-devices", "2"], "this script runs on one device"),
    (["--buffer-size", "1000"], "must be a multiple of --num-envs 32"),
    (["--learning-starts", "10"], "at least num_envs x the longest n-step window = 320"),
    (["--n-step-start", "0"], "--n-step-start must be"),
    (["--replay-ratio", "1e9"], "more gradient steps than the optimizer can count"),
    (["--reset-period", "3000000000"], "--reset-period must be less than 2**31"),
    (["--reset-period", "1000"], "shorter than an iteration's 8192 gradient steps"),
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
    # SIGTERM after the fourth iteration, one reset done and one to come: the run writes a
    # checkpoint, exits 143, and --resume ends where the uninterrupted run ends.
    end_iteration = training.Run.end_iteration

    def signal_after_fourth(run, iteration, state):
        end_iteration(run, iteration, state)
        if iteration == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "end_iteration", signal_after_fourth)
        stopped = run_in_process(tmp_path, *TINY)
    assert stopped.returncode == 143, stopped.stderr
    run_dir = only_run_dir(tmp_path)
    assert read_summary(run_dir)["global_step"] == 1024
    resumed = run_in_process(tmp_path, "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    ends = what_a_run_ends_with(run_dir)
    assert any("buffer_state.obs" in key for key in ends["tensors"])
    assert ends == what_a_run_ends_with(tiny_run[1])

"""pqn_minatar.py run the way a user runs it, in this process with tiny flags: what a run leaves,
a saved model played back, bad input, and a stopped run resumed bit for bit. The script's functions:
test_pqn_minatar.py."""

import glob
import os
import signal

import pytest

import pqn_minatar as pqn
from helpers import only_run_dir, read_scalars, read_summary, run_main, what_a_run_ends_with
from utils import training

# 3 iterations of 16 x 32 steps, a checkpoint after each.
TINY = ["--total-timesteps", "1536", "--num-envs", "16", "--num-steps", "32",
        "--num-minibatches", "4", "--update-epochs", "2", "--eval-episodes", "8", "--seed", "3",
        "--checkpoint-every", "1"]
TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
        "charts/epsilon", "losses/td_loss", "losses/q_values", "eval/sampled_return",
        "eval/greedy_return", "eval/sticky_0.1/sampled_return", "eval/sticky_0.1/greedy_return"]


def run_in_process(cwd, *flags):
    """pqn_minatar.main() in this process, as `python pqn_minatar.py FLAGS` run in `cwd`."""
    return run_main(pqn, cwd, *flags)


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
    assert os.path.basename(run_dir).startswith("Breakout-MinAtar__pqn_minatar__3__")
    assert len(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))) == 1
    assert os.path.exists(os.path.join(run_dir, "model.safetensors"))
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["global_step"] == 1536
    assert summary["args"]["num_devices"] == 2  # the data-parallel path ran (conftest.py)
    for protocol in (summary["eval"], summary["eval"]["sticky_0.1"]):
        for mode in ("sampled", "greedy"):
            assert sum(protocol[mode]["return_counts"].values()) == 8
    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert tag in scalars, tag
    assert [step for step, _ in scalars["losses/td_loss"]] == [512, 1024, 1536]
    # 3 iterations x 2 epochs x 4 minibatches: each logs the rate of its last update (7, 15, 23).
    rates = [value for _, value in scalars["charts/learning_rate"]]
    assert rates == pytest.approx([5e-4 * (1 - k / 24) for k in (7, 15, 23)])
    # Epsilon decays over max(1, round(0.1 x 3)) = 1 iteration: 1 on the first, then 0.01.
    assert [value for _, value in scalars["charts/epsilon"]] == pytest.approx([1.0, 0.01, 0.01])


def test_a_saved_model_evaluates_to_the_training_runs_own_evaluation(tiny_run, tmp_path):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "8", "--seed", "3")
    assert result.returncode == 0, result.stderr
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["status"] == "completed" and summary["load_model"] == model
    assert summary["eval"] == read_summary(train_dir)["eval"]
    assert "model" not in summary


BAD_INPUTS = [
    (["--q-lambda", "1.5"], "--q-lambda must be in [0, 1], got 1.5"),
    (["--epsilon-end", "nan"], "--epsilon-end must be in [0, 1], got nan"),
    (["--eval-epsilon", "-0.1"], "--eval-epsilon must be in [0, 1]"),
    (["--epsilon-start", "0.01", "--epsilon-end", "0.5"],
     "--epsilon-end 0.5 is above --epsilon-start 0.01: epsilon would rise"),
    (["--exploration-fraction", "0"], "--exploration-fraction must be in (0, 1], got 0.0"),
    (["--learning-rate", "inf"], "--learning-rate must be a positive finite number, got inf"),
    (["--num-minibatches", "7"], "does not divide into --num-minibatches 7"),
    (["--conv-channels", "4", "--env-id", "CartPole-v1"], "--conv-channels needs a grid"),
    (["--load-model", "nothing.safetensors"], "no such file"),
    (["--resume", "runs/nothing"], "--resume runs/nothing: no such run directory"),
    (["--num-envs", "abc"], "Error parsing --num-envs"),
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
    # SIGTERM arrives during the first iteration: the run ends it, writes a checkpoint, exits 143.
    end_iteration = training.Run.end_iteration

    def signal_after_first(run, iteration, state):
        end_iteration(run, iteration, state)
        if iteration == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "end_iteration", signal_after_first)
        stopped = run_in_process(tmp_path, *TINY)
    assert stopped.returncode == 143, stopped.stderr
    run_dir = only_run_dir(tmp_path)
    assert read_summary(run_dir)["status"] == "interrupted"
    assert read_summary(run_dir)["global_step"] == 512
    resumed = run_in_process(tmp_path, "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert read_summary(run_dir)["resumed_at_step"] == 512
    assert what_a_run_ends_with(run_dir) == what_a_run_ends_with(tiny_run[1])

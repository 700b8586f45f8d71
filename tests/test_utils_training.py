"""Tests of utils/training.py: the run around a script's training loop, taken through a minimal
script that keeps the contract (tests/tiny_pg.py). It trains with checkpoints, a run stopped by
SIGTERM resumes to the uninterrupted run bit for bit (its evaluation compiled beside training, as
on an accelerator), its saved model plays to the training run's
own evaluation, and each update step takes over the state before it. Each script's own runs, the
way a user runs them: test_<script>_run.py."""

import os
import signal
import types

import jax
import numpy as np
import pytest
import safetensors.numpy

import ppo_breakout as ppo
import tiny_pg
from helpers import TINY as PPO_TINY
from helpers import only_run_dir, read_summary, run_main
from utils import checkpoint, training

TINY = ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "64", "--eval-episodes",
        "4", "--checkpoint-every", "2"]


def ends_with(run_dir) -> dict:
    """The model's and the last checkpoint's tensors (but the learning curve's seconds), and the
    evaluation."""
    tensors = {}
    for name in ("model.safetensors", checkpoint.CHECKPOINT):
        loaded = safetensors.numpy.load_file(os.path.join(run_dir, name))
        tensors |= {f"{name}:{key}": t.tobytes() for key, t in loaded.items()
                    if key != "history.seconds"}
    return {"tensors": tensors, "eval": read_summary(run_dir)["eval"]}


def test_training_checkpoints_resume_and_load_model(tmp_path, monkeypatch):
    (tmp_path / "whole").mkdir()
    # Its initial state made and its evaluation compiled in threads (a GPU's or TPU's way): the
    # stopped run below makes its own before it compiles, and resumes to the same end.
    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "evaluation_beside_training", True)
        whole = run_main(tiny_pg, tmp_path / "whole", *TINY)
    assert whole.returncode == 0, whole.stderr
    whole_dir = only_run_dir(tmp_path / "whole")
    summary = read_summary(whole_dir)
    assert summary["status"] == "completed" and summary["global_step"] == 2048
    assert summary["policy"] == "sampled" and summary["eval"]["sampled"]["mean"] > 0
    assert "env_vars" not in summary  # the scripts' own precision: nothing to set

    # Stopped by SIGTERM after its third iteration (one past a checkpoint), then resumed.
    end_iteration = training.Run.end_iteration

    def signal_after_third(run, iteration, state):
        end_iteration(run, iteration, state)
        if iteration == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    (tmp_path / "stopped").mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "end_iteration", signal_after_third)
        stopped = run_main(tiny_pg, tmp_path / "stopped", *TINY)
    assert stopped.returncode == 143, stopped.stderr
    run_dir = only_run_dir(tmp_path / "stopped")
    assert read_summary(run_dir)["global_step"] == 3 * 256
    # Resumed where the environment sets another precision than the run's (on a TPU, other
    # numbers): refused in one line, before anything is written.
    with monkeypatch.context() as patch:
        patch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "high")
        elsewhere = run_main(tiny_pg, tmp_path / "stopped", "--resume", run_dir)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.strip().splitlines() == [
        f"error: {run_dir}/checkpoint.safetensors was written at the scripts' own precision, and "
        f"this process runs with JAX_DEFAULT_MATMUL_PRECISION=high: resume it as it was run"]
    # Resumed with its evaluation compiled in a thread while it trains (a GPU's or TPU's way).
    with monkeypatch.context() as patch:
        patch.setattr(training.Run, "evaluation_beside_training", True)
        resumed = run_main(tiny_pg, tmp_path / "stopped", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert ends_with(run_dir) == ends_with(whole_dir)

    # The saved model plays to the training run's own evaluation. With the environment naming
    # another precision, its summary names it (this process's JAX took its precision at import,
    # so here only the record changes).
    (tmp_path / "load").mkdir()
    model = os.path.join(whole_dir, "model.safetensors")
    with monkeypatch.context() as patch:
        patch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "high")
        loaded = run_main(tiny_pg, tmp_path / "load", "--load-model", model, "--eval-episodes",
                          "4")
    assert loaded.returncode == 0, loaded.stderr
    played = read_summary(only_run_dir(tmp_path / "load"))
    assert played["eval"] == summary["eval"]
    assert played["env_vars"] == "JAX_DEFAULT_MATMUL_PRECISION=high"


def bad_header_values(script) -> list[tuple[str, object]]:
    """For each field of the script's NETWORK_ARGS, a value of the wrong type or outside its
    choices, as a damaged or foreign model file's header could hold."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(script.Args)
    bad = []
    for name in script.NETWORK_ARGS:
        default = {f.name: f.default for f in dataclasses.fields(script.Args)}[name]
        if typing.get_origin(hints[name]) is typing.Literal:
            bad.append((name, "bogus"))
        elif isinstance(default, bool):
            bad += [(name, 1), (name, "yes")]
        elif isinstance(default, int):
            bad += [(name, True), (name, "16"), (name, -1)]
        elif isinstance(default, tuple):
            bad += [(name, [64.5]), (name, "64"), (name, [0])]
        else:
            bad.append((name, "Bogus-v0"))
    return bad


SCRIPTS = ["ppo_breakout", "pqn_minatar", "dqn_minatar", "sr_dqn_minatar"]


@pytest.mark.parametrize("script, flags, iterations", [
    (tiny_pg, TINY, 8),  # one device
    (ppo, [*PPO_TINY, "--num-devices", "2", "--checkpoint-every", "1"], 2),  # shard_map's step
])
def test_each_update_step_writes_the_new_state_into_the_old_ones_memory(script, flags, iterations,
                                                                        tmp_path, monkeypatch):
    # Donated: a run holds one training state (one replay buffer), not the old and the new.
    states, end_iteration = [], training.Run.end_iteration

    def keep_state(run, iteration, state):
        states.append(state)
        end_iteration(run, iteration, state)

    monkeypatch.setattr(training.Run, "end_iteration", keep_state)
    result = run_main(script, tmp_path, *flags)
    assert result.returncode == 0, result.stderr
    assert len(states) == iterations
    for state in states[:-1]:
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(states[-1]))


@pytest.mark.parametrize("script_name", SCRIPTS)
def test_a_model_header_value_outside_the_scripts_choices_is_refused(script_name, tmp_path):
    # Each header field is checked against the script's Args (type, choices, and the script's own
    # checks) before anything is built: one error line, exit 2, and no run directory.
    import importlib

    from utils import cli, model

    script = importlib.import_module(script_name)
    good = {name: getattr(script.Args(), name) for name in script.NETWORK_ARGS}
    for name, value in bad_header_values(script):
        path = str(tmp_path / "model.safetensors")
        model.save_model(path, {"w": {"b": np.zeros(1, np.float32)}}, good | {name: value}, {})
        result = run_main(script, tmp_path, "--load-model", path)
        err = result.stderr.strip().splitlines()
        assert result.returncode == 2, (name, value, result.stderr[-300:])
        assert len(err) == 1 and err[0].startswith("error: "), (name, value, err)
        assert not (tmp_path / "runs").exists()
        assert cli.flag(name) in err[0], err  # the line names the field


def test_a_script_written_to_log_iterations_earlier_form_stops_at_once_with_one_line(tmp_path):
    # The loop as scripts wrote it before log_iteration read the metrics itself: the metrics read
    # by the script, a dict of scalars, and stop_non_finite called by the loop.
    def earlier_main():
        args = training.parse_args(tiny_pg)
        env, env_params = tiny_pg.make_env(args.env_id, args.sticky_action_prob)
        agent = tiny_pg.make_agent(args, env, env_params)
        with training.Run(tiny_pg, args, agent, env, env_params) as run:
            state = run.state
            for iteration in run.iterations():
                state, metrics = run.update_step(state)
                metrics = jax.device_get(metrics)
                run.log_iteration(iteration, metrics, {"losses/loss": metrics["loss"]})
                if not metrics["finite"]:
                    run.stop_non_finite(iteration, "losses/loss")
                    break
                run.end_iteration(iteration, state)
            run.finish(state)

    earlier = types.SimpleNamespace(main=earlier_main, __file__=tiny_pg.__file__)
    result = run_main(earlier, tmp_path, *TINY, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {training.EARLIER_LOG_ITERATION}"]
    assert "CHANGELOG.md" in training.EARLIER_LOG_ITERATION

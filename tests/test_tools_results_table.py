"""tools/results_table.py: arguments reach ppo_breakout.py, and bad ones stop it with exit
status 2."""

import os
import shutil

import pytest

from helpers import read_scalars, read_summary, run_main
from tools import common, results_table


def run_table(tmp_path, *flags):
    """`python tools/results_table.py FLAGS` run in tmp_path, in this process (helpers.run_main)."""
    return run_main(results_table, tmp_path, *flags, timeout=300)



def test_script_args_reach_the_script_and_its_error_stops_the_table(tmp_path):
    result = run_table(tmp_path, "--seeds", "1", "--script-args=--update-epochs 0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: seed 1 failed: error: --update-epochs must be positive, got 0"]
    assert not (tmp_path / "runs").exists()


def test_script_args_that_do_not_parse_exit_2_before_any_run(tmp_path):
    result = run_table(tmp_path, "--script-args=--exp-name 'unclosed")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--script-args" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_collect_makes_the_rows_of_finished_runs_and_their_commands(tmp_path, tiny_run):
    import hashlib
    import json

    from tools import make_tables

    _, run_dir = tiny_run
    out = tmp_path / "collected.json"
    result = run_table(tmp_path, "--collect", run_dir, "--scalars", "losses/value_loss",
                       "charts/SPS", "--out", str(out))
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(out.read_text())["rows"]
    summary = read_summary(run_dir)
    # --scalars: every logged point of the tags named (a figure drawn later reads them).
    logged = read_scalars(run_dir)
    assert set(row["scalars"]) == {"losses/value_loss", "charts/SPS"}
    for tag, kept in row["scalars"].items():
        assert len(kept["steps"]) >= 2
        assert list(zip(kept["steps"], kept["values"])) == logged[tag]
    assert (row["seed"], row["eval"], row["args"]) == (3, summary["eval"], summary["args"])
    with open(os.path.join(run_dir, "model.safetensors"), "rb") as f:
        assert row["model_sha256"] == hashlib.sha256(f.read()).hexdigest()
    seconds = row["curve"]["seconds"]
    assert 0 < seconds[0] <= seconds[-1] <= row["wall_seconds"]
    # The run's evaluations during training (--eval-every 1) and its final one.
    curve = row["eval_curve"]
    assert curve["steps"] == [2048, 4096]
    assert 0 < curve["train_seconds"][0] < curve["train_seconds"][1]
    assert curve["train_seconds"][1] == pytest.approx(summary["train_seconds"], abs=0.1)
    final = summary["eval"]
    assert curve["minatar/greedy"][1] == pytest.approx(final["sticky_0.1"]["greedy"]["mean"])
    assert curve["gymnax/sampled"][1] == pytest.approx(final["sampled"]["mean"])
    # The table's command is the run's own, with the arguments it changed.
    assert make_tables.command(json.loads(out.read_text())) == (
        "python ppo_breakout.py --seed 3 --num-devices 2 --eval-every 1 --total-timesteps 4096 "
        "--num-envs 16 --num-minibatches 4 --update-epochs 1")
    # The machine that trained, as its summary names it: this CPU. A run that trained on a chip
    # names the chip and its host, wherever it is collected; one from before summaries named the
    # machine names the chip and this CPU.
    assert row["device"] == "cpu x 2"
    assert summary["machine"] == json.loads(out.read_text())["cpu"] == common.machine()
    chip, other, four = tmp_path / "chip", tmp_path / "other_chip", tmp_path / "four_chips"
    host = "TPU v5 lite x 1 (a chip's host, CPU family 175, 13 cores, no AVX-512)"
    for copy, device in ((chip, "TPU v5 lite x 1"), (other, "TPU v4 x 1"),
                         (four, "TPU v5 lite x 4")):
        shutil.copytree(run_dir, copy)
        (copy / "summary.json").write_text(json.dumps({**summary, "device": device,
                                                       "machine": host}))
    on_chip = run_table(tmp_path, "--collect", str(chip), "--out", str(tmp_path / "chip.json"))
    assert on_chip.returncode == 0, on_chip.stderr
    assert json.loads((tmp_path / "chip.json").read_text())["cpu"] == host
    old = tmp_path / "old_chip"
    shutil.copytree(chip, old)
    (old / "summary.json").write_text(json.dumps(
        {k: v for k, v in {**summary, "device": "TPU v5 lite x 1"}.items() if k != "machine"}))
    before = run_table(tmp_path, "--collect", str(old), "--out", str(tmp_path / "old.json"))
    assert before.returncode == 0, before.stderr
    assert json.loads((tmp_path / "old.json").read_text())["cpu"] == (
        f"TPU v5 lite x 1 ({common.machine()})")
    # Runs of one device kind from two machines: the table names both.
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run_dir, elsewhere)
    (elsewhere / "summary.json").write_text(json.dumps({**summary, "machine": "Another CPU"}))
    both = run_table(tmp_path, "--collect", str(run_dir), str(elsewhere), "--out",
                     str(tmp_path / "both.json"))
    assert both.returncode == 0, both.stderr
    assert json.loads((tmp_path / "both.json").read_text())["cpu"] == " and ".join(
        sorted(["Another CPU", common.machine()]))
    # A run in an environment that changed its products (another precision) keeps it, and its
    # command carries it.
    high = tmp_path / "high"
    shutil.copytree(run_dir, high)
    precision = "JAX_DEFAULT_MATMUL_PRECISION=high"
    (high / "summary.json").write_text(json.dumps({**summary, "env_vars": precision}))
    in_high = run_table(tmp_path, "--collect", str(high), "--out", str(tmp_path / "high.json"))
    assert in_high.returncode == 0, in_high.stderr
    collected = json.loads((tmp_path / "high.json").read_text())
    assert collected["rows"][0]["env_vars"] == precision
    assert make_tables.command(collected).startswith(f"{precision} python ppo_breakout.py --seed 3")
    # Runs at different precisions make no one table.
    mixed = run_table(tmp_path, "--collect", str(run_dir), str(high), "--out",
                      str(tmp_path / "mixed.json"))
    assert mixed.returncode == 2 and mixed.stderr.strip().splitlines() == [
        "error: the runs computed at different precisions: ['JAX_DEFAULT_MATMUL_PRECISION=high', "
        "\"the scripts' own precision\"]"]
    assert not (tmp_path / "mixed.json").exists()
    # Runs from different devices (another chip, another count, a CPU) make no one table.
    for second in (other, four, run_dir):
        mixed = run_table(tmp_path, "--collect", str(chip), str(second), "--out",
                          str(tmp_path / "mixed.json"))
        assert mixed.returncode == 2 and "different devices" in mixed.stderr
        assert len(mixed.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "mixed.json").exists()
    # A run that did not complete is refused, and nothing is written.
    summary["status"] = "interrupted"
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "summary.json").write_text(json.dumps(summary))
    refused = run_table(tmp_path, "--collect", str(stopped), "--out", str(tmp_path / "no.json"))
    assert refused.returncode == 2 and "did not complete" in refused.stderr
    assert not (tmp_path / "no.json").exists()


def test_scalars_refuses_a_tag_the_run_did_not_log(tiny_run, capsys):
    _, run_dir = tiny_run
    with pytest.raises(SystemExit) as stopped:
        results_table.logged_scalars(run_dir, ("losses/value_loss", "losses/no_such"))
    assert stopped.value.code != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --scalars losses/no_such:") and "losses/value_loss" in line


def test_a_load_model_run_makes_a_row_without_training_speed(tmp_path, tiny_run):
    # A --load-model run trains nothing: its summary has no SPS and its row says so (None), where
    # the table used to end in a KeyError.
    import json

    _, run_dir = tiny_run
    played = tmp_path / "played"
    shutil.copytree(run_dir, played)
    summary = json.loads((played / "summary.json").read_text())
    del summary["sps"]
    summary["load_model"] = os.path.join(run_dir, "model.safetensors")
    (played / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "played.json"
    result = run_table(tmp_path, "--collect", str(played), "--out", str(out))
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["sps"] is None and row["eval"] == summary["eval"]
    assert "| nan |" in result.stdout

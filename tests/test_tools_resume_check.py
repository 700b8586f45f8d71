"""Tests of tools/resume_check.py: on the CPU, with the contract's tiny script, a run stopped and
continued (the script's --resume, the harness's --checkpoint-dir) is found identical to the run
never stopped; what it compares is there, a difference in any of it is found, and bad input gets
one line."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy
import tensorboardX

from helpers import only_run_dir, run_main
from tools import resume_check
from utils import checkpoint

SCRIPT = "tests/tiny_pg.py"
# Ten iterations of 65,536 CartPole steps: slow enough on a CPU that a signal sent after the third
# progress line lands before the run ends.
FLAGS = "--total-timesteps 655360 --num-envs 1024 --num-steps 64"


def check(tmp_path, *flags):
    """The tool's main() in this process (its runs are processes of their own)."""
    return run_main(resume_check, tmp_path, "--script", SCRIPT, *flags, timeout=600)


def test_a_script_run_stopped_and_resumed_is_found_identical(tmp_path):
    result = check(tmp_path, f"--script-args={FLAGS}", "--stop-after", "3", "--out", "r.json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["identical"] and report["differing"] == [] and report["mode"] == "script"
    # Stopped where the signal found it, after the third of ten progress lines and before the end.
    assert 3 * 65536 <= report["stopped_at_step"] == report["resumed_at_step"] < 655360
    assert report["global_step"] == 655360
    assert all(n > 0 for n in report["compared"].values())  # tensors, scalars, the evaluation
    assert report["first_differing_step"] is None
    assert report["whole_evaluation"] == report["evaluation"]  # the run never stopped's, beside


def test_a_harness_run_killed_and_run_again_is_found_identical(tmp_path):
    result = check(tmp_path, "--harness", "--stop-after", "2", "--out", "r.json",
                   "--script-args=--num-seeds 2 --num-chunks 4 --tiny.total-timesteps 8192")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["identical"] and report["chunks"] == 4 and report["stopped_after_chunk"] == 2
    # killed after the second chunk's line, whose checkpoint was written before it: the run again
    # trained chunks 3 and 4 only (the tool refuses otherwise)
    assert report["resumed_after_chunk"] == 2 and report["first_differing_chunk"] is None
    assert report["whole_eval_returns"] == report["eval_returns"]
    assert report["whole_eval_returns_minatar"] == report["eval_returns_minatar"]


def test_a_harness_run_killed_after_its_last_chunk_evaluates_as_the_whole_run(tmp_path):
    # Killed after the last chunk's checkpoint, in its evaluation: the run again trains nothing
    # and evaluates the restored seeds.
    result = check(tmp_path, "--harness", "--stop-after", "4", "--out", "r.json",
                   "--script-args=--num-seeds 2 --num-chunks 4 --tiny.total-timesteps 8192")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["identical"] and report["resumed_after_chunk"] == report["chunks"] == 4


def test_the_first_step_at_which_two_runs_logs_part_is_found():
    a = {"loss": [(1, 0.5), (2, 0.25), (3, 0.125)], "return": [(2, 1.0), (3, 2.0)]}
    assert resume_check.first_differing_step(a, a) is None
    assert resume_check.first_differing_step(a, a | {"loss": [(1, 0.5), (2, 0.25), (3, 0.5)]}) == 3
    assert resume_check.first_differing_step(a, a | {"return": [(2, 1.5), (3, 2.5)]}) == 2
    assert resume_check.first_differing_step(a, a | {"return": [(2, 1.0)]}) == 3  # one logged more
    assert resume_check.first_differing_step(a, {"loss": a["loss"]}) == 2  # a tag only one has


def test_the_first_chunk_whose_curve_differs_is_found():
    a = {"steps": [10, 20, 30], "return_sums": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
         "episodes": [[1, 1, 1], [2, 2, 2]]}
    assert resume_check.first_differing_chunk(a, a) is None
    assert resume_check.first_differing_chunk(
        a, a | {"return_sums": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]}) == 3  # the second seed's
    assert resume_check.first_differing_chunk(a, a | {"episodes": [[1, 3, 1], [2, 2, 2]]}) == 2
    assert resume_check.first_differing_chunk(a, a | {"steps": [10, 25, 30]}) == 2
    shorter = {"steps": [10, 20], "return_sums": [[1.0, 2.0], [4.0, 5.0]],
               "episodes": [[1, 1], [2, 2]]}
    assert resume_check.first_differing_chunk(a, shorter) == 3


def a_run(tmp_path) -> str:
    import tiny_pg

    assert run_main(tiny_pg, tmp_path, "--total-timesteps", "4096").returncode == 0
    return only_run_dir(tmp_path)


def test_any_difference_in_what_a_run_ends_with_is_found(tmp_path):
    original = a_run(tmp_path)
    ends = resume_check.what_a_run_ends_with(original)
    assert resume_check.differing(ends, ends) == []

    # One bit of one checkpoint tensor.
    copy = shutil.copytree(original, tmp_path / "tensor")
    path = os.path.join(copy, checkpoint.CHECKPOINT)
    with open(path, "rb") as f:
        tensors = safetensors.numpy.load(f.read())
    name = next(k for k, t in tensors.items() if t.dtype == np.float32 and t.size)
    tensors[name] = tensors[name].copy()
    tensors[name].view(np.uint32).flat[0] ^= 1
    metadata = safetensors.safe_open(path, "np").metadata()
    safetensors.numpy.save_file(tensors, path, metadata=metadata)
    assert resume_check.differing(ends, resume_check.what_a_run_ends_with(copy)) == [
        f"tensors/{checkpoint.CHECKPOINT}:{name}"]

    # One more logged scalar.
    copy = shutil.copytree(original, tmp_path / "scalar")
    with tensorboardX.SummaryWriter(copy) as writer:
        writer.add_scalar("charts/episodic_return", 1.0, 10**9)
    assert resume_check.differing(ends, resume_check.what_a_run_ends_with(copy)) == [
        "scalars/charts/episodic_return"]

    # Another evaluation.
    copy = shutil.copytree(original, tmp_path / "evaluation")
    with open(os.path.join(copy, "summary.json")) as f:
        summary = json.load(f)
    protocol = next(iter(summary["eval"]))
    summary["eval"][protocol] = "changed"
    with open(os.path.join(copy, "summary.json"), "w") as f:
        json.dump(summary, f)
    assert resume_check.differing(ends, resume_check.what_a_run_ends_with(copy)) == [
        f"evaluation/{protocol}"]


def test_bad_input_gets_one_line(tmp_path):
    for flags, message in [(["--stop-after", "0"], "--stop-after must be positive, got 0"),
                           (["--script", "nothing"], "--script nothing: no such script"),
                           (["--out", "taken.json"], "--out taken.json exists"),
                           (["--script-args=--seed '1"], "--script-args \"--seed '1\": No closing"),
                           (["--script-args=--no-save-model"], "--script-args --no-save-model: "),
                           (["--harness", "--script-args=--quiet"], "--script-args --quiet: ")]:
        (tmp_path / "taken.json").write_text("{}")
        result = check(tmp_path, *flags)
        assert result.returncode == 2, (flags, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {message}"), (flags, line)
        assert (tmp_path / "taken.json").read_text() == "{}"  # nothing overwritten


# A stand-in for a script: a run directory, two progress lines, then the end.
TWO_LINES = """import json, os, time
os.makedirs("runs/run")
with open("runs/run/summary.json", "w") as f:
    json.dump({"global_step": 2}, f)
for step in (1, 2):
    print(f"step {step} | SPS 5", flush=True)
    time.sleep(0.2)
"""


def test_a_run_that_ends_before_its_stop_or_fails_is_one_line(tmp_path, capsys):
    script = tmp_path / "two_lines.py"
    script.write_text(TWO_LINES)
    for stop, message in [("3", "the run printed 2 progress lines, fewer than --stop-after 3"),
                          ("2", "the run ended before the stop reached it")]:
        result = check(tmp_path, "--script", str(script), "--stop-after", stop)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {message}"), line

    command = [sys.executable, "-c", "print('error: --num-envs must be positive'); exit(2)"]
    with pytest.raises(SystemExit) as exit_:
        resume_check.run(command, tmp_path)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and line.endswith(
        "exited with 2: error: --num-envs must be positive")
    # A run still going is stopped at the count, and one left running when the tool stops is
    # killed and reaped.
    command = [sys.executable, "-c", "import time\nfor i in range(100): print(f'step {i} | SPS 5',"
               " flush=True); time.sleep(0.1)"]
    with resume_check.started(command, tmp_path) as process:
        assert resume_check.stop_after(process, lambda line: " | SPS " in line, 2, 15) == 2
        assert process.wait(timeout=5) == -15
    with pytest.raises(KeyError), resume_check.started(command, tmp_path) as process:
        raise KeyError
    assert process.returncode == -9


def test_the_chunks_a_harness_run_trained_are_read_from_its_progress_lines():
    output = ("compiled train in 1.0 s\nchunk  3/10 |     6,144 of 20,480 steps per seed | ...\n"
              "chunk 10/10 |    20,480 of 20,480 steps per seed | ...\n{\n \"chunk\": 1\n}\n")
    assert resume_check.chunk_numbers(output) == [3, 10]


def test_importing_the_tool_starts_no_jax_backend():
    # On a TPU only one process may hold the chip: the tool's parent process must leave it to the
    # runs it starts (importing the harness had, through gymnax's import-time arrays).
    code = ("import sys; sys.argv = ['x']; import tools.resume_check; "
            "from jax._src import xla_bridge; print(sorted(xla_bridge._backends))")
    out = subprocess.run([sys.executable, "-c", code], cwd=resume_check.ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"

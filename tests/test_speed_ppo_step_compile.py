"""Tests of speed/ppo_step_compile.py: on the CPU, with tiny flags, it compiles and runs each part
asked for with each convolution, the `xla` one being XLA's convolution in the traced program, and
refuses what it does not know with one line."""

import json

from helpers import run_main
from speed import ppo_step_compile

TINY = ("--script-args=--num-devices 1 --num-envs 8 --num-steps 4 --num-minibatches 2 "
        "--update-epochs 1 --total-timesteps 64")


def test_it_compiles_and_runs_each_part_with_each_convolution(tmp_path):
    result = run_main(ppo_step_compile, tmp_path, TINY, "--parts", "forward", "one_minibatch",
                      "--precisions", "highest", "--convs", "matmul", "xla", "--repeats", "1",
                      "--out", "compile.json", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((tmp_path / "compile.json").read_text())["rows"]
    assert [(r["part"], r["conv"], r["precision"]) for r in rows] == [
        (part, conv, "highest") for conv in ("matmul", "xla") for part in ("forward",
                                                                            "one_minibatch")]
    assert all(r["compile_s"] > 0 and r["run_ms"] > 0 for r in rows)
    # the matrix-product convolution is no convolution in StableHLO; XLA's is one
    forward = {r["conv"]: r["convolutions"] for r in rows if r["part"] == "forward"}
    assert forward == {"matmul": 0, "xla": 1}


def test_an_unknown_part_is_refused_with_one_line(tmp_path):
    result = run_main(ppo_step_compile, tmp_path, "--parts", "backward", timeout=120)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [
        f"error: unknown ['backward']: parts {ppo_step_compile.PARTS}, precisions "
        f"{ppo_step_compile.PRECISIONS}, convs {ppo_step_compile.CONVS}"]

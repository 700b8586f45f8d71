"""Tests of speed/compile_parts.py: on the CPU, with the contract's tiny script, it names the
programs a run compiles (the update step, the initial state, the evaluation) with their seconds,
and sums them."""

import json

import pytest

from helpers import run_main
from speed import compile_parts


def test_it_names_each_program_the_run_compiles_and_sums_their_seconds(tmp_path):
    result = run_main(compile_parts, tmp_path, "--script", "tests/tiny_pg.py",
                      "--script-args=--total-timesteps 2048 --eval-episodes 4 --num-devices 1",
                      "--out", "parts.json", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "parts.json").read_text())
    programs = {row["program"]: row for row in report["programs"]}
    # the run's three programs, each traced, lowered and compiled once, its "jit(...)" name undone
    for name in ("update_step", "init_state", "evaluate_pair"):
        assert programs[name]["compiles"] == 1 and programs[name]["trace"] > 0, name
    for part in ("trace", "lower", "compile"):
        assert report["totals"][part] == pytest.approx(sum(r[part] for r in report["programs"]))
        assert report["totals"][part] == pytest.approx(
            sum(e["seconds"] for e in report["events"] if e["part"] == part))
    assert report["run"]["global_step"] == 2048 and report["script"] == "tiny_pg"
    # In this process the suite's compilation cache is on (tests/conftest.py): what it loaded is
    # counted; run as a command, with the cache off, it counts none.
    assert isinstance(report["cache_hits"], int)
    assert not (tmp_path / "runs").exists()  # the script ran in a work directory of its own

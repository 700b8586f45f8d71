"""benchmarks/results_table.py: arguments reach ppo_breakout.py, and bad ones stop it with exit
status 2."""

import os
import subprocess
import sys

TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                     "results_table.py")


def run_table(tmp_path, *flags):
    return subprocess.run([sys.executable, TABLE, *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)



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

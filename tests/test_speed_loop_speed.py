"""Tests of speed/loop_speed.py: on the CPU, with tiny flags, it times the script as a user
runs it against its bare update step, the bare step at another precision, and the harness's seeds,
and reports what it timed."""

import json

from helpers import run_main
from speed import loop_speed

# The contract's tiny script: what is timed is the machinery's, whichever script it runs.
TINY = ("--script=tests/tiny_pg.py", "--script-args=--total-timesteps 8192 --num-envs 16 "
        "--num-steps 128 --eval-episodes 8 --num-devices 1")


def test_it_times_the_loop_the_bare_step_and_the_harness(tmp_path):
    result = run_main(loop_speed, tmp_path, *TINY, "--rounds", "1", "--precisions", "default",
                      "--harness-seeds", "2", "--harness-vmap-seeds", "2",
                      "--harness-one-at-a-time", "2",
                      "--harness-timesteps", "4096", "--out", "loop.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "loop.json").read_text())
    assert (report["script"], report["iterations"], report["steps_per_iteration"]) == (
        "tiny_pg", 4, 2048)
    (row,) = report["rounds"]  # the round that compiles is not recorded
    assert row["script"]["global_step"] == 8192
    assert row["bare"]["sps"] == 8192 / row["bare"]["train_seconds"]
    assert row["ratio"] == row["script"]["sps"] / row["bare"]["sps"]
    assert set(report["bare_step_at_precision"]) == {"default"}
    assert report["matmul_precision"] == "highest"  # the scripts' own (utils/startup.py)
    side_by_side, one_at_a_time = report["harness"]
    assert side_by_side["seeds"] == one_at_a_time["seeds"] == 2
    assert side_by_side["vmap_seeds"] == 2 and one_at_a_time["vmap_seeds"] == 1
    # 2 seeds, 2 at once on each of the CPU's 2 devices: 4 trained, the SPS counting 2
    assert (side_by_side["trained_seeds"], one_at_a_time["trained_seeds"]) == (4, 2)
    assert side_by_side["sps"] == 2 * 4096 / side_by_side["train_seconds"]
    assert not (tmp_path / "runs").exists()  # the script ran in a work directory of its own


def test_each_measurement_is_written_as_it_comes(tmp_path, monkeypatch):
    # A run cut short by a time limit (a chip's call) keeps the rows it measured.
    rows = iter([{"seeds": 1, "sps": 5.0}])

    def harness(script, args, n, timesteps, vmap):
        try:
            return next(rows)
        except StopIteration:
            raise KeyboardInterrupt from None

    monkeypatch.setattr(loop_speed, "harness", harness)
    monkeypatch.setattr("sys.argv", ["loop_speed.py", *TINY, "--rounds", "0", "--harness-seeds",
                                     "1", "8", "--out", str(tmp_path / "loop.json")])
    try:
        loop_speed.main()
    except KeyboardInterrupt:
        pass
    assert json.loads((tmp_path / "loop.json").read_text())["harness"] == [{"seeds": 1, "sps": 5.0}]

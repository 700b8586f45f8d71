"""tools/common.py: the summary line read back, a child's own wall time and peak memory, rounds
that alternate and their ratios, and the report's head."""

import json
import os
import sys

import pytest

from tools import common

# A child that holds `n` MiB, written byte by byte so that every page is resident.
HOLD = "import sys, time; block = b'x' * (int(sys.argv[1]) * 2**20); time.sleep(0.2)"


# ------------------------------------------------------------------------------------------------
# Running a process and reading its summary
# ------------------------------------------------------------------------------------------------
def test_the_summary_path_is_the_last_summary_line_whatever_follows_it():
    stdout = "summary: runs/old/summary.json\nstep 1\nsummary: runs/a b/summary.json\nbye\n"
    assert common.summary_path(stdout) == "runs/a b/summary.json"
    with pytest.raises(ValueError, match="no 'summary: PATH' line"):
        common.summary_path("step 1\nthe summary: is not at the start\n")


def test_the_summary_is_read_from_the_directory_the_script_ran_in(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "summary.json").write_text('{"sps": 5}')
    summary, path = common.read_summary("summary: runs/summary.json\n", str(tmp_path))
    assert summary == {"sps": 5}
    assert path == str(tmp_path / "runs" / "summary.json")


def test_a_run_keeps_its_output_exit_status_and_wall_time(tmp_path):
    code = "import sys, time; time.sleep(0.3); print('out'); print('err', file=sys.stderr); exit(3)"
    run = common.run_timed([sys.executable, "-c", code], str(tmp_path))
    assert (run.returncode, run.stdout, run.stderr) == (3, "out\n", "err\n")
    assert 0.3 <= run.wall_seconds < 30


def test_the_peak_memory_is_the_childs_own_in_mib(tmp_path):
    small, large, small_after = (common.run_timed([sys.executable, "-c", HOLD, str(n)])
                                 for n in (0, 200, 0))
    assert 5 < small.peak_rss_mb < 60  # an interpreter, in MiB (not KiB, not GiB)
    assert 190 < large.peak_rss_mb - small.peak_rss_mb < 230
    # Not the largest of every child so far (RUSAGE_CHILDREN): the small one after the large one.
    assert small_after.peak_rss_mb < small.peak_rss_mb + 20


def test_the_peak_memory_carries_nothing_of_a_large_process_that_starts_the_child():
    ballast = b"x" * (300 * 2**20)  # Linux would pass this peak on through fork and exec
    small = common.run_timed([sys.executable, "-c", HOLD, "0"])
    assert len(ballast) and small.peak_rss_mb < 60


def test_a_script_of_any_name_in_a_tree_is_run_and_its_summary_read(tmp_path):
    tree, workdir = tmp_path / "tree", tmp_path / "work"
    tree.mkdir()
    workdir.mkdir()
    (tree / "pqn_minatar.py").write_text(
        "import json, os, sys\n"
        "os.makedirs('runs/r', exist_ok=True)\n"
        "json.dump({'sps': 10.0, 'compile_seconds': 1.5, 'flags': sys.argv[1:]},"
        " open('runs/r/summary.json', 'w'))\n"
        "print('summary: runs/r/summary.json')\n")
    run = common.run_script("pqn_minatar.py", ["--seed", "3"], str(workdir), tree=str(tree))
    assert run.summary == {"sps": 10.0, "compile_seconds": 1.5, "flags": ["--seed", "3"]}
    assert run.summary_path == str(workdir / "runs" / "r" / "summary.json")
    fields = common.speed_fields(run)
    assert fields == {"wall_seconds": run.run.wall_seconds, "peak_memory_mb": run.run.peak_rss_mb,
                      "sps": 10.0, "compile_seconds": 1.5}


def test_a_failing_script_raises_with_its_last_error_line(tmp_path):
    (tmp_path / "bad.py").write_text("import sys\nprint('error: --seed is odd', file=sys.stderr)\n"
                                     "sys.exit(2)\n")
    with pytest.raises(RuntimeError, match=r"exited with 2: error: --seed is odd$"):
        common.run_script("bad.py", [], str(tmp_path), tree=str(tmp_path))


def test_any_command_that_names_its_summary_is_run_and_read(tmp_path):
    code = ("import json; json.dump({'sps': 2.0}, open('s.json', 'w')); print('summary: s.json')")
    run = common.run_reporting([sys.executable, "-c", code], str(tmp_path))
    assert run.summary == {"sps": 2.0} and run.summary_path == str(tmp_path / "s.json")


# ------------------------------------------------------------------------------------------------
# Alternating rounds
# ------------------------------------------------------------------------------------------------
def test_rounds_alternate_the_versions_after_a_warm_up_of_those_named(capsys):
    calls = []

    def version(name, sps):
        def run():
            calls.append(name)
            return {"wall_seconds": 1.0, "peak_memory_mb": 10.0, "sps": sps}
        return run

    rounds = common.alternate({"a": version("a", 300.0), "b": version("b", 100.0)}, 2,
                              warm_up=["a"])
    assert calls == ["a", "a", "b", "a", "b"]  # the warm-up run of "a" is not recorded
    assert rounds == [{"a": {"wall_seconds": 1.0, "peak_memory_mb": 10.0, "sps": 300.0},
                       "b": {"wall_seconds": 1.0, "peak_memory_mb": 10.0, "sps": 100.0}}] * 2
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["a: 1.00 s, 10 MB, 300 SPS | b: 1.00 s, 10 MB, 100 SPS"] * 2
    calls.clear()
    common.alternate({"a": version("a", 1.0), "b": version("b", 1.0)}, 1)
    assert calls == ["a", "b", "a", "b"]  # by default every version warms up


def test_round_ratios_pair_each_round_and_give_median_and_range():
    rounds = [{"own": {"sps": 50.0}, "ref": {"sps": 10.0}},
              {"own": {"sps": 30.0}, "ref": {"sps": 10.0}},
              {"own": {"sps": 80.0}, "ref": {"sps": 20.0}}]
    assert common.round_ratios(rounds, "own", "ref") == {
        "per_round": [5.0, 3.0, 4.0], "median": 4.0, "range": [3.0, 5.0]}


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------
def test_a_report_says_what_ran_where_and_when_and_is_written_as_printed(tmp_path, capsys,
                                                                         monkeypatch):
    argv = [os.path.join(common.ROOT, "tools", "x.py"), "--a", "b c"]
    monkeypatch.setattr(sys, "argv", argv)
    report = common.new_report("python ppo_breakout.py --seed 1", rounds=[1, 2])
    assert report["command"] == "python ppo_breakout.py --seed 1"
    assert report["benchmark"] == "python tools/x.py --a 'b c'"
    assert report["machine"] == common.machine() and report["rounds"] == [1, 2]
    assert report["date"].endswith("+00:00") and report["date"][:2] == "20"
    assert common.new_report()["command"] == report["benchmark"]
    assert "env_vars" not in report  # the scripts' own precision: nothing to set
    monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "high")  # what the command needs to rerun
    assert common.new_report()["env_vars"] == "JAX_DEFAULT_MATMUL_PRECISION=high"
    out = tmp_path / "report.json"
    common.write_report(report, str(out))
    assert json.loads(out.read_text()) == report == json.loads(capsys.readouterr().out)


def test_an_existing_out_is_refused_before_anything_runs(tmp_path, capsys):
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    for out, message in ((kept, "exists; choose another name"),
                         (tmp_path / "no" / "x.json", "its directory does not exist")):
        with pytest.raises(SystemExit) as exit_:
            common.check_out(str(out))
        assert exit_.value.code == 2
        assert capsys.readouterr().err == f"error: --out {out}: {message}\n".replace(
            ": exists", " exists")
    common.check_out(str(tmp_path / "new.json"))  # a new file in a directory that exists
    assert kept.read_text() == "{}"


def test_a_script_run_in_process_fails_in_one_line_with_its_reason(capsys):
    import tiny_pg

    with pytest.raises(SystemExit) as exit_:
        common.main_in_work_dir(tiny_pg, ["--num-envs", "0"])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: tiny_pg --num-envs 0 exited with 2: error: --num-envs")
    summary = common.main_in_work_dir(tiny_pg, ["--total-timesteps", "1024", "--eval-episodes", "2",
                                                "--num-devices", "1"])
    assert summary["global_step"] == 1024

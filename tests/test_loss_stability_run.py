"""loss_stability.py run the way a user runs it, in this process and as a subprocess: it writes what
its summary says, prints its tables, and bad arguments exit 2 with one line and write nothing. The
script's functions: test_loss_stability.py."""

import csv
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import loss_stability as ls
from helpers import ROOT

# --------------------------------------------------------------------------------------------------
# loss_stability.py (float64 beside float32, as in tests/test_loss_stability.py)
# --------------------------------------------------------------------------------------------------
FIGURES = ["gradient_sweep.png", "loss_sweep.png", "safe_zone_ulps.png"]
OUTPUT_FILES = sorted(FIGURES + ["summary.json", "sweep_large.csv", "sweep_safe.csv"])


def run_loss_study(*flags):
    command = [sys.executable, "loss_stability.py", *flags]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def png_size(path):
    """(width, height) from a PNG's header."""
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.usefixtures("float64_available")
def test_main_writes_what_its_summary_says(tmp_path, monkeypatch, capsys):
    # In-process (so that coverage and mutation tools see it), on the smallest grid the script
    # accepts.
    out_dir = tmp_path / "out"
    out_dir.mkdir()  # rerunning into an existing directory is how the docs' copies are regenerated
    monkeypatch.setattr(sys, "argv", ["loss_stability.py", "--out-dir", str(out_dir),
                                      "--num-points", str(ls.MIN_POINTS)])
    y_labels, save_figure = {}, ls.save_figure
    monkeypatch.setattr(ls, "save_figure", lambda fig, path: (
        y_labels.update({os.path.basename(path): fig.get_supylabel()}), save_figure(fig, path)))
    with jax.enable_x64(False):  # as a user's process starts: main() must turn float64 on itself
        ls.main()
    assert sorted(os.listdir(out_dir)) == OUTPUT_FILES and not ls.plt.get_fignums()
    for figure in FIGURES:
        assert png_size(out_dir / figure) == (1200, 1350)  # 12 x 13.5 inches at 100 dpi
    # Each figure's axis says what it plots.
    assert "relative error of the loss" in y_labels["loss_sweep.png"]
    assert ("gradient error" in y_labels["gradient_sweep.png"]
            and "ulps" in y_labels["safe_zone_ulps.png"])
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["args"]["num_points"] == ls.MIN_POINTS
    out = capsys.readouterr().out
    assert (out.startswith("\n\n".join(ls.format_tables(summary)))
            and out.endswith(f"to {out_dir}\n"))

    # The summary: each dtype computed in its own precision, checked against its own float format.
    for dtype in ls.DTYPES:
        name = np.dtype(dtype).name
        assert summary["exp_flushes_subnormals"][name] == ls.exp_flushes_subnormals(dtype)
        predicted = ls.predicted_breaks(dtype, 0.99, ls.exp_flushes_subnormals(dtype))
        for method, t in summary["thresholds"][name].items():
            assert (t["matches_prediction"]
                    and t["predicted"] == json.loads(json.dumps(predicted[method])))
        safe = summary["safe_zone_ulp_error"][name]
        errors = [s["max_abs_loss_error"] for s in safe.values()]
        assert ((1e-9 < min(errors) and max(errors) < 1e-5) if name == "float32"
                else max(errors) < 1e-13)

        assert set(summary["log_space_paired_not_worse"][name]) == {
            "sweep 1 loss", "sweep 1 gradient", "sweep 2 loss (ulps)", "sweep 2 gradient"
        }
    for sweep, (low, high) in [("sweep 1", (-1000, 1000)), ("sweep 2", (-20, 20))]:
        assert (summary["windows"][sweep]["edges"]
                == np.linspace(low, high, ls.NUM_WINDOWS + 1).tolist())

    # The CSVs: one column per dtype, method and quantity, agreeing with what the summary reports.
    with open(out_dir / "sweep_large.csv") as f:
        large = list(csv.DictReader(f))
    with open(out_dir / "sweep_safe.csv") as f:
        safe = list(csv.DictReader(f))
    assert len(large) == len(safe) == ls.MIN_POINTS
    # 6 digits, "nan", "inf"
    assert all(v == "%.6g" % float(v) for row in large + safe for v in row.values())
    np.testing.assert_allclose([float(r["m"]) for r in large],
                               np.linspace(-1000, 1000, ls.MIN_POINTS))
    np.testing.assert_allclose([float(r["m"]) for r in safe], np.linspace(-20, 20, ls.MIN_POINTS))
    quantities = {"loss", "loss_rel_error", "grad_error"}
    assert set(large[0]) == (
        {"m"} | {f"{name}/reference/loss" for name in ("float32", "float64")}
        | {f"{name}/{method}/{q}"
           for name in ("float32", "float64") for method in ls.METHODS for q in quantities})
    for name in ("float32", "float64"):
        for method in ls.METHODS:

            def column(rows, q):
                return np.array([float(r[f"{name}/{method}/{q}"]) for r in rows])

            for q, key in [("loss_rel_error", "loss"), ("grad_error", "grad")]:
                errors = column(large, q)
                largest = summary["thresholds"][name][method]["largest_finite_error"][key]
                np.testing.assert_allclose(errors[np.isfinite(errors)].max(), largest, rtol=1e-5)
            stats = summary["safe_zone_ulp_error"][name][method]
            np.testing.assert_allclose(np.abs(column(safe, "ulp_error")).max(), stats["max_abs"],
                                       rtol=1e-5)
            np.testing.assert_allclose(column(safe, "grad_error").max(), stats["max_grad_error"],
                                       rtol=1e-5)


@pytest.mark.usefixtures("float64_available")
def test_script_runs_from_the_shell(tmp_path):
    out_dir = tmp_path / "out"
    result = run_loss_study("--out-dir", str(out_dir), "--num-points", str(ls.MIN_POINTS))
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out_dir)) == OUTPUT_FILES
    summary = json.loads((out_dir / "summary.json").read_text())
    assert result.stdout.startswith("\n\n".join(ls.format_tables(summary)))


@pytest.mark.usefixtures("float64_available")
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--min-logit", "5", "--max-logit", "5"], "must be below --max-logit"),
        (["--num-points", "0"], "--num-points must be at least 65"),
        (["--out-dir", "{blocker}/figures"], "is a file, not a directory"),
        # passes the checks, fails makedirs
        (["--out-dir", "{tmp}/" + "x" * 300], "File name too long"),
    ],
)
def test_bad_args_exit_2_with_one_error_line_and_write_nothing(tmp_path, monkeypatch, capsys, flags,
                                                               message):
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file where a directory would have to be")
    flags = [flag.format(blocker=blocker, tmp=tmp_path) for flag in flags]
    if "--out-dir" not in flags:
        flags += ["--out-dir", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", ["loss_stability.py", *flags])
    with pytest.raises(SystemExit) as exit_info:
        ls.main()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert sorted(os.listdir(tmp_path)) == ["blocker"] and captured.out == ""


@pytest.mark.usefixtures("float64_available")
def test_unwritable_out_dir_exits_2_from_the_shell(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = run_loss_study("--out-dir", str(blocker / "figures"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (f"error: --out-dir {blocker}/figures: {blocker} is a file, "
                                     "not a directory")


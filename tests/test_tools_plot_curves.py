"""Tests of tools/plot_curves.py: it overlays runs' learning curves and never overwrites a
file."""

import os
import subprocess
import sys

from PIL import Image

from helpers import SCRIPT, run_main
from tools import plot_curves


def test_plot_curves_overlays_runs_and_never_overwrites(tiny_run, tmp_path):
    _, run_dir = tiny_run
    plot = os.path.join(os.path.dirname(SCRIPT), "tools", "plot_curves.py")
    out = tmp_path / "curves.png"
    command = [sys.executable, plot, run_dir, run_dir, "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    with Image.open(out) as image:
        image.load()
    written = out.read_bytes()
    # The same command again, in this process (a second process would only repeat the imports).
    again = run_main(plot_curves, tmp_path, run_dir, run_dir, "--out", str(out))
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: --out {out} exists; choose another name"]
    assert out.read_bytes() == written

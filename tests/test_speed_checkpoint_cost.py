"""Tests of speed/checkpoint_cost.py: it measures on the devices it asks for, or refuses."""

import os
import subprocess
import sys

from tools.common import ROOT

SCRIPT = os.path.join(ROOT, "speed", "checkpoint_cost.py")


def test_importing_it_gives_jax_the_two_devices_the_update_is_split_over():
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}  # as a user runs it
    code = ("from speed import checkpoint_cost; from tools import common; import jax; "
            "print(len(jax.devices()))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2"]


def test_too_few_devices_are_refused_before_anything_runs(tmp_path):
    out = tmp_path / "cost.json"
    result = subprocess.run([sys.executable, SCRIPT, "--out", str(out)], capture_output=True,
                            text=True, timeout=300, env=os.environ | {"JAX_NUM_CPU_DEVICES": "1"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: JAX has 1 device(s) and the update is split over 2: unset JAX_NUM_CPU_DEVICES or "
        "set it to 2 or more")
    assert not out.exists()

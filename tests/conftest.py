"""Put the repository root on sys.path, so that tests import the scripts as modules, and give JAX's
CPU backend two devices whatever the machine, so the data-parallel paths always run."""

import os
import sys

os.environ["JAX_NUM_CPU_DEVICES"] = "2"  # before JAX starts; inherited by the scripts' subprocesses

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import pytest  # noqa: E402

from helpers import TINY, only_run_dir, run_in_process  # noqa: E402


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny training run of the script, shared by the tests that read what it leaves (in
    test_scripts.py, test_utils_startup.py and test_benchmarks_plot_curves.py)."""
    path = tmp_path_factory.mktemp("tiny")
    result = run_in_process(path, *TINY)
    assert result.returncode == 0, result.stderr
    return result, only_run_dir(path)


@pytest.fixture
def float64_available():
    """The study puts float32 and float64 side by side, as the script does once its args are
    parsed."""

    with jax.enable_x64(True):
        yield

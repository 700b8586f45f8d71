"""Put the repository root on sys.path, so that tests import the scripts as modules, and give JAX's
CPU backend two devices whatever the machine, so the data-parallel paths always run."""

import os
import sys

os.environ["JAX_NUM_CPU_DEVICES"] = "2"  # before JAX starts; inherited by the scripts' subprocesses

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import pytest  # noqa: E402

from helpers import TINY, only_run_dir, run_in_process  # noqa: E402

JAX_MIN_COMPILE_SECONDS = jax.config.jax_persistent_cache_min_compile_time_secs  # JAX's own, 1 s


@pytest.fixture(autouse=True)
def cache_only_slow_compiles():
    """A script's main() run in this process leaves JAX's persistent cache writing every program it
    compiles (utils/startup.py: a run's start-up wants even its key splits cached). A test's own
    operations, one small program each, would then write thousands of entries to the capped cache,
    each write rescanning all of it: each test starts with JAX's threshold back. Reading the cache
    is untouched, and a main() sets its own threshold again."""
    jax.config.update("jax_persistent_cache_min_compile_time_secs", JAX_MIN_COMPILE_SECONDS)


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

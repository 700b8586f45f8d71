"""Put the repository root on sys.path, so that tests import the scripts as modules, and give JAX's
CPU backend two devices whatever the machine, so the data-parallel paths always run. The suite runs
on two pytest-xdist workers (pyproject.toml); the files whose runs share compiled programs run on
one.

Where a test goes: test_<script>.py tests the script's functions in the order of its sections;
test_<script>_run.py runs the script as a user runs it (what a run leaves, bad input, model files,
signals, resume); test_<dir>_<module>.py tests a shared module (utils/training.py's run paths
through tests/tiny_pg.py, the minimal script that keeps the contract)."""

import os
import sys

os.environ["JAX_NUM_CPU_DEVICES"] = "2"  # before JAX starts; inherited by the scripts' subprocesses
# The suite checks what programs compute, not how fast they run. With XLA's backend optimisations
# and its CPU fusion emitters off, the runs' programs compile in less than half the time. Results
# move in float32's last digits (a tiny run's parameters by ~1e-6), and every test compares runs
# made under this same setting.
os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0"
                           " --xla_cpu_use_fusion_emitters=false")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import pytest  # noqa: E402

import ppo_breakout as ppo  # noqa: E402
from helpers import TINY, only_run_dir, run_in_process  # noqa: E402
from utils import startup  # noqa: E402

JAX_MIN_COMPILE_SECONDS = jax.config.jax_persistent_cache_min_compile_time_secs  # JAX's own, 1 s
# JAX decides at a process's first compile whether it uses the persistent cache, once: the one the
# script's main() would set up, from the start, whichever test a worker runs first.
startup.configure_jax(ppo.Args.jax_cache_dir)

# Files whose runs load each other's programs from the compilation cache: on one worker, one after
# the other, not compiled twice at once.
SHARED_PROGRAMS = {
    # the session's tiny run; the signal tests' run is the resume tests' one
    "ppo_breakout runs": ["test_ppo_breakout_run.py", "test_ppo_breakout_stops.py",
                          "test_utils_startup.py", "test_tools_plot_curves.py",
                          "test_tools_results_table.py"],
    # tune's tiny PQN run is the search's PQN defaults trial
    "harness runs": ["test_tools_tune.py", "test_tools_search.py"],
}
GROUP_OF_FILE = {name: group for group, names in SHARED_PROGRAMS.items() for name in names}


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (pyproject.toml), the files of each SHARED_PROGRAMS group as one file.
    (xdist's own groups, --dist loadgroup, are lost on pytest 9: xdist 3.8 renames a test by an
    attribute that pytest no longer reads.)"""
    from xdist.scheduler import LoadFileScheduling

    class SharedProgramsScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return GROUP_OF_FILE.get(os.path.basename(path), path)

    return SharedProgramsScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


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
    test_ppo_breakout_run.py, test_ppo_breakout_stops.py, test_utils_startup.py,
    test_tools_plot_curves.py and test_tools_results_table.py); it also evaluates after
    its first iteration."""
    path = tmp_path_factory.mktemp("tiny")
    result = run_in_process(path, *TINY, "--eval-every", "1")
    assert result.returncode == 0, result.stderr
    return result, only_run_dir(path)


@pytest.fixture
def float64_available():
    """The study puts float32 and float64 side by side, as the script does once its args are
    parsed."""

    with jax.enable_x64(True):
        yield

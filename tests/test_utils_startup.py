"""Tests of utils/startup.py: one compilation cache for every entry point, which recovers from the
entries a JAX program without the size cap leaves behind."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import tyro

import ppo_breakout as ppo
from helpers import network_args, run_in_process, tiny_network_params
from utils import model as model_file
from utils import startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What tools/search.py did before every entry point shared startup's cache: JAX's cache with
# no cap, whose entries have no access-time file.
UNCAPPED = ("import jax; jax.config.update('jax_compilation_cache_dir', {!r}); "
            "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0); "
            "jax.jit(lambda x: x * 3 + 1)(1.0).block_until_ready()")


def test_the_compilation_cache_is_capped(tmp_path):
    # A search compiles a program per setting: without a cap the persistent cache grows without
    # bound. The script's start-up sets it: main() runs here as far as a model file it refuses, in
    # a process whose cache is uncapped (conftest.py set the cap up before any test).
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "--conv-channels", "0"])
    not_finite = jax.tree.map(lambda x: np.full(x.shape, np.nan, np.float32),
                              tiny_network_params(args))
    model = str(tmp_path / "nan.safetensors")
    model_file.save_model(model, not_finite, network_args(args), {})
    jax.config.update("jax_compilation_cache_max_size", -1)  # JAX's default: no cap
    try:
        result = run_in_process(tmp_path, "--load-model", model)
        assert result.returncode == 2 and "non-finite parameters" in result.stderr, result.stderr
        assert jax.config.jax_compilation_cache_max_size == startup.CACHE_MAX_BYTES > 0
    finally:
        jax.config.update("jax_compilation_cache_max_size", startup.CACHE_MAX_BYTES)


def test_every_program_multiplies_float32_in_float32():
    # The scripts' set-up (tests/conftest.py runs it, as main() does): a TPU would otherwise
    # multiply float32 in one pass of bfloat16.
    lowered = jax.jit(lambda a, b: a @ b).lower(jnp.ones((2, 2)), jnp.ones((2, 2))).as_text()
    assert "precision = [HIGHEST, HIGHEST]" in lowered


def test_entries_without_an_access_time_get_the_oldest_one(tmp_path):
    (tmp_path / "old-cache").write_bytes(b"x")
    (tmp_path / "kept-cache").write_bytes(b"y")
    (tmp_path / "kept-atime").write_bytes((5).to_bytes(8, "little"))
    startup.configure_jax(str(tmp_path))
    assert (tmp_path / "old-atime").read_bytes() == (0).to_bytes(8, "little")
    assert (tmp_path / "kept-atime").read_bytes() == (5).to_bytes(8, "little")


def test_after_an_uncapped_program_the_script_warns_nothing_and_reruns_from_the_cache(tiny_run,
                                                                                    tmp_path):
    cache = tmp_path / "cache"
    subprocess.run([sys.executable, "-c", UNCAPPED.format(str(cache))], check=True, cwd=tmp_path)
    assert list(cache.glob("*-cache")) and not list(cache.glob("*-atime"))
    # The tiny run's model evaluated: the script's start-up, its cache and its compiled programs,
    # without the training's (which would cost three times the compiling).
    model = os.path.join(tiny_run[1], "model.safetensors")
    entries = []
    for _ in range(2):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "ppo_breakout.py"), "--load-model",
                              model, "--eval-episodes", "4", "--jax-cache-dir", str(cache)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        assert "compilation cache" not in run.stderr
        entries.append(sorted(path.name for path in cache.glob("*-cache")))
    assert len(entries[0]) > 1 and entries[1] == entries[0]  # the second run compiled nothing


MALLOPT_CALLS = ("import ctypes, sys; sys.path.insert(0, {root!r}); calls = []\n"
                 "class Libc:\n"
                 "    def mallopt(self, *a): calls.append(a)\n"
                 "ctypes.CDLL = lambda name: Libc()\n"
                 "from utils import startup; startup.before_imports(); print(calls)")


def test_glibc_gets_one_malloc_arena_per_core_unless_malloc_arena_max_is_set():
    def mallopt_calls(env: dict) -> str:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
        return subprocess.run([sys.executable, "-c", MALLOPT_CALLS.format(root=ROOT)], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    cores = len(os.sched_getaffinity(0))
    assert mallopt_calls({}) == f"[({startup.M_ARENA_MAX}, {cores})]"
    assert mallopt_calls({"MALLOC_ARENA_MAX": "16"}) == "[]"


def test_in_background_runs_the_function_in_a_thread_of_its_own():
    import threading

    future = startup.in_background(lambda: threading.current_thread())
    assert future.result(timeout=10) is not threading.current_thread()

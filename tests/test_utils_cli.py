"""Tests of utils/cli.py: the flags a command line gives are found, whichever way they are spelt;
the memory check counts a donated state once and sees the process's own limit; the machine is
described from /proc/cpuinfo. Every argument check, run as a user meets it:
test_ppo_breakout_stops.py."""

import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import pytest

import ppo_breakout as ppo
from helpers import ROOT
from utils import cli


@pytest.mark.parametrize("argv, given", [
    (["--hidden-sizes", "8", "8", "--seed=3"], {"hidden_sizes", "seed"}),
    (["--hidden_sizes", "8", "--no-save-model"], {"hidden_sizes", "save_model"}),
    (["--exp-name", "seed"], {"exp_name"}),
    ([], set()),
])
def test_the_flags_a_command_line_gives_are_found(argv, given):
    assert cli.given_fields(ppo.Args, argv) == given


def test_the_memory_check_counts_a_state_written_into_its_own_memory_once(monkeypatch):
    # The run's update step is donated its state: the new state takes the old one's memory.
    step = jax.jit(lambda state: (state * 2 + 1, state.sum()), donate_argnums=0)
    like = jax.ShapeDtypeStruct((1 << 20,), jnp.float32)
    compiled = step.lower(like).compile()
    analysis = compiled.memory_analysis()
    assert analysis.alias_size_in_bytes == 4 << 20
    needed = (4 << 20) + analysis.temp_size_in_bytes + analysis.output_size_in_bytes - (4 << 20)
    monkeypatch.setattr(cli, "available_memory_bytes", lambda: needed)
    cli.check_memory("training", like, compiled)
    monkeypatch.setattr(cli, "available_memory_bytes", lambda: needed - 1)
    with pytest.raises(ValueError, match="training would need about"):
        cli.check_memory("training", like, compiled)


def test_the_memory_check_sees_the_process_address_space_limit():
    # Under RLIMIT_AS (or a cgroup's limit) a machine's free memory is not the process's.
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
            "from utils import cli; print(cli.available_memory_bytes())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert 0 < int(out) < 2**30


# ------------------------------------------------------------------------------------------------
# The machine
# ------------------------------------------------------------------------------------------------
CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B45
cpu family\t: 26
flags\t\t: fpu sse2 avx2 {flag}

processor\t: 1
model name\t: Another
"""


@pytest.mark.parametrize("flag, avx512", [("avx512f avx512bw", "AVX-512"),
                                          ("avx512fp16 avx512_bf16", "no AVX-512")])
def test_the_machine_is_the_first_processors_model_family_cores_and_avx512(tmp_path, flag, avx512):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO.format(flag=flag))
    cores = len(os.sched_getaffinity(0))
    assert cli.machine(cpuinfo=str(cpuinfo)) == (
        f"AMD EPYC 9B45, CPU family 26, {cores} cores, {avx512}")


def test_accelerators_come_first_and_cpus_add_nothing(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO.format(flag=""))
    cpu = cli.machine(cpuinfo=str(cpuinfo))
    gpu = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")
    assert cli.machine([gpu, gpu], str(cpuinfo)) == f"NVIDIA H200 x 2 ({cpu})"
    host = types.SimpleNamespace(platform="cpu", device_kind="cpu")
    assert cli.machine([host], str(cpuinfo)) == cpu


def test_a_machine_without_cpuinfo_is_still_described(tmp_path):
    assert "CPU family ?" in cli.machine(cpuinfo=str(tmp_path / "missing"))


@pytest.mark.parametrize("value, recorded", [
    (None, {}), ("highest", {}), ("float32", {}),
    ("high", {"env_vars": "JAX_DEFAULT_MATMUL_PRECISION=high"}),
    ("default", {"env_vars": "JAX_DEFAULT_MATMUL_PRECISION=default"})])
def test_a_record_names_the_precision_the_environment_sets_other_than_the_scripts(monkeypatch,
                                                                                value, recorded):
    # A TPU computes other numbers at another precision: a record's command must carry it.
    if value is None:
        monkeypatch.delenv("JAX_DEFAULT_MATMUL_PRECISION", raising=False)
    else:
        monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", value)
    assert cli.env_vars() == recorded

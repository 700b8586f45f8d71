"""Tests of utils/cli.py: the flags a command line gives are found, whichever way they are spelt;
the memory check counts a donated state once and sees the process's own limit. Every argument
check, run as a user meets it: test_ppo_breakout_stops.py."""

import subprocess
import sys

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

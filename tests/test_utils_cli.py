"""Tests of utils/cli.py: the flags a command line gives are found, whichever way they are spelt.
Every argument check, run as a user meets it: test_ppo_breakout_run.py."""

import pytest

import ppo_breakout as ppo
from utils import cli


@pytest.mark.parametrize("argv, given", [
    (["--hidden-sizes", "8", "8", "--seed=3"], {"hidden_sizes", "seed"}),
    (["--hidden_sizes", "8", "--no-save-model"], {"hidden_sizes", "save_model"}),
    (["--exp-name", "seed"], {"exp_name"}),
    ([], set()),
])
def test_the_flags_a_command_line_gives_are_found(argv, given):
    assert cli.given_fields(ppo.Args, argv) == given

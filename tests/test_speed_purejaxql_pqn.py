"""Tests of speed/purejaxql_pqn.py, which runs under purejaxql's own packages: what it asks
purejaxql's config for, the commit it records, and a module that needs the standard library alone
to import (its own imports of purejaxql, JAX and Hydra wait for main)."""

import os
import subprocess
import sys

from speed import purejaxql_pqn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_overrides_are_its_minatar_config_without_tests_wandb_or_saving():
    assert purejaxql_pqn.overrides("Asterix-MinAtar", 2_000_000) == [
        "+alg=pqn_minatar", "alg.ENV_NAME=Asterix-MinAtar", "alg.TOTAL_TIMESTEPS=2000000",
        "alg.TEST_DURING_TRAINING=False", "WANDB_MODE=disabled", "SAVE_PATH=null"]


def test_the_commit_says_whether_the_checkout_has_changes(tmp_path):
    assert purejaxql_pqn.commit(str(tmp_path)) == ""  # not a git checkout

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "f").write_text("a")
    git("add", "f")
    git("commit", "-q", "-m", "c")
    head = git("rev-parse", "HEAD")
    assert purejaxql_pqn.commit(str(tmp_path)) == head
    (tmp_path / "f").write_text("b")
    assert purejaxql_pqn.commit(str(tmp_path)) == head + "-dirty"


def test_it_imports_with_the_standard_library_alone():
    code = f"import sys; sys.path.insert(0, {ROOT!r}); import speed.purejaxql_pqn"
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr

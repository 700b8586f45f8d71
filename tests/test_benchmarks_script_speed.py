"""Tests of benchmarks/script_speed.py: bad input refused with one line before anything runs."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def empty_repository(tmp_path_factory):
    """A git repository without commits, where --base names none, in a checkout or an archive."""
    path = tmp_path_factory.mktemp("repository")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return str(path / ".git")


@pytest.mark.parametrize("flags, git_dir, message", [
    (["--rounds", "0"], None, "error: --rounds must be positive, got 0"),
    (["--base", "no-such-commit"], "empty",
     "error: --base no-such-commit: fatal: invalid reference: no-such-commit"),
    (["--base", "fc64c6e"], "missing", "error: --base fc64c6e: the earlier commit comes from a "
     "git checkout, and {root} is not one"),
    (["--out", "{existing}"], None, "error: --out {existing} exists; choose another name"),
])
def test_script_speed_refuses_bad_input_with_one_line_before_running_anything(
        tmp_path, empty_repository, flags, git_dir, message):
    existing = tmp_path / "kept.json"
    existing.write_text("{}")
    flags = [f.format(existing=existing) for f in flags]
    # GIT_DIR stands in for the tree's own repository, so the test reads the same without one.
    git_dirs = {"empty": empty_repository, "missing": os.path.join(tmp_path, "no-repository")}
    env = os.environ | ({"GIT_DIR": git_dirs[git_dir]} if git_dir else {})
    script = os.path.join(ROOT, "benchmarks", "script_speed.py")
    result = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message.format(existing=existing, root=ROOT)]
    assert existing.read_text() == "{}" and os.listdir(tmp_path) == ["kept.json"]

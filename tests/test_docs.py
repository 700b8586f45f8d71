"""Tests of the pages (README.md, docs/, the models/ and results/ READMEs): every `python PATH.py`
command they give names a file that exists, and its `--help` exits 0. CHANGELOG.md is left out: it
names the paths a change left behind."""

import glob
import importlib
import os
import re

import pytest

from helpers import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(glob.glob("docs/*.md", root_dir=ROOT)), "models/README.md",
         "results/README.md"]
# A command run in another commit's tree (`git checkout SHA && python ...`) names that tree's paths.
COMMAND = re.compile(r"(?<!&& )\bpython3? (?:-m )?([\w./-]+\.py)\b")


def documented_paths() -> dict[str, list[str]]:
    """Each path a page runs with `python`, and the pages that run it; an upper-case name
    (`SCRIPT.py`) stands for any script and is left out, and so is a command run after a `git
    checkout` of another commit."""
    paths: dict[str, list[str]] = {}
    for page in PAGES:
        with open(os.path.join(ROOT, page)) as f:
            for match in COMMAND.finditer(f.read()):
                path = match.group(1)
                if not os.path.basename(path)[:-3].isupper():
                    paths.setdefault(path, []).append(page)
    return paths


def test_the_pages_run_the_scripts_the_tools_and_the_speed_benchmarks():
    paths = documented_paths()
    assert {"ppo_breakout.py", "pqn_minatar.py", "dqn_minatar.py", "tools/tune.py",
            "tools/make_tables.py", "speed/loop_speed.py"} <= set(paths)


@pytest.mark.parametrize("path", sorted(documented_paths()))
def test_each_documented_command_exists_and_its_help_exits_0(path, tmp_path):
    file = os.path.join(ROOT, path)
    assert os.path.isfile(file), f"{path}, run in {sorted(set(documented_paths()[path]))}"
    module = importlib.import_module(os.path.splitext(path)[0].replace("/", "."))
    result = run_main(module, tmp_path, "--help", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower(), result.stdout[-2000:]

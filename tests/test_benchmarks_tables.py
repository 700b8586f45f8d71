"""Tests of benchmarks/make_tables.py: the docs' tables are the committed JSON's, and a stale one is caught."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import make_tables, stats  # noqa: E402


def test_committed_docs_hold_the_tables_of_the_committed_json():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "make_tables.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_a_block_is_replaced_whole_and_the_text_around_it_kept(monkeypatch):
    monkeypatch.setitem(make_tables.TABLES, "speed", lambda: "| new |\n|---|")
    doc = "before\n<!-- begin: speed -->\n| old |\n| stale row |\n<!-- end: speed -->\nafter\n"
    assert make_tables.with_tables(doc) == "before\n<!-- begin: speed -->\n| new |\n|---|\n<!-- end: speed -->\nafter\n"
    empty = "<!-- begin: speed -->\n<!-- end: speed -->"  # a new page's block is filled too
    assert make_tables.with_tables(empty) == "<!-- begin: speed -->\n| new |\n|---|\n<!-- end: speed -->"


def test_check_fails_on_a_stale_table(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("<!-- begin: confirmation -->\n| typed by hand |\n<!-- end: confirmation -->\n")
    monkeypatch.setattr(make_tables, "ROOT", str(tmp_path))
    monkeypatch.setattr(make_tables, "DOCS", ("page.md",))
    monkeypatch.setattr(make_tables, "load", lambda *parts: _fake_confirmation())
    monkeypatch.setattr(sys, "argv", ["make_tables.py", "--check"])
    with pytest.raises(SystemExit) as exit_:
        make_tables.main()
    assert exit_.value.code == 1


def _fake_confirmation() -> dict:
    return {"seeds": [1, 2, 3, 4], "eval_returns": [10.0, 20.0, 30.0, 40.0], "timing": {"train_seconds": 1.0},
            "command": "python benchmarks/tune.py"}


def test_evidence_rows_compare_on_the_alternatives_seeds(monkeypatch):
    # The defaults ran seeds 1-4, the alternative seeds 3-4: the comparison must use the defaults' 3-4.
    defaults = {"seeds": [1, 2, 3, 4], "eval_returns": [100.0, 100.0, 10.0, 20.0]}
    alternative = {"seeds": [3, 4], "eval_returns": [30.0, 40.0], "changed_args": {"gae_lambda": 0.95}}
    files = {make_tables.EVIDENCE_DEFAULTS: defaults, "gae_lambda_0.95.json": alternative}
    monkeypatch.setattr(make_tables, "EVIDENCE", [("--ppo.gae-lambda 0.95", 2)])
    monkeypatch.setattr(make_tables, "load", lambda *parts: files[parts[-1]])
    row = make_tables.evidence_table().splitlines()[-1]
    difference = stats.compare(np.array([10.0, 20.0]), np.array([30.0, 40.0]))["mean_difference"]
    assert f"{difference['value']:+.1f}" == "+20.0" and "+20.0" in row
    assert "| 3-4 |" in row and "| `gae_lambda` 0.9 | 0.95 |" in row


def test_every_evidence_file_holds_the_setting_its_command_names():
    for flags, num_seeds in make_tables.EVIDENCE:
        with open(os.path.join(ROOT, make_tables.RESULTS, "evidence", make_tables.evidence_file(flags))) as f:
            result = json.load(f)
        assert len(result["seeds"]) == num_seeds, flags
        (name, value), = result["changed_args"].items()
        assert flags.split()[0] == "--ppo." + name.replace("_", "-"), flags
        assert " ".join(map(str, value if isinstance(value, list) else [value])) == " ".join(flags.split()[1:])


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


def test_commands_of_results_from_before_a_change_of_defaults_pin_the_earlier_values():
    old = {"layer_norm": False, "sticky_action_prob": 0.0}
    assert make_tables.pinned("python benchmarks/tune.py --out a.json", old) == (
        "python benchmarks/tune.py --out a.json --ppo.no-layer-norm --ppo.sticky-action-prob 0.0"
        " --ppo.conv-channels 0")  # a run from before the convolution records no conv_channels
    assert make_tables.pinned("python benchmarks/tune.py --out a.json", None).endswith(
        "--ppo.no-layer-norm --ppo.sticky-action-prob 0.0 --ppo.conv-channels 0")  # older files record none
    today = {"layer_norm": True, "sticky_action_prob": 0.1, "conv_channels": 8}
    assert make_tables.pinned("python benchmarks/tune.py --out b.json", today) == (
        "python benchmarks/tune.py --out b.json")
    # A flag the command gives itself stays as it is; the script's flags go into --script-args.
    assert make_tables.pinned("python benchmarks/tune.py --ppo.layer-norm", {"layer_norm": True}) == (
        "python benchmarks/tune.py --ppo.layer-norm --ppo.sticky-action-prob 0.0 --ppo.conv-channels 0")
    given = "python benchmarks/tune.py --ppo.sticky-action-prob 0.05 --ppo.conv-channels 0"
    assert make_tables.pinned(given, {**today, "sticky_action_prob": 0.05, "conv_channels": 0}) == given
    assert make_tables.pinned("python benchmarks/tune.py", {**today, "conv_channels": 0}) == (
        "python benchmarks/tune.py --ppo.conv-channels 0")
    assert make_tables.pinned("python benchmarks/results_table.py '--script-args=--seed 1'", None) == (
        "python benchmarks/results_table.py '--script-args=--no-layer-norm --sticky-action-prob 0.0"
        " --conv-channels 0 --seed 1'")

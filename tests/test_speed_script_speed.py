"""Tests of speed/script_speed.py: the versions it alternates, labelled as the committed
reports are; bad input refused with one line before anything runs."""

import json
import os
import subprocess
import sys

import pytest

from speed import script_speed
from tools import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def versions(**flags) -> dict:
    return script_speed.versions_of(script_speed.Args(**flags), "/tmp")


def test_an_earlier_commit_this_tree_and_its_variants_keep_their_labels():
    found = versions(base=("fc64c6e", "aee73fa"),
                     variant=("--no-diagnostics", " --hidden-sizes 8 8"))
    assert list(found) == ["fc64c6e", "aee73fa", "this tree", "this tree, --no-diagnostics",
                           "this tree,  --hidden-sizes 8 8"]
    assert [(v.tree, v.flags, v.cores) for v in found.values()] == [
        ("/tmp/base0", [], ""), ("/tmp/base1", [], ""), (ROOT, [], ""),
        (ROOT, ["--no-diagnostics"], ""),
        (ROOT, ["--hidden-sizes", "8", "8"], "")]


def test_an_environment_variant_runs_this_tree_with_its_variable_set():
    found = versions(env_variant=("MALLOC_ARENA_MAX=16",), cores_devices=("0:1",))
    assert list(found) == ["this tree on 0:1", "this tree, MALLOC_ARENA_MAX=16 on 0:1"]
    assert [v.env for v in found.values()] == [{}, {"MALLOC_ARENA_MAX": "16"}]


@pytest.mark.parametrize("variant", ["MALLOC_ARENA_MAX", "=16", "A B=1"])
def test_an_environment_variant_that_is_not_name_equals_value_exits_2(variant, capsys):
    with pytest.raises(SystemExit) as exit_:
        versions(env_variant=(variant,))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --env-variant {variant}: ")


def test_cores_and_devices_alone_are_labelled_by_their_configuration():
    found = versions(cores_devices=("0:1", "0:2"))
    assert list(found) == ["0:1", "0:2"]  # as device_speed.json's rounds are keyed
    assert [(v.tree, v.cores, v.devices) for v in found.values()] == [(ROOT, "0", 1),
                                                                       (ROOT, "0", 2)]
    crossed = versions(base=("abc1234",), cores_devices=("0:1",))
    assert list(crossed) == ["abc1234 on 0:1", "this tree on 0:1"]


@pytest.mark.parametrize("config", ["0", "0:0", ":2", "0,x:1", "9999:1"])
def test_a_configuration_that_cannot_run_exits_2(config, capsys):
    with pytest.raises(SystemExit) as exit_:
        versions(cores_devices=(config,))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --cores-devices {config}: ")


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
    (["--cold-cache", "--flags=--seed 1 --jax-cache-dir c"], None, "error: --cold-cache gives "
     "every run its own --jax-cache-dir; leave it out of the flags"),
])
def test_script_speed_refuses_bad_input_with_one_line_before_running_anything(
        tmp_path, empty_repository, flags, git_dir, message):
    existing = tmp_path / "kept.json"
    existing.write_text("{}")
    flags = [f.format(existing=existing) for f in flags]
    # GIT_DIR stands in for the tree's own repository, so the test reads the same without one.
    git_dirs = {"empty": empty_repository, "missing": os.path.join(tmp_path, "no-repository")}
    env = os.environ | ({"GIT_DIR": git_dirs[git_dir]} if git_dir else {})
    script = os.path.join(ROOT, "speed", "script_speed.py")
    result = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message.format(existing=existing, root=ROOT)]
    assert existing.read_text() == "{}" and os.listdir(tmp_path) == ["kept.json"]


@pytest.mark.parametrize("cold", [False, True])
def test_a_cold_cache_gives_each_run_a_new_empty_cache_and_skips_the_warm_up(cold, tmp_path,
                                                                             monkeypatch):
    # A cold run's peak is what a first run of the script pays: one warm-up, or one cache shared
    # by two runs, would measure the warm peak instead.
    seen = []

    def run_script(script, flags, cwd, tree, prefix, env):
        cache = flags[flags.index("--jax-cache-dir") + 1] if "--jax-cache-dir" in flags else None
        seen.append(cache and (os.path.dirname(cache) == cwd, os.listdir(cache)))
        assert flags[:2] == ["--load-model", str(tmp_path / "m.safetensors")]
        if cache:
            open(os.path.join(cache, "entry-cache"), "w").close()  # what the run would leave
        return None

    monkeypatch.setattr(common, "run_script", run_script)
    monkeypatch.setattr(common, "speed_fields", lambda run: {"wall_seconds": 1.0,
                                                             "peak_memory_mb": 1.0})
    out = tmp_path / "report.json"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["script_speed.py", "--rounds", "2", "--variant=--x",
                                      "--flags=--load-model m.safetensors", "--out", str(out),
                                      *(["--cold-cache"] if cold else [])])
    script_speed.main()
    report = json.loads(out.read_text())
    assert report["cache"] == ("cold" if cold else "warm")
    assert report["command"] == "python ppo_breakout.py --load-model m.safetensors"  # as typed
    assert len(report["rounds"]) == 2
    if cold:
        assert seen == [(True, [])] * 4  # two versions, two rounds, no warm-up
    else:
        assert seen == [None] * 6  # a warm-up round, then two


def test_a_model_or_run_named_in_the_flags_is_found_from_where_the_command_was_typed(
        tmp_path, monkeypatch):
    # The runs start in a work directory of their own: a relative --load-model would name nothing.
    monkeypatch.chdir(tmp_path)
    flags = ["--seed", "1", "--load-model", "models/a.safetensors", "--resume=runs/b",
             "--exp-name", "models/c"]
    assert script_speed.absolute_paths(flags) == [
        "--seed", "1", "--load-model", str(tmp_path / "models/a.safetensors"),
        f"--resume={tmp_path / 'runs/b'}", "--exp-name", "models/c"]
    assert script_speed.absolute_paths(["--load-model", "/m.safetensors"]) == [
        "--load-model", "/m.safetensors"]

"""benchmarks/script_speed.py: the versions it alternates, labelled as the committed reports are."""

import pytest

from benchmarks import script_speed
from benchmarks.common import ROOT


def versions(**flags) -> dict:
    return script_speed.versions_of(script_speed.Args(**flags), "/tmp/base")


def test_an_earlier_commit_this_tree_and_its_variants_keep_their_labels():
    found = versions(base="fc64c6e", variant=("--no-diagnostics", " --hidden-sizes 8 8"))
    assert list(found) == ["fc64c6e", "this tree", "this tree, --no-diagnostics",
                           "this tree,  --hidden-sizes 8 8"]
    assert [(v.tree, v.flags, v.cores) for v in found.values()] == [
        ("/tmp/base", [], ""), (ROOT, [], ""), (ROOT, ["--no-diagnostics"], ""),
        (ROOT, ["--hidden-sizes", "8", "8"], "")]


def test_cores_and_devices_alone_are_labelled_by_their_configuration():
    found = versions(cores_devices=("0:1", "0:2"))
    assert list(found) == ["0:1", "0:2"]  # as device_speed.json's rounds are keyed
    assert [(v.tree, v.cores, v.devices) for v in found.values()] == [(ROOT, "0", 1),
                                                                       (ROOT, "0", 2)]
    crossed = versions(base="abc1234", cores_devices=("0:1",))
    assert list(crossed) == ["abc1234 on 0:1", "this tree on 0:1"]


@pytest.mark.parametrize("config", ["0", "0:0", ":2", "0,x:1", "9999:1"])
def test_a_configuration_that_cannot_run_exits_2(config, capsys):
    with pytest.raises(SystemExit) as exit_:
        versions(cores_devices=(config,))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --cores-devices {config}: ")

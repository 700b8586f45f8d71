"""Tests of tools/restore_probe.py: on the CPU, with the contract's tiny script, a state sent
through a checkpoint's tensors trains on as the live one, in one process and across a save and a
load; a restore that changes the state, and a saved state off by one bit, are found; bad input
gets one line."""

import json

import numpy as np
import safetensors.numpy

from helpers import run_main
from tools import restore_probe
from utils import checkpoint

SCRIPT = ("--script", "tests/tiny_pg.py", "--script-args=--total-timesteps 4096")


def probe(tmp_path, *flags):
    return run_main(restore_probe, tmp_path, *SCRIPT, *flags, timeout=300)


def test_how_tensors_differ_counts_elements_and_tells_equal_numbers_apart():
    a = {"w": np.array([0.0, 1.0, 2.0], np.float32), "b": np.array([True, False]),
         "n": np.array([1, 2], np.int32), "gone": np.zeros(2, np.float32)}
    b = {"w": np.array([-0.0, 1.0, 2.5], np.float32), "b": np.array([True, False]),
         "n": np.array([1, 2], np.int64)}
    assert restore_probe.how_they_differ(a, b) == {
        "w": {"elements": 2, "of": 3, "values_equal": False, "not_finite_on_one_side": 0,
              "max_abs": 0.5},
        "n": {"comparable": False}, "gone": {"comparable": False}}
    signed_zero = restore_probe.how_they_differ({"z": np.zeros(4, np.float32)},
                                                {"z": -np.zeros(4, np.float32)})
    assert signed_zero == {"z": {"elements": 4, "of": 4, "values_equal": True,
                                 "not_finite_on_one_side": 0, "max_abs": 0.0}}
    # NaN (memory never written, say) against a number: counted apart, not hidden in the largest
    # difference, which is over the elements finite on both sides (None where there are none).
    nan = restore_probe.how_they_differ({"x": np.array([np.nan, 2.0, 3.0], np.float32)},
                                        {"x": np.array([1.0, 2.0, 3.5], np.float32)})
    assert nan == {"x": {"elements": 2, "of": 3, "values_equal": False,
                         "not_finite_on_one_side": 1, "max_abs": 0.5}}
    inf = restore_probe.how_they_differ({"x": np.array([np.inf], np.float32)},
                                        {"x": np.array([1.0], np.float32)})
    assert inf["x"]["not_finite_on_one_side"] == 1 and inf["x"]["max_abs"] is None
    flipped = restore_probe.how_they_differ({"b": np.array([True, False])},
                                            {"b": np.array([False, False])})
    assert flipped == {"b": {"elements": 1, "of": 2, "values_equal": False}}


def test_in_one_process_a_restored_state_trains_on_as_the_live_one(tmp_path, monkeypatch):
    full, nan_bytes = restore_probe.jnp.full, []

    def recorded(shape, fill_value, *args, **kwargs):  # the memory the probe dirties, in bytes
        made = full(shape, fill_value, *args, **kwargs)
        if np.isnan(fill_value):
            nan_bytes.append(made.nbytes)
        return made

    monkeypatch.setattr(restore_probe.jnp, "full", recorded)
    result = probe(tmp_path, "--out", "r.json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["mode"] == "in_process" and report["differing"] == {}
    assert all(report[name] for name in ("deterministic", "restored_continues_equal",
                                         "fetched_continues_equal", "split_equals_straight",
                                         "recompiled_equal", "after_dirty_memory_equal",
                                         "file_restored_continues_equal", "program_equal"))
    assert report["column_major_on_host"] == []  # the CPU hands every array over row-major
    # Before that check, memory was filled with NaN: a piece per leaf and at least 64 MiB more.
    assert len(nan_bytes) > 1 and sum(nan_bytes) >= 2 ** 26


def test_column_major_arrays_on_the_host_are_listed_and_written_in_their_own_order(
        tmp_path, monkeypatch):
    # As a TPU hands some arrays over: column-major on the host, the values right. The probe lists
    # them, and its state written as a file and read back trains on as the live one.
    import jax
    device_get = jax.device_get

    def column_major(tree):
        return jax.tree.map(lambda x: np.asarray(x, order="F") if isinstance(x, np.ndarray) else x,
                            device_get(tree))

    monkeypatch.setattr(jax, "device_get", column_major)
    result = probe(tmp_path, "--out", "r.json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert "runner.params['policy']['w']" in report["column_major_on_host"]
    assert report["file_restored_continues_equal"]
    # Written as their memory lies (the writer before the fix), they come back transposed.
    monkeypatch.setattr(checkpoint, "row_major", np.asarray)
    result = probe(tmp_path, "--out", "r2.json")
    assert result.returncode == 1
    report = json.loads((tmp_path / "r2.json").read_text())
    assert not report["file_restored_continues_equal"] and report["restored_continues_equal"]
    assert any("['w']" in name for name in report["differing"]["file_restored_continues_equal"])


def test_a_restore_that_changes_a_leaf_is_found(tmp_path, monkeypatch):
    restore = checkpoint.restore

    def off_by_a_little(*args, **kwargs):  # every float leaf nudged, as a lossy round trip would
        import jax
        return jax.tree.map(lambda x: x * np.float32(1.0001) if x.dtype == np.float32 else x,
                            restore(*args, **kwargs))

    monkeypatch.setattr(checkpoint, "restore", off_by_a_little)
    result = probe(tmp_path, "--out", "r.json")
    assert result.returncode == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert not report["restored_continues_equal"] and report["deterministic"]
    assert report["fetched_continues_equal"]  # that path does not restore
    changed = report["differing"]["restored_continues_equal"]
    assert any(name.startswith("runner.params") for name in changed)


def test_across_processes_a_saved_state_trains_on_as_it_did(tmp_path):
    assert probe(tmp_path, "--save", "saved").returncode == 0
    result = probe(tmp_path, "--load", "saved", "--out", "r.json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["mode"] == "load" and report["continues_equal"] and report["differing"] == {}
    assert report["program_equal"] and report["fresh_equal"] and report["fresh_continues_equal"]
    assert (tmp_path / "saved" / restore_probe.PROGRAM).read_text().startswith("HloModule")

    # Another program (another learning rate) is told apart from the saved one.
    other = run_main(restore_probe, tmp_path, "--script", "tests/tiny_pg.py",
                     "--script-args=--total-timesteps 4096 --learning-rate 0.5", "--load", "saved",
                     "--out", "other.json", timeout=300)
    assert other.returncode == 1
    report = json.loads((tmp_path / "other.json").read_text())
    assert not report["program_equal"] and not report["continues_equal"]
    assert not report["fresh_equal"]  # its own start trains elsewhere too

    # One bit of one saved parameter off: the state trains elsewhere, and it is said.
    path = tmp_path / "saved" / restore_probe.SAVED
    with safetensors.safe_open(str(path), "numpy") as f:
        header = f.metadata()
    tensors = safetensors.numpy.load_file(path)
    name = next(n for n, t in tensors.items()
                if t.dtype == np.float32 and "params" in n and np.all(t != 0))  # no denormal made
    flipped = tensors[name].copy()
    # Bit 12 of the mantissa (a relative change of 5e-4): the tiny policy's update rounds away
    # a change in the lowest bits.
    flipped.view(np.uint32).flat[0] ^= 1 << 12
    safetensors.numpy.save_file(tensors | {name: flipped}, path, header)
    result = probe(tmp_path, "--load", "saved", "--out", "r2.json")
    assert result.returncode == 1
    report = json.loads((tmp_path / "r2.json").read_text())
    assert not report["continues_equal"] and report["differing"]
    # This process's own run from the start replays the saving one: it differs in that bit only.
    assert report["fresh_differing"] == {name: {
        "elements": 1, "of": flipped.size, "values_equal": False, "not_finite_on_one_side": 0,
        "max_abs": float(abs(np.float64(flipped.flat[0]) - np.float64(tensors[name].flat[0])))}}
    assert report["fresh_continues_equal"]


def test_bad_input_gets_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_program").mkdir()  # a --save directory without its program's text
    for name in (restore_probe.SAVED, restore_probe.LATER):
        (tmp_path / "no_program" / name).write_bytes(b"")
    for flags, expected in [(("--iterations", "0"), "--iterations must be positive"),
                            (("--save", "a", "--load", "b"), "not both"),
                            (("--save", "empty"), "--save empty exists"),
                            (("--load", "empty"), "not a directory that --save wrote"),
                            (("--load", "no_program"), "not a directory that --save wrote")]:
        result = probe(tmp_path, *flags)
        assert result.returncode != 0
        assert result.stderr.strip().splitlines()[-1].startswith("error:"), result.stderr
        assert expected in result.stderr

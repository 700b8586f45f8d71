"""Tests of utils/checkpoint.py: a state with a typed key round-trips bit for bit, and what was
logged before a checkpoint is on disk once the checkpoint is. The script resumed from its
checkpoints: test_ppo_breakout_run.py."""

import glob
import os

import jax
import numpy as np
import pytest

import ppo_breakout as ppo
from helpers import logged_events
from utils import checkpoint, files, logger


def test_a_state_with_a_typed_key_round_trips_bit_for_bit(tmp_path):
    state = {"key": jax.random.split(jax.random.key(3), 4), "flags": np.array([True, False]),
             "x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    path = str(tmp_path / "state.safetensors")
    files.write_atomically(path, checkpoint.state_bytes({"state": state}, {}))
    tensors, header = files.read_safetensors(path, "")
    restored = checkpoint.restore(path, tensors, header, "state", state)
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]),
                                  jax.random.key_data(state["key"]))
    assert restored["key"].dtype == state["key"].dtype
    np.testing.assert_array_equal(restored["x"], state["x"])
    np.testing.assert_array_equal(restored["flags"], state["flags"])
    with pytest.raises(ValueError, match=r"does not hold state\['x'\] as float32\[2, 4\]"):
        checkpoint.restore(path, tensors, header, "state",
                           state | {"x": np.zeros((2, 4), np.float32)})


def test_a_state_written_from_its_arrays_is_the_file_its_bytes_make(tmp_path):
    # What a checkpoint writes (write_state: safetensors straight from the arrays into the file,
    # the way a replay buffer is not copied in memory) is the file state_bytes's bytes make: the
    # same tensors and header (safetensors orders a header's keys by chance).
    state = {"key": jax.random.key(5), "buffer": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
             "x": jax.numpy.linspace(0.0, 1.0, 7)}
    header = {"iteration": "3"}
    path = str(tmp_path / "checkpoint.safetensors")
    with open(path, "wb") as f:
        f.write(b"the last checkpoint, replaced whole")
    checkpoint.write_state(path, {"runner": state}, header)
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"]  # no temporary file left
    expected = str(tmp_path / "expected.safetensors")
    with open(expected, "wb") as f:
        f.write(checkpoint.state_bytes({"runner": state}, header))
    (tensors, written), (want, want_header) = (files.read_safetensors(p, "") for p in
                                               (path, expected))
    assert written == want_header and sorted(tensors) == sorted(want)
    for name in want:
        assert tensors[name].dtype == want[name].dtype
        np.testing.assert_array_equal(tensors[name], want[name])


def test_what_was_logged_before_a_checkpoint_is_on_disk_once_the_checkpoint_is(tmp_path):
    log = logger.RunLog(str(tmp_path), step=0)
    log.add_scalar("charts/x", 1.0, 7)
    checkpoints = checkpoint.Checkpointer(ppo.__file__, str(tmp_path), ppo.Args(), log)
    checkpoints.save({"x": np.zeros(3)}, checkpoint.fresh_start(), step=7)
    checkpoints.wait()
    assert os.path.exists(tmp_path / checkpoint.CHECKPOINT)
    assert [e.step for e in logged_events(tmp_path) if e.summary.value] == [7]  # the log not closed
    log.add_scalar("charts/x", 2.0, 8)  # and still open: one event file for the whole run
    log.close()
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 1

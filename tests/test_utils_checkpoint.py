"""Tests of utils/checkpoint.py: a state with a typed key round-trips bit for bit, and what was
logged before a checkpoint is on disk once the checkpoint is. The script resumed from its
checkpoints: test_ppo_breakout_stops.py."""

import glob
import os
import threading

import jax
import numpy as np
import pytest

import ppo_breakout as ppo
from helpers import logged_events
from utils import checkpoint, files, logger, training


def test_a_state_with_a_typed_key_round_trips_bit_for_bit(tmp_path):
    state = {"key": jax.random.split(jax.random.key(3), 4), "flags": np.array([True, False]),
             "x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    path = str(tmp_path / "state.safetensors")
    checkpoint.write_state(path, {"state": state}, {})
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


def test_a_column_major_array_is_written_in_its_own_order(tmp_path):
    # A TPU hands some arrays to the host in column-major order (a (256, 3) weight matrix): their
    # values are right, but safetensors writes memory as it lies, so they came back transposed.
    # write_state is what the background writer, the harness and tools/restore_probe.py write.
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    cube = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    state = {"w": np.asfortranarray(x), "cube": cube.transpose(2, 1, 0).copy().transpose(2, 1, 0),
             "count": np.int32(7)}  # and a scalar stays one
    assert not state["w"].flags.c_contiguous and not state["cube"].flags.c_contiguous
    path = str(tmp_path / "state.safetensors")
    checkpoint.write_state(path, {"state": state}, {})
    tensors, header = files.read_safetensors(path, "")
    restored = checkpoint.restore(path, tensors, header, "state", state)
    np.testing.assert_array_equal(restored["w"], x)
    np.testing.assert_array_equal(restored["cube"], cube)
    assert restored["count"].shape == () and restored["count"] == 7


def test_a_checkpoint_holds_the_state_as_saved_while_the_next_step_takes_over_its_memory(
        tmp_path, monkeypatch):
    # The run's update step is donated the state it steps: the run hands a checkpoint a copy made on
    # the device (training.copy_tree), which the background write brings to the host while the
    # next step writes into the original's memory. Its write waits here until the step ran.
    state = {"key": jax.random.key(5), "buffer": jax.numpy.arange(24, dtype=jax.numpy.uint8),
             "x": jax.numpy.linspace(0.0, 1.0, 7)}
    saved = jax.tree.map(np.array, jax.random.key_data(state["key"])), np.array(state["x"])
    stepped, write = threading.Event(), checkpoint.Checkpointer.write
    monkeypatch.setattr(checkpoint.Checkpointer, "write",
                        lambda self, *a: (stepped.wait(10), write(self, *a)))
    path = str(tmp_path / checkpoint.CHECKPOINT)
    with open(path, "wb") as f:
        f.write(b"the last checkpoint, replaced whole")
    log = logger.RunLog(str(tmp_path), step=0)
    checkpoints = checkpoint.Checkpointer(ppo.__file__, str(tmp_path), ppo.Args(), log)
    checkpoints.save(training.copy_tree(state), checkpoint.fresh_start(), step=7)
    step = jax.jit(lambda s: jax.tree.map(lambda x: x if x.dtype == state["key"].dtype else x + 1,
                                          s), donate_argnums=0)
    try:
        new_state = jax.block_until_ready(step(state))
        assert state["x"].is_deleted() and state["buffer"].is_deleted()  # donated, not kept
    finally:
        stepped.set()
        checkpoints.close()
        log.close()
    assert sorted(os.listdir(tmp_path))[0] == checkpoint.CHECKPOINT  # no temporary file left
    tensors, header = files.read_safetensors(path, "")
    np.testing.assert_array_equal(tensors["runner['x']"], saved[1])
    np.testing.assert_array_equal(tensors["runner['buffer']"], np.arange(24, dtype=np.uint8))
    np.testing.assert_array_equal(tensors["runner['key']"], saved[0])
    assert not np.array_equal(tensors["runner['x']"], new_state["x"])


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

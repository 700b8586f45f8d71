"""Tests of utils/logger.py: a resumed run's log tells TensorBoard to drop what was logged after its
checkpoint."""

from tensorboard.compat.proto.event_pb2 import SessionLog

from helpers import logged_events
from utils import logger


def test_a_resumed_log_starts_by_dropping_what_was_logged_after_its_checkpoint(tmp_path):
    logger.RunLog(str(tmp_path), step=0).close()
    log = logger.RunLog(str(tmp_path), step=4096, purge_step=4097)  # a new second: a new file
    log.close()
    starts = [e.step for e in logged_events(tmp_path) if e.session_log.status == SessionLog.START]
    assert starts == [4097]

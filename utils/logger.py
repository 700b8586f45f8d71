"""The run's TensorBoard log: one event file per process, written as it goes, and the helpers that
log an iteration's scalars and histograms and the final pictures.

Why not tensorboardX's SummaryWriter as it is: it writes from a queue in a thread, and its flush()
does not wait for that queue, so "everything logged so far is on disk" (what a checkpoint needs)
would take closing the file. Writing each event synchronously costs microseconds per iteration."""

import io
import os
import time

import numpy as np
from PIL import Image
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.summary import histogram_raw, text


class RunLog:
    """An event file in `logdir`. A resumed run passes `purge_step`: TensorBoard then drops what
    earlier files logged from that step on (a killed run's steps after its checkpoint, which the
    resumed run logs again)."""

    def __init__(self, logdir: str, step: int = 0, purge_step: int | None = None):
        # Event files sort by the second they were made in, then by this suffix (the step they
        # start at), so a resumed log waits for a second that no earlier file was made in.
        made = [int(name.split(".")[3]) for name in os.listdir(logdir)
                if name.startswith("events.out.tfevents.")]
        time.sleep(max(0.0, max(made, default=0) + 1 - time.time()))
        self.events = EventsWriter(os.path.join(logdir, "events"),
                                   filename_suffix=f".{step:012d}.{os.getpid()}")
        if purge_step is not None:
            self.add_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def add_event(self, event: Event) -> None:
        event.wall_time = time.time()
        self.events.write_event(event)

    def add_summary(self, summary: Summary, step: int | None = None) -> None:
        self.add_event(Event(summary=summary, step=step))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.add_summary(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step)

    def add_text(self, tag: str, text_string: str) -> None:
        self.add_summary(text(tag, text_string))

    def flush(self) -> None:
        """Puts everything logged so far into the file."""
        self.events.flush()

    def close(self) -> None:
        self.events.close()


def hyperparameters_text(args) -> str:
    """The run's arguments as a Markdown table, for TensorBoard's text tab."""
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())


def log_scalars(log: RunLog, scalars: dict, step: int) -> None:
    """Scalars of one step as one event, rather than one event a tag."""
    values = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in scalars.items()]
    log.add_summary(Summary(value=values), step)


def log_histograms(log: RunLog, histograms: dict, step: int) -> None:
    """Histograms given as {name: {"counts", "edges"}} (fixed bins counted inside jit), under
    histograms/."""
    for name, h in histograms.items():
        centres = (h["edges"][1:] + h["edges"][:-1]) / 2
        if h["counts"].sum() > 0 and np.isfinite(h["edges"]).all():
            log.add_summary(histogram_raw(
                f"histograms/{name}", min=h["edges"][0], max=h["edges"][-1],
                num=h["counts"].sum(), sum=(centres * h["counts"]).sum(),
                sum_squares=(centres**2 * h["counts"]).sum(),
                bucket_limits=h["edges"][1:].tolist(), bucket_counts=h["counts"].tolist()), step)


def log_encoded_image(log: RunLog, tag: str, data: bytes, step: int) -> None:
    """An encoded PNG or GIF as a TensorBoard image (TensorBoard plays GIFs), without decoding
    it."""
    width, height = Image.open(io.BytesIO(data)).size
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
    log.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


def write_picture(log: RunLog, run_dir: str, name: str, tag: str, data: bytes, step: int) -> None:
    """An encoded picture into the run directory (as `name`) and into TensorBoard (as `tag`)."""
    with open(os.path.join(run_dir, name), "wb") as f:
        f.write(data)
    log_encoded_image(log, tag, data, step)

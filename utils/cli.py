"""What the scripts share around a run: parsing with one-line errors, run directories that never clash,
and stopping cleanly on Ctrl-C. None of it touches the algorithm."""

import contextlib
import io
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable

import tyro


def flag(name: str) -> str:
    """The command-line flag of an Args field: learning_rate -> --learning-rate."""
    return "--" + name.replace("_", "-")


def parse_args(args_type: type, check_args: Callable, description: str, argv: list[str] | None = None):
    """The command line as `args_type`, or exit status 2 with one `error:` line: tyro's own parse errors
    (condensed from its boxed message) and whatever `check_args(args)` returns instead of None."""
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            args = tyro.cli(args_type, args=argv, description=description)
    except SystemExit as exit_:
        if exit_.code:  # tyro's box: a title line, then the message up to a rule
            rule = set("─-╰╯")
            body = [line.strip().strip("│").strip() for line in messages.getvalue().splitlines()[1:]]
            body = list(itertools.dropwhile(lambda line: not line or set(line) <= rule, body))
            message = itertools.takewhile(lambda line: line and not set(line) <= rule, body)
            print(f"error: {' '.join(message)}", file=sys.stderr)
        raise
    error = check_args(args)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    return args


def available_memory_bytes() -> int:
    """Memory the OS can give this process now (MemAvailable), or all of it where that is unknown."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            return int(next(line for line in f if line.startswith("MemAvailable")).split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def make_run_dir(name: str) -> str:
    """A new runs/{name}__{unix time}; never an existing run's directory."""
    base = os.path.join("runs", f"{name}__{int(time.time())}")
    for attempt in range(100):
        run_dir = base + (f"_{attempt}" if attempt else "")
        with contextlib.suppress(FileExistsError):
            os.makedirs(run_dir)
            return run_dir
    raise FileExistsError(f"{base} and 99 more like it exist")


class StopSignals:
    """While active, SIGINT (Ctrl-C) and SIGTERM ask the run to stop at the next safe point, the end
    of the current iteration; a second signal acts at once."""

    def __enter__(self):
        self.received = None
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum, frame):
        self.received = signum
        self.__exit__()

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

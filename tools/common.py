"""What the benchmark scripts share: running a script as its own process and reading what it
reports, alternating rounds of the versions compared, describing the machine, and writing a report.

Any script in the repository root that ends its output with a line `summary: PATH` (the path of its
summary.json) can be run this way; which one is a parameter. So can any other command that ends
its output so (speed/purejaxql_pqn.py for purejaxql). Importing this module starts no JAX.
"""

import contextlib
import datetime
import io
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, NoReturn

from utils import cli, files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY_PREFIX = "summary: "
# The harness's (tools/tune.py) checkpoint in its --checkpoint-dir; named here so that a tool that
# runs the harness as a process can read it without importing the harness, whose imports start JAX.
HARNESS_CHECKPOINT = "tune_checkpoint.safetensors"


class Run(NamedTuple):
    """One finished process: wall time from start to exit, peak resident memory, its output."""
    wall_seconds: float
    peak_rss_mb: float
    returncode: int
    stdout: str
    stderr: str


class ScriptRun(NamedTuple):
    """One run of a script that completed: the process and the summary.json it reported."""
    run: Run
    summary: dict
    summary_path: str


def fail(message: str) -> NoReturn:
    """The tools' and speed benchmarks' refusal: one line on stderr and exit status 2, as the
    scripts' own."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


# ------------------------------------------------------------------------------------------------
# Running a process and reading its summary
# ------------------------------------------------------------------------------------------------
# Linux carries a process's high-water mark of resident memory across fork and exec, so a command
# started from a large process would report at least that process's peak. It runs instead as the
# child of this small launcher, which writes the command's wall time, peak RSS (KiB on Linux) and
# wait status to the file descriptor in argv[1].
LAUNCHER = """
import os, sys, time
report = int(sys.argv[1])
os.set_inheritable(report, False)
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as e:
        print(f"{sys.argv[2]}: {e}", file=sys.stderr)
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
os.write(report, f"{time.perf_counter() - start} {usage.ru_maxrss} {status}".encode())
"""


def run_timed(command: list[str], cwd: str | None = None, env: dict | None = None) -> Run:
    """Runs `command` to its exit; its wall seconds and peak RSS in MiB (os.wait4's rusage of this
    one process and the children it waited for, not the largest child so far)."""
    read_end, write_end = os.pipe()
    try:
        with tempfile.TemporaryFile("w+") as stderr:  # a file, so that no second pipe can block
            process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, str(write_end), *command], cwd=cwd, env=env,
                stdout=subprocess.PIPE, stderr=stderr, text=True, pass_fds=(write_end,))
            os.close(write_end)
            write_end = None
            stdout = process.communicate()[0]
            with os.fdopen(read_end) as report:
                read_end = None
                measured = report.read().split()
            if not measured:  # the launcher itself was killed
                raise RuntimeError(f"{shlex.join(command)}: its launcher ended without a report")
            wall, max_rss, status = measured
            stderr.seek(0)
            errors = stderr.read()
    finally:
        for fd in (read_end, write_end):
            if fd is not None:
                os.close(fd)
    scale = 2**20 if sys.platform == "darwin" else 2**10  # ru_maxrss is in bytes on macOS
    return Run(float(wall), int(max_rss) / scale, os.waitstatus_to_exitcode(int(status)), stdout,
               errors)


def summary_path(stdout: str) -> str:
    """The PATH of the last `summary: PATH` line a script printed (ValueError if there is none)."""
    lines = [line for line in stdout.splitlines() if line.startswith(SUMMARY_PREFIX)]
    if not lines:
        raise ValueError("the script printed no 'summary: PATH' line")
    return lines[-1].removeprefix(SUMMARY_PREFIX).strip()


def read_summary(stdout: str, cwd: str | None = None) -> tuple[dict, str]:
    """The summary.json a script's output names, read from the directory it ran in; and its path."""
    path = os.path.join(cwd or os.getcwd(), summary_path(stdout))
    with open(path) as f:
        return json.load(f), path


def main_in_work_dir(script, flags: list[str]) -> dict:
    """An imported script's main() with `flags`, in this process, as `python SCRIPT FLAGS` run in a
    new work directory (its runs/ goes with it): the summary.json it reported. A run that fails
    stops the caller with one line."""
    name = os.path.splitext(os.path.basename(script.__file__))[0]
    argv = sys.argv
    with tempfile.TemporaryDirectory() as work, contextlib.chdir(work):
        output, errors = io.StringIO(), io.StringIO()
        sys.argv = [script.__file__, *flags]
        try:
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(errors):
                script.main()
        except SystemExit as e:
            if e.code:
                last = (errors.getvalue().strip().splitlines() or ["(nothing on stderr)"])[-1]
                fail(f"{name} {shlex.join(flags)} exited with {e.code}: {last}")
        finally:
            sys.argv = argv
        return read_summary(output.getvalue())[0]


def script_command(script: str, flags: list[str], tree: str = ROOT) -> list[str]:
    """`python TREE/SCRIPT FLAGS...` with this interpreter; `script` is relative to the tree."""
    return [sys.executable, os.path.join(tree, script), *flags]


def run_reporting(command: list[str], cwd: str, env: dict | None = None) -> ScriptRun:
    """Runs any command that ends its output with `summary: PATH` in `cwd`, and reads that summary;
    RuntimeError with its last stderr line if it fails."""
    run = run_timed(command, cwd, env)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no output on stderr)"])[-1]
        raise RuntimeError(f"{shlex.join(command)} exited with {run.returncode}: {last}")
    summary, path = read_summary(run.stdout, cwd)
    return ScriptRun(run, summary, path)


def run_script(script: str, flags: list[str], cwd: str, tree: str = ROOT,
               prefix: Sequence[str] = (), env: dict | None = None) -> ScriptRun:
    """Runs a script of `tree` in `cwd` (its runs/ lands there) behind an optional command `prefix`
    (e.g. taskset); RuntimeError with its last stderr line if it fails."""
    return run_reporting([*prefix, *script_command(script, flags, tree)], cwd, env)


def speed_fields(run: ScriptRun) -> dict:
    """What a speed table reads of one run: the process's wall time and peak memory, and the parts
    of summary.json that time it (those the script reports) and its sampled evaluation if any."""
    fields = {"wall_seconds": run.run.wall_seconds, "peak_memory_mb": run.run.peak_rss_mb}
    fields |= {k: run.summary[k] for k in ("sps", "compile_seconds", "train_seconds",
                                           "eval_seconds") if k in run.summary}
    sampled = run.summary.get("eval", {}).get("sampled", {})
    if "mean" in sampled:
        fields["sampled"] = sampled["mean"]
    return fields


# ------------------------------------------------------------------------------------------------
# Alternating rounds
# ------------------------------------------------------------------------------------------------
def progress(run: dict) -> str:
    """One run in a round's line: what the script's summary.json reported of its time."""
    parts = [f"{run['wall_seconds']:.2f} s", f"{run['peak_memory_mb']:.0f} MB"]
    if "sps" in run:
        parts.append(f"{run['sps']:,.0f} SPS")
    if "compile_seconds" in run:
        parts.append(f"compile {run['compile_seconds']:.2f} s")
    return ", ".join(parts)


def alternate(versions: dict[str, Callable[[], dict]], rounds: int,
              warm_up: Collection[str] | None = None) -> list[dict[str, dict]]:
    """Runs every version once per round, in turn, so that slow drifts of the machine hit them
    alike: `rounds` recorded rounds of {label: speed fields} after one unrecorded round of the
    versions in `warm_up` (all by default), which fills their compilation caches. A line per
    recorded round goes to stdout."""
    warm_up = versions if warm_up is None else warm_up
    for label in warm_up:
        versions[label]()
    recorded = []
    for _ in range(rounds):
        runs = {label: run() for label, run in versions.items()}
        recorded.append(runs)
        print(" | ".join(f"{label}: {progress(r)}" for label, r in runs.items()), flush=True)
    return recorded


def round_ratios(rounds: list[dict[str, dict]], own: str, ref: str, field: str = "sps") -> dict:
    """`own`'s `field` over `ref`'s, per round (both ran in it, so a busy spell hits both), with
    their median and range: the interval a few rounds give."""
    ratios = [r[own][field] / r[ref][field] for r in rounds]
    return {"per_round": ratios, "median": statistics.median(ratios),
            "range": [min(ratios), max(ratios)]}


# ------------------------------------------------------------------------------------------------
# The machine: utils.cli's description, which a run's summary.json records too
# ------------------------------------------------------------------------------------------------
cpu_info, num_cores, machine = cli.cpu_info, cli.num_cores, cli.machine


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------
CACHE_FLAG = re.compile(r"\s*--(\w+\.)?jax[-_]cache[-_]dir(=|\s+)[^\s'\"]+")


def without_cache_dir(command: str) -> str:
    """`command` without its --jax-cache-dir flags (a script's, or a harness's --ppo.* one, also
    inside --script-args): a cache changes no result, and its path is one machine's."""
    return CACHE_FLAG.sub("", command)


def invocation(argv: list[str] | None = None) -> str:
    """The command line that ran this benchmark, as one runs it from the repository root."""
    argv = sys.argv if argv is None else argv
    return shlex.join(["python", os.path.relpath(os.path.abspath(argv[0]), ROOT), *argv[1:]])


def check_out(out: str) -> None:
    """Refuses an --out that exists (a measurement is never overwritten) or has no directory."""
    if not out:
        return
    if os.path.exists(out):
        fail(f"--out {out} exists; choose another name")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        fail(f"--out {out}: its directory does not exist")


def utc_date() -> str:
    """Now, in UTC, to the second (ISO 8601)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def new_report(command: str | None = None, **fields) -> dict:
    """A report's head: the command it measured (by default this benchmark's own), the benchmark's
    command line, the environment it needs to run the same products (utils.cli.env_vars, where
    any), the machine and the date (UTC); then `fields`."""
    return {"command": command or invocation(), "benchmark": invocation(), **cli.env_vars(),
            "machine": machine(), "date": utc_date(), **fields}


def write_report(report: dict, out: str = "", echo: bool = True) -> None:
    """Writes the report as JSON to `out` (if given) and prints it to stdout (if `echo`)."""
    text = json.dumps(report, indent=1)
    if out:  # whole or not at all: a benchmark killed while writing leaves the last one
        files.write_atomically(out, (text + "\n").encode())
    if echo:
        print(text)

"""Whether a run stopped partway and continued ends as the run never stopped, to the last bit, for
any script that keeps utils/contract.py, on the devices JAX has here (a GPU or TPU where there is
one). The tests show it on the CPU; this shows it where the long runs are trained.

- The script (the default): run whole; run again, stopped with SIGTERM after its --stop-after'th
  progress line (it ends the iteration it is in and writes a checkpoint), then `--resume`d.
  Compared: every tensor of model.safetensors and of the last checkpoint (but its learning curve's
  seconds), every logged scalar but SPS, and the final evaluation.
- The harness (--harness): tools/tune.py run whole; again with --checkpoint-dir, killed (SIGKILL)
  after its --stop-after'th chunk, then the same command again, which continues from the last chunk
  it wrote; that run must train only the chunks after it. Compared: the per-seed returns under
  both protocols (both policies with --both-policies), the learning curves and the statistics.

Where they differ, it says where the two parted: the first logged step (first_differing_step) or
chunk (first_differing_chunk) that differs. One before the stop means the runs parted before any
resume.

Each run is its own process, in a work directory of its own, with the same flags.

Run:  python tools/resume_check.py --script ppo_breakout --stop-after 3 \\
          '--script-args=--num-devices 1 --total-timesteps 10000000' --out resume_ppo.json
"""

import contextlib
import dataclasses
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import jax
import safetensors.numpy
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import common  # noqa: E402
from utils import checkpoint  # noqa: E402

# What the harness's result holds of the training and its evaluation (not its timings or command).
HARNESS_RESULTS = ("seeds", "eval_returns", "eval_returns_minatar", "minatar_bound_hits", "curve",
                   "summary", "summary_minatar", "pooled_curve", "other_policy", "stability")
ENDED_FIRST = ("the run ended before the stop reached it: give a smaller --stop-after than its "
               "progress lines")


@dataclasses.dataclass
class Args:
    script: str = "ppo_breakout"
    """the script (a name, or a path relative to the project)"""
    script_args: str = ""
    """the script's flags, as one string; with --harness, tools/tune.py's flags and the script's
    own as --NAME.* flags (--num-seeds 8 --ppo.total-timesteps 1000000)"""
    harness: bool = False
    """check tools/tune.py's --checkpoint-dir instead of the script's --resume"""
    stop_after: int = 3
    """stop the second run after this many progress lines (the script's: one each tenth of
    training; the harness's: one per chunk), fewer than it prints: a run already at its end has
    nothing left to resume. The harness's last chunk may be given: killed after it, the run
    again only restores its seeds and evaluates them"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


@contextlib.contextmanager
def started(command: list[str], cwd: str):
    """`command` running in `cwd`, its stderr and stdout as one stream (one pipe, which cannot
    block on the other) of lines, each as it is printed; killed and reaped on the way out if still
    running (an error here, Ctrl-C), before its work directory goes."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        if process.stdout.closed:  # read to its end already (finish)
            process.wait()
        else:
            process.communicate()


def finish(process: subprocess.Popen, command: list[str], expected: int = 0) -> str:
    """Waits for `process`; the rest of its output. A return code other than `expected` stops this
    tool with the command's last line of output."""
    output = process.communicate()[0]
    if process.returncode != expected:
        last = (output.strip().splitlines() or ["(no output)"])[-1]
        common.fail(f"{shlex.join(command)} exited with {process.returncode}: {last}")
    return output


def run(command: list[str], cwd: str) -> str:
    with started(command, cwd) as process:
        return finish(process, command)


def stop_after(process: subprocess.Popen, is_progress, count: int, sig: int) -> int:
    """Sends `sig` to `process` after `count` lines of its output that `is_progress`; the number of
    progress lines it printed before that (fewer: it ended first)."""
    seen = 0
    for line in process.stdout:
        seen += is_progress(line)
        if seen == count:
            process.send_signal(sig)
            break
    return seen


def stopped(process: subprocess.Popen, command: list[str], is_progress, count: int, sig: int,
            expected: int) -> None:
    """Stops `process` after `count` progress lines with `sig`; this tool stops with one line
    unless it exits as a stopped run does (`expected`)."""
    seen = stop_after(process, is_progress, count, sig)
    if seen < count:
        common.fail(f"the run printed {seen} progress lines, fewer than --stop-after {count}")
    output = process.communicate()[0]
    if process.returncode in (0, -signal.SIGTERM):  # finished, or its handler already gone
        common.fail(ENDED_FIRST)
    if process.returncode != expected:
        last = (output.strip().splitlines() or ["(no output)"])[-1]
        common.fail(f"{shlex.join(command)} exited with {process.returncode}: {last}")


def run_dir(work: str) -> str:
    paths = glob.glob(os.path.join(work, "runs", "*"))
    if len(paths) != 1:
        common.fail(f"the run made {len(paths)} run directories in {work}/runs, not one")
    return paths[0]


def what_a_run_ends_with(path: str) -> dict:
    """Every tensor of the model file and of the last checkpoint (but its learning curve's seconds),
    every logged scalar but SPS (step, value), and the final evaluation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tensors = {}
    for name in ("model.safetensors", checkpoint.CHECKPOINT):
        with open(os.path.join(path, name), "rb") as f:
            tensors |= {f"{name}:{key}": (str(t.dtype), t.shape, t.tobytes())
                        for key, t in safetensors.numpy.load(f.read()).items()
                        if key != "history.seconds"}
    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
               for tag in events.Tags()["scalars"] if tag != "charts/SPS"}
    with open(os.path.join(path, "summary.json")) as f:
        summary = json.load(f)
    return {"tensors": tensors, "scalars": scalars, "evaluation": summary["eval"]}


def differing(a: dict, b: dict) -> list[str]:
    """The names, in each part of two runs' ends, that differ (or that only one has)."""
    return sorted(f"{part}/{name}" for part in a for name in set(a[part]) | set(b[part])
                  if a[part].get(name) != b[part].get(name))


def first_differing_step(a: dict, b: dict) -> int | None:
    """The first environment step at which two runs' logged scalars ({tag: [(step, value)]})
    differ, or one logged what the other did not: before the stop, the runs parted before any
    resume; None where they agree throughout."""
    steps = []
    for tag in set(a) | set(b):
        x, y = dict(a.get(tag, [])), dict(b.get(tag, []))
        steps += [step for step in set(x) | set(y) if x.get(step) != y.get(step)]
    return min(steps, default=None)


def first_differing_chunk(a: dict, b: dict) -> int | None:
    """The first chunk (counted from 1) whose per-seed learning curve differs between two harness
    results' curves ({"steps", "return_sums", "episodes"}, the sums per seed and chunk); None
    where none does."""
    def at(curve: dict, chunk: int) -> list:  # the chunk's step and every seed's sums in it
        return [curve["steps"][chunk:chunk + 1]] + [
            seed[chunk:chunk + 1] for name in ("return_sums", "episodes") for seed in curve[name]]

    for chunk in range(max(len(a["steps"]), len(b["steps"]))):
        if at(a, chunk) != at(b, chunk):
            return chunk + 1
    return None


def check_script(script_path: str, flags: list[str], count: int) -> dict:
    command = [sys.executable, script_path, *flags]
    seconds = {}
    with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as cut:
        start_time = time.time()
        run(command, whole)
        seconds["whole"] = time.time() - start_time
        with open(os.path.join(run_dir(whole), "summary.json")) as f:
            total = json.load(f)["global_step"]

        start_time = time.time()
        with started(command, cut) as process:
            stopped(process, command, lambda line: " | SPS " in line, count, signal.SIGTERM,
                    expected=128 + signal.SIGTERM)
        seconds["stopped"] = time.time() - start_time
        path = run_dir(cut)
        with open(os.path.join(path, "summary.json")) as f:
            stopped_at = json.load(f)["global_step"]
        if stopped_at >= total:  # stopped after its last iteration: nothing left to resume
            common.fail(ENDED_FIRST)

        start_time = time.time()
        run([*command, "--resume", path], cut)
        seconds["resumed"] = time.time() - start_time
        ends = what_a_run_ends_with(run_dir(whole)), what_a_run_ends_with(path)
        with open(os.path.join(path, "summary.json")) as f:
            summary = json.load(f)
    diff = differing(*ends)
    return {"stopped_at_step": stopped_at, "resumed_at_step": summary["resumed_at_step"],
            "global_step": summary["global_step"], "identical": not diff, "differing": diff,
            "first_differing_step": first_differing_step(ends[0]["scalars"], ends[1]["scalars"]),
            "compared": {part: len(names) for part, names in ends[0].items()},
            "evaluation": summary["eval"], "whole_evaluation": ends[0]["evaluation"],
            "seconds": seconds}


def chunk_numbers(output: str) -> list[int]:
    """The chunks the harness's progress lines say it trained ("chunk  3/10 | ...")."""
    return [int(line.split()[1].split("/")[0]) for line in output.splitlines()
            if line.startswith("chunk ")]


def check_harness(flags: list[str], count: int) -> dict:
    tune_path = os.path.join(ROOT, "tools", "tune.py")
    seconds, results = {}, []
    with tempfile.TemporaryDirectory() as work:
        whole = [sys.executable, tune_path, *flags, "--out", "whole.json"]
        start_time = time.time()
        run(whole, work)
        seconds["whole"] = time.time() - start_time

        resumed = [sys.executable, tune_path, *flags, "--checkpoint-dir", "chunks",
                   "--out", "resumed.json"]
        start_time = time.time()
        with started(resumed, work) as process:
            stopped(process, resumed, lambda line: line.startswith("chunk "), count,
                    signal.SIGKILL, expected=-signal.SIGKILL)
        seconds["stopped"] = time.time() - start_time
        # Where the killed run's last checkpoint stands: the run again must go on from there.
        saved = os.path.join(work, "chunks", common.HARNESS_CHECKPOINT)
        with safetensors.safe_open(saved, "numpy") as f:
            done = int(json.loads(f.metadata()["chunks_done"]))
        start_time = time.time()
        trained = chunk_numbers(run(resumed, work))
        seconds["resumed"] = time.time() - start_time
        for name in ("whole.json", "resumed.json"):
            with open(os.path.join(work, name)) as f:
                results.append(json.load(f))
    chunks = len(results[0]["curve"]["steps"])
    if not count <= done <= chunks or trained != list(range(done + 1, chunks + 1)):
        common.fail(f"the run again trained chunks {trained} after a checkpoint of {done} of "
                    f"{chunks}: it did not go on from where it was killed")
    diff = [name for name in HARNESS_RESULTS if results[0].get(name) != results[1].get(name)]
    return {"stopped_after_chunk": count, "resumed_after_chunk": done, "chunks": chunks,
            "identical": not diff, "differing": diff,
            "first_differing_chunk": first_differing_chunk(*(r["curve"] for r in results)),
            "eval_returns": results[1]["eval_returns"],
            "eval_returns_minatar": results[1]["eval_returns_minatar"],
            "whole_eval_returns": results[0]["eval_returns"],
            "whole_eval_returns_minatar": results[0]["eval_returns_minatar"], "seconds": seconds}


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if args.stop_after <= 0:
        common.fail(f"--stop-after must be positive, got {args.stop_after}")
    common.check_out(args.out)
    # The script is not imported here (nor any JAX backend started): the runs it starts hold the
    # devices.
    script = os.path.join(ROOT, args.script if args.script.endswith(".py") else f"{args.script}.py")
    if not os.path.isfile(script):
        common.fail(f"--script {args.script}: no such script")
    name = os.path.splitext(os.path.basename(script))[0]
    try:
        flags = shlex.split(args.script_args)
    except ValueError as e:
        common.fail(f"--script-args {args.script_args!r}: {e}")
    refused = {"--quiet": "the harness's progress lines are what it stops on"} if args.harness \
        else {"--no-save-model": "the model files are part of what it compares"}
    for flag, why in refused.items():
        if flag in flags:
            common.fail(f"--script-args {flag}: {why}")
    if args.harness:
        found = check_harness(["--script", args.script, *flags], args.stop_after)
    else:
        found = check_script(script, flags, args.stop_after)
    print(f"{'identical' if found['identical'] else 'DIFFERENT: ' + ', '.join(found['differing'])}",
          file=sys.stderr, flush=True)
    # Only now does this process start JAX's backend: the runs above held the devices.
    common.write_report(common.new_report(
        machine=common.machine(jax.devices()), script=name,
        script_args=args.script_args, mode="harness" if args.harness else "script", **found),
        args.out)
    if not found["identical"]:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Reproduces the docs' results tables (docs/results.md and the scripts' pages): an algorithm script
(ppo_breakout.py, or any other that keeps utils/contract.py, e.g. --script pqn_minatar) run once per
seed, each as its own process.

Each run is timed from outside (process start to exit, so imports, compilation, training, evaluation
and the pictures all count), its peak memory read from the OS, and its summary.json read back. The
evaluation columns are both protocols the script reports: gymnax's (no sticky actions) and MinAtar's
(sticky actions with probability 0.1). `--out` keeps the rows as JSON; `--from-json` prints the
table again from such a file without running anything; `--collect` makes the rows from finished run
directories of the script (runs started by hand) instead of running it; `--scalars` keeps every
logged point of the scalars named, for a figure.

Run:  python tools/results_table.py --seeds 1 2 3 4 5 --num-devices 2 --out results.json
      python tools/results_table.py --script-args="--update-epochs 3"   # other settings
      python tools/results_table.py --script pqn_minatar --total-timesteps 10000000
      python tools/results_table.py \\
          --from-json results/ppo_breakout/tuning/earlier_defaults/readme_table.json
      python tools/results_table.py --script pqn_minatar --collect runs/A runs/B --out r.json
"""

import dataclasses
import json
import os
import shlex
import sys
import time

import numpy as np
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import common  # noqa: E402
from utils import files  # noqa: E402
from utils.evaluation import EVALUATIONS, PROTOCOL_OF, return_tag  # noqa: E402


@dataclasses.dataclass
class Args:
    script: str = "ppo_breakout"
    """the algorithm script run: a script of this project by name, or the path of one"""
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    """the seeds to run, one process each, one after another"""
    total_timesteps: int = 1_000_000
    """passed to the script"""
    num_devices: int = 0
    """passed to the script (0: the script's own default); a seed replays the same run only with
    the same device count: give it in a command meant to reproduce a table"""
    exp_name: str = "results_table"
    """passed to the script; the run directories are
    runs/{env_id}__{exp_name}__{seed}__{time}"""
    script_args: str = ""
    """more arguments for the script, as one string, e.g. --script-args='--update-epochs 3'"""
    out: str = ""
    """write the rows and the command as JSON to this new file ("" writes none)"""
    from_json: str = ""
    """print the table of a JSON file written by --out, and run nothing"""
    collect: tuple[str, ...] = ()
    """make the rows from these finished run directories of --script instead of running it: their
    summary.json, event log and model; the wall seconds are the script's own (from its start), the
    peak memory is not known"""
    scalars: tuple[str, ...] = ()
    """more of each run's logged scalars to keep, every point (e.g. losses/q_values charts/resets):
    a row's `scalars` maps each tag to its steps and values, so a figure can be drawn later"""


def learning_curve(run_dir: str, started: float, max_points: int = 250) -> dict:
    """The run's training return (charts/episodic_return) from its TensorBoard log, at most
    `max_points` evenly spaced points of it, so the JSON can draw the curve later, with each
    point's wall seconds since the process was started (at unix time `started`)."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    if "charts/episodic_return" not in events.Tags()["scalars"]:  # --load-model: no training
        return {"steps": [], "returns": [], "seconds": []}
    points = events.Scalars("charts/episodic_return")
    spaced = np.linspace(0, len(points) - 1, min(max_points, len(points)))
    keep = np.unique(spaced.round().astype(int))
    return {"steps": [points[i].step for i in keep], "returns": [points[i].value for i in keep],
            "seconds": [round(points[i].wall_time - started, 2) for i in keep]}


def eval_curve(run_dir: str) -> dict | None:
    """With --eval-every, the evaluations during training and the final one: at each step, the
    training seconds so far (read back from charts/SPS) and each policy's mean return under each
    protocol ("gymnax/greedy", "minatar/sampled", ...). None for a run evaluated only at the end."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    curve = {f"{PROTOCOL_OF[protocol]}/{mode}": events.Scalars(return_tag(protocol, mode))
             for protocol, mode in EVALUATIONS}
    steps = [point.step for point in next(iter(curve.values()))]
    if len(steps) < 2:
        return None
    sps = {point.step: point.value for point in events.Scalars("charts/SPS")}
    # Milliseconds: a tiny run's iterations on a fast CPU are a few hundredths of a second apart.
    return {"steps": steps, "train_seconds": [round(step / sps[step], 3) for step in steps],
            **{name: [point.value for point in points] for name, points in curve.items()}}


def logged_scalars(run_dir: str, tags: tuple[str, ...]) -> dict:
    """Every logged point of each tag in the run's TensorBoard log: {tag: {steps, values}}. A tag
    the run did not log is refused with the ones it did."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    logged = events.Tags()["scalars"]
    missing = [tag for tag in tags if tag not in logged]
    if missing:
        common.fail(f"--scalars {missing[0]}: {run_dir} logged no such scalar; it logged "
                    f"{', '.join(sorted(logged))}")
    points = {tag: events.Scalars(tag) for tag in tags}
    return {tag: {"steps": [p.step for p in kept], "values": [p.value for p in kept]}
            for tag, kept in points.items()}


def row_of(summary: dict, run_dir: str, wall_seconds: float, peak_gb: float | None,
           started: float, scalars: tuple[str, ...] = ()) -> dict:
    """A seed's row: its evaluation, times, curve, arguments and model digest (and the
    evaluations during training, with --eval-every; the --scalars asked for)."""
    row = {"seed": summary["seed"], "policy": summary["policy"], "eval": summary["eval"],
           "wall_seconds": wall_seconds,  # a --load-model run trains nothing: it has no SPS
           "compile_seconds": summary["compile_seconds"], "sps": summary.get("sps"),
           "peak_gb": peak_gb, "run_dir": run_dir, "curve": learning_curve(run_dir, started),
           "args": summary["args"], "model_sha256": model_digest(run_dir),
           "device": summary.get("device"),  # None in runs from before summaries named it
           "machine": summary.get("machine"),  # None likewise
           # the environment the run needed to compute what it did (utils.cli.env_vars)
           **({"env_vars": summary["env_vars"]} if "env_vars" in summary else {})}
    if scalars:
        row["scalars"] = logged_scalars(run_dir, scalars)
    return row | ({"eval_curve": eval_curve(run_dir)} if summary["args"].get("eval_every") else {})


def machine_of(rows: list[dict]) -> str:
    """The machine the rows trained on, as utils.cli.machine names it: the one their runs'
    summaries name (a run collected here from another machine names that one); for runs from
    before summaries named it, this one's CPU, with first the accelerator their runs name. Rows
    from different devices, or device counts, or precisions, are refused; from different machines,
    named."""
    devices = {r["device"] for r in rows if r.get("device")}
    if len(devices) > 1:
        common.fail(f"the runs trained on different devices: {sorted(devices)}")
    environments = {r.get("env_vars", "") for r in rows}
    if len(environments) > 1:
        shown = sorted(e or "the scripts' own precision" for e in environments)
        common.fail(f"the runs computed at different precisions: {shown}")
    machines = {r.get("machine") for r in rows}
    if None not in machines:
        return " and ".join(sorted(machines))
    if devices and not next(iter(devices)).startswith("cpu"):
        return f"{next(iter(devices))} ({common.machine()})"
    return common.machine()


def collected_row(run_dir: str, scalars: tuple[str, ...] = ()) -> dict:
    """The row of a finished run directory. Its process started wall_seconds before summary.json
    was written, the run's last act."""
    path = os.path.join(run_dir, "summary.json")
    with open(path) as f:
        summary = json.load(f)
    if summary.get("status") != "completed":
        print(f"error: --collect {run_dir}: the run did not complete (status "
              f"{summary.get('status')!r})", file=sys.stderr)
        sys.exit(2)
    started = os.path.getmtime(path) - summary["wall_seconds"]
    return row_of(summary, os.path.relpath(run_dir), summary["wall_seconds"], None, started,
                  scalars)


def model_digest(run_dir: str) -> str | None:
    """The SHA-256 of the run's model.safetensors (a file in models/ names the run it came from by
    it), or None where the run saved none."""
    path = os.path.join(run_dir, "model.safetensors")
    if not os.path.exists(path):
        return None
    return files.source_digest(path)


def headline_policy(rows: list[dict]) -> str:
    """The policy the script reports, from its runs' summary.json."""
    return rows[0]["policy"]


def print_table(table: dict) -> None:
    rows = table["rows"]
    print(f"`{table['command']}` on {table['cpu']}:\n")
    print("| seed | sampled | greedy | sampled, sticky 0.1 | greedy, sticky 0.1 | wall s "
          "| compile s | train SPS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    # --collect's rows have no peak memory, and --load-model's no SPS
    rows = [{**row, "peak_gb": row["peak_gb"] or float("nan"), "sps": row["sps"] or float("nan")}
            for row in rows]
    cell = lambda e: f"{e['mean']:.2f} ± {e['std']:.2f}"  # noqa: E731
    for row in rows:
        e = row["eval"]
        print(f"| {row['seed']} | {cell(e['sampled'])} | {cell(e['greedy'])} "
              f"| {cell(e['sticky_0.1']['sampled'])} | {cell(e['sticky_0.1']['greedy'])} "
              f"| {row['wall_seconds']:.1f} | {row['compile_seconds']:.1f} | {row['sps']:,.0f} |")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    column = lambda pick: [pick(row) for row in rows]  # noqa: E731
    sampled = column(lambda r: r["eval"]["sampled"]["mean"])
    sticky = column(lambda r: r["eval"]["sticky_0.1"]["sampled"]["mean"])
    print(f"| **mean** | **{mean(sampled):.2f}** (min {min(sampled):.2f}) "
          f"| {mean(column(lambda r: r['eval']['greedy']['mean'])):.2f} "
          f"| **{mean(sticky):.2f}** (min {min(sticky):.2f}) "
          f"| {mean(column(lambda r: r['eval']['sticky_0.1']['greedy']['mean'])):.2f} "
          f"| {mean(column(lambda r: r['wall_seconds'])):.1f} "
          f"| {mean(column(lambda r: r['compile_seconds'])):.1f} "
          f"| {mean(column(lambda r: r['sps'])):,.0f} |")
    print(f"\npeak memory of any run: {max(column(lambda r: r['peak_gb'])):.2f} GB")


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = None
    if args.from_json:
        try:
            with open(args.from_json) as f:
                print_table(json.load(f))
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: --from-json {args.from_json}: {e!r}", file=sys.stderr)
            sys.exit(2)
    if not args.seeds:
        error = "give at least one seed (--seeds 1 2 3)"
    elif args.total_timesteps <= 0:
        error = f"--total-timesteps must be positive, got {args.total_timesteps}"
    elif [d for d in args.collect if not os.path.isfile(os.path.join(d, "summary.json"))]:
        missing = [d for d in args.collect if not os.path.isfile(os.path.join(d, "summary.json"))]
        error = f"--collect {missing[0]}: no summary.json there"
    elif args.out and os.path.exists(args.out):
        error = f"--out {args.out} exists; choose another name"
    try:
        script_args = shlex.split(args.script_args)
    except ValueError as e:  # an unclosed quote
        error = error or f"--script-args does not parse as a shell command line: {e}"
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    rows = [collected_row(run_dir, args.scalars) for run_dir in args.collect]
    for seed in () if args.collect else args.seeds:
        flags = ["--seed", str(seed), "--total-timesteps", str(args.total_timesteps),
                 "--num-devices", str(args.num_devices), "--exp-name", args.exp_name, *script_args]
        started = time.time()
        script = args.script if args.script.endswith(".py") else f"{args.script}.py"
        run = common.run_timed(common.script_command(script, flags))
        if run.returncode != 0:  # the script's own error line, and its exit status (2: bad args)
            print(f"error: seed {seed} failed: {run.stderr.strip()}", file=sys.stderr)
            sys.exit(run.returncode)
        summary, summary_path = common.read_summary(run.stdout)
        run_dir = os.path.relpath(os.path.dirname(summary_path))
        rows.append(row_of(summary, run_dir, run.wall_seconds, run.peak_rss_mb / 2**10, started,
                           args.scalars))
        policy = summary["policy"]  # the script's headline policy
        print(f"seed {seed}: {policy} {summary['eval'][policy]['mean']:.2f}, "
              f"wall {run.wall_seconds:.1f}s", file=sys.stderr)
    table = {"command": common.without_cache_dir(
                 "python tools/results_table.py " + shlex.join(sys.argv[1:])),
             "script": args.script, "policy": headline_policy(rows), "cpu": machine_of(rows),
             "rows": rows, "date": common.utc_date()}
    print_table(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()

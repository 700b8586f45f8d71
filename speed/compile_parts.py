"""Where a script's first run on a machine spends its compile time: every program JAX traces, lowers
to MLIR and compiles during the run, with the seconds of each, the compilation cache off, for any
script that keeps utils/contract.py. On a GPU or TPU, where a fresh machine's first run compiles for
most of a minute, it says which programs (the update step, the evaluation's, the pictures') to cut.

The script's main() runs in this process (in a work directory of its own), JAX's monitoring events
heard as they come: a program compiled twice is two compiles of the same name. The cache is off
only where this process started it (run as a command; `cache_hits` in the JSON says).

Run:  python speed/compile_parts.py --script ppo_breakout \\
          '--script-args=--num-devices 1 --total-timesteps 1000000' --out compile_ppo.json
"""

import collections
import dataclasses
import os
import shlex
import sys
import time

# On a CPU, one JAX device per core, as the scripts have them; set before JAX starts.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(len(os.sched_getaffinity(0))))
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the cache off: every program compiled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import tyro  # noqa: E402
from jax._src import dispatch  # noqa: E402  (the events' names; jax.monitoring has no constants)

from tools import common, tune  # noqa: E402

CACHE_HIT = "/jax/compilation_cache/cache_hits"
EVENTS = {dispatch.JAXPR_TRACE_EVENT: "trace", dispatch.JAXPR_TO_MLIR_MODULE_EVENT: "lower",
          dispatch.BACKEND_COMPILE_EVENT: "compile"}


@dataclasses.dataclass
class Args:
    script: str = "ppo_breakout"
    """the script measured (a name, or a path relative to the project)"""
    script_args: str = ""
    """the script's flags, as one string (--jax-cache-dir is set to "", the cache off)"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    common.check_out(bench.out)
    try:
        script = tune.load_script(bench.script)
    except ValueError as e:
        common.fail(str(e))
    try:
        flags = [*shlex.split(bench.script_args), "--jax-cache-dir", ""]
    except ValueError as e:
        common.fail(f"--script-args {bench.script_args!r}: {e}")
    heard = []  # (part, program, seconds, seconds since the start when it ended)
    cache_hits = []  # programs loaded from a compilation cache: none when it is off
    start = time.time()

    def hit(event: str, **_) -> None:
        if event == CACHE_HIT:
            cache_hits.append(time.time() - start)

    def listen(event: str, seconds: float, **metadata) -> None:
        if event in EVENTS:  # a program is "f" when traced, "jit(f)" when lowered and compiled
            name = metadata.get("fun_name", "?")
            name = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name
            heard.append((EVENTS[event], name, seconds, time.time() - start))

    jax.monitoring.register_event_duration_secs_listener(listen)
    jax.monitoring.register_event_listener(hit)
    try:
        summary = common.main_in_work_dir(script, flags)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
        jax.monitoring.unregister_event_listener(hit)
    wall = time.time() - start

    programs = collections.defaultdict(lambda: {"trace": 0.0, "lower": 0.0, "compile": 0.0,
                                                "compiles": 0})
    for part, name, seconds, _ in heard:
        programs[name][part] += seconds
        programs[name]["compiles"] += part == "compile"
    rows = sorted(({"program": name, **parts} for name, parts in programs.items()),
                  key=lambda row: -(row["trace"] + row["lower"] + row["compile"]))
    totals = {part: sum(row[part] for row in rows) for part in ("trace", "lower", "compile")}
    for row in rows[:10]:
        print(f"{row['program']}: compile {row['compile']:.1f} s ({row['compiles']}), trace "
              f"{row['trace']:.1f} s, lower {row['lower']:.1f} s", file=sys.stderr)
    common.write_report(common.new_report(
        machine=common.machine(jax.devices()), script=tune.name_of(script),
        script_args=bench.script_args,
        matmul_precision=jax.config.jax_default_matmul_precision or "default",
        run={k: summary.get(k) for k in ("compile_seconds", "train_seconds", "sps",
                                          "global_step")},
        wall_seconds=wall, cache_hits=len(cache_hits), totals=totals, programs=rows,
        events=[{"part": part, "program": name, "seconds": seconds, "ended_at": at}
                for part, name, seconds, at in heard]), bench.out)


if __name__ == "__main__":
    main()

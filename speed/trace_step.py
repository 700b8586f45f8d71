"""Where a DQN iteration's time goes on a TPU or GPU, op by op: the update step of dqn_minatar.py or
sr_dqn_minatar.py (--script) for N seeds side by side (vmap, as the harness trains them), on a
state past the warm-up (as speed/dqn_profile.py builds it), run once under JAX's profiler. The
report lists the ops of the compiled step that took the most device time (their HLO text, kind,
runs and total milliseconds; control flow, whose time is its ops', left out) and the step's
median time untraced. Where dqn_profile.py says which part costs more inside the step than alone,
this says which op: a copy of a whole buffer, for instance.

--script-args default to --num-steps 8: eight chunks an iteration, each the full run's chunk
(the same environments, buffer and gradient steps), so that the trace stays small.

Run:  python speed/trace_step.py --script sr_dqn_minatar --seeds 8 --out trace.json
"""

import collections
import dataclasses
import os
import re
import sys
import tempfile
from typing import Literal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import tyro  # noqa: E402

import dqn_minatar  # noqa: E402
import sr_dqn_minatar  # noqa: E402
from speed.dqn_profile import PARTS, past_warm_up, report_writer, script_setup, timed  # noqa: E402
from tools import common  # noqa: E402

CONTROL = ("while", "conditional", "call")  # ops whose time is that of the ops they run


@dataclasses.dataclass
class Args:
    script: Literal["dqn_minatar", "sr_dqn_minatar"] = "sr_dqn_minatar"
    """the script whose update step is traced"""
    script_args: str = "--num-steps 8"
    """the script's flags, as one string"""
    seeds: int = 8
    """seeds side by side"""
    top: int = 25
    """ops reported, the costliest first"""
    repeats: int = 3
    """untraced runs timed (after one that compiles), their median reported"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def op_totals(planes, top: int) -> tuple[float, list[dict]]:
    """From a profile's planes (jax.profiler.ProfileData's), the device's milliseconds in ops (no
    control flow) and its `top` ops by total time: HLO name, kind, text, runs, milliseconds."""
    total, runs, text = collections.Counter(), collections.Counter(), {}
    for plane in planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if line.name != "XLA Ops":
                continue
            for event in line.events:  # name: the op's HLO line, "%name = shape kind(operands)..."
                match = re.match(r"(%\S+) = .*? ([\w-]+)\(", event.name)
                if not match or match[2] in CONTROL:
                    continue
                total[match[1]] += event.duration_ns / 1e6
                runs[match[1]] += 1
                text[match[1]] = (match[2], event.name[:300])
    rows = [{"op": name, "kind": text[name][0], "runs": runs[name], "ms": ms,
             "hlo": text[name][1]} for name, ms in total.most_common(top)]
    return sum(total.values()), rows


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if bench.seeds <= 0 or bench.top <= 0 or bench.repeats <= 0:
        common.fail("--seeds, --top and --repeats must be positive")
    if jax.default_backend() == "cpu":
        common.fail("a CPU's trace holds no device ops: run this where JAX has a TPU or GPU")
    common.check_out(bench.out)
    script = {"dqn_minatar": dqn_minatar, "sr_dqn_minatar": sr_dqn_minatar}[bench.script]
    args, env, env_params, _ = script_setup(script, bench.script_args)
    init, update_step, _ = PARTS[bench.script](args, env, env_params)
    state = past_warm_up(init, update_step, args)
    states = jax.tree.map(lambda x: jnp.broadcast_to(x, (bench.seeds, *x.shape)), state)
    compiled = jax.jit(jax.vmap(update_step)).lower(states).compile()
    seconds = timed(compiled, states, repeats=bench.repeats)
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        jax.block_until_ready(compiled(states))
        jax.profiler.stop_trace()
        traces = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files
                  if f.endswith(".xplane.pb")]
        planes = [plane for path in traces
                  for plane in jax.profiler.ProfileData.from_file(path).planes]
    device_ms, rows = op_totals(planes, bench.top)
    report_writer(bench, rows, script=bench.script, seeds=bench.seeds,
                  interleaving=dict(zip(("chunks", "steps_per_chunk", "updates_per_chunk"),
                                        script.interleaving(args))),
                  step_ms=1e3 * seconds, traced_device_ms=device_ms)(echo=True)


if __name__ == "__main__":
    main()

"""Whether a script's training state, sent to the host as a checkpoint's tensors and back, trains
on as the live state does, to the bit, for any script that keeps utils/contract.py: the step under
a resume, without the run around it. tools/resume_check.py compares whole runs; where they differ,
this says whether the state's round trip or the update step is to blame.

- In one process (the default): from the initial state, K iterations of the update step (compiled
  as utils/training.Run compiles it: ahead of time, the state donated), then: K more twice from
  copies of that state (is the step deterministic?); K more from the state restored from its
  checkpoint tensors; K more from the state written as a checkpoint file and read back; K more
  from the state fetched to the host and put back; 2K straight from the start (is K then K the
  same as 2K?); K more after memory was filled with NaN and freed (pieces the state's leaves'
  sizes, and twice what the step uses: does the step read memory it never wrote?); and K more
  with the update step compiled a second time (does the compiler give the same program, and the
  same bits?). It lists the tensors that reach the host in another order than row-major
  (column_major_on_host).
- Across two processes: `--save DIR` writes the state after K iterations and the state K later
  (checkpoint tensors) and the compiled update step's text; `--load DIR`, in another process,
  restores the first, runs K iterations and compares them with the second, and its own compiled
  step with the saved one; then it trains K and K from the start itself (does this process replay
  the saving one?). Where tensors differ, it says in how many elements and by how much.

The compilation cache is off. Run:
    python tools/restore_probe.py --script dqn_minatar '--script-args=--total-timesteps 409600'
"""

import dataclasses
import os
import re
import shlex
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.numpy  # noqa: E402
import tyro  # noqa: E402

from tools import common, tune  # noqa: E402
from utils import checkpoint, files, training  # noqa: E402
from utils.env import make_env  # noqa: E402

SAVED, LATER, PROGRAM = "state.safetensors", "later.safetensors", "program.txt"


@dataclasses.dataclass
class Args:
    script: str = "dqn_minatar"
    """the script (a name, or a path relative to the project)"""
    script_args: str = ""
    """the script's flags, as one string (--num-devices 1 and the cache off are added)"""
    iterations: int = 3
    """K: the update steps before the state is sent through the host, and after"""
    save: str = ""
    """write the state after K iterations and the state K later into this directory (new)"""
    load: str = ""
    """restore --save's first state, train K iterations, compare them with its second"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def host_tensors(state) -> dict[str, np.ndarray]:
    """The state's checkpoint tensors, as a checkpoint writes them (utils/checkpoint.py)."""
    return checkpoint.state_tensors({"runner": state}, {})[0]


def program_text(compiled) -> str:
    """A compiled program's text without where in the source each operation came from: the caller's
    lines differ between two compiles of one program."""
    lines = [line for line in compiled.as_text().splitlines()
             if not re.match(r"(\d+ |FileNames|FunctionNames|FileLocations|StackFrames)", line)]
    return re.sub(r", metadata=\{[^}]*\}", "", "\n".join(lines))


def column_major_on_host(state) -> list[str]:
    """The state's tensors that arrive on the host in another order than row-major (a TPU hands
    some over column-major): a writer that copies memory as it lies would write them transposed
    (utils/files.row_major)."""
    arrays = checkpoint.host_arrays({"runner": state})[0]
    return sorted(name for name, x in arrays.items() if not np.asarray(x).flags.c_contiguous)


def differing(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The names of the tensors that differ in bits, dtype or shape (or that one lacks)."""
    return sorted(name for name in set(a) | set(b)
                  if name not in a or name not in b or a[name].dtype != b[name].dtype
                  or a[name].shape != b[name].shape or a[name].tobytes() != b[name].tobytes())


def how_they_differ(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, dict]:
    """For each tensor that differs in bits: how many of its elements do, whether they are equal
    as numbers anyway (signed zeros, a bool's byte) and, for floats (bfloat16 too), in how many
    elements one side is NaN or infinite and the other not, and the largest difference where both
    are finite (None where no element is)."""
    found = {}
    for name in differing(a, b):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.dtype != y.dtype or x.shape != y.shape:
            found[name] = {"comparable": False}
            continue
        rows = (x.reshape(-1).view(np.uint8).reshape(x.size, -1)
                != y.reshape(-1).view(np.uint8).reshape(y.size, -1)).any(-1)
        floating = np.issubdtype(x.dtype, np.floating) or x.dtype == jnp.bfloat16
        how = {"elements": int(rows.sum()), "of": int(x.size),
               "values_equal": bool(np.array_equal(x, y, equal_nan=floating))}
        if floating:
            x, y = x.astype(np.float64), y.astype(np.float64)
            nan_x, nan_y, finite = np.isnan(x), np.isnan(y), np.isfinite(x) & np.isfinite(y)
            how["not_finite_on_one_side"] = int(((nan_x != nan_y)
                                                 | (np.isinf(x) & (x != y))).sum())
            how["max_abs"] = float(np.abs(x - y)[finite].max()) if finite.any() else None
        found[name] = how
    return found


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if args.iterations <= 0:
        common.fail(f"--iterations must be positive, got {args.iterations}")
    if args.save and args.load:
        common.fail("give --save or --load, not both")
    if args.save and os.path.exists(args.save):
        common.fail(f"--save {args.save} exists; choose another name")
    if args.load and not all(os.path.isfile(os.path.join(args.load, name))
                             for name in (SAVED, LATER, PROGRAM)):
        common.fail(f"--load {args.load}: not a directory that --save wrote")
    common.check_out(args.out)
    try:
        script = tune.load_script(args.script)
        flags = [*shlex.split(args.script_args), "--num-devices", "1", "--jax-cache-dir", ""]
    except ValueError as e:
        common.fail(str(e))
    cfg = training.parse_args(script, flags)
    env, env_params = make_env(cfg.env_id, cfg.sticky_action_prob)
    agent = script.make_agent(cfg, env, env_params)
    runner_key = jax.random.split(jax.random.key(cfg.seed))[0]  # the script's own
    init = jax.jit(agent.init)
    like = jax.eval_shape(init, runner_key)

    def compile_step():  # a new function each time: compiled again (the cache is off)
        return jax.jit(lambda state: agent.update_step(state), donate_argnums=0).lower(
            like).compile()

    step = compile_step()

    def train(state, n: int, program=step):  # takes over (donates) `state`
        for _ in range(n):
            state = program(state)[0]
        return state

    k = args.iterations
    found = {}
    if args.load:
        tensors = safetensors.numpy.load_file(os.path.join(args.load, SAVED))
        with safetensors.safe_open(os.path.join(args.load, SAVED), "numpy") as f:
            header = f.metadata()
        state = jax.device_put(checkpoint.restore("probe", tensors, header, "runner", like), None)
        later = safetensors.numpy.load_file(os.path.join(args.load, LATER))
        diff = how_they_differ(host_tensors(train(state, k)), later)
        with open(os.path.join(args.load, PROGRAM)) as f:
            same_program = f.read() == program_text(step)
        # K and K iterations from the start in this process: does it replay the saving one?
        fresh = train(init(runner_key), k)
        fresh_diff = how_they_differ(host_tensors(fresh), tensors)
        fresh_later = differing(host_tensors(train(fresh, k)), later)
        found = {"mode": "load", "continues_equal": not diff, "program_equal": same_program,
                 "fresh_equal": not fresh_diff, "fresh_continues_equal": not fresh_later,
                 "differing": diff, "fresh_differing": fresh_diff}
    else:
        state = train(training.copy_tree(init(runner_key)), k)
        tensors, header = checkpoint.state_tensors({"runner": state}, {})
        live = host_tensors(train(training.copy_tree(state), k))
        if args.save:
            os.makedirs(args.save)
            safetensors.numpy.save_file(tensors, os.path.join(args.save, SAVED), header)
            safetensors.numpy.save_file(live, os.path.join(args.save, LATER))
            with open(os.path.join(args.save, PROGRAM), "w") as f:
                f.write(program_text(step))
            found = {"mode": "save"}
        else:
            again = host_tensors(train(training.copy_tree(state), k))
            back = jax.device_put(checkpoint.restore("probe", tensors, header, "runner", like),
                                  None)
            fetched = jax.device_put(jax.device_get(state))
            straight = host_tensors(train(init(runner_key), 2 * k))
            # Memory filled with NaN and freed (pieces the state's leaves' sizes, and twice what
            # the step uses in all), then K more from a copy: a program that read memory it never
            # wrote would now see the NaN.
            used = step.memory_analysis()
            used = 2 * (used.temp_size_in_bytes + used.argument_size_in_bytes
                        + used.output_size_in_bytes)
            piece = 2 ** 24  # float32s: 64 MiB
            dirty = [jnp.full(x.shape, np.nan, jnp.float32) for x in jax.tree.leaves(state)]
            dirty += [jnp.full(piece, np.nan, jnp.float32) for _ in range(-(-used // (4 * piece)))]
            jax.block_until_ready(dirty)
            del dirty
            after_dirty = host_tensors(train(training.copy_tree(state), k))
            # As a checkpoint is written and read: the file's bytes, not the host's arrays.
            with tempfile.TemporaryDirectory() as work:
                path = os.path.join(work, "state.safetensors")
                checkpoint.write_state(path, {"runner": state}, {})
                from_file = jax.device_put(checkpoint.restore(
                    path, *files.read_safetensors(path, "probe"), "runner", like), None)
            step_again = compile_step()
            recompiled = host_tensors(train(training.copy_tree(state), k, step_again))
            diffs = {"deterministic": differing(again, live),
                     "restored_continues_equal": differing(host_tensors(train(back, k)), live),
                     "fetched_continues_equal": differing(host_tensors(train(fetched, k)), live),
                     "file_restored_continues_equal": differing(
                         host_tensors(train(from_file, k)), live),
                     "split_equals_straight": differing(straight, live),
                     "recompiled_equal": differing(recompiled, live),
                     "after_dirty_memory_equal": differing(after_dirty, live)}
            found = {"mode": "in_process", **{name: not d for name, d in diffs.items()},
                     "column_major_on_host": column_major_on_host(state),
                     "program_equal": program_text(step_again) == program_text(step),
                     "differing": {name: d for name, d in diffs.items() if d}}
    common.write_report(common.new_report(
        machine=common.machine(jax.devices()), script=tune.name_of(script),
        script_args=args.script_args, iterations=k, **found), args.out)
    if found.get("differing") or found.get("fresh_differing"):
        sys.exit(1)


if __name__ == "__main__":
    main()

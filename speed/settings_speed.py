"""Whether each of several settings of a script compiles and runs on the device JAX has (a GPU or
TPU where there is one, else the CPU), and at what speed, in one process: for each --settings
string, the script's arguments as its command line would take them (a refusal recorded as the
script's own error line), then its update step compiled as its run compiles it and run back to
back for the setting's iterations (speed/loop_speed.py's bare step). A compile or run that
fails is recorded with its error's first line, and the next setting goes on.

Run:  python speed/settings_speed.py --script dqn_minatar \\
          '--settings=--replay-ratio 0.03125; --buffer-size 1000000' --out settings.json
"""

import contextlib
import dataclasses
import io
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import jax  # noqa: E402
import tyro  # noqa: E402

from speed import loop_speed  # noqa: E402
from tools import common, tune  # noqa: E402
from utils import training  # noqa: E402


@dataclasses.dataclass
class Args:
    script: str = "dqn_minatar"
    """the script measured (a name, or a path relative to the project)"""
    settings: str = ""
    """the settings, separated by ';', each the script's flags (its --total-timesteps sets the
    iterations timed); "": its defaults alone"""
    common_args: str = "--num-devices 1 --exp-name settings"
    """flags added to every setting, before its own"""
    out: str = ""
    """write the JSON here (it is printed either way)"""


def measure(script, flags: list[str]) -> dict:
    """One setting: the bare step's SPS and compile seconds, or where it stopped and why."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = training.parse_args(script, flags)
    except SystemExit as e:
        said = stderr.getvalue().strip().splitlines()
        return {"outcome": "refused", "error": said[-1] if said else f"exit status {e.code}"}
    try:
        return {"outcome": "ran", **loop_speed.bare_step(script, args)}
    except Exception as e:  # noqa: BLE001 (XLA's errors have no common class): recorded, not raised
        return {"outcome": "failed", "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}


def main() -> None:
    bench = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    common.check_out(bench.out)
    try:
        script = tune.load_script(bench.script)
    except ValueError as e:
        common.fail(str(e))
    rows = []
    for setting in (s.strip() for s in bench.settings.split(";")):
        row = {"setting": setting,
               **measure(script, [*shlex.split(bench.common_args), *shlex.split(setting)])}
        print(" | ".join(f"{k} {v:,.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in row.items()), file=sys.stderr, flush=True)
        rows.append(row)
    report = common.new_report(
        machine=common.machine(jax.devices()), script=tune.name_of(script),
        common_args=bench.common_args,
        matmul_precision=jax.config.jax_default_matmul_precision or "default", rows=rows)
    common.write_report(report, bench.out)


if __name__ == "__main__":
    main()

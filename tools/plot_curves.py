"""Overlays the learning curves of several runs of ppo_breakout.py, read from their
TensorBoard logs.

Each run's `charts/episodic_return` is interpolated onto a common grid of environment steps (up to
the shortest run's last step); the figure shows every run thinly, their mean, and a 95% bootstrap
confidence interval of the mean (scipy.stats.bootstrap, percentile method, over runs).

Run:  python tools/plot_curves.py runs/Breakout-MinAtar__ppo__* --out curves.png
"""

import dataclasses
import os
import sys

import matplotlib

matplotlib.use("Agg")  # write files, never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402
import tyro  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


@dataclasses.dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """the run directories (runs/...) whose curves to overlay"""
    out: str = "learning_curves.png"
    """the figure to write (PNG); an existing file is not overwritten"""
    tag: str = "charts/episodic_return"
    """the scalar to plot"""
    points: int = 100
    """the number of grid points the curves are interpolated onto"""


def read_curve(run_dir: str, tag: str) -> tuple[np.ndarray, np.ndarray]:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        raise ValueError(f"{run_dir} has no {tag} in its TensorBoard log")
    scalars = events.Scalars(tag)
    return np.array([s.step for s in scalars], float), np.array([s.value for s in scalars])


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    error = None
    if os.path.exists(args.out):
        error = f"--out {args.out} exists; choose another name"
    elif args.points < 2:
        error = f"--points must be at least 2, got {args.points}"
    curves = []
    for run_dir in args.run_dirs:
        if error:
            break
        try:
            curves.append(read_curve(run_dir, args.tag))
        except (ValueError, OSError) as e:
            error = str(e)
    if not error and not curves:
        error = "give at least one run directory"
    if error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)

    first_step = max(steps[0] for steps, _ in curves)
    last_step = min(steps[-1] for steps, _ in curves)
    grid = np.linspace(first_step, last_step, args.points)
    values = np.stack([np.interp(grid, steps, returns) for steps, returns in curves])
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    for run in values:
        ax.plot(grid, run, color="tab:blue", alpha=0.25, linewidth=0.8)
    ax.plot(grid, values.mean(0), color="tab:blue", linewidth=2.2,
            label=f"mean of {len(values)} runs")
    if len(values) > 1:
        ci = scipy.stats.bootstrap((values,), np.mean, axis=0, confidence_level=0.95,
                                   n_resamples=2000, method="percentile",
                                   rng=np.random.default_rng(0)).confidence_interval
        ax.fill_between(grid, ci.low, ci.high, color="tab:blue", alpha=0.25,
                        label="95% bootstrap CI of the mean")
    ax.set(xlabel="environment steps", ylabel=args.tag)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out} ({len(values)} runs, steps {grid[0]:,.0f}-{grid[-1]:,.0f})")


if __name__ == "__main__":
    main()

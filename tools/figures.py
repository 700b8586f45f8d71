"""The docs' figures from the committed JSON in results/ (tools/make_tables.py
calls main() after the tables): the search and its confirmation (docs/tuning.md), Breakout at 20M
steps (docs/ppo_breakout.md), the ratio in training (docs/loss_stability.md), SR-DQN's resets
(docs/sr_dqn_minatar.md)."""

import os

import numpy as np

from tools import stats
from tools.result_files import ROOT, load, seed_range

FIGURES = os.path.join("docs", "figures", "tuning")
SCRIPT_FIGURES = os.path.join("docs", "figures", "ppo_breakout")
CONFIRMATION = ("ppo_breakout/tuning/confirmation/defaults.json",
                "ppo_breakout/tuning/confirmation/best.json")
BREAKOUT_BUDGETS = ("ppo_breakout/games/conv8__Breakout__10000000.json",
                    "ppo_breakout/games/conv8__Breakout__20000000.json")
RATIO_SETTINGS = [("defaults", "defaults"), ("ent_coef_0", "no entropy bonus"),
                  ("learning_rate_0.02", "learning rate 0.02 (4x)"),
                  ("total_timesteps_5M", "5M steps (5x)")]
SR_DQN_RESETS = (("sr_dqn_minatar/cpu/resets__defaults__Breakout__400000__seed1.json",
                  "resets every 40,000 gradient steps (the defaults)", "C3"),
                 ("sr_dqn_minatar/cpu/resets__no_resets__Breakout__400000__seed1.json",
                  "no resets (--reset-period 0)", "C0"))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # write files, never open a window
    import matplotlib.pyplot as plt
    os.makedirs(os.path.join(ROOT, FIGURES), exist_ok=True)
    return plt


def search_figure() -> None:
    """docs/figures/tuning/search.png: the trials' scores, the curves the pruner saw, the
    importances."""
    plt = _pyplot()
    report = load("ppo_breakout/tuning/search/search.json")
    fig, (ax_value, ax_curve, ax_importance) = plt.subplots(1, 3, figsize=(16, 4.5))
    best_so_far, best = [], -np.inf
    for t in report["trials"]:
        if t["state"] == "COMPLETE":
            s = stats.summarize(t["eval_returns"])["iqm"]
            error = [[s["value"] - s["ci"][0]], [s["ci"][1] - s["value"]]]
            ax_value.errorbar(t["number"], s["value"], yerr=error,
                              fmt="o", color="C0", capsize=2)
            best = max(best, t["value"])
        elif t["state"] == "PRUNED":
            ax_value.axvline(t["number"], color="0.85", zorder=0)
        best_so_far.append(best)
    ax_value.step(range(len(best_so_far)), best_so_far, where="post", color="C1",
                  label="best so far")
    ax_value.set(xlabel="trial (grey lines: pruned)", ylabel="IQM of evaluation returns (95% CI)",
                 title="Completed trials")
    ax_value.legend()
    for t in report["trials"]:
        if t["curve"]:
            sums, eps = np.array(t["curve"]["return_sums"]), np.array(t["curve"]["episodes"])
            curve = sums.sum(1) / np.maximum(eps.sum(1), 1)
            x = np.arange(1, len(curve) + 1) / report["settings"]["num_chunks"]
            complete = t["state"] == "COMPLETE"
            ax_curve.plot(x, curve, color="C0" if complete else "0.6", lw=1,
                          zorder=2 if complete else 1)
    ax_curve.set(xlabel="fraction of training", ylabel="training return, pooled over seeds",
                 title="What the pruner saw (grey: pruned)")
    importances = report["importances"]["values"]
    ax_importance.barh(list(importances)[::-1], list(importances.values())[::-1])
    ax_importance.set(xlabel="importance (PED-ANOVA)", title="Parameter importances")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, FIGURES, "search.png"), dpi=80)
    plt.close(fig)


def confirmation_figure() -> None:
    """docs/figures/tuning/confirmation.png: both settings' pooled curves with bands, and their
    seeds."""
    plt = _pyplot()
    results = [load(f) for f in CONFIRMATION]
    fig, (ax_curve, ax_seeds) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ("defaults", "best setting of the search")
    for color, name, result in zip(("C0", "C1"), names, results):
        band = stats.pooled_curve(result["curve"]["return_sums"], result["curve"]["episodes"])
        steps = np.array(result["curve"]["steps"]) / 1e6
        ax_curve.plot(steps, band["return"], color=color, label=name)
        ax_curve.fill_between(steps, band["low"], band["high"], color=color, alpha=0.25)
        returns = np.sort(result["eval_returns"])
        ax_seeds.plot(returns, 1 - np.arange(len(returns)) / len(returns),
                      drawstyle="steps-post", color=color,
                      label=name)
    ax_curve.set(xlabel="environment steps per seed (millions)",
                 ylabel="training return, pooled (95% band)",
                 title=f"Seeds {seed_range(results[0]['seeds'])}")
    ax_seeds.axvline(stats.FIRST_WALL, color="0.5", ls="--", lw=1)
    ax_seeds.set(xlabel="evaluation return", ylabel="share of seeds scoring at least this",
                 title="Per-seed evaluation returns (dashed: first wall)")
    for ax in (ax_curve, ax_seeds):
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, FIGURES, "confirmation.png"), dpi=80)
    plt.close(fig)


def breakout_budgets_figure() -> None:
    """docs/figures/ppo_breakout/breakout_20m.png: the training return of each seed on Breakout at
    10M and at 20M steps (the annealed learning rate reaches 0 at the end of each run), with the
    pooled curve."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for color, file in zip(("C0", "C1"), BREAKOUT_BUDGETS):
        result = load(file)
        steps = result["ppo_args"]["total_timesteps"]
        x = np.array(result["curve"]["steps"]) / 1e6
        per_seed = (np.array(result["curve"]["return_sums"])
                    / np.maximum(result["curve"]["episodes"], 1))
        for returns in per_seed:
            ax.plot(x, returns, color=color, lw=0.6, alpha=0.5)
        ax.plot(x, result["pooled_curve"]["return"], color=color, lw=2,
                label=f"{steps // 1_000_000}M steps, {len(per_seed)} seeds (thin: each seed)")
    ax.set(xlabel="environment steps (millions)", ylabel="training return (sticky actions 0.1)",
           title="Breakout, today's defaults: trained for 10M and for 20M steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, SCRIPT_FIGURES, "breakout_20m.png"), dpi=80)
    plt.close(fig)


def ratio_figure() -> None:
    """docs/figures/loss_stability/ratio_in_training.png: per seed, each ratio's return and
    largest logit gap."""
    plt = _pyplot()
    fig, (ax_return, ax_gap) = plt.subplots(1, 2, figsize=(13, 4.5))
    legend = set()  # each entry once per panel
    for i, (name, label) in enumerate(RATIO_SETTINGS):
        for offset, ratio, color in ((-0.15, "log", "C0"), (0.15, "direct", "C3")):
            result = load(f"ppo_breakout/loss_stability/{name}_{ratio}.json")
            jitter = np.linspace(-0.08, 0.08, len(result["seeds"]))
            non_finite = np.array(result["stability"]["non_finite"])
            panels = ((ax_return, result["eval_returns"]),
                      (ax_gap, result["stability"]["logit_gap_max"]))
            for ax, values in panels:
                x, y = i + offset + jitter, np.array(values, float)
                for points, marker, text in ((~non_finite, "o", ratio),
                                             (non_finite, "x",
                                              f"{ratio}, a non-finite value in training")):
                    if points.any():
                        ax.scatter(x[points], y[points], s=14, marker=marker, color=color,
                                   label=None if (ax, text) in legend else text)
                        legend.add((ax, text))
    ax_gap.axhline(88, color="0.5", ls="--", lw=1, label="float32 softmax breaks beyond (sweep 1)")
    ax_gap.set_yscale("log")
    for ax, ylabel in ((ax_return, "evaluation return per seed"),
                       (ax_gap, "largest logit gap in training, per seed")):
        ax.set_xticks(range(len(RATIO_SETTINGS)), [label for _, label in RATIO_SETTINGS])
        ax.set(ylabel=ylabel)
        ax.legend(fontsize=9)
    fig.suptitle("The direct ratio against log space in real training (float32)")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "figures", "loss_stability", "ratio_in_training.png"),
                dpi=80)
    plt.close(fig)


def sr_dqn_resets_figure() -> None:
    """docs/figures/sr_dqn_minatar/resets.png: one seed with and without resets, what it logged
    each iteration (training return, mean Q-value, TD loss), the resets marked."""
    plt = _pyplot()
    panels = (("charts/episodic_return", "training return (ε-greedy, target network acting)"),
              ("losses/q_values", "mean Q-value of the batches"),
              ("losses/td_loss", "TD loss"))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
    for path, label, color in SR_DQN_RESETS:
        (row,) = load(path)["rows"]
        label = f"{label}; greedy evaluation {row['eval']['greedy']['mean']:.1f}"
        for ax, (tag, _) in zip(axes, panels):
            points = row["scalars"][tag]
            ax.plot(points["steps"], points["values"], color=color, lw=1.2, label=label)
        resets = row["scalars"]["charts/resets"]
        marks = [step for step, before, after in zip(resets["steps"][1:], resets["values"],
                                                     resets["values"][1:]) if after > before]
        for ax in axes:
            for step in marks:  # the iteration that held a reset
                ax.axvline(step, color=color, lw=0.6, alpha=0.35)
    for ax, (_, ylabel) in zip(axes, panels):
        ax.set(xlabel="environment steps", ylabel=ylabel)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}k")
    axes[2].set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9)
    fig.suptitle("sr_dqn_minatar.py on Breakout, seed 1, on a CPU: thin lines mark the iterations "
                 "that held a reset")
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below
    os.makedirs(os.path.join(ROOT, "docs", "figures", "sr_dqn_minatar"), exist_ok=True)
    fig.savefig(os.path.join(ROOT, "docs", "figures", "sr_dqn_minatar", "resets.png"), dpi=80)
    plt.close(fig)


def main() -> None:
    search_figure()
    confirmation_figure()
    breakout_budgets_figure()
    ratio_figure()
    sr_dqn_resets_figure()

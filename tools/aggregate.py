"""One score across the five MinAtar games: each seed's return normalised by the random policy and
the published PPO number, then the interquartile mean (IQM) over games x seeds, as rliable does.

    normalised = (return - random) / (published PPO - random)

1.0 is the published PPO number, 0.0 a random policy. The interval is a stratified bootstrap: seeds
are resampled within each game (scipy.stats.bootstrap with one sample per game). A comparison
against a baseline pairs the seeds within each game.

Reads the harness results
results/ppo_breakout/tuning/screen/{setting}__{game}__{steps}.json.

Run:  python tools/aggregate.py --steps 1000000 --settings defaults sticky --out aggregate.json
"""

import dataclasses
import json
import os
import shlex
import sys

import numpy as np
import scipy.stats
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import stats  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GAMES = ("Asterix", "Breakout", "Freeway", "SpaceInvaders", "Seaquest")
# Published PPO returns at 10M steps (docs/ppo_breakout.md, "Results on the five games", has their
# sources): gymnax's protocol, MinAtar's (sticky actions 0.1, no time limit). Seaquest has no gymnax
# figure; pgx's stands for both.
PUBLISHED = {"Asterix": (17.8, 25.0), "Breakout": (43.4, 50.0), "Freeway": (58.8, 63.5),
             "SpaceInvaders": (131.6, 185.0), "Seaquest": (54.0, 54.0)}
PROTOCOL_KEYS = {"gymnax": "eval_returns", "minatar": "eval_returns_minatar"}


@dataclasses.dataclass
class Args:
    settings: tuple[str, ...] = ("defaults",)
    """the settings to aggregate (the first part of the result files' names)"""
    steps: int = 1_000_000
    """the training budget of the results"""
    baseline: str = "defaults"
    """the setting the others are compared with, seed by seed ("" for none)"""
    results_dir: str = os.path.join(RESULTS, "ppo_breakout", "tuning", "screen")
    """where the harness results are"""
    out: str = ""
    """write the JSON to this file"""


def load(results_dir: str, setting: str, steps: int) -> dict[str, dict] | None:
    """{game: harness result} of `setting` at `steps`, or None unless all five games are there."""
    found = {}
    for game in GAMES:
        path = os.path.join(results_dir, f"{setting}__{game}__{steps}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            found[game] = json.load(f)
    return found


def normalised(results: dict[str, dict], protocol: str, random: dict) -> list[np.ndarray]:
    """Per game, the normalised returns of its seeds under `protocol`."""
    column = list(PROTOCOL_KEYS).index(protocol)
    out = []
    for game in GAMES:
        low = random[f"{game}-MinAtar"][protocol]
        high = PUBLISHED[game][column]
        out.append((np.asarray(results[game][PROTOCOL_KEYS[protocol]]) - low) / (high - low))
    return out


def iqm_of_games(*per_game, axis=-1):
    return stats.iqm(np.concatenate(per_game, axis=axis), axis=axis)


def summarize(per_game: list[np.ndarray]) -> dict:
    """The IQM over games x seeds with its stratified 95% bootstrap interval."""
    result = scipy.stats.bootstrap(per_game, iqm_of_games, method="percentile",
                                   n_resamples=stats.N_RESAMPLES, rng=np.random.default_rng(0))
    return {"value": float(iqm_of_games(*per_game)),
            "ci": [float(result.confidence_interval.low), float(result.confidence_interval.high)]}


def compare(baseline: list[np.ndarray], candidate: list[np.ndarray]) -> dict:
    """IQM(candidate) - IQM(baseline), seeds paired within each game, with its 95% interval."""
    def difference(*samples, axis=-1):
        half = len(samples) // 2
        return iqm_of_games(*samples[half:], axis=axis) - iqm_of_games(*samples[:half], axis=axis)
    # Pairing within a game: resample one index set per game for both settings, drawn resample by
    # resample, game by game; the differences of all resamples are then computed at once.
    rng = np.random.default_rng(0)
    picks = [[rng.integers(0, len(b), len(b)) for b in baseline] for _ in range(stats.N_RESAMPLES)]
    picks = [np.stack(game) for game in zip(*picks)]  # per game: (resamples, seeds)
    draws = difference(*[b[p] for b, p in zip(baseline, picks)],
                       *[c[p] for c, p in zip(candidate, picks)])
    return {"value": float(difference(*baseline, *candidate)),
            "ci": np.percentile(draws, [2.5, 97.5]).tolist()}


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    with open(os.path.join(RESULTS, "shared", "random_scores.json")) as f:
        random = json.load(f)["random_returns"]
    table = {}
    base = load(args.results_dir, args.baseline, args.steps) if args.baseline else None
    for setting in args.settings:
        results = load(args.results_dir, setting, args.steps)
        if results is None:
            print(f"error: {setting} at {args.steps} steps lacks a game in {args.results_dir}",
                  file=sys.stderr)
            sys.exit(2)
        row = {"changed_args": results["Breakout"]["changed_args"],
               "num_seeds": len(results["Breakout"]["seeds"])}
        for protocol in PROTOCOL_KEYS:
            per_game = normalised(results, protocol, random)
            row[protocol] = summarize(per_game)
            row[protocol]["per_game_mean"] = {
                g: float(np.mean(results[g][PROTOCOL_KEYS[protocol]])) for g in GAMES}
            if base is not None and setting != args.baseline:
                row[protocol]["vs_baseline"] = compare(normalised(base, protocol, random), per_game)
        table[setting] = row
        line = " | ".join(
            f"{p} {row[p]['value']:.2f} [{row[p]['ci'][0]:.2f}, {row[p]['ci'][1]:.2f}]"
            + (f" diff {row[p]['vs_baseline']['value']:+.2f} "
               f"[{row[p]['vs_baseline']['ci'][0]:+.2f}, {row[p]['vs_baseline']['ci'][1]:+.2f}]"
               if "vs_baseline" in row[p] else "")
            for p in PROTOCOL_KEYS)
        means = " ".join(f"{g[:5]} {row['gymnax']['per_game_mean'][g]:.1f}/"
                         f"{row['minatar']['per_game_mean'][g]:.1f}" for g in GAMES)
        print(f"{setting:20s} {line}\n{'':20s} {means}", file=sys.stderr)
    out = {"command": shlex.join(["python", "tools/aggregate.py", *sys.argv[1:]]),
           "steps": args.steps, "baseline": args.baseline, "published": PUBLISHED,
           "settings": table}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

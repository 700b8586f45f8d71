"""Writes the docs' tables and figures from the committed JSON in benchmarks/results/: the tuning
evidence, search and harness speed (docs/tuning.md, tuning_history.md), the ratio study
(docs/loss_stability.md), the long runs and the script's speed (docs/ppo_breakout.md).

Each table sits in its page between `<!-- begin: NAME -->` and `<!-- end: NAME -->` lines and is
replaced whole; the text around it is left alone. Every statistic is recomputed from the per-seed
returns with benchmarks/stats.py (fixed resampling seeds), so a rerun gives the same digits.

Run:  python benchmarks/make_tables.py            # rewrite the tables and the figures
      python benchmarks/make_tables.py --check    # exit 1 if a table in those pages is stale
      python benchmarks/make_tables.py --commands # the harness commands behind every result file
"""

import dataclasses
import json
import os
import re
import sys

import numpy as np
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import stats  # noqa: E402

RESULTS = os.path.join("benchmarks", "results")
DOCS = (*(os.path.join("docs", name) for name in (
    "tuning.md", "tuning_history.md", "loss_stability.md", "ppo_breakout.md")), "README.md")
FIGURES = os.path.join("docs", "figures", "tuning")
SCRIPT_FIGURES = os.path.join("docs", "figures", "ppo_breakout")
THIS = "python benchmarks/make_tables.py"

# The evidence for each default: one alternative value per row, on seeds 1-N, against the defaults
# on the same seeds (defaults.json holds seeds 1-40; a seed's result does not depend on the others).
EVIDENCE_DEFAULTS = "defaults.json"  # seeds 1-40
EVIDENCE = [  # (harness flags, seeds)
    ("--ppo.activation relu", 40),
    ("--ppo.hidden-sizes 128 64", 16),
    ("--ppo.gae-lambda 0.95", 16),
    ("--ppo.gae-lambda 0.85", 16),
    ("--ppo.num-minibatches 8", 16),
    ("--ppo.num-minibatches 32", 16),
    ("--ppo.learning-rate 0.003", 16),
    ("--ppo.learning-rate 0.0075", 16),
    ("--ppo.ent-coef 0.005", 16),
    ("--ppo.ent-coef 0.02", 16),
    ("--ppo.update-epochs 3", 16),
    ("--ppo.update-epochs 6", 16),
    ("--ppo.clip-coef 0.3", 16),
]
CONFIRMATION = ("defaults.json", "best.json")  # in results/confirmation, seeds 1001-1040


@dataclasses.dataclass
class Args:
    check: bool = False
    """write nothing; exit 1 if a generated table in the pages differs from the committed JSON's"""
    commands: bool = False
    """print the harness command behind each evidence file, and exit"""


# Defaults that changed after some results were run, with their earlier values: the commands shown
# for those results pin the earlier values, so that they reproduce the committed JSON today.
EARLIER_DEFAULTS = {"layer_norm": False, "sticky_action_prob": 0.0, "conv_channels": 0}


def pinned(command: str, recorded: dict | None) -> str:
    """`command` plus the flags that pin each of EARLIER_DEFAULTS where the run used a value other
    than today's default. `recorded` is the run's arguments (None: it predates the change)."""
    import ppo_breakout  # here, not at the top: it starts JAX, which --commands does not need
    flags = []
    for name, earlier in EARLIER_DEFAULTS.items():
        value = earlier if recorded is None else recorded.get(name, earlier)
        flag = "--" + name.replace("_", "-")
        given = (flag, "--no-" + flag[2:], "--ppo." + flag[2:], "--ppo.no-" + flag[2:])
        if value == getattr(ppo_breakout.Args, name) or any(g in command for g in given):
            continue
        flags.append(flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag} {value}")
    if not flags:
        return command
    if command.startswith("python benchmarks/results_table.py"):  # flags for the script it runs
        if "--script-args=" in command:
            return command.replace("'--script-args=", "'--script-args=" + " ".join(flags) + " ")
        return command + " '--script-args=" + " ".join(flags) + "'"
    return command + " " + " ".join(f.replace("--", "--ppo.", 1) for f in flags)


def command_of(result: dict) -> str:
    """A result's recorded command, with the defaults that changed since pinned to the run's values
    (`pinned`)."""
    recorded = result.get("ppo_args") or (result["rows"][0].get("args") if "rows" in result else None)
    return pinned(result["command"], recorded)


def evidence_file(flags: str) -> str:
    """gae_lambda_0.95.json for '--ppo.gae-lambda 0.95'."""
    return "_".join(part.removeprefix("--ppo.").replace("-", "_") for part in flags.split()) + ".json"


def evidence_commands() -> list[str]:
    """The harness commands that write the evidence files, the defaults first."""
    out = os.path.join(RESULTS, "evidence")
    commands = [f"python benchmarks/tune.py --num-seeds 40 --out {os.path.join(out, EVIDENCE_DEFAULTS)}"] + [
        f"python benchmarks/tune.py --num-seeds {n} {flags} --out {os.path.join(out, evidence_file(flags))}"
        for flags, n in EVIDENCE]
    return [pinned(command, None) for command in commands]  # all run before the change of defaults


def load(*parts: str) -> dict:
    with open(os.path.join(ROOT, RESULTS, *parts)) as f:
        return json.load(f)


def ci(x: dict, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(x['value'])} [{fmt.format(x['ci'][0])}, {fmt.format(x['ci'][1])}]"


def signed_ci(x: dict, fmt: str = "{:+.1f}") -> str:
    return f"{fmt.format(x['value'])} [{fmt.format(x['ci'][0])}, {fmt.format(x['ci'][1])}]"


def wall(returns) -> str:
    share = stats.share_past_wall(returns)
    return f"{share['count']}/{share['of']}"


def on_seeds(result: dict, seeds: list[int]) -> np.ndarray:
    """result's per-seed returns on `seeds`, in that order."""
    index = {seed: i for i, seed in enumerate(result["seeds"])}
    missing = [s for s in seeds if s not in index]
    if missing:
        raise ValueError(f"the defaults were not run on seeds {missing}")
    return np.array([result["eval_returns"][index[s]] for s in seeds])


PROTOCOLS = ("eval_returns", "eval_returns_minatar")  # gymnax's protocol, then MinAtar's


def protocol_means(result: dict) -> list[str]:
    """The mean return [95% CI] under each protocol."""
    return [ci(stats.summarize(result[key])["mean"]) for key in PROTOCOLS]


def protocol_differences(base: dict, alt: dict) -> list[str]:
    """alt - base on the same seeds, the mean difference [95% CI] under each protocol."""
    return [signed_ci(stats.compare(base[key], alt[key])["mean_difference"]) for key in PROTOCOLS]


def seed_range(seeds: list[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def evidence_table() -> str:
    defaults = load("evidence", EVIDENCE_DEFAULTS)
    summary = stats.summarize(defaults["eval_returns"])
    lines = [
        "| default | alternative | seeds | IQM of the alternative | IQM difference | mean difference "
        "| P(alternative > default) | seeds ≥ 30, alternative vs default |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        f"| all defaults | — | {seed_range(defaults['seeds'])} | {ci(summary['iqm'])} (defaults) | | | "
        f"| {wall(defaults['eval_returns'])} |",
    ]
    for flags, _ in EVIDENCE:
        result = load("evidence", evidence_file(flags))
        (name, value), = result["changed_args"].items()
        default = getattr(ppo_defaults(), name)
        baseline = on_seeds(defaults, result["seeds"])
        c = stats.compare(baseline, result["eval_returns"])
        show = lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
        lines.append(
            f"| `{name}` {show(default)} | {show(value)} | {seed_range(result['seeds'])} "
            f"| {ci(stats.summarize(result['eval_returns'])['iqm'])} | {signed_ci(c['iqm_difference'])} "
            f"| {signed_ci(c['mean_difference'])} | {ci(c['probability_of_improvement'], '{:.2f}')} "
            f"| {wall(result['eval_returns'])} vs {wall(baseline)} |")
    return "\n".join(lines)


def ppo_defaults():
    import ppo_breakout  # here, not at the top: it starts JAX, which --commands does not need
    return ppo_breakout.Args()


def confirmation_table() -> str:
    names = ("defaults", "best setting of the search")
    results = [load("confirmation", f) for f in CONFIRMATION]
    if results[0]["seeds"] != results[1]["seeds"]:
        raise ValueError("the confirmation runs must share their seeds")
    lines = ["| setting | seeds | IQM | mean | seeds ≥ 30 | seeds < 30 | lowest seed | training time |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, result in zip(names, results):
        s = stats.summarize(result["eval_returns"])
        below = s["share_past_wall"]["of"] - s["share_past_wall"]["count"]
        seconds = result["timing"]["train_seconds"]
        lines.append(f"| {name} | {seed_range(result['seeds'])} | {ci(s['iqm'])} | {ci(s['mean'])} "
                     f"| {wall(result['eval_returns'])} | {below} ({below / s['seeds']:.0%}) | {s['min']:.1f} "
                     f"| {seconds:.0f} s ({seconds / results[0]['timing']['train_seconds']:.2f}x) |")
    c = stats.compare(results[0]["eval_returns"], results[1]["eval_returns"])
    lines += ["", "| best setting against the defaults, same seeds | value [95% CI] |", "|---|---:|",
              f"| IQM difference | {signed_ci(c['iqm_difference'])} |",
              f"| mean difference | {signed_ci(c['mean_difference'])} |",
              f"| probability of improvement | {ci(c['probability_of_improvement'], '{:.2f}')} |"]
    return "\n".join(lines)


def fresh_seeds_table() -> str:
    """Today's defaults on 40 fresh Breakout seeds at 1M steps, under both protocols."""
    result = load("confirmation", "defaults_sticky_layernorm.json")
    lines = ["| protocol | seeds | mean [95% CI] | IQM [95% CI] | lowest, highest seed "
             "| seeds at 40 or more |", "|---|---:|---:|---:|---|---:|"]
    for label, key in (("gymnax's", "eval_returns"), ("MinAtar's", "eval_returns_minatar")):
        returns = np.array(result[key])
        summary = stats.summarize(returns)
        lines.append(f"| {label} | {len(returns)} | {ci(summary['mean'])} | {ci(summary['iqm'])} "
                     f"| {returns.min():.1f}, {returns.max():.1f} | {(returns >= 40).sum()} |")
    return "\n".join(lines)


def code_change_table() -> str:
    """The defaults on seeds 3001-3040 with the code before and after the epoch's advantage
    moments were computed in one go (c3ef732): the same arithmetic, rounded differently."""
    results = {"`eae0e9f`": load("confirmation", "defaults_eae0e9f_seeds3001-3040.json"),
               "`c3ef732` and later": load("confirmation", "defaults_epoch_moments.json")}
    lines = ["| code | seeds | gymnax's protocol, mean [95% CI] | MinAtar's protocol, mean [95% CI] |",
             "|---|---:|---:|---:|"]
    for label, result in results.items():
        assert result["seeds"] == list(range(3001, 3041)), label
        cells = [ci(stats.summarize(result[key])["mean"])
                 for key in ("eval_returns", "eval_returns_minatar")]
        lines.append(f"| {label} | 3001-3040 | {cells[0]} | {cells[1]} |")
    old, new = results.values()
    cells = [signed_ci(stats.compare(old[key], new[key])["mean_difference"])
             for key in ("eval_returns", "eval_returns_minatar")]
    lines.append(f"| difference, same seeds | | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


CURRENT_10M = {"Breakout": "stickyln", "SpaceInvaders": "stickyln", "Asterix": "epochs2",
               "Freeway": "stickyln", "Seaquest": "stickyln"}  # game: the setting of its 10M run in results/screen


def games_10m_current_table() -> str:
    """The 10M runs again with the code from c3ef732 (results/current_code), beside the runs of
    the table above on the same seeds."""
    lines = ["| game | gymnax's protocol, then | now | difference [95% CI] | MinAtar's protocol, "
             "then | now | difference [95% CI] | lowest seed now |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for game, setting in CURRENT_10M.items():
        old = load("screen", f"{setting}__{game}__10000000.json")
        new = load("current_code", f"{game}__10000000.json")
        assert old["seeds"][:5] == new["seeds"] == [1, 2, 3, 4, 5], game
        cells = [game]
        for key in ("eval_returns", "eval_returns_minatar"):
            cells += [ci(stats.summarize(old[key][:5])["mean"]),
                      ci(stats.summarize(new[key])["mean"]),
                      signed_ci(stats.compare(old[key][:5], new[key])["mean_difference"])]
        cells.append(f"{min(new['eval_returns']):.1f} / {min(new['eval_returns_minatar']):.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


ASTERIX_EPOCHS_10M = {  # setting: its two files in results/current_code, seeds 1-5 and 6-10
    "2 epochs (its row)": ("Asterix__10000000.json", "epochs2_seeds6-10__Asterix__10000000.json"),
    "4 epochs (the shared defaults)": ("epochs4__Asterix__10000000.json",
                                       "epochs4_seeds6-10__Asterix__10000000.json")}


def asterix_epochs_10m_table() -> str:
    """Asterix at 10M steps with 2 and 4 epochs on seeds 1-10, the code from c3ef732."""
    pooled = {}
    for label, files in ASTERIX_EPOCHS_10M.items():
        parts = [load("current_code", f) for f in files]
        assert [s for p in parts for s in p["seeds"]] == list(range(1, 11)), label
        pooled[label] = {k: [x for p in parts for x in p[k]]
                         for k in ("eval_returns", "eval_returns_minatar")}
    lines = ["| setting | gymnax's protocol, per seed | mean [95% CI] | MinAtar's protocol, "
             "mean [95% CI] |", "|---|---|---:|---:|"]
    for label, result in pooled.items():
        per_seed = ", ".join(f"{x:.1f}" for x in result["eval_returns"])
        lines.append(f"| {label} | {per_seed} | " + " | ".join(protocol_means(result)) + " |")
    two, four = pooled.values()
    lines.append("| 2 epochs − 4, same seeds | | " + " | ".join(protocol_differences(four, two))
                 + " |")
    return "\n".join(lines)


def asterix_epochs_10m_commands() -> str:
    return "```bash\n" + "\n".join(command_of(load("current_code", f))
                                    for files in ASTERIX_EPOCHS_10M.values()
                                    for f in files) + "\n```"


def games_10m_current_commands() -> str:
    return "```bash\n" + "\n".join(command_of(load("current_code", f"{game}__10000000.json"))
                                    for game in CURRENT_10M) + "\n```"


def confirmation_commands() -> str:
    results = [load("confirmation", f) for f in CONFIRMATION]
    return "\n".join(["```bash", *[pinned(r["command"], r["ppo_args"]) for r in results], "```"])


def search_table(file: str = "search.json") -> str:
    report = load(file)
    trials = report["trials"]
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    pruned = [t for t in trials if t["state"] == "PRUNED"]
    hours = sum(t["seconds"] or 0 for t in trials) / 3600
    lines = [f"{len(trials)} trials ({len(complete)} completed, {len(pruned)} pruned), "
             f"{report['settings']['num_seeds']} seeds each (seeds {report['settings']['first_seed']}-"
             f"{report['settings']['first_seed'] + report['settings']['num_seeds'] - 1}), "
             f"{hours:.2f} hours of trials on {report['settings']['machine']}.", "",
             "| trial | IQM on the search's seeds | seeds ≥ 30 | changes from the defaults |",
             "|---:|---:|---:|---|"]
    defaults = ppo_defaults()
    rows = report["best"] + [b for b in ([_trial_row(trials[0])] if trials and trials[0]["state"] == "COMPLETE"
                                         else []) if b["number"] not in [r["number"] for r in report["best"]]]
    for row in rows:
        lines.append(f"| {row['number']} | {ci(row['summary']['iqm'])} | "
                     f"{row['summary']['share_past_wall']['count']}/{row['summary']['seeds']} "
                     f"| {_changes(row['params'], defaults)} |")
    importances = report["importances"]["values"]
    lines += ["", "| parameter | importance (PED-ANOVA) |", "|---|---:|"]
    lines += [f"| `{name}` | {value:.3f} |" for name, value in importances.items()]
    return "\n".join(lines)


def _trial_row(trial: dict) -> dict:
    return {"number": trial["number"], "params": trial["params"], "summary": stats.summarize(trial["eval_returns"])}


def _changes(params: dict, defaults) -> str:
    """The trial's flags that differ from the script's defaults."""
    from benchmarks.search import WIDTHS, ppo_flags  # here: it starts JAX
    changed = {name: value for name, value in params.items()
               if name not in WIDTHS and getattr(defaults, name) != value}
    widths = {w: params[w] for w in WIDTHS if w in params}
    if widths and tuple(widths.values()) != tuple(defaults.hidden_sizes):
        changed.update(widths)
    return ppo_flags(changed) or "none (the defaults)"


def speed_table() -> str:
    report = load("harness_speed.json")
    n = report["num_seeds"]
    lines = [f"Measured on {report['machine']}; `{report['command']}`.", "",
             f"| round | cache | harness, {n} seeds: wall s | peak GB | {n} script runs: wall s (sum) "
             f"| peak GB (largest) | ratio | harness training time, {report['num_chunks']} chunks / 1 chunk |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(report["rounds"]):
        script_wall = sum(s["wall_seconds"] for s in r["script"])
        lines.append(f"| {i + 1} | {'cold' if i == 0 else 'warm'} | {r['harness']['wall_seconds']:.1f} "
                     f"| {r['harness']['peak_memory_gb']:.2f} | {script_wall:.1f} "
                     f"| {max(s['peak_memory_gb'] for s in r['script']):.2f} | {r['ratio']:.2f} "
                     f"| {r['one_chunk_train_ratio']:.3f} |")
    return "\n".join(lines)


def script_speed_table(file: str = "script_speed.json") -> str:
    """ppo_breakout.py against an earlier commit, alternating rounds: medians and ranges over the rounds."""
    report = load(file)
    base = report["base"]

    def cell(values, fmt, unit=""):
        return f"{np.median(values):{fmt}}{unit} ({min(values):{fmt}}-{max(values):{fmt}})"

    lines = [f"Measured on {report['machine']}; `{report['command']}`, {len(report['rounds'])} rounds after a "
             f"warm-up round; medians (range over the rounds).", "",
             f"| version | wall s | wall / `{base}`, per round | train SPS | train SPS / `{base}`, per round "
             "| compile s | evaluation and pictures, s | peak memory, MB | sampled return |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for version in report["versions"]:
        runs = [r[version] for r in report["rounds"]]
        ratios = [r[version]["wall_seconds"] / r[base]["wall_seconds"] for r in report["rounds"]]
        sps_ratios = [r[version]["sps"] / r[base]["sps"] for r in report["rounds"]]
        sampled = sorted({f"{r['sampled']:.2f}" for r in runs})
        lines.append(f"| {'`' + version + '`' if version == base else version} "
                     f"| {cell([r['wall_seconds'] for r in runs], '.2f')} | {cell(ratios, '.3f')} "
                     f"| {cell([r['sps'] / 1000 for r in runs], '.1f', 'k')} | {cell(sps_ratios, '.3f')} "
                     f"| {cell([r['compile_seconds'] for r in runs], '.2f')} "
                     f"| {cell([r['eval_seconds'] for r in runs], '.2f')} "
                     f"| {cell([r['peak_memory_mb'] for r in runs], '.0f')} | {', '.join(sampled)} |")
    return "\n".join(lines)


def device_speed_table() -> str:
    """ppo_breakout.py on a set of cores with a device count, alternating rounds."""
    report = load("device_speed.json")
    lines = [f"Measured on {report['machine']}; `{report['command']}` under `taskset -c CORES`, "
             f"{len(report['rounds'])} rounds after a warm-up round; medians (range over the rounds).",
             "", "| cores | devices | wall s | train SPS | SPS / one core, one device, per round "
             "| sampled return |", "|---|---:|---:|---:|---:|---:|"]
    first = report["configs"][0]
    for config in report["configs"]:
        cores, devices = config.split(":")
        runs = [r[config] for r in report["rounds"]]
        ratios = [r[config]["sps"] / r[first]["sps"] for r in report["rounds"]]
        cell = lambda v, f: f"{np.median(v):{f}} ({min(v):{f}}-{max(v):{f}})"  # noqa: E731
        sampled = ", ".join(sorted({f"{r['sampled']:.2f}" for r in runs}))
        lines.append(f"| {cores} | {devices} | {cell([r['wall_seconds'] for r in runs], '.2f')} "
                     f"| {cell([r['sps'] / 1000 for r in runs], '.1f')}k | {cell(ratios, '.2f')} "
                     f"| {sampled} |")
    return "\n".join(lines)


def search_space_table() -> str:
    report = load("search.json")
    lines = ["| parameter | values searched | default |", "|---|---|---|"]
    defaults = ppo_defaults()
    for name, encoded in report["search_space"].items():
        dist = json.loads(encoded)
        attrs = dist["attributes"]
        if dist["name"] == "CategoricalDistribution":
            values = ", ".join(map(str, attrs["choices"]))
        else:
            step = f", step {attrs['step']}" if attrs.get("step") not in (None, 1) else ""
            values = f"{attrs['low']} to {attrs['high']}{', log scale' if attrs.get('log') else ''}{step}"
        if name.startswith("width_"):
            default = defaults.hidden_sizes[int(name[-1]) - 1]
        else:
            default = getattr(defaults, name)
        lines.append(f"| `{name}` | {values} | {default} |")
    return "\n".join(lines)


def history_tables() -> str:
    """The hand-tuning diary's tables, as copied into history.json, under a heading per round."""
    history = load("history.json")
    lines = [f"Source: {history['source']}; {history['note']}."]
    current_round = None
    for table in sorted(history["tables"], key=lambda t: t["round"]):
        if table["round"] != current_round:
            current_round = table["round"]
            lines += ["", f"### Round {current_round}: tables"]
        lines += ["", f"{table['caption']} On {table['machine']}.", "",
                  "| " + " | ".join(table["header"]) + " |", "|" + "|".join(table["align"]) + "|",
                  *["| " + " | ".join(row) + " |" for row in table["rows"]]]
    return "\n".join(lines)


# Does the log-space ratio matter in practice: each setting trained with both ratios on the same seeds
# (results/ratio/{name}_{log,direct}.json, benchmarks/tune.py --stability).
RATIO_SETTINGS = [("defaults", "defaults"), ("ent_coef_0", "no entropy bonus"),
                  ("learning_rate_0.02", "learning rate 0.02 (4x)"), ("total_timesteps_5M", "5M steps (5x)")]


def ratio_table() -> str:
    lines = ["| setting | seeds | ratio | IQM | mean | seeds with a non-finite value | largest logit gap "
             "| log-ratio range |", "|---|---:|---|---:|---:|---:|---:|---|"]
    comparisons = ["| setting | IQM difference, direct − log | mean difference | P(direct > log) |",
                   "|---|---:|---:|---:|"]
    for name, label in RATIO_SETTINGS:
        results = {ratio: load("ratio", f"{name}_{ratio}.json") for ratio in ("log", "direct")}
        if results["log"]["seeds"] != results["direct"]["seeds"]:
            raise ValueError(f"the two ratios of {name} must share their seeds")
        for ratio, result in results.items():
            s, st = stats.summarize(result["eval_returns"]), result["stability"]
            lines.append(f"| {label} | {seed_range(result['seeds'])} | {ratio} | {ci(s['iqm'])} | {ci(s['mean'])} "
                         f"| {sum(st['non_finite'])} | {max(st['logit_gap_max']):.1f} "
                         f"| [{min(st['log_ratio_min']):.2f}, {max(st['log_ratio_max']):.2f}] |")
        c = stats.compare(results["log"]["eval_returns"], results["direct"]["eval_returns"])
        comparisons.append(f"| {label} | {signed_ci(c['iqm_difference'])} | {signed_ci(c['mean_difference'])} "
                           f"| {ci(c['probability_of_improvement'], '{:.2f}')} |")
    return "\n".join(lines + [""] + comparisons)


def ratio_commands() -> str:
    results = [load("ratio", f"{name}_{ratio}.json") for name, _ in RATIO_SETTINGS for ratio in ("log", "direct")]
    return "\n".join(["```bash", *[pinned(r["command"], r["ppo_args"]) for r in results], "```"])


# Five seeds of the script, longer and under MinAtar's protocol (results_table.py JSON).
LONG_RUNS = [("readme_table.json", "no sticky actions", "1M"), ("long/defaults_5M.json", "no sticky actions", "5M"),
             ("long/defaults_10M.json", "no sticky actions", "10M"), ("long/sticky_0.1_1M.json", "sticky 0.1", "1M"),
             ("long/sticky_0.1_5M.json", "sticky 0.1", "5M")]


def long_runs_table() -> str:
    """Per training length and protocol: each seed's sampled return under both protocols, the mean with
    a bootstrap interval, and how many of the gymnax-protocol episodes ran to the time limit."""
    lines = ["| trained with | steps | gymnax protocol, per seed | mean [95% CI] | lowest "
             "| episodes to the time limit, per seed | best episode "
             "| sticky 0.1 within gymnax's time limit, per seed | mean [95% CI] | lowest |",
             "|---|---:|---|---:|---:|---|---:|---|---:|---:|"]

    def returns_cells(evals: list[dict]) -> list[str]:
        returns = np.array([e["mean"] for e in evals])
        low, high = stats.bootstrap_ci(returns, stats.mean)
        return [", ".join(f"{r:.1f}" for r in returns), f"{returns.mean():.1f} [{low:.1f}, {high:.1f}]",
                f"{returns.min():.1f}"]

    for path, protocol, steps in LONG_RUNS:
        rows = load(*path.split("/"))["rows"]
        gymnax = [row["eval"]["sampled"] for row in rows]
        sticky = [row["eval"]["sticky_0.1"]["sampled"] for row in rows]
        time_limit = [1 - e["terminated"] / sum(e["return_counts"].values()) for e in gymnax]
        cells = returns_cells(gymnax) + [", ".join(f"{c:.0%}" for c in time_limit),
                                         f"{max(e['max'] for e in gymnax):.0f}"] + returns_cells(sticky)
        lines.append(f"| {protocol} | {steps} | {' | '.join(cells)} |")
    return "\n".join(lines)


# The settings screened on all five games (benchmarks/results/screen, 4 seeds each), in the order tried;
# "defaults" are the defaults before LayerNorm and sticky actions were adopted.
SCREEN = ["defaults", "sticky", "layernorm", "stickyln"]
SCREEN_NAMES = {"defaults": "earlier defaults", "sticky": "+ sticky actions", "layernorm": "+ LayerNorm",
                "stickyln": "+ both (the MLP defaults)"}


def games_screen_table(steps: int = 1_000_000) -> str:
    """Per setting: the normalised IQM over the five games x seeds under each protocol, its paired
    difference from the defaults, and each game's mean return (gymnax's / MinAtar's protocol)."""
    from benchmarks import aggregate
    random = load("games", "random_scores.json")["random_returns"]
    results_dir = os.path.join(ROOT, RESULTS, "screen")
    base = aggregate.load(results_dir, "defaults", steps)
    lines = ["| setting | LayerNorm | sticky actions in training | gymnax: IQM [95% CI] | vs earlier defaults "
             "| MinAtar: IQM [95% CI] | vs earlier defaults | " + " | ".join(aggregate.GAMES) + " |",
             "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(aggregate.GAMES)]
    for setting in SCREEN:
        results = aggregate.load(results_dir, setting, steps)
        if results is None:
            continue
        ppo_args = results["Breakout"]["ppo_args"]
        cells = [SCREEN_NAMES[setting], f"{'yes' if ppo_args['layer_norm'] else 'no'}",
                 f"{ppo_args['sticky_action_prob']:g}"]
        for protocol in aggregate.PROTOCOL_KEYS:
            per_game = aggregate.normalised(results, protocol, random)
            cells.append(ci(aggregate.summarize(per_game), "{:.2f}"))
            cells.append("" if setting == "defaults" else
                         signed_ci(aggregate.compare(aggregate.normalised(base, protocol, random), per_game),
                                   "{:+.2f}"))
        for game in aggregate.GAMES:
            cells.append(" / ".join(f"{np.mean(results[game][key]):.1f}"
                                    for key in aggregate.PROTOCOL_KEYS.values()))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The longer-budget screens on one game: setting name -> what it changes, against "stickyln" (the
# defaults). A row appears once its JSON is committed.
LONG_SCREEN = {"stickyln": "shared defaults (4 epochs)", "lr2e-3": "learning rate 2e-3",
               "lr1e-2": "learning rate 1e-2", "lambda95": "GAE λ 0.95", "ent03": "entropy 0.03",
               "wide128": "torso 128-128", "wide256": "torso 256-256",
               "search": "the search's pick (below)",
               "noclipv": "no value clipping", "steps32mb4": "32 steps x 64 envs, 4 minibatches",
               "epochs8": "8 epochs", "mb8": "8 minibatches", "gamma995": "γ 0.995",
               "ent003": "entropy 0.003", "ent001": "entropy 0.001"}


def game_screen_table(game: str, steps: int) -> str:
    """Per setting on one game: the per-seed returns and their mean under each protocol, the mean's
    paired difference from the defaults (seeds 1-4 of each, paired)."""
    def path(setting: str) -> str:
        return os.path.join(ROOT, RESULTS, "screen", f"{setting}__{game}__{steps}.json")

    base = load("screen", f"stickyln__{game}__{steps}.json")
    lines = ["| setting | gymnax's protocol, per seed | mean [95% CI] | vs defaults [95% CI] "
             "| MinAtar's protocol, mean [95% CI] | vs defaults [95% CI] |",
             "|---|---|---:|---:|---:|---:|"]
    for setting, label in LONG_SCREEN.items():
        if not os.path.exists(path(setting)):
            continue
        result = load("screen", f"{setting}__{game}__{steps}.json")
        cells = [label, ", ".join(f"{x:.1f}" for x in result["eval_returns"])]
        for key in ("eval_returns", "eval_returns_minatar"):
            cells.append(ci(stats.summarize(result[key])["mean"]))
            cells.append("" if setting == "stickyln" else
                         signed_ci(stats.compare(base[key], result[key])["mean_difference"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Settings run on seeds 1-8: one 8-seed file, or the screen's seeds 1-4 and a second file of seeds 5-8.
EIGHT_SEEDS = {"ent003": "entropy 0.003", "epochs2": "2 epochs", "epochs3": "3 epochs",
               "wide256": "torso 256-256"}


def eight_seed_files(setting: str, game: str, steps: int) -> list[str]:
    one = f"{setting}_seeds1-8__{game}__{steps}.json"
    if os.path.exists(os.path.join(ROOT, RESULTS, "screen", one)):
        return [one]
    two = [f"{setting}__{game}__{steps}.json", f"{setting}_seeds5-8__{game}__{steps}.json"]
    return two if all(os.path.exists(os.path.join(ROOT, RESULTS, "screen", f)) for f in two) else []


def eight_seed_table() -> str:
    """Changes run on seeds 1-8 against the defaults on the same seeds (two files of four)."""
    lines = ["| game, steps | setting | defaults, gymnax's protocol | setting | difference [95% CI] "
             "| MinAtar's protocol, difference [95% CI] |", "|---|---|---:|---:|---:|---:|"]
    keys = ("eval_returns", "eval_returns_minatar")
    for game, steps in (("Breakout", 1_000_000), ("Asterix", 5_000_000)):
        base_files = eight_seed_files("stickyln", game, steps)
        base = {k: sum((load("screen", f)[k] for f in base_files), []) for k in keys}
        for setting, label in EIGHT_SEEDS.items():
            files = eight_seed_files(setting, game, steps)
            if not files:
                continue
            alt = {k: sum((load("screen", f)[k] for f in files), []) for k in keys}
            cells = [f"{game}, {steps // 1_000_000}M", label,
                     ci(stats.summarize(base["eval_returns"])["mean"]),
                     ci(stats.summarize(alt["eval_returns"])["mean"])]
            cells += [signed_ci(stats.compare(base[k], alt[k])["mean_difference"]) for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The third screen, seeds 1-8 each, against the settings it starts from on the same seeds.
THIRD_SCREEN = {
    "stickyln_seeds1-8__Breakout__1000000.json": [
        ("sticky005__Breakout__1000000.json", "sticky actions 0.05 in training"),
        ("noanneal__Breakout__1000000.json", "learning rate not annealed"),
        ("clip03__Breakout__1000000.json", "clip 0.3"),
        ("envs32__Breakout__1000000.json", "32 environments"),
        ("steps64__Breakout__1000000.json", "64-step rollouts"),
        ("ent001_seeds1-8__Breakout__1000000.json", "entropy 0.001"),
        ("envs32_ent001__Breakout__1000000.json", "32 environments, entropy 0.001")],
    "epochs2_seeds1-8__Asterix__5000000.json": [
        ("epochs1_seeds1-8__Asterix__5000000.json", "1 epoch"),
        ("epochs2_envs32__Asterix__5000000.json", "32 environments"),
        ("epochs2_envs128__Asterix__5000000.json", "128 environments"),
        ("epochs2_steps64__Asterix__5000000.json", "64-step rollouts"),
        ("epochs2_ent001__Asterix__5000000.json", "entropy 0.001"),
        ("epochs2_ent02__Asterix__5000000.json", "entropy 0.02")],
}


def third_screen_table() -> str:
    """Each change against its starting point: Breakout's defaults at 1M, Asterix's row at 5M."""
    lines = ["| game, steps | starting point | its mean, gymnax's protocol | change | mean | "
             "difference [95% CI] | MinAtar's protocol, difference [95% CI] |",
             "|---|---|---:|---|---:|---:|---:|"]
    keys = ("eval_returns", "eval_returns_minatar")
    for base_file, rows in THIRD_SCREEN.items():
        base = load("screen", base_file)
        game, steps = base_file.split("__")[1], int(base_file.split("__")[2][:-5])
        start = "the defaults" if game == "Breakout" else "2 epochs (its row)"
        for file, label in rows:
            alt = load("screen", file)
            assert alt["seeds"] == base["seeds"] == list(range(1, 9)), file
            cells = [f"{game}, {steps // 1_000_000}M", start,
                     ci(stats.summarize(base["eval_returns"])["mean"]), label,
                     ci(stats.summarize(alt["eval_returns"])["mean"])]
            cells += [signed_ci(stats.compare(base[k], alt[k])["mean_difference"]) for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The fourth screen, with the code from c3ef732: (folder, file, label) of each change against its
# starting point on the same seeds. A prototype's JSON records the environment that switched the
# patch in results/prototypes on.
FOURTH_SCREEN = {
    ("current_code", "defaults_seeds1-8__Breakout__1000000.json"): [
        ("current_code", "mb32__Breakout__1000000.json", "32 minibatches"),
        ("prototypes", "rewardscale01__Breakout__1000000.json", "the critic's returns scaled by 0.1"),
        ("prototypes", "rewardscale10__Breakout__1000000.json", "the critic's returns scaled by 10"),
        ("prototypes", "patch16__Breakout__1000000.json",
         "2x2 patches, stride 2, 16 features, before the MLP"),
        ("prototypes", "conv8_3_stride2__Breakout__1000000.json",
         "3x3 convolution, 8 channels, stride 2, before the MLP"),
        ("prototypes", "conv8_3_2__Breakout__1000000.json",
         "3x3 convolution, 8 channels, stride 1, 2x2 average pooling, before the MLP")],
    ("current_code", "epochs2_seeds1-8__Asterix__5000000.json"): [
        ("prototypes", "epochs2_conv8_3_2_seeds1-4__Asterix__5000000.json",
         "3x3 convolution, 8 channels, stride 1, 2x2 average pooling, before the MLP")],
}


def fourth_screen_table() -> str:
    """Each change against its starting point, on the seeds the change ran."""
    lines = ["| game, steps | change | seeds | starting point, gymnax's protocol | mean | "
             "difference [95% CI] | MinAtar's protocol, difference [95% CI] |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (folder, base_file), rows in FOURTH_SCREEN.items():
        base = load(folder, base_file)
        game, steps = base_file.split("__")[1], int(base_file.split("__")[2][:-5])
        for alt_folder, file, label in rows:
            alt = load(alt_folder, file)
            on = {k: np.array([dict(zip(base["seeds"], base[k]))[seed] for seed in alt["seeds"]])
                  for k in PROTOCOLS}  # the starting point on the change's seeds
            cells = [f"{game}, {steps // 1_000_000}M", label, seed_range(alt["seeds"]),
                     protocol_means(on)[0], protocol_means(alt)[0], *protocol_differences(on, alt)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fourth_screen_commands() -> str:
    commands = []
    for (folder, base_file), rows in FOURTH_SCREEN.items():
        commands.append(command_of(load(folder, base_file)))
        for alt_folder, file, _ in rows:
            result = load(alt_folder, file)
            commands.append(" ".join(filter(None, [result.get("environment"), result["command"]])))
    return "```bash\n" + "\n".join(commands) + "\n```"


def conv_flag_check() -> str:
    """The script's --conv-channels 8 (before its rewrite in 8ddb867) against the prototype it was
    built from: the same run."""
    flag, prototype = (load("prototypes", f"conv_flag_check__{name}__Breakout__65536.json")
                       for name in ("flag", "prototype"))
    same = all(flag[k] == prototype[k] for k in ("seeds", "eval_returns", "eval_returns_minatar",
                                                  "curve"))
    assert same, "--conv-channels 8 no longer computes the prototype"
    return "\n".join(["```bash", flag["command"],
                      f"{prototype['environment']} {prototype['command']}", "```", "",
                      f"Both give evaluation returns {', '.join(map(str, flag['eval_returns']))} "
                      f"on seeds {seed_range(flag['seeds'])}, and the same training curve."])


EQUAL_TIME = {"Asterix": ("epochs2_conv8_seeds1-4__Asterix__2000000.json",
                          "epochs2_seeds1-4__Asterix__26000000.json")}  # in results/current_code


def equal_time_table() -> str:
    """The convolution against the defaults given about the same training time: 13 times the steps
    (the script's speed ratio), each run annealing its rate over its own budget."""
    lines = ["| game | torso | steps | training time (harness, 4 seeds) | gymnax's protocol, mean "
             "[95% CI] | MinAtar's protocol, mean [95% CI] |", "|---|---|---:|---:|---:|---:|"]
    for game, files in EQUAL_TIME.items():
        conv, mlp = (load("current_code", f) for f in files)
        assert conv["seeds"] == mlp["seeds"] == [1, 2, 3, 4] and conv["ppo_args"]["conv_channels"]
        for result, torso in ((conv, "3x3 convolution, 8 channels, then the 64-64 MLP"),
                              (mlp, "64-64 MLP (the defaults then)")):
            steps = result["ppo_args"]["total_timesteps"]
            lines.append(f"| {game} | {torso} | {steps / 1e6:g}M | "
                         f"{result['timing']['train_seconds']:.0f} s | "
                         + " | ".join(protocol_means(result)) + " |")
        lines.append(f"| {game} | convolution − MLP, same seeds | | | "
                     + " | ".join(protocol_differences(mlp, conv)) + " |")
    return "\n".join(lines)


def equal_time_commands() -> str:
    return "```bash\n" + "\n".join(command_of(load("current_code", f))
                                    for files in EQUAL_TIME.values() for f in files) + "\n```"


def torso_speed_table() -> str:
    """Training speed of the torso prototypes, alternating rounds of the script (one seed)."""
    result = load("prototypes", "torso_speed.json")
    runs = result["runs"]
    rounds = sorted({r["round"] for r in runs})
    sps = {(r["variant"], r["round"]): r["sps"] for r in runs}
    labels = {"mlp": "the defaults then (64-64 MLP)",
              "conv8_3_s2": "3x3 convolution, 8 channels, stride 2",
              "conv8_3_2": "3x3 convolution, 8 channels, stride 1, pooled"}
    lines = [f"Measured on {result['machine']}; `{result['command']}`, with the patch and "
             f"each row's environment, {len(rounds)} rounds; medians (range over the rounds).", "",
             "| torso | training SPS | the MLP's SPS over its SPS, per round |",
             "|---|---:|---:|"]
    for variant, label in labels.items():
        own = [sps[variant, k] for k in rounds]
        ratio = [sps["mlp", k] / sps[variant, k] for k in rounds]
        lines.append(f"| {label} | {np.median(own):,.0f} ({min(own):,.0f}-{max(own):,.0f}) | "
                     f"{np.median(ratio):.1f} ({min(ratio):.1f}-{max(ratio):.1f}) |")
    return "\n".join(lines)


def conv_speed_table() -> str:
    """Training speed and whole-process time of the MLP alone and of the convolution, before and
    after its rewrite, alternating rounds."""
    result = load("conv", "conv_speed.json")
    labels = {"mlp": "64-64 MLP alone (the defaults before the convolution)",
              "conv_old": "convolution, `hk.Conv2D` and `hk.avg_pool` (387da56)",
              "conv_new": "convolution, one matrix product per 2x2 block (8ddb867; today's defaults)"}
    lines = [f"Measured on {result['machine']}; `{result['command']}`, at each row's commit with "
             "`--conv-channels 8` for the convolution (today, the MLP alone is `--conv-channels 0`); "
             "medians (range over the rounds).",
             "",
             "| game | torso | rounds | training SPS | the MLP's SPS over its SPS, per round | "
             "whole process, s |",
             "|---|---|---:|---:|---:|---:|"]
    for game in dict.fromkeys(r["game"] for r in result["runs"]):
        runs = {(r["variant"], r["round"]): r for r in result["runs"] if r["game"] == game}
        rounds = sorted({k for _, k in runs})
        for variant, label in labels.items():
            if (variant, rounds[0]) not in runs:
                continue
            own = [runs[variant, k]["sps"] for k in rounds]
            ratio = [runs["mlp", k]["sps"] / runs[variant, k]["sps"] for k in rounds]
            wall = [runs[variant, k]["wall_seconds"] for k in rounds]
            lines.append(f"| {game.removesuffix('-MinAtar')} | {label} | {len(rounds)} | "
                         f"{np.median(own):,.0f} ({min(own):,.0f}-{max(own):,.0f}) | "
                         f"{np.median(ratio):.1f} ({min(ratio):.1f}-{max(ratio):.1f}) | "
                         f"{np.median(wall):.1f} ({min(wall):.1f}-{max(wall):.1f}) |")
    return "\n".join(lines)


# The faster convolution against the defaults run for more steps on the same seeds: per game, the
# convolution's file and the defaults' files (in results/).
CHEAP_CONV_TIME = {
    "Breakout": ("conv/conv8_seeds1-8__Breakout__1000000.json",
                 ("conv/defaults_seeds1-8__Breakout__2500000.json",
                  "conv/defaults_seeds1-8__Breakout__4000000.json")),
    "Asterix": ("conv/epochs2_conv8_seeds1-5__Asterix__5000000.json",
                ("current_code/Asterix__10000000.json",)),
}


def cheap_conv_time_table() -> str:
    """The convolution (after its rewrite) against the defaults run for more steps, each run
    annealing its rate over its own budget; paired differences on the same seeds. (No training
    times: these runs shared the machine with other work.)"""
    lines = ["| game | torso | steps | seeds | gymnax's protocol, mean [95% CI] | "
             "MinAtar's protocol, mean [95% CI] |", "|---|---|---:|---:|---:|---:|"]
    row = lambda game, torso, r: (  # noqa: E731
        f"| {game} | {torso} | {r['ppo_args']['total_timesteps'] / 1e6:g}M | "
        f"{seed_range(r['seeds'])} | " + " | ".join(protocol_means(r)) + " |")
    for game, (conv_file, mlp_files) in CHEAP_CONV_TIME.items():
        conv = load(conv_file)
        assert conv["ppo_args"]["conv_channels"] == 8
        lines.append(row(game, "3x3 convolution, 8 channels, then the 64-64 MLP", conv))
        for mlp_file in mlp_files:
            mlp = load(mlp_file)
            assert mlp["seeds"] == conv["seeds"] and not mlp["ppo_args"].get("conv_channels")
            assert mlp["ppo_args"]["update_epochs"] == conv["ppo_args"]["update_epochs"]
            steps = f"{mlp['ppo_args']['total_timesteps'] / 1e6:g}M"
            lines.append(row(game, "64-64 MLP", mlp))
            lines.append(f"| {game} | convolution − MLP at {steps}, same seeds | | | "
                         + " | ".join(protocol_differences(mlp, conv)) + " |")
    return "\n".join(lines)


def cheap_conv_time_commands() -> str:
    files = [f for conv, mlps in CHEAP_CONV_TIME.values() for f in (conv, *mlps)]
    return "```bash\n" + "\n".join(command_of(load(f)) for f in files) + "\n```"


def conv_games_table() -> str:
    """The five games at 1M steps, seeds 1-5 of the script: the MLP alone (the README's runs before
    the convolution became the default) and the convolution, each seed's mean return under both
    protocols, with paired differences."""
    from benchmarks import aggregate
    lines = ["| game | protocol | MLP alone | convolution | convolution − MLP [95% CI] | "
             "published PPO, 10M steps |", "|---|---|---:|---:|---:|---:|"]
    for game in aggregate.GAMES:
        mlp, conv = load("conv", f"mlp_script_{game}_1M.json"), load("conv", f"script_{game}_1M.json")
        assert [r["seed"] for r in mlp["rows"]] == [r["seed"] for r in conv["rows"]]
        assert not any(r["args"].get("conv_channels") for r in mlp["rows"])
        assert all(r["args"]["conv_channels"] == 8 for r in conv["rows"])
        protocols = (("gymnax's", lambda e: e["sampled"]),
                     ("MinAtar's", lambda e: e["sticky_0.1"]["sampled"]))
        for column, (protocol, pick) in enumerate(protocols):
            base, alt = ([pick(r["eval"])["mean"] for r in result["rows"]]
                         for result in (mlp, conv))
            lines.append(f"| {game} | {protocol} | {np.mean(base):.1f} | {np.mean(alt):.1f} | "
                         f"{signed_ci(stats.compare(base, alt)['mean_difference'])} | "
                         f"{aggregate.PUBLISHED[game][column]:g} |")
    return "\n".join(lines)


def conv_games_commands() -> str:
    from benchmarks import aggregate
    results = [load("conv", f"{torso}script_{game}_1M.json")
               for torso in ("mlp_", "") for game in aggregate.GAMES]
    commands = [command_of(r) for r in results]
    return "\n".join(["```bash", *commands, "```"])


def conv_10m_file(game: str) -> str:
    """The convolution's 10M run of a game in results/conv (Asterix's with its row's 2 epochs)."""
    return f"{'epochs2_' if game == 'Asterix' else ''}conv8__{game}__10000000.json"


def conv_10m_games() -> list[str]:
    """The games whose 10M run with the convolution is committed, in the README's order."""
    from benchmarks import aggregate
    return [g for g in aggregate.GAMES
            if os.path.exists(os.path.join(ROOT, RESULTS, "conv", conv_10m_file(g)))]


def conv_10m_table() -> str:
    """The convolution at 10M steps against the MLP defaults' current_code runs on the same seeds."""
    from benchmarks import aggregate
    lines = ["| game | protocol | MLP alone | convolution | convolution − MLP [95% CI] | "
             "lowest seed, convolution | published PPO |", "|---|---|---:|---:|---:|---:|---:|"]
    for game in conv_10m_games():
        mlp = load("current_code", f"{game}__10000000.json")
        conv = load("conv", conv_10m_file(game))
        assert mlp["seeds"] == conv["seeds"] and conv["ppo_args"]["conv_channels"] == 8, game
        for column, (protocol, key) in enumerate((("gymnax's", "eval_returns"),
                                                  ("MinAtar's", "eval_returns_minatar"))):
            lines.append(f"| {game} | {protocol} | {ci(stats.summarize(mlp[key])['mean'])} | "
                         f"{ci(stats.summarize(conv[key])['mean'])} | "
                         f"{signed_ci(stats.compare(mlp[key], conv[key])['mean_difference'])} | "
                         f"{min(conv[key]):.1f} | {aggregate.PUBLISHED[game][column]:g} |")
    return "\n".join(lines)


def conv_10m_commands() -> str:
    return "```bash\n" + "\n".join(command_of(load("conv", conv_10m_file(g)))
                                    for g in conv_10m_games()) + "\n```"


def conv_fresh_seeds_table() -> str:
    """Breakout at 1M steps on 40 fresh harness seeds (3001-3040): the MLP alone and the
    convolution, with the mean, the IQM, the lowest seed and the seeds at 40 or more."""
    results = {"MLP alone": load("confirmation", "defaults_epoch_moments.json"),
               "convolution": load("conv", "conv8_seeds3001-3040__Breakout__1000000.json")}
    lines = ["| torso | protocol | mean [95% CI] | IQM [95% CI] | lowest, highest seed | "
             "seeds at 40 or more |", "|---|---|---:|---:|---|---:|"]
    for label, result in results.items():
        assert result["seeds"] == list(range(3001, 3041)), label
        for protocol, key in zip(("gymnax's", "MinAtar's"), PROTOCOLS):
            summary, returns = stats.summarize(result[key]), result[key]
            lines.append(f"| {label} | {protocol} | {ci(summary['mean'])} | {ci(summary['iqm'])} | "
                         f"{min(returns):.1f}, {max(returns):.1f} | "
                         f"{sum(r >= 40 for r in returns)} |")
    mlp, conv = results.values()
    for protocol, difference in zip(("gymnax's", "MinAtar's"), protocol_differences(mlp, conv)):
        lines.append(f"| convolution − MLP, same seeds | {protocol} | {difference} | | | |")
    return "\n".join(lines)


def conv_fresh_seeds_commands() -> str:
    result = load("conv", "conv8_seeds3001-3040__Breakout__1000000.json")
    return "```bash\n" + command_of(result) + "\n```"


def third_screen_commands() -> str:
    files = [f for base, rows in THIRD_SCREEN.items() for f in (base, *(r[0] for r in rows))]
    return "```bash\n" + "\n".join(command_of(load("screen", f)) for f in files) + "\n```"


def eight_seed_commands() -> str:
    files = sorted({f for setting in ("stickyln", *EIGHT_SEEDS)
                    for game, steps in (("Breakout", 1_000_000), ("Asterix", 5_000_000))
                    for f in eight_seed_files(setting, game, steps) if "seeds" in f})
    return "```bash\n" + "\n".join(command_of(load("screen", f)) for f in files) + "\n```"


def game_screen_commands(game: str, steps: int) -> str:
    commands = [command_of(load("screen", f"{setting}__{game}__{steps}.json"))
                for setting in LONG_SCREEN
                if os.path.exists(os.path.join(ROOT, RESULTS, "screen",
                                               f"{setting}__{game}__{steps}.json"))]
    return "```bash\n" + "\n".join(commands) + "\n```"


def breakout_10m_table() -> str:
    """Breakout at 10M steps, 4 seeds per setting: each seed's return under both protocols and the
    largest logit gap of its training."""
    lines = ["| setting | gymnax protocol, per seed | mean [95% CI] | MinAtar protocol, per seed | "
             "mean [95% CI] | largest logit gap, per seed |", "|---|---|---:|---|---:|---|"]
    for setting in SCREEN:
        path = os.path.join(ROOT, RESULTS, "screen", f"{setting}__Breakout__10000000.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            result = json.load(f)
        cells = [SCREEN_NAMES[setting]]
        first = slice(0, 4)  # seeds 1-4: the defaults' row has a fifth (games_10m_table)
        assert result["seeds"][first] == [1, 2, 3, 4], path
        for key in ("eval_returns", "eval_returns_minatar"):
            returns = np.array(result[key][first])
            cells += [", ".join(f"{r:.1f}" for r in returns),
                      ci({"value": returns.mean(), "ci": stats.bootstrap_ci(returns, stats.mean)})]
        cells.append(", ".join(f"{g:.0f}" for g in result["stability"]["logit_gap_max"][first]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The 10M runs of the MLP defaults (before the convolution), in results/screen: the game's row of
# ppo_breakout.GAME_DEFAULTS, where it has one, is in the command.
MLP_10M = {"Asterix": "epochs2__Asterix__10000000.json"}


def mlp_10m_file(game: str) -> str:
    return "screen/" + MLP_10M.get(game, f"stickyln__{game}__10000000.json")


def defaults_10m_file(game: str) -> str:
    """Today's defaults at 10M steps: the convolution's run (conv_10m_file), in results/conv."""
    return "conv/" + conv_10m_file(game)


def games_10m_table(file_of=defaults_10m_file) -> str:
    """A setting at 10M steps, per game measured (harness seeds): each seed's return under both
    protocols, the mean with its interval, the published PPO number beside it."""
    from benchmarks import aggregate
    lines = ["| game | seeds | gymnax's protocol, per seed | mean [95% CI] | published | "
             "MinAtar's protocol, per seed | mean [95% CI] | published |",
             "|---|---:|---|---:|---:|---|---:|---:|"]
    for game in aggregate.GAMES:
        if not os.path.exists(os.path.join(ROOT, RESULTS, file_of(game))):
            continue
        result = load(*file_of(game).split("/"))
        cells = [game, str(len(result["seeds"]))]
        for column, key in enumerate(("eval_returns", "eval_returns_minatar")):
            returns = np.array(result[key])
            cells += [", ".join(f"{r:.1f}" for r in returns),
                      ci({"value": returns.mean(), "ci": stats.bootstrap_ci(returns, stats.mean)}),
                      f"{aggregate.PUBLISHED[game][column]:g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def games_10m_commands(file_of=defaults_10m_file) -> str:
    from benchmarks import aggregate
    commands = [command_of(load(*file_of(game).split("/"))) for game in aggregate.GAMES
                if os.path.exists(os.path.join(ROOT, RESULTS, file_of(game)))]
    return "\n".join(["```bash", *commands, "```"])


def screen_commands() -> str:
    commands = []
    for name in sorted(os.listdir(os.path.join(ROOT, RESULTS, "screen"))):
        if name.endswith(".json"):
            result = load("screen", name)
            commands.append(pinned(result["command"], result["ppo_args"]))
    return "\n".join(["```bash", *commands, "```"])


def readme_games_table() -> str:
    """The README's table: per game, seeds 1-5 of the script at 1M steps under both protocols (sampled
    actions), the mean and the lowest seed, beside the published PPO numbers at 10M steps."""
    from benchmarks import aggregate
    lines = ["| game | gymnax's protocol: mean [95% CI] (lowest seed) | published PPO, 10M steps | "
             "MinAtar's protocol: mean [95% CI] (lowest seed) | published PPO, 10M steps |",
             "|---|---:|---:|---:|---:|"]
    for game in aggregate.GAMES:
        rows = load("games", f"readme_{game}_1M.json")["rows"]
        cells = [game]
        for column, pick in enumerate((lambda e: e["sampled"], lambda e: e["sticky_0.1"]["sampled"])):
            returns = np.array([pick(row["eval"])["mean"] for row in rows])
            interval = ci({"value": returns.mean(), "ci": stats.bootstrap_ci(returns, stats.mean)})
            cells += [f"{interval} ({returns.min():.1f})", f"{aggregate.PUBLISHED[game][column]:g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_games_commands() -> str:
    from benchmarks import aggregate
    results = [load("games", f"readme_{game}_1M.json") for game in aggregate.GAMES]
    commands = [command_of(r) for r in results]
    return "\n".join(["```bash", *commands, "```"])


def long_runs_commands() -> str:
    return "\n".join(["```bash", *[pinned(load(*path.split("/"))["command"], None) for path, _, _ in LONG_RUNS],
                      "```"])


def long_runs_figure() -> None:
    """docs/figures/ppo_breakout/long_runs.png: each long run's training curve, seed by seed."""
    plt = _pyplot()
    os.makedirs(os.path.join(ROOT, SCRIPT_FIGURES), exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for color, (path, protocol, steps) in zip(("C0", "C1", "C2", "C3", "C4"), LONG_RUNS):
        for i, row in enumerate(load(*path.split("/"))["rows"]):
            ax.plot(np.array(row["curve"]["steps"]) / 1e6, row["curve"]["returns"], color=color, lw=0.8,
                    label=f"{steps} steps, {protocol}" if i == 0 else None)
    ax.set(xlabel="environment steps (millions)", ylabel="training return, under the protocol trained with",
           title="Five seeds of ppo_breakout.py each, by training length and protocol")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, SCRIPT_FIGURES, "long_runs.png"), dpi=80)
    plt.close(fig)


# Breakout by training length, harness seeds: today's defaults (the convolution), and the MLP's.
BREAKOUT_BUDGETS = {
    "conv": {1_000_000: "conv/conv8_seeds1-8__Breakout__1000000.json",
             10_000_000: "conv/conv8__Breakout__10000000.json",
             20_000_000: "conv/conv8__Breakout__20000000.json"},
    "mlp": {steps: f"screen/stickyln__Breakout__{steps}.json"
            for steps in (1_000_000, 10_000_000, 20_000_000)}}
BUDGETS_FIGURE = {"conv": "breakout_20m.png", "mlp": "breakout_20m_mlp.png"}


def breakout_budgets_figure(setting: str) -> None:
    """docs/figures/ppo_breakout/BUDGETS_FIGURE[setting]: the training return of each seed on Breakout
    at 10M and at 20M steps (its annealed learning rate reaches 0 at the end of each run), with the
    pooled curve."""
    paths = [(steps, os.path.join(ROOT, RESULTS, file))
             for steps, file in BREAKOUT_BUDGETS[setting].items() if steps > 1_000_000]
    if not all(os.path.exists(path) for _, path in paths):
        return
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for color, (steps, path) in zip(("C0", "C1"), paths):
        with open(path) as f:
            result = json.load(f)
        x = np.array(result["curve"]["steps"]) / 1e6
        per_seed = np.array(result["curve"]["return_sums"]) / np.maximum(result["curve"]["episodes"], 1)
        for returns in per_seed:
            ax.plot(x, returns, color=color, lw=0.6, alpha=0.5)
        ax.plot(x, result["pooled_curve"]["return"], color=color, lw=2,
                label=f"{steps // 1_000_000}M steps, {len(per_seed)} seeds (thin: each seed)")
    torso = {"conv": "today's defaults", "mlp": "the MLP defaults (no convolution)"}[setting]
    ax.set(xlabel="environment steps (millions)", ylabel="training return (sticky actions 0.1)",
           title=f"Breakout, {torso}: trained for 10M and for 20M steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, SCRIPT_FIGURES, BUDGETS_FIGURE[setting]), dpi=80)
    plt.close(fig)


def breakout_budgets_table(setting: str) -> str:
    """Breakout by training length: the evaluation of each seed's final policy."""
    lines = ["| steps | seeds | gymnax's protocol, per seed | mean [95% CI] | MinAtar's protocol, "
             "per seed | mean [95% CI] | largest logit gap, per seed |",
             "|---:|---:|---|---:|---|---:|---|"]
    for steps, file in BREAKOUT_BUDGETS[setting].items():
        if not os.path.exists(os.path.join(ROOT, RESULTS, file)):
            continue
        result = load(*file.split("/"))
        cells = [f"{steps // 1_000_000}M", str(len(result["seeds"]))]
        for key in ("eval_returns", "eval_returns_minatar"):
            returns = np.array(result[key])
            cells += [", ".join(f"{r:.1f}" for r in returns),
                      ci({"value": returns.mean(), "ci": stats.bootstrap_ci(returns, stats.mean)})]
        gaps = (result.get("stability") or {}).get("logit_gap_max")
        cells.append(", ".join(f"{g:.0f}" for g in gaps) if gaps else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakout_budgets_commands(setting: str) -> str:
    commands = [command_of(load(*file.split("/"))) for file in BREAKOUT_BUDGETS[setting].values()
                if os.path.exists(os.path.join(ROOT, RESULTS, file))]
    return "\n".join(["```bash", *commands, "```"])


def ratio_figure() -> None:
    """docs/figures/loss_stability/ratio_in_training.png: per seed, each ratio's return and largest logit gap."""
    plt = _pyplot()
    fig, (ax_return, ax_gap) = plt.subplots(1, 2, figsize=(13, 4.5))
    legend = set()  # each entry once per panel
    for i, (name, label) in enumerate(RATIO_SETTINGS):
        for offset, ratio, color in ((-0.15, "log", "C0"), (0.15, "direct", "C3")):
            result = load("ratio", f"{name}_{ratio}.json")
            jitter = np.linspace(-0.08, 0.08, len(result["seeds"]))
            non_finite = np.array(result["stability"]["non_finite"])
            for ax, values in ((ax_return, result["eval_returns"]), (ax_gap, result["stability"]["logit_gap_max"])):
                x, y = i + offset + jitter, np.array(values, float)
                for points, marker, text in ((~non_finite, "o", ratio),
                                             (non_finite, "x", f"{ratio}, a non-finite value in training")):
                    if points.any():
                        ax.scatter(x[points], y[points], s=14, marker=marker, color=color,
                                   label=None if (ax, text) in legend else text)
                        legend.add((ax, text))
    ax_gap.axhline(88, color="0.5", ls="--", lw=1, label="float32 softmax breaks beyond (sweep 1)")
    ax_gap.set_yscale("log")
    for ax, ylabel in ((ax_return, "evaluation return per seed"), (ax_gap, "largest logit gap in training, per seed")):
        ax.set_xticks(range(len(RATIO_SETTINGS)), [label for _, label in RATIO_SETTINGS])
        ax.set(ylabel=ylabel)
        ax.legend(fontsize=9)
    fig.suptitle("The direct ratio against log space in real training (float32)")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "figures", "loss_stability", "ratio_in_training.png"), dpi=80)
    plt.close(fig)


TABLES = {"evidence": evidence_table, "search": search_table, "search-space": search_space_table,
          "confirmation": confirmation_table, "confirmation-commands": confirmation_commands,
          "speed": speed_table, "script-speed": script_speed_table, "history": history_tables,
          "ratio": ratio_table, "ratio-commands": ratio_commands,
          "long-runs": long_runs_table, "long-runs-commands": long_runs_commands,
          "search-sticky": lambda: search_table("search_sticky.json"),
          "games-screen": games_screen_table, "breakout-10m": breakout_10m_table,
          "defaults-speed": lambda: script_speed_table("script_speed_defaults.json"),
          "screen-commands": screen_commands, "games-10m": games_10m_table,
          "games-10m-commands": games_10m_commands, "readme-games": readme_games_table,
          "readme-games-commands": readme_games_commands, "device-speed": device_speed_table, "breakout-budgets": lambda: breakout_budgets_table("conv"),
          "breakout-budgets-commands": lambda: breakout_budgets_commands("conv"),
          "breakout-budgets-mlp": lambda: breakout_budgets_table("mlp"),
          "breakout-budgets-mlp-commands": lambda: breakout_budgets_commands("mlp"),
          "games-10m-mlp": lambda: games_10m_table(mlp_10m_file),
          "games-10m-mlp-commands": lambda: games_10m_commands(mlp_10m_file), "fresh-seeds": fresh_seeds_table, "code-change": code_change_table,
          "games-10m-current": games_10m_current_table,
          "asterix-epochs-10m": asterix_epochs_10m_table,
          "fourth-screen": fourth_screen_table, "fourth-screen-commands": fourth_screen_commands,
          "torso-speed": torso_speed_table,
          "conv-speed": conv_speed_table,
          "cheap-conv-time": cheap_conv_time_table,
          "conv-games": conv_games_table, "conv-games-commands": conv_games_commands,
          "conv-10m": conv_10m_table, "conv-10m-commands": conv_10m_commands,
          "conv-fresh-seeds": conv_fresh_seeds_table,
          "conv-fresh-seeds-commands": conv_fresh_seeds_commands,
          "cheap-conv-time-commands": cheap_conv_time_commands,
          "conv-flag-check": conv_flag_check,
          "equal-time": equal_time_table, "equal-time-commands": equal_time_commands,
          "asterix-epochs-10m-commands": asterix_epochs_10m_commands,
          "games-10m-current-commands": games_10m_current_commands,
          "readable-speed": lambda: script_speed_table("script_speed_readable.json"),
          "device-free-speed": lambda: script_speed_table("script_speed_device_free.json"),
          "eight-seeds": eight_seed_table, "eight-seeds-commands": eight_seed_commands,
          "third-screen": third_screen_table, "third-screen-commands": third_screen_commands,
          "widths-speed": lambda: script_speed_table("script_speed_widths.json"),
          "asterix-5m": lambda: game_screen_table("Asterix", 5_000_000),
          "asterix-5m-commands": lambda: game_screen_commands("Asterix", 5_000_000),
          "breakout-1m-screen": lambda: game_screen_table("Breakout", 1_000_000),
          "breakout-1m-screen-commands": lambda: game_screen_commands("Breakout", 1_000_000)}


def with_tables(doc: str) -> str:
    """doc with every marked block replaced by its freshly generated table."""
    def replace(match):
        name = match.group(1)
        return f"<!-- begin: {name} -->\n{TABLES[name]()}\n<!-- end: {name} -->"
    return re.sub(r"<!-- begin: ([\w-]+) -->\n(?:.*?\n)?<!-- end: \1 -->", replace, doc, flags=re.S)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # write files, never open a window
    import matplotlib.pyplot as plt
    os.makedirs(os.path.join(ROOT, FIGURES), exist_ok=True)
    return plt


def search_figure() -> None:
    """docs/figures/tuning/search.png: the trials' scores, the curves the pruner saw, the importances."""
    plt = _pyplot()
    report = load("search.json")
    fig, (ax_value, ax_curve, ax_importance) = plt.subplots(1, 3, figsize=(16, 4.5))
    best_so_far, best = [], -np.inf
    for t in report["trials"]:
        if t["state"] == "COMPLETE":
            s = stats.summarize(t["eval_returns"])["iqm"]
            ax_value.errorbar(t["number"], s["value"], yerr=[[s["value"] - s["ci"][0]], [s["ci"][1] - s["value"]]],
                              fmt="o", color="C0", capsize=2)
            best = max(best, t["value"])
        elif t["state"] == "PRUNED":
            ax_value.axvline(t["number"], color="0.85", zorder=0)
        best_so_far.append(best)
    ax_value.step(range(len(best_so_far)), best_so_far, where="post", color="C1", label="best so far")
    ax_value.set(xlabel="trial (grey lines: pruned)", ylabel="IQM of evaluation returns (95% CI)",
                 title="Completed trials")
    ax_value.legend()
    for t in report["trials"]:
        if t["curve"]:
            sums, eps = np.array(t["curve"]["return_sums"]), np.array(t["curve"]["episodes"])
            curve = sums.sum(1) / np.maximum(eps.sum(1), 1)
            x = np.arange(1, len(curve) + 1) / report["settings"]["num_chunks"]
            complete = t["state"] == "COMPLETE"
            ax_curve.plot(x, curve, color="C0" if complete else "0.6", lw=1, zorder=2 if complete else 1)
    ax_curve.set(xlabel="fraction of training", ylabel="training return, pooled over seeds",
                 title="What the pruner saw (grey: pruned)")
    importances = report["importances"]["values"]
    ax_importance.barh(list(importances)[::-1], list(importances.values())[::-1])
    ax_importance.set(xlabel="importance (PED-ANOVA)", title="Parameter importances")
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, FIGURES, "search.png"), dpi=80)
    plt.close(fig)


def confirmation_figure() -> None:
    """docs/figures/tuning/confirmation.png: both settings' pooled curves with bands, and their seeds."""
    plt = _pyplot()
    results = [load("confirmation", f) for f in CONFIRMATION]
    fig, (ax_curve, ax_seeds) = plt.subplots(1, 2, figsize=(12, 4.5))
    for color, name, result in zip(("C0", "C1"), ("defaults", "best setting of the search"), results):
        band = stats.pooled_curve(result["curve"]["return_sums"], result["curve"]["episodes"])
        steps = np.array(result["curve"]["steps"]) / 1e6
        ax_curve.plot(steps, band["return"], color=color, label=name)
        ax_curve.fill_between(steps, band["low"], band["high"], color=color, alpha=0.25)
        returns = np.sort(result["eval_returns"])
        ax_seeds.plot(returns, 1 - np.arange(len(returns)) / len(returns), drawstyle="steps-post", color=color,
                      label=name)
    ax_curve.set(xlabel="environment steps per seed (millions)", ylabel="training return, pooled (95% band)",
                 title=f"Seeds {seed_range(results[0]['seeds'])}")
    ax_seeds.axvline(stats.FIRST_WALL, color="0.5", ls="--", lw=1)
    ax_seeds.set(xlabel="evaluation return", ylabel="share of seeds scoring at least this",
                 title="Per-seed evaluation returns (dashed: first wall)")
    for ax in (ax_curve, ax_seeds):
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, FIGURES, "confirmation.png"), dpi=80)
    plt.close(fig)


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if args.commands:
        print("\n".join(evidence_commands()))
        return
    docs = {}
    for name in DOCS:
        with open(os.path.join(ROOT, name)) as f:
            docs[name] = f.read()
    stale = [name for name, doc in docs.items() if with_tables(doc) != doc]
    if args.check:
        if stale:
            print(f"error: tables in {', '.join(stale)} differ from the committed JSON; run {THIS}", file=sys.stderr)
            sys.exit(1)
        return
    for name in stale:
        with open(os.path.join(ROOT, name), "w") as f:
            f.write(with_tables(docs[name]))
    search_figure()
    confirmation_figure()
    long_runs_figure()
    breakout_budgets_figure("conv")
    breakout_budgets_figure("mlp")
    ratio_figure()


if __name__ == "__main__":
    main()

"""Writes the docs' tables and figures from the committed JSON in results/, as the
manifest tools/tables.toml describes them: which result files make each table's rows, against
which baselines, and the cells it wants. A new result costs a manifest entry, not a function.

Each table sits in its page between `<!-- begin: ID -->` and `<!-- end: ID -->` lines and is
replaced whole; the text around it is left alone. Every statistic is recomputed from the per-seed
returns with tools/stats.py (fixed resampling seeds), so a rerun gives the same digits. The
command shown beside a table is rendered from what its result files recorded (`command`).

Run:  python tools/make_tables.py            # rewrite the tables and the figures
      python tools/make_tables.py --check    # exit 1 if a table in the pages is stale
      python tools/make_tables.py --commands # the command behind every result file it uses
"""

import collections
import dataclasses
import functools
import glob
import importlib
import os
import re
import shlex
import string
import sys
import tomllib

import numpy as np
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import aggregate, stats  # noqa: E402
from tools.result_files import RESULTS, load, seed_range  # noqa: E402
from utils import contract, files  # noqa: E402

MANIFEST = os.path.join("tools", "tables.toml")
# The pages with tables: the README, every page in docs/ (one per script, and more), models/'s.
DOCS = ("README.md", *sorted(glob.glob("*.md", root_dir=os.path.join(ROOT, "docs"))),
        os.path.join("models", "README.md"))
DOCS = tuple(page if page in ("README.md", DOCS[-1]) else os.path.join("docs", page)
             for page in DOCS)
THIS = "python tools/make_tables.py"
PROTOCOLS = {"g": ("eval_returns", "gymnax's"), "m": ("eval_returns_minatar", "MinAtar's")}


@dataclasses.dataclass
class Args:
    check: bool = False
    """write nothing; exit 1 if a generated table in the pages differs from the committed JSON's"""
    commands: bool = False
    """print the command behind each result file the tables use, and exit"""


@functools.cache  # read once: every table and command consults it; nothing writes to it
def manifest() -> dict:
    with open(os.path.join(ROOT, MANIFEST), "rb") as f:
        return tomllib.load(f)


# --------------------------------------------------------------------------------------------------
# Results: one shape for the harness's JSON (tools/tune.py) and the script runs'
# (tools/results_table.py, a row per seed)
# --------------------------------------------------------------------------------------------------
def recorded_args(result: dict) -> dict | None:
    """The script arguments a result recorded, or None where it recorded none."""
    rows = result.get("rows") or [{}]
    return (result.get("args") or result.get("ppo_args") or result.get("pqn_args")
            or rows[0].get("args"))


def per_seed(result: dict, policy: str | None = None) -> dict:
    """A result file as per-seed lists: seeds, both protocols' returns (of `policy`, by default the
    one the script reports first: PPO's sampled, PQN's greedy), the logit gaps."""
    if "rows" in result:
        rows, policy = result["rows"], policy or result.get("policy", "sampled")
        if policy not in rows[0]["eval"]:
            raise ValueError(f"{result['command']} evaluated no {policy} policy")
        return {"seeds": [r["seed"] for r in rows], "args": recorded_args(result),
                "policy": policy, "eval_returns": [r["eval"][policy]["mean"] for r in rows],
                "eval_returns_minatar": [r["eval"]["sticky_0.1"][policy]["mean"] for r in rows],
                "curves": [r["curve"] for r in rows],
                "eval_curves": [r.get("eval_curve") for r in rows],
                "sps": [r.get("sps") for r in rows],
                "timings": [{k: r.get(k) for k in RUN_TIMES} for r in rows]}
    # The harness's files from before it recorded its policy are PPO's: sampled.
    if policy and policy != result.get("policy", "sampled"):  # its other one (--both-policies)
        other = result.get("other_policy") or {}
        if other.get("policy") != policy:
            raise ValueError(f"{result['command']} evaluated no {policy} policy "
                             "(the harness does with --both-policies)")
        result = {**result, **{k: other[k] for k in (
            "policy", "eval_returns", "eval_returns_minatar", "minatar_bound_hits", "summary",
            "summary_minatar")}}
    return {**result, "args": recorded_args(result), **(result.get("stability") or {})}


PER_SEED = ("seeds", "eval_returns", "eval_returns_minatar", "curves", "eval_curves", "sps",
            "timings", "logit_gap_max", "log_ratio_min", "log_ratio_max", "non_finite")
# A script run's times, in seconds, as its row records them (process_wall_seconds: from the
# process's start to its exit, where a timer outside it recorded that).
RUN_TIMES = ("process_wall_seconds", "compile_seconds", "train_seconds", "eval_seconds")


def result_of(files: str | list[str], seeds: list[int] | None = None,
              policy: str | None = None) -> dict:
    """One file, or several pooled seed by seed; on `seeds` (in that order) where given; the
    returns of `policy` where given, else of each file's own."""
    parts = [per_seed(load(f), policy) for f in ([files] if isinstance(files, str) else files)]
    out = {**parts[0], **{k: [x for p in parts for x in p[k]] for k in PER_SEED if k in parts[0]}}
    if seeds is not None:
        index = {seed: i for i, seed in enumerate(out["seeds"])}
        missing = [s for s in seeds if s not in index]
        if missing:
            raise ValueError(f"{files} holds no seeds {missing}")
        out.update({k: [out[k][index[s]] for s in seeds] for k in PER_SEED if k in out})
    return out


# --------------------------------------------------------------------------------------------------
# Commands, rendered from what each result recorded
# --------------------------------------------------------------------------------------------------
def flag(name: str, value, prefix: str) -> str:
    kebab = name.replace("_", "-")
    if isinstance(value, bool):
        return f"{prefix}{'' if value else 'no-'}{kebab}"
    shown = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return f"{prefix}{kebab} {shown}"


def ignored(module) -> set[str]:
    """The fields a rendered command leaves out: those that change no result (utils/contract.py),
    the evaluation's size, and what only adds logging; --eval-every stays, as a row's eval_curve
    needs it."""
    return ({*contract.NOT_RESULTS, "eval_episodes", *getattr(module, "QUIET_ARGS", {})}
            - {"eval_every"})


def command(result: dict) -> str:
    """The recorded command, with a flag for each recorded argument that differs from the script's
    defaults today and that the command leaves to them: it reruns the result on today's code. The
    script comes from the command (a harness names its script in the manifest's [harness]). The
    environment it ran in goes before it, where that changed what it computed (utils.cli.env_vars:
    another matrix product precision)."""
    return with_environment(result, script_command(result))


def with_environment(result: dict, cmd: str | None = None) -> str:
    """`cmd` (by default the result's recorded command) after the environment it ran in, where
    that changed what it computed: the result's own, or the one its script runs share (rows of
    tools/results_table.py's runs; collected runs each carry their own, seed_command)."""
    cmd = result["command"] if cmd is None else cmd
    runs = ([row.get("env_vars") for row in result.get("rows") or [] if "args" in row]
            if "--collect" not in result["command"] else [])
    shared = runs[0] if runs and len(set(runs)) == 1 else None
    environment = result.get("env_vars") or shared
    return f"{environment} {cmd}" if environment else cmd


def shown(report: dict) -> dict:
    """A benchmark report's fields for a preamble: its command after its environment."""
    return report | ({"command": with_environment(report)} if "command" in report else {})


def script_command(result: dict) -> str:
    """`command`'s command line, without the environment."""
    cmd = result["command"]
    if result.get("environment"):  # a prototype: a patched script that today's arguments miss
        return f"{result['environment']} {cmd}"
    words = shlex.split(cmd)
    if "--collect" in words:  # rows of runs started by hand: each seed's own command
        return "\n".join(seed_command(result, row) for row in result["rows"])
    if len(words) < 2 or words[0] != "python" or recorded_args(result) is None:
        return cmd  # no script arguments recorded: shown as run
    spec = dict(manifest()["harness"].get(words[1], {"script": words[1]}))
    if result.get("script"):  # a harness that runs more than one script names the one it ran
        spec["script"] = f"{result['script']}.py"
    name = os.path.splitext(os.path.basename(spec["script"]))[0]
    # The harness's flags of a script's settings are named after it: --ppo.* for ppo_breakout.
    prefix = f"--{name.split('_')[0]}." if spec.get("grouped") else "--"
    before = manifest()["script"].get(spec["script"], {}).get("before", {})
    args = {**before, **recorded_args(result)}  # a field younger than the run: "before"
    module = importlib.import_module(name)
    defaults = {f.name: getattr(module.Args, f.name) for f in dataclasses.fields(module.Args)
                if f.init and f.name not in ignored(module)}
    if spec.get("game_rows"):  # the script applies its per-game rows
        defaults.update(getattr(module, "GAME_DEFAULTS", {}).get(args.get("env_id"), {}))
    given = " ".join(words[2:])
    pins = []
    for name, value in args.items():
        kebab = name.replace("_", "-")
        if name not in defaults or re.search(rf"--(\w+\.)?(no-)?{kebab}\b", given):
            continue
        if value != (list(defaults[name]) if isinstance(defaults[name], tuple) else defaults[name]):
            pins.append(flag(name, value, prefix))
    if not pins:
        return cmd
    if spec.get("inside"):  # the script's flags travel in one argument of the harness
        inside = spec["inside"]
        if inside in cmd:
            return cmd.replace(f"'{inside}", f"'{inside}" + " ".join(pins) + " ")
        return f"{cmd} '{inside}{' '.join(pins)}'"
    return f"{cmd} {' '.join(pins)}"


def seed_command(result: dict, row: dict) -> str:
    """The script command that trains one seed's row of a script-run result again."""
    return command({"command": f"python {result.get('script', 'ppo_breakout')}.py --seed "
                               f"{row['seed']} --num-devices {row['args']['num_devices']}",
                    "args": row["args"], "env_vars": row.get("env_vars")})


def files_of(patterns: list[str]) -> list[str]:
    out = []
    for pattern in patterns:
        found = sorted(os.path.relpath(p, os.path.join(ROOT, RESULTS))
                       for p in glob.glob(os.path.join(ROOT, RESULTS, pattern)))
        if not found:
            raise ValueError(f"no result file matches {pattern}")
        out += found
    return out


def commands_block(table: dict) -> str:
    return "```bash\n" + "\n".join(command(load(f)) for f in files_of(table["files"])) + "\n```"


# --------------------------------------------------------------------------------------------------
# Cells: `{name}` or `{name:p}` with p a protocol (g: gymnax's, m: MinAtar's); `{base.name:p}`
# reads the row's baseline, `{NAME.name:p}` the result the row's `also` names NAME (all its seeds);
# a row's own keys are cells too
# --------------------------------------------------------------------------------------------------
def ci(x: dict, fmt: str = "{:.1f}") -> str:
    if x["ci"] is None:  # one seed
        return fmt.format(x["value"])
    return f"{fmt.format(x['value'])} [{fmt.format(x['ci'][0])}, {fmt.format(x['ci'][1])}]"


def game(r: dict) -> str:
    return r["args"]["env_id"].removesuffix("-MinAtar")


def show(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def changed(r: dict, b: dict) -> str:
    (name, _), = r["changed_args"].items()
    return f"`{name}` {show(b['args'][name])}"


def seconds(r: dict) -> float:
    return r["timing"]["train_seconds"]


def wall(x) -> str:
    share = stats.share_past_wall(x)
    return f"{share['count']}/{share['of']}"


def below(x) -> str:
    n = len(x) - stats.share_past_wall(x)["count"]
    return f"{n} ({n / len(x):.0%})"


def published(r: dict, p: str) -> float:
    """The published PPO score of r's game under protocol p."""
    return aggregate.PUBLISHED[game(r)][list(PROTOCOLS).index(p)]


def reach(r: dict, target: float, p: str) -> str:
    """Where each seed of r, evaluated during training (--eval-every), first scores at least
    `target` under protocol p (r's own policy): the step and the training seconds there."""
    name = {"g": "gymnax", "m": "minatar"}[p]
    shown = []
    for curve in r["eval_curves"]:
        returns = curve[f"{name}/{r['policy']}"]
        at = next((i for i, value in enumerate(returns) if value >= target), None)
        shown.append(f"not by {curve['steps'][-1] / 1e6:.1f}M" if at is None else
                     f"{curve['steps'][at] / 1e6:.1f}M steps, {curve['train_seconds'][at]:.0f} s")
    return "; ".join(shown)


def at_steps(r: dict, steps: int, p: str) -> str:
    """The seeds' mean evaluation under protocol p (r's own policy) at the evaluation during
    training (--eval-every) nearest `steps`, within 5% of it; "" where a seed was not evaluated
    there (a run not that far yet, or evaluated at other steps)."""
    name, values = {"g": "gymnax", "m": "minatar"}[p], []
    for curve in r["eval_curves"]:
        near = np.abs(np.asarray(curve["steps"]) - steps) if curve else np.array([np.inf])
        if near.min() > 0.05 * steps:
            return ""
        values.append(curve[f"{name}/{r['policy']}"][int(near.argmin())])
    return f"{np.mean(values):.1f}"


ONE = {  # cells of one protocol's per-seed returns x (and the baseline's, bx)
    "per_seed": lambda x, bx: ", ".join(f"{v:.1f}" for v in x),
    "mean": lambda x, bx: ci(stats.summarize(x)["mean"]),
    "iqm": lambda x, bx: ci(stats.summarize(x)["iqm"]),
    "avg": lambda x, bx: f"{np.mean(x):.1f}",
    "min": lambda x, bx: f"{min(x):.1f}",
    "max": lambda x, bx: f"{max(x):.1f}",
    "wall": lambda x, bx: wall(x),
    "below": lambda x, bx: below(x),
    "atleast40": lambda x, bx: str(sum(v >= 40 for v in x)),
    "diff": lambda x, bx: ci(stats.compare(bx, x)["mean_difference"], "{:+.1f}"),
    "iqm_diff": lambda x, bx: ci(stats.compare(bx, x)["iqm_difference"], "{:+.1f}"),
    "poi": lambda x, bx: ci(stats.compare(bx, x)["probability_of_improvement"], "{:.2f}"),
}
WHOLE = {  # cells of a whole result r (and its baseline b)
    "game": lambda r, b: game(r),
    "n": lambda r, b: str(len(r["seeds"])),
    "seeds": lambda r, b: seed_range(r["seeds"]),
    "steps": lambda r, b: f"{r['args']['total_timesteps'] / 1e6:g}M",
    "gaps": lambda r, b: ", ".join(f"{g:.0f}" for g in r.get("logit_gap_max") or []),
    "gap_max": lambda r, b: f"{max(r['logit_gap_max']):.1f}",
    "non_finite": lambda r, b: str(sum(r["non_finite"])),
    "log_ratio": lambda r, b: f"[{min(r['log_ratio_min']):.2f}, {max(r['log_ratio_max']):.2f}]",
    "ratio": lambda r, b: r["args"]["ratio"],
    "train_s": lambda r, b: f"{seconds(r):.0f}",
    "sps": lambda r, b: ", ".join(f"{v:,.0f}" for v in r["sps"]),  # per seed
    **{f"run_{name.split('_')[0]}": lambda r, b, name=name: ", ".join(  # per seed, e.g. run_compile
        f"{t[name]:.1f}" for t in r["timings"]) for name in RUN_TIMES},
    "train_ratio": lambda r, b: f"{seconds(r) / seconds(b):.2f}",
    "changed": changed,
    "changed_value": lambda r, b: show(next(iter(r["changed_args"].values()))),
}
CELL = re.compile(r"\{(?:(\w+)\.)?(\w+)(?::(\w))?\}")


def cell(template: str, row: dict, r: dict, b: dict | None, protocol: str,
         also: dict | None = None) -> str:
    def one(match):
        on, name, p = match.groups()
        p = protocol if p == "p" else p
        who, other = (r, b) if on is None else (b if on == "base" else also[on], None)
        if name in ONE:
            key = PROTOCOLS[p][0]
            return ONE[name](who[key], other[key] if other else None)
        if name == "published":
            return f"{published(who, p):g}"
        if name == "protocol":
            return PROTOCOLS[protocol][1]
        # Where r's evaluations during training first reach b's mean, the published PPO score of
        # r's game, or the row's `target` (another paper's).
        if name == "reach":
            return reach(r, float(np.mean(b[PROTOCOLS[p][0]])), p)
        if name == "reach_published":
            return reach(r, published(r, p), p)
        if name == "reach_target":
            return reach(r, float(row["target"]), p)
        if at := re.fullmatch(r"at(\d+)M", name):  # e.g. {at2M:g}: its evaluation at 2M steps
            return at_steps(who, int(at[1]) * 10**6, p)
        return WHOLE[name](who, other) if name in WHOLE else str(row[name])
    return CELL.sub(one, template)


# --------------------------------------------------------------------------------------------------
# Renderers, one per kind of table
# --------------------------------------------------------------------------------------------------
def results_table(table: dict) -> str:
    """Rows of results (per-seed, summaries, paired differences against a baseline on its seeds);
    each row is a result, its baseline, its own cells or the table's."""
    lines = [table["head"], table["rule"]]
    for row in table["rows"]:
        row = {"file": row} if isinstance(row, str) else row
        r = result_of(row["file"], row.get("seeds"), row.get("policy"))
        b = result_of(row["base"], r["seeds"] if row.get("paired", True) else None,
                      row.get("base_policy")) if "base" in row else None
        also = {name: result_of(file) for name, file in row.get("also", {}).items()}
        for protocol in ("g", "m") if table.get("per_protocol") else ("g",):
            if "line" in row:  # the whole line as one template
                lines.append(cell(row["line"], row, r, b, protocol, also))
                continue
            cells = [cell(c, row, r, b, protocol, also)
                     for c in row.get("cells", table.get("cells"))]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def games_table(table: dict) -> str:
    """Settings over the five games: the normalised IQM over games x seeds, its paired difference
    from the first setting, and each game's mean return under both protocols."""
    random = load("shared/random_scores.json")["random_returns"]
    runs = {row["setting"]: aggregate.load(os.path.join(ROOT, RESULTS, table["folder"]),
                                           row["setting"], table["steps"]) for row in table["rows"]}
    base = runs[table["rows"][0]["setting"]]
    lines = [table["head"], table["rule"]]
    for i, row in enumerate(table["rows"]):
        results = runs[row["setting"]]
        args = results["Breakout"]["ppo_args"]
        cells = [row["label"], "yes" if args["layer_norm"] else "no",
                 f"{args['sticky_action_prob']:g}"]
        for protocol in aggregate.PROTOCOL_KEYS:
            per_game = aggregate.normalised(results, protocol, random)
            cells.append(ci(aggregate.summarize(per_game), "{:.2f}"))
            cells.append("" if i == 0 else ci(aggregate.compare(
                aggregate.normalised(base, protocol, random), per_game), "{:+.2f}"))
        cells += [" / ".join(f"{np.mean(results[g][k]):.1f}"
                             for k in aggregate.PROTOCOL_KEYS.values()) for g in aggregate.GAMES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


class Median(string.Formatter):
    """Formats a list of per-round values as its median (range over the rounds)."""

    def format_field(self, value, spec):
        if isinstance(value, list):
            f = lambda v: format(v, spec)  # noqa: E731
            return f"{f(np.median(value))} ({f(min(value))}-{f(max(value))})"
        return format(value, spec)


def run_sps(run: dict) -> float:
    """A timed run's training SPS; NaN for an evaluation, which trains nothing."""
    return run.get("sps", float("nan"))


def speed_rows(table: dict, report: dict) -> list[dict]:
    """Per row of the table, its values: a list over the rounds, or one value per round-row."""
    if table["source"] == "harness":  # a row per round
        return [{"round": i + 1, "cache": "cold" if i == 0 else "warm",
                 "harness_wall": r["harness"]["wall_seconds"],
                 "harness_peak": r["harness"]["peak_memory_gb"],
                 "script_wall": sum(s["wall_seconds"] for s in r["script"]),
                 "script_peak": max(s["peak_memory_gb"] for s in r["script"]),
                 "ratio": r["ratio"], "one_chunk": r["one_chunk_train_ratio"]}
                for i, r in enumerate(report["rounds"])]
    configs = report.get("configs") or report.get("versions")  # script_speed.py's: versions
    if table["source"] == "configs":  # rounds of {config: run}, against the first config
        rounds = [[r[c] | {"key": c} for c in configs] for r in report["rounds"]]
    elif table["source"] == "loop":  # loop_speed.py's: the script and its bare step per round,
        # the bare step at other precisions once, in the first round
        configs = ["bare", "script"]
        rounds = [[r[c] | {"key": c} for c in configs] for r in report["rounds"]]
        rounds[0] += [run | {"key": f"bare, {precision}"}
                      for precision, run in report["bare_step_at_precision"].items()]
    else:  # "runs": a flat list of runs, each of a variant (and a game) in a round
        runs = report["runs"]
        keys = sorted({r["round"] for r in runs})
        rounds = [[r for r in runs if r["round"] == k] for k in keys]
    def match(run: dict, key: str, row: dict) -> bool:
        return run.get("key", run.get("variant")) == key and run.get("game") == row.get("game")

    out = []
    for row in table["rows"]:
        ref = row.get("ref", (configs or [None])[0])
        pairs = [(own, first) for runs in rounds for own in runs if match(own, row["key"], row)
                 for first in runs if match(first, ref, row)]
        own = [o for o, _ in pairs]
        sps = lambda r: r.get("sps", float("nan"))  # noqa: E731  (an evaluation trains nothing)
        out.append({**row, "rounds": len(own), "sps": [sps(r) for r in own],
                    "sps_k": [sps(r) / 1000 for r in own],
                    "wall": [r.get("wall_seconds", float("nan")) for r in own],
                    "compile": [r.get("compile_seconds", float("nan")) for r in own],
                    "peak": [r.get("peak_memory_mb", float("nan")) for r in own],
                    "ref_over_own": [sps(f) / sps(o) for o, f in pairs],
                    "own_over_ref": [sps(o) / sps(f) for o, f in pairs],
                    "sampled": ", ".join(sorted({f"{r['sampled']:.2f}" for r in own}))
                    if "sampled" in own[0] else ""})
    return out


def speed_table(table: dict) -> str:
    """Timings in alternating rounds: medians (range over the rounds) of each row's runs, from the
    table's file or each row's own (whose command the row then has; the preamble reads the
    first)."""
    fmt = Median()
    rows, facts = [], None
    for row in table.get("rows") or [{}]:  # a harness table: a row per round, none listed
        report = load(row.get("file", table.get("file")))
        rounds = report.get("rounds") or {r["round"] for r in report["runs"]}
        facts = facts or {**shown(report), "rounds": len(rounds)}
        one = table | {"rows": [row]} if row else table
        rows += [{"command": shown(report)["command"]} | r for r in speed_rows(one, report)]
    lines = [fmt.format(table["preamble"], **facts), "", fmt.format(table["head"], **facts),
             table["rule"]]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(c, **row) for c in table["cells"]) + " |")
    return "\n".join(lines)


def same_run(table: dict) -> str:
    """Two runs that must be the same run (a flag against the prototype it was built from)."""
    first, second = (load(f) for f in table["files"])
    assert all(first[k] == second[k] for k in ("seeds", "eval_returns", "eval_returns_minatar",
                                               "curve")), f"{table['id']}: not the same run"
    return "\n".join(["```bash", command(first), command(second), "```", "",
                      f"Both give evaluation returns {', '.join(map(str, first['eval_returns']))} "
                      f"on seeds {seed_range(first['seeds'])}, and the same training curve."])


def parts(table: dict) -> str:
    """Several tables in one block, a blank line apart."""
    return "\n\n".join(render(dict(part, id=table["id"])) for part in table["parts"])


def trained_on(machine: str, device: str | None = None) -> str:
    """Where a model's run trained, in a few words: the accelerator its run named (`device`, in
    runs since summaries name it) or its results file's machine names (tools.common.machine's
    words), "TPU v5 lite x 1"; else the CPU's cores, "2-core CPU" (its model is in the file)."""
    if device and not device.startswith("cpu"):
        return device
    accelerator = re.match(r"(.+ x \d+) \(", machine)  # an accelerator, then its host's CPU
    if accelerator:
        return accelerator.group(1)
    cores = re.search(r"(\d+) cores", machine)
    return f"{cores.group(1)}-core CPU" if cores else "CPU"


def models_table(table: dict) -> str:
    """The pretrained agents: each file in models/ with the run it came from (the file's digest is
    that run's model_sha256, or the table fails), its scores under both protocols and both policies
    (the run's own, or those of the file played again, `evaluated`), and the commands that play it
    and train it again."""
    lines = [table["head"], table["rule"]]
    for row in table["rows"]:
        result = load(row["file"])
        (run,) = [r for r in result["rows"] if r["seed"] == row["seed"]]
        if files.source_digest(os.path.join(ROOT, row["model"])) != run["model_sha256"]:
            raise ValueError(f"{row['model']} is not the model of seed {row['seed']} in "
                             f"{row['file']}")
        script, e = result["script"], run["eval"]
        if "evaluated" in row:  # the file played again (`play it`) by today's evaluation
            e = load(row["evaluated"])["rows"][0]["eval"]
        play = (f"python {script}.py --load-model {row['model']} --seed {run['seed']} "
                f"--num-devices {run['args']['num_devices']}")
        scores = [e["greedy"], e["sampled"], e["sticky_0.1"]["greedy"], e["sticky_0.1"]["sampled"]]
        lines.append("| " + " | ".join([
            run["args"]["env_id"].removesuffix("-MinAtar"), f"`{script}.py`",
            f"[{os.path.basename(row['model'])}]({os.path.basename(row['model'])})",
            f"{run['args']['total_timesteps'] / 1e6:g}M", trained_on(result["cpu"],
                                                                     run.get("device")),
            *[f"{x['mean']:.1f}" for x in scores], f"`{play}`",
            f"`{seed_command(result, run)}`"]) + " |")
    return "\n".join(lines)


def rows_table(table: dict) -> str:
    """A benchmark's own rows (its report's `rows`): each table row is the report's row whose
    fields equal the table row's `match`, its cells formatted from that row's fields and the table
    row's own (a field neither has: "–"); the preamble from the report's fields. A table row may
    name its own `file`, and the `list` of that report to look in ("": the report itself is the
    one row), and its own `cells` (where its report lacks a nested field the others have)."""
    report = load(table["file"])
    lines = [table["preamble"].format(**shown(report)), "", table["head"], table["rule"]]
    for row in table["rows"]:
        source = load(row["file"]) if "file" in row else report
        listed = row.get("list", "rows")
        (found,) = [r for r in (source[listed] if listed else [source])
                    if all(r[k] == v for k, v in row.get("match", {}).items())]
        fields = collections.defaultdict(Dash, {**found, **row})
        cells = row.get("cells", table["cells"])
        lines.append("| " + " | ".join(c.format_map(fields) for c in cells) + " |")
    return "\n".join(lines)


class Dash:
    """What a rows table shows where its row lacks a field (a refused setting's SPS)."""

    def __format__(self, spec: str) -> str:
        return "–"


RENDERERS = {"results": results_table, "games": games_table, "speed": speed_table,
             "rows": rows_table,
             "same_run": same_run, "commands": commands_block,
             "parts": parts, "models": models_table}


def render(table: dict) -> str:
    return RENDERERS[table["kind"]](table)


def tables() -> dict:
    return {t["id"]: t for t in manifest()["table"]}


def with_tables(doc: str, by_id: dict | None = None) -> str:
    """doc with every marked block replaced by its freshly rendered table."""
    by_id = tables() if by_id is None else by_id

    def replace(match):
        name = match.group(1)
        return f"<!-- begin: {name} -->\n{render(by_id[name])}\n<!-- end: {name} -->"
    return re.sub(r"<!-- begin: ([\w-]+) -->\n(?:.*?\n)?<!-- end: \1 -->", replace, doc,
                  flags=re.S)


def main() -> None:
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    if args.commands:
        for table in tables().values():
            if table["kind"] == "commands":
                print("\n".join(command(load(f)) for f in files_of(table["files"])))
        return
    docs = {}
    for name in DOCS:
        with open(os.path.join(ROOT, name)) as f:
            docs[name] = f.read()
    by_id = tables()
    try:  # a manifest row that its files cannot fill: one line
        stale = [name for name, doc in docs.items() if with_tables(doc, by_id) != doc]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.check:
        if stale:
            print(f"error: tables in {', '.join(stale)} differ from the committed JSON; run {THIS}",
                  file=sys.stderr)
            sys.exit(1)
        return
    for name in stale:
        with open(os.path.join(ROOT, name), "w") as f:
            f.write(with_tables(docs[name], by_id))
    from tools import figures  # here: matplotlib, which --check does not need
    figures.main()


if __name__ == "__main__":
    main()

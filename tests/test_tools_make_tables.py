"""Tests of tools/make_tables.py: the docs' tables are the committed JSON's, a stale one is
caught, and the README's and docs/results.md's results ran with today's defaults."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import make_tables, stats  # noqa: E402


def test_committed_docs_hold_the_tables_of_the_committed_json(monkeypatch, capsys):
    # `python tools/make_tables.py --check`, in this process: a stale table exits 1 (below).
    monkeypatch.setattr(sys, "argv", ["make_tables.py", "--check"])
    make_tables.main()
    assert capsys.readouterr().err == ""


def test_a_block_is_replaced_whole_and_the_text_around_it_kept(monkeypatch):
    monkeypatch.setitem(make_tables.RENDERERS, "fake", lambda table: "| new |\n|---|")
    by_id = {"speed": {"id": "speed", "kind": "fake"}}
    doc = "before\n<!-- begin: speed -->\n| old |\n| stale row |\n<!-- end: speed -->\nafter\n"
    assert make_tables.with_tables(doc, by_id) == (
        "before\n<!-- begin: speed -->\n| new |\n|---|\n<!-- end: speed -->\nafter\n")
    empty = "<!-- begin: speed -->\n<!-- end: speed -->"  # a new page's block is filled too
    assert make_tables.with_tables(empty, by_id) == (
        "<!-- begin: speed -->\n| new |\n|---|\n<!-- end: speed -->")


FAKE = {"a.json": {"seeds": [1, 2, 3, 4], "eval_returns": [100.0, 100.0, 10.0, 20.0],
                   "eval_returns_minatar": [1.0, 2.0, 3.0, 4.0], "changed_args": {},
                   "ppo_args": {"gae_lambda": 0.9, "env_id": "Breakout-MinAtar"}},
        "b.json": {"seeds": [3, 4], "eval_returns": [30.0, 40.0],
                   "eval_returns_minatar": [5.0, 6.0],
                   "changed_args": {"gae_lambda": 0.95},
                   "ppo_args": {"gae_lambda": 0.95, "env_id": "Breakout-MinAtar"}}}
PAIRED = {"kind": "results", "head": "| h |", "rule": "|---|",
          "cells": ["{changed}", "{changed_value}", "{seeds}", "{mean:g}", "{diff:g}", "{game}"],
          "rows": [{"file": "b.json", "base": "a.json"}]}


def test_check_fails_on_a_stale_table(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("<!-- begin: paired -->\n| typed by hand |\n<!-- end: paired -->\n")
    monkeypatch.setattr(make_tables, "ROOT", str(tmp_path))
    monkeypatch.setattr(make_tables, "DOCS", ("page.md",))
    monkeypatch.setattr(make_tables, "load", lambda path: FAKE[path])
    monkeypatch.setattr(make_tables, "manifest", lambda: {"table": [dict(PAIRED, id="paired")]})
    monkeypatch.setattr(sys, "argv", ["make_tables.py", "--check"])
    with pytest.raises(SystemExit) as exit_:
        make_tables.main()
    assert exit_.value.code == 1


def test_a_row_compares_with_its_baseline_on_the_rows_seeds(monkeypatch):
    # The baseline ran seeds 1-4, the row seeds 3-4: the comparison must use the baseline's 3-4.
    monkeypatch.setattr(make_tables, "load", lambda path: FAKE[path])
    row = make_tables.results_table(PAIRED).splitlines()[-1]
    difference = stats.compare(np.array([10.0, 20.0]), np.array([30.0, 40.0]))["mean_difference"]
    mean = stats.summarize(np.array([30.0, 40.0]))["mean"]
    assert row == (f"| `gae_lambda` 0.9 | 0.95 | 3-4 | {make_tables.ci(mean)} "
                   f"| {make_tables.ci(difference, '{:+.1f}')} | Breakout |")
    assert f"{difference['value']:+.1f}" == "+20.0"


def test_per_protocol_rows_and_pooled_files(monkeypatch):
    monkeypatch.setattr(make_tables, "load", lambda path: FAKE[path])
    table = {"kind": "results", "head": "| h |", "rule": "|---|", "per_protocol": True,
             "cells": ["{protocol}", "{per_seed:p}", "{n}"],
             "rows": [{"file": ["a.json", "b.json"]}]}
    assert make_tables.results_table(table).splitlines()[2:] == [
        "| gymnax's | 100.0, 100.0, 10.0, 20.0, 30.0, 40.0 | 6 |",
        "| MinAtar's | 1.0, 2.0, 3.0, 4.0, 5.0, 6.0 | 6 |"]


def test_a_row_shows_the_results_its_also_names_beside_its_own(monkeypatch):
    # {pqn.mean:g} reads the file the row's `also` names pqn, all its seeds; {mean:g} the row's.
    monkeypatch.setattr(make_tables, "load", lambda path: FAKE[path])
    table = {"kind": "results", "head": "| h |", "rule": "|---|",
             "cells": ["{per_seed:g}", "{pqn.per_seed:g}", "{pqn.per_seed:m}", "{pqn.n}"],
             "rows": [{"file": "b.json", "also": {"pqn": "a.json"}}]}
    assert make_tables.results_table(table).splitlines()[2:] == [
        "| 30.0, 40.0 | 100.0, 100.0, 10.0, 20.0 | 1.0, 2.0, 3.0, 4.0 | 4 |"]


def test_every_evidence_row_changes_the_one_argument_its_file_names():
    (evidence,) = [t for t in make_tables.manifest()["table"] if t["id"] == "evidence"]
    for row in evidence["rows"][1:]:
        result = make_tables.load(row["file"])
        (name, value), = result["changed_args"].items()
        shown = "_".join(map(str, value if isinstance(value, list) else [value]))
        assert row["file"] == f"ppo_breakout/tuning/evidence/{name}_{shown}.json"
        assert row["base"] == "ppo_breakout/tuning/evidence/defaults.json"


def test_commands_are_rendered_from_the_arguments_the_result_recorded():
    import ppo_breakout
    today = {f.name: getattr(ppo_breakout.Args, f.name)
             for f in make_tables.dataclasses.fields(ppo_breakout.Args) if f.init}
    today = {k: list(v) if isinstance(v, tuple) else v for k, v in today.items()}
    run = "python tools/tune.py --out a.json"
    assert make_tables.command({"command": run, "ppo_args": today}) == run
    # A record older than a field holds none of it: the manifest says what the run did instead.
    old = {k: v for k, v in today.items() if k not in ("layer_norm", "sticky_action_prob",
                                                       "conv_channels")}
    assert make_tables.command({"command": run, "ppo_args": old}) == (
        run + " --ppo.no-layer-norm --ppo.sticky-action-prob 0.0 --ppo.conv-channels 0")
    # Any recorded value other than today's default is pinned; one the command gives stays as is.
    changed = {**today, "gamma": 0.995, "update_epochs": 2}
    given = run + " --ppo.update-epochs 2"
    assert make_tables.command({"command": given, "ppo_args": changed}) == (
        given + " --ppo.gamma 0.995")
    # The script itself, and a harness that passes the script's flags in one argument.
    assert make_tables.command({"command": "python ppo_breakout.py --seed 3",
                                "args": {**today, "clip_vloss": False}}) == (
        "python ppo_breakout.py --seed 3 --no-clip-vloss")
    rows = [{"args": {**today, "ent_coef": 0.02}}]
    assert make_tables.command({"command": "python tools/results_table.py "
                                "'--script-args=--env-id Freeway-MinAtar'", "rows": rows}) == (
        "python tools/results_table.py "
        "'--script-args=--ent-coef 0.02 --env-id Freeway-MinAtar'")
    # A script run applies the per-game rows: Asterix's 2 epochs need no flag there, but do in
    # the harness, which applies none.
    asterix = {**today, "env_id": "Asterix-MinAtar", "update_epochs": 2}
    table = "python tools/results_table.py '--script-args=--env-id Asterix-MinAtar'"
    assert make_tables.command({"command": table, "rows": [{"args": asterix}]}) == table
    assert make_tables.command({"command": run, "ppo_args": asterix}).endswith(
        "--ppo.env-id Asterix-MinAtar --ppo.update-epochs 2")
    # A run in an environment that changed what it computed (another precision) reruns in it:
    # a harness's or benchmark's command, and each collected run's own.
    high = "JAX_DEFAULT_MATMUL_PRECISION=high"
    assert make_tables.command({"command": given, "ppo_args": changed, "env_vars": high}) == (
        f"{high} {given} --ppo.gamma 0.995")
    collected = {"command": "python tools/results_table.py --collect runs/a runs/b",
                 "rows": [{"seed": 1, "args": {**today, "num_devices": 1}, "env_vars": high},
                          {"seed": 2, "args": {**today, "num_devices": 1}}]}
    assert make_tables.command(collected).splitlines() == [
        f"{high} python ppo_breakout.py --seed 1 --num-devices 1",
        "python ppo_breakout.py --seed 2 --num-devices 1"]
    # Seeds that tools/results_table.py ran itself share the environment it ran in.
    ran = {"command": "python tools/results_table.py --seeds 1 2",
           "rows": [{"args": today, "env_vars": high}, {"args": today, "env_vars": high}]}
    assert make_tables.command(ran) == f"{high} python tools/results_table.py --seeds 1 2"
    # A benchmark's preamble shows its command in its environment.
    assert make_tables.shown({"command": "python speed/x.py", "env_vars": high, "n": 1}) == {
        "command": f"{high} python speed/x.py", "env_vars": high, "n": 1}


def recorded_args_differing_from_todays(script_name: str, module, args: dict,
                                        budget: bool = False) -> list[str]:
    """The fields of `args` (a row's recorded arguments) that differ from the script's defaults
    today (with its game's row of per-game defaults), but for the fields a rendered command leaves
    out, eval_every (evaluating during training leaves training and the final evaluation as they
    are) and total_timesteps where the table chose the `budget`."""
    script = make_tables.manifest()["script"][script_name]
    ignore = make_tables.ignored(module) | {"eval_every"}
    ignore |= {"total_timesteps"} if budget else set()
    before = script["before"]  # fields younger than a run
    today = module.Args(env_id=args["env_id"])
    for name, value in getattr(module, "GAME_DEFAULTS", {}).get(today.env_id, {}).items():
        setattr(today, name, value)
    differing = []
    for f in make_tables.dataclasses.fields(today):
        if not f.init or f.name in ignore:
            continue
        value = getattr(today, f.name)
        value = list(value) if isinstance(value, tuple) else value
        if args.get(f.name, before.get(f.name, "absent")) != value:
            differing.append(f.name)
    return differing


def test_the_readmes_results_ran_with_todays_defaults():
    """Were a default changed, the README's and docs/results.md's numbers would no longer be what
    the script gives: rerun them (results/ppo_breakout/games/readme_*_1M.json and the collection's
    PQN seeds, commands in docs/results.md and docs/pqn_minatar.md) or keep the default."""
    import ppo_breakout
    import pqn_minatar
    for game in ("Asterix", "Breakout", "Freeway", "SpaceInvaders", "Seaquest"):
        for row in make_tables.load(f"ppo_breakout/games/readme_{game}_1M.json")["rows"]:
            assert recorded_args_differing_from_todays(
                "ppo_breakout.py", ppo_breakout, row["args"]) == [], (game, row["seed"])
    (collection,) = [t for t in make_tables.manifest()["table"] if t["id"] == "readme-collection"]
    for table_row in collection["rows"]:
        files = table_row["base"]
        for file in [files] if isinstance(files, str) else files:
            for row in make_tables.load(file)["rows"]:
                assert recorded_args_differing_from_todays(
                    "pqn_minatar.py", pqn_minatar, row["args"], budget=True) == [], file


def test_a_pqn_result_renders_pqn_flags_and_its_greedy_returns():
    import pqn_minatar
    today = {f.name: getattr(pqn_minatar.Args, f.name)
             for f in make_tables.dataclasses.fields(pqn_minatar.Args) if f.init}
    today = {k: list(v) if isinstance(v, tuple) else v for k, v in today.items()}
    # The harness names the script it ran: its flags take that script's group and defaults.
    run = "python tools/tune.py --script pqn_minatar --out a.json"
    result = {"command": run, "script": "pqn_minatar", "pqn_args": {**today, "q_lambda": 0.8}}
    assert make_tables.command(result) == run + " --pqn.q-lambda 0.8"
    # A script run's table reports the policy it names (PQN: greedy), under both protocols.
    table = "python tools/results_table.py --script pqn_minatar"
    evaluation = {"sampled": {"mean": 1.0}, "greedy": {"mean": 2.0},
                  "sticky_0.1": {"sampled": {"mean": 3.0}, "greedy": {"mean": 4.0}}}
    rows = [{"seed": 1, "args": today, "eval": evaluation, "curve": {}}]
    result = {"command": table, "script": "pqn_minatar", "policy": "greedy", "rows": rows}
    assert make_tables.command(result) == table
    returns = make_tables.per_seed(result)
    assert (returns["eval_returns"], returns["eval_returns_minatar"]) == ([2.0], [4.0])


def test_reach_is_the_first_evaluation_at_or_above_the_baselines_mean_or_a_target():
    # A run evaluated during training (--eval-every), as results_table.py records it, and a
    # baseline whose means are 62 (gymnax's protocol) and 45 (MinAtar's).
    curve = {"steps": [1_000_000, 2_000_000, 3_000_000], "train_seconds": [100.4, 200.0, 300.0],
             "gymnax/greedy": [10.0, 62.0, 70.0], "minatar/greedy": [5.0, 44.0, 30.0],
             "gymnax/sampled": [70.0, 70.0, 70.0], "minatar/sampled": [50.0, 50.0, 50.0]}
    rows = [{"seed": 1, "args": {}, "curve": {}, "eval_curve": curve,
             "eval": {"greedy": {"mean": 70.0}, "sticky_0.1": {"greedy": {"mean": 30.0}}}}]
    r = make_tables.per_seed({"command": "", "policy": "greedy", "rows": rows})
    b = {"eval_returns": [60.0, 64.0], "eval_returns_minatar": [40.0, 50.0]}
    assert make_tables.cell("{reach:g}", {}, r, b, "g") == "2.0M steps, 200 s"  # 62 reaches it
    assert make_tables.cell("{reach:m}", {}, r, b, "g") == "not by 3.0M"
    # Against the row's own target, and against the published PPO scores of its game (Breakout:
    # 43.4 under gymnax's protocol, 50.0 under MinAtar's).
    assert make_tables.cell("{reach_target:g}", {"target": 9.5}, r, b, "g") == "1.0M steps, 100 s"
    r["args"] = {"env_id": "Breakout-MinAtar"}
    assert make_tables.cell("{reach_published:g}", {}, r, None, "g") == "2.0M steps, 200 s"
    assert make_tables.cell("{reach_published:m}", {}, r, None, "g") == "not by 3.0M"
    r["eval_curves"] *= 2  # one entry per seed
    assert make_tables.reach(r, 62.0, "g") == "2.0M steps, 200 s; 2.0M steps, 200 s"


def test_at_steps_is_the_seeds_mean_evaluation_nearest_those_steps():
    # Two seeds evaluated every 244 iterations of 4096 steps, as a 10M DQN run is; the second
    # seed stopped before 3M.
    steps = [999_424, 1_998_848, 2_998_272]
    curves = [{"steps": steps, "gymnax/greedy": [10.0, 20.0, 30.0],
               "minatar/greedy": [1.0, 2.0, 3.0]},
              {"steps": steps[:2], "gymnax/greedy": [14.0, 40.0], "minatar/greedy": [5.0, 6.0]}]
    r = {"policy": "greedy", "eval_curves": curves}
    assert make_tables.at_steps(r, 1_000_000, "g") == "12.0"
    assert make_tables.at_steps(r, 2_000_000, "g") == "30.0"
    assert make_tables.at_steps(r, 2_000_000, "m") == "4.0"
    assert make_tables.at_steps(r, 3_000_000, "g") == ""  # not every seed got there
    assert make_tables.at_steps({**r, "eval_curves": curves[:1]}, 3_000_000, "g") == "30.0"
    assert make_tables.at_steps({**r, "eval_curves": curves[:1]}, 4_000_000, "g") == ""
    assert make_tables.cell("{at2M:g} / {at2M:m}", {}, r, None, "g") == "30.0 / 4.0"


def test_a_script_runs_sps_cell_is_each_seeds_own():
    # results_table.py's rows, one per seed, each with the SPS its run measured.
    evaluation = {"greedy": {"mean": 1.0}, "sticky_0.1": {"greedy": {"mean": 1.0}}}
    rows = [{"seed": seed, "args": {}, "curve": {}, "eval": evaluation, "sps": sps}
            for seed, sps in ((1, 4321.4), (2, 12_345.6))]
    r = make_tables.per_seed({"command": "", "policy": "greedy", "rows": rows})
    assert make_tables.cell("{sps}", {}, r, None, "g") == "4,321, 12,346"


def test_a_speed_row_may_read_its_own_file_and_show_its_command(monkeypatch):
    # A table of several commands' first runs: each row its own report, an evaluation without SPS.
    def report(command, peaks, sps=None):
        runs = [{"wall_seconds": 1.0, "peak_memory_mb": p} | ({"sps": sps} if sps else {})
                for p in peaks]
        return {"command": command, "machine": "M", "versions": ["this tree"],
                "rounds": [{"this tree": r} for r in runs]}

    files = {"a.json": report("python a.py", [600, 640], sps=10.0),
             "b.json": report("python b.py --load-model m", [500, 520])
             | {"env_vars": "JAX_DEFAULT_MATMUL_PRECISION=high"}}  # run in that environment
    monkeypatch.setattr(make_tables, "load", lambda path: files[path])
    table = {"id": "t", "kind": "speed", "source": "configs", "preamble": "On {machine}.",
             "head": "| run | command | peak |", "rule": "|---|---|---:|",
             "cells": ["{label}", "`{command}`", "{peak:.0f}"],
             "rows": [{"file": "a.json", "key": "this tree", "label": "A"},
                      {"file": "b.json", "key": "this tree", "label": "B"}]}
    assert make_tables.speed_table(table).splitlines()[4:] == [
        "| A | `python a.py` | 620 (600-640) |",
        "| B | `JAX_DEFAULT_MATMUL_PRECISION=high python b.py --load-model m` | 510 (500-520) |"]


def test_a_rows_tables_row_may_read_its_own_file_and_list(monkeypatch):
    # A profile's rows beside a summary (the report itself one row) and a harness's listed rows.
    files = {"profile.json": {"machine": "M", "command": "python p.py",
                              "env_vars": "JAX_DEFAULT_MATMUL_PRECISION=high",
                              "rows": [{"seeds": 1, "sps": 10.0}, {"seeds": 8, "sps": 40.0}]},
             "summary.json": {"sps": 25.0},
             "harness.json": {"harness": [{"seeds": 8, "sps": 90.0}]}}
    monkeypatch.setattr(make_tables, "load", lambda path: files[path])
    table = {"id": "t", "kind": "rows", "file": "profile.json",
             "preamble": "On {machine}: `{command}`.",
             "head": "| what | SPS |", "rule": "|---|---:|", "cells": ["{label}", "{sps:,.0f}"],
             "rows": [{"match": {"seeds": 8}, "label": "before, 8"},
                      {"file": "summary.json", "list": "", "label": "the script"},
                      {"file": "harness.json", "list": "harness", "match": {"seeds": 8},
                       "label": "the harness, 8"}]}
    assert make_tables.rows_table(table).splitlines()[0] == (
        "On M: `JAX_DEFAULT_MATMUL_PRECISION=high python p.py`.")
    assert make_tables.rows_table(table).splitlines()[2:] == [
        "| what | SPS |", "|---|---:|", "| before, 8 | 40 |", "| the script | 25 |",
        "| the harness, 8 | 90 |"]


def test_a_rows_tables_row_may_give_its_own_cells(monkeypatch):
    # An older report lacks a nested field (timing[checkpoint_seconds]) that a later one holds.
    files = {"old.json": {"machine": "M", "command": "c", "timing": {"train_seconds": 9.0}},
             "new.json": {"timing": {"train_seconds": 5.0, "checkpoint_seconds": 1.0}}}
    monkeypatch.setattr(make_tables, "load", lambda path: files[path])
    table = {"id": "t", "kind": "rows", "file": "old.json", "preamble": "On {machine}.",
             "head": "| run | training | checkpoints |", "rule": "|---|---:|---:|",
             "cells": ["{label}", "{timing[train_seconds]:.0f}",
                       "{timing[checkpoint_seconds]:.0f}"],
             "rows": [{"list": "", "label": "old",
                       "cells": ["{label}", "{timing[train_seconds]:.0f}", "not recorded"]},
                      {"file": "new.json", "list": "", "label": "new"}]}
    assert make_tables.rows_table(table).splitlines()[4:] == [
        "| old | 9 | not recorded |", "| new | 5 | 1 |"]


def test_a_row_reads_the_policy_it_names(monkeypatch):
    # The harness's --both-policies records the other policy beside the headline; a script run's
    # rows hold both. A row may read either; a file without that policy is refused.
    harness = {"command": "python tools/tune.py", "seeds": [1, 2], "policy": "greedy",
               "eval_returns": [1.0, 2.0], "eval_returns_minatar": [3.0, 4.0],
               "minatar_bound_hits": [0, 0], "changed_args": {}, "args": {"env_id": "Breakout"},
               "other_policy": {"policy": "sampled", "eval_returns": [5.0, 6.0],
                                "eval_returns_minatar": [7.0, 8.0], "minatar_bound_hits": [0, 1],
                                "summary": {}, "summary_minatar": {}}}
    rows = {"command": "python tools/results_table.py", "policy": "sampled", "rows": [
        {"seed": 1, "args": {"env_id": "Breakout"}, "curve": None,
         "eval": {"sampled": {"mean": 9.0}, "greedy": {"mean": 10.0},
                  "sticky_0.1": {"sampled": {"mean": 11.0}, "greedy": {"mean": 12.0}}}}]}
    files = {"h.json": harness, "r.json": rows,
             "old.json": {**harness, "other_policy": None}}
    monkeypatch.setattr(make_tables, "load", lambda path: files[path])
    table = {"kind": "results", "head": "| h |", "rule": "|---|",
             "cells": ["{per_seed:g}", "{per_seed:m}", "{base.per_seed:g}", "{base.per_seed:m}"],
             "rows": [{"file": "h.json", "base": "r.json", "paired": False},
                      {"file": "h.json", "policy": "sampled", "base": "r.json",
                       "base_policy": "greedy", "paired": False},
                      {"file": "h.json", "policy": "greedy", "base": "r.json",
                       "base_policy": "sampled", "paired": False}]}
    assert make_tables.results_table(table).splitlines()[2:] == [
        "| 1.0, 2.0 | 3.0, 4.0 | 9.0 | 11.0 |",
        "| 5.0, 6.0 | 7.0, 8.0 | 10.0 | 12.0 |",
        "| 1.0, 2.0 | 3.0, 4.0 | 9.0 | 11.0 |"]
    with pytest.raises(ValueError, match="evaluated no sampled policy .* --both-policies"):
        make_tables.result_of("old.json", policy="sampled")
    with pytest.raises(ValueError, match="results_table.py evaluated no argmax policy"):
        make_tables.result_of("r.json", policy="argmax")
    # A harness file from before the harness recorded its policy is PPO's: sampled.
    files["ppo.json"] = {k: v for k, v in harness.items() if k not in ("policy", "other_policy")}
    assert make_tables.result_of("ppo.json", policy="sampled")["eval_returns"] == [1.0, 2.0]


def test_a_models_machine_is_its_accelerator_or_its_cpus_cores():
    assert make_tables.trained_on(
        "TPU v5 lite x 1 (AMD EPYC, CPU family 175, 13 cores, no AVX-512)") == "TPU v5 lite x 1"
    # A CPU's own brackets are not an accelerator's host.
    assert make_tables.trained_on(
        "Intel(R) Xeon(R) Processor, CPU family 6, 2 cores, AVX-512") == "2-core CPU"
    assert make_tables.trained_on("AMD EPYC, CPU family 25, 2 cores, AVX-512") == "2-core CPU"
    # The run's own device first: a chip's run collected on another machine.
    assert make_tables.trained_on("AMD EPYC, CPU family 25, 2 cores, AVX-512",
                                  "TPU v5 lite x 1") == "TPU v5 lite x 1"
    assert make_tables.trained_on("AMD EPYC, CPU family 25, 2 cores, AVX-512",
                                  "cpu x 2") == "2-core CPU"

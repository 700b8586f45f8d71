"""Tests of speed/dqn_step_variants.py: on the CPU, with tiny flags, it times each gradient
step and batch draw variant for one seed and for two side by side, writes and counts each
program's products, and refuses a variant it does not know."""

import gzip
import json
import re

from helpers import run_main
from speed import dqn_step_variants

TINY = "--script-args=--num-envs 4 --num-steps 8 --buffer-size 256 --batch-size 8"


def test_it_times_every_variant_for_each_seed_count(tmp_path):
    result = run_main(dqn_step_variants, tmp_path, TINY, "--seeds", "1", "2", "--repeats", "1",
                      "--hlo-dir", ".", "--out", "variants.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "variants.json").read_text())
    assert report["gradient_steps_per_program"] == 8  # 0.25 x 4 environments x 8 steps
    measured = [(row["part"], row["variant"], row["seeds"]) for row in report["rows"]]
    expected = [(part, variant, n) for n in (1, 2)
                for part, variants in (("gradient", dqn_step_variants.GRADIENT_VARIANTS),
                                       ("sample", dqn_step_variants.SAMPLE_VARIANTS))
                for variant in variants]
    assert measured == expected
    assert all(row["us_per_step"] > 0 and row["compile_seconds"] > 0 for row in report["rows"])
    # each program's optimized HLO written, its products counted: a gradient step has its
    # network's, forward and backward; the CPU writes none as a convolution over the seeds. Its
    # products keep the precision they were traced at: the scripts' highest, or the variant's.
    for row in report["rows"]:
        hlo = gzip.open(tmp_path / f"{row['part']}_{row['variant']}_{row['seeds']}.hlo.gz",
                        "rt").read()
        assert "ENTRY" in hlo
        if row["part"] == "gradient":
            precision = {"precision_default": set(), "precision_high": {"high"}}
            assert set(re.findall(r"operand_precision=\{(\w+),", hlo)) == precision.get(
                row["variant"], {"highest"}), row
        assert row["seed_window_products"] == 0
        assert (row["loop_products"] >= 6) == (row["part"] == "gradient"), row
        assert row["products"] >= row["loop_products"]


def test_an_unknown_variant_is_refused_with_one_line(tmp_path):
    result = run_main(dqn_step_variants, tmp_path, "--gradient", "script", "fused", timeout=120)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: unknown variants ['fused']: gradient ('script', 'matmul_conv', 'xla_conv', "
        "'one_online_pass', 'two_online_passes', 'sgd', 'precision_default', "
        "'precision_high'), "
        "sample ('script', 'flashbax')"]

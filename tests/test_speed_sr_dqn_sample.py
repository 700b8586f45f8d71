"""Tests of speed/sr_dqn_sample.py: on the CPU, with tiny flags, it times each batch draw variant
for one seed and for two side by side; its two forms of the windows' reads draw the same steps;
it refuses a variant it does not know."""

import json

import jax
import jax.numpy as jnp
import numpy as np

import sr_dqn_minatar as sr
from helpers import run_main
from speed import sr_dqn_sample
from speed.dqn_profile import script_setup

TINY = "--script-args=--num-envs 4 --num-steps 8 --buffer-size 256 --batch-size 8"


def test_it_times_every_variant_for_each_seed_count(tmp_path):
    result = run_main(sr_dqn_sample, tmp_path, TINY, "--seeds", "1", "2", "--repeats", "1",
                      "--out", "sample.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "sample.json").read_text())
    assert report["batches_per_program"] == 64  # 2 x 4 environments x 8 steps
    assert (report["batch_size"], report["buffer_size"], report["max_n"]) == (8, 256, 10)
    assert [(row["variant"], row["seeds"]) for row in report["rows"]] == [
        (variant, n) for n in (1, 2) for variant in sr_dqn_sample.VARIANTS]
    assert all(row["us_per_batch"] > 0 and row["compile_seconds"] > 0 for row in report["rows"])


def test_the_windows_two_forms_draw_the_same_steps():
    # what the table compares must be one draw in two forms: the blocks' and the single steps'
    args, env, env_params, codec = script_setup(sr, TINY.removeprefix("--script-args="))
    state = sr_dqn_sample.full_replay(jax.random.key(0), args, codec,
                                      env.observation_space(env_params).shape,
                                      env.action_space(env_params).n)
    n, gamma = jnp.asarray(3), jnp.asarray(0.9)
    draw = lambda variant: sr_dqn_sample.draw(  # noqa: E731
        variant, state, jax.random.key(1), n, gamma, 10, args.batch_size, codec)
    for blocked, single in zip(draw("windows"), draw("windows_gathered")):
        np.testing.assert_array_equal(blocked, single)
    rows, slots = draw("indices")
    assert slots.shape == (args.batch_size, 10)


def test_an_unknown_variant_is_refused_with_one_line(tmp_path):
    result = run_main(sr_dqn_sample, tmp_path, "--variants", "script", "fused", timeout=120)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: unknown variants ['fused']: choose from ('script', 'indices', 'observations', "
        "'windows', 'windows_gathered')"]

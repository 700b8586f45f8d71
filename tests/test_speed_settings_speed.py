"""Tests of speed/settings_speed.py: on the CPU, with tiny settings of DQN, it records each
setting as run (with its speed), refused (with the script's own error line) or failed (with the
error's first line), and goes on to the next."""

import json

from helpers import run_main
from speed import loop_speed, settings_speed

TINY = ("--total-timesteps 1024 --num-envs 16 --num-steps 32 --buffer-size 1024 --batch-size 8 "
        "--learning-starts 256 --target-update-period 256 --epsilon-decay-steps 512")


def test_each_setting_is_run_refused_or_failed_and_the_next_goes_on(tmp_path, monkeypatch):
    real_bare_step = loop_speed.bare_step

    def bare_step(script, args):  # the compiler's refusal of a setting, as XLA raises it
        if args.buffer_size == 2048:
            raise RuntimeError("RESOURCE_EXHAUSTED: copy u8[...] is 25.32M\nand more lines")
        return real_bare_step(script, args)

    monkeypatch.setattr(loop_speed, "bare_step", bare_step)
    settings = [f"{TINY} --buffer-size 2048", f"{TINY} --replay-ratio 0.3", TINY]
    result = run_main(settings_speed, tmp_path, f"--settings={'; '.join(settings)}",
                      "--out", "settings.json", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((tmp_path / "settings.json").read_text())["rows"]
    assert [row["setting"] for row in rows] == settings
    assert [row["outcome"] for row in rows] == ["failed", "refused", "ran"]
    assert rows[0]["error"] == "RuntimeError: RESOURCE_EXHAUSTED: copy u8[...] is 25.32M"
    assert rows[1]["error"] == ("error: --replay-ratio 0.3 x the iteration's 512 steps (num_envs "
                                "x num_steps) must be a whole number of gradient steps")
    # 1024 steps: the run's two iterations of 512, timed after one unrecorded
    assert rows[2]["sps"] == 1024 / rows[2]["train_seconds"] and rows[2]["compile_seconds"] > 0

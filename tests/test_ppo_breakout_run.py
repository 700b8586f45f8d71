"""ppo_breakout.py run the way a user runs it, in this process or as a subprocess with tiny flags:
what a run leaves, learning, every game, model files played back (a damaged or mismatched one
refused). How it stops (bad input, a non-finite loss, signals) and resumes:
test_ppo_breakout_stops.py; the script's functions: test_ppo_breakout.py."""

import glob
import json
import os
import sys

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import tyro
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo_breakout as ppo
from helpers import (
    GAMES,
    TINY,
    network_args,
    only_run_dir,
    read_scalars,
    read_summary,
    run_in_process,
    tiny_network_params,
)
from utils import evaluation, files
from utils import model as model_file
from utils.evaluation import evaluate

# --------------------------------------------------------------------------------------------------
# ppo_breakout.py: a run and what it leaves
# --------------------------------------------------------------------------------------------------
TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
        "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
        "losses/clipfrac", "losses/explained_variance",
        "eval/sampled_return", "eval/greedy_return", "eval/sticky_0.1/sampled_return",
        "eval/sticky_0.1/greedy_return", "eval/greedy_distinct_episodes"]
DIAGNOSTIC_TAGS = [f"diagnostics/{name}" for name in ppo.DIAGNOSTICS] + [
    f"diagnostics/action_{a}_frequency" for a in range(3)]


def test_script_logs_tensorboard_and_writes_summary(tiny_run):
    result, run_dir = tiny_run
    assert ("eval (sampled, 8 episodes)" in result.stdout
            and "eval ( greedy, 8 episodes)" in result.stdout)
    assert os.path.basename(run_dir).startswith("Breakout-MinAtar__ppo_breakout__3__")

    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert tag in scalars, tag
    # --eval-every 1: evaluated after the first iteration too, under the final evaluation's tags
    summary = read_summary(run_dir)
    for protocol, numbers in (("", summary["eval"]), ("sticky_0.1", summary["eval"]["sticky_0.1"])):
        for mode in ("sampled", "greedy"):
            points = scalars[evaluation.return_tag(protocol, mode)]
            assert [step for step, _ in points] == [2048, 4096]
            assert points[-1][1] == pytest.approx(numbers[mode]["mean"])
    assert "step     2,048 | eval return, gymnax's / MinAtar's protocol: sampled " in result.stdout
    assert len(scalars["losses/policy_loss"]) == 2  # one point per iteration
    assert [step for step, _ in scalars["charts/SPS"]] == [2048, 4096]
    learning_rates = [value for _, value in scalars["charts/learning_rate"]]
    # 2 iterations x 1 epoch x 4 minibatches: the last updates of each iteration are numbers 3 and 7
    # of 8.
    assert learning_rates == pytest.approx([5e-3 * (1 - 3 / 8), 5e-3 * (1 - 7 / 8)])
    # never a placeholder 0
    assert all(0 < value < 1000 for _, value in scalars["charts/episodic_length"])
    for tag in DIAGNOSTIC_TAGS:
        values = [value for _, value in scalars[tag]]
        assert len(scalars[tag]) == 2 and np.isfinite(values).all(), tag
    frequencies = np.array([[value for _, value in scalars[f"diagnostics/action_{a}_frequency"]]
                            for a in range(3)])
    np.testing.assert_allclose(frequencies.sum(0), 1.0, rtol=1e-5)
    events = EventAccumulator(run_dir, size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    assert any("hyperparameters" in tag for tag in events.Tags()["tensors"])
    assert set(events.Tags()["histograms"]) == {f"histograms/{name}" for name in
                                                 ("logits", "log_ratio", "advantage", "value")}
    assert len(events.Histograms("histograms/logits")) == 2  # every tenth of training (here: each)
    assert set(events.Tags()["images"]) == {"eval/play", "eval/behaviour", "charts/learning_curve"}
    for name, frames in (("play.gif", 2), ("behaviour.png", 1), ("learning_curve.png", 1)):
        with Image.open(os.path.join(run_dir, name)) as image:  # a valid image, decoded to the end
            image.load()
            assert getattr(image, "n_frames", 1) >= frames and min(image.size) > 100, name

    assert summary["status"] == "completed"
    assert summary["env_id"] == "Breakout-MinAtar" and summary["seed"] == 3
    assert summary["total_timesteps"] == 4096 and summary["global_step"] == 4096
    for protocol in (summary["eval"], summary["eval"]["sticky_0.1"]):
        for mode in ("sampled", "greedy"):
            numbers = protocol[mode]
            assert numbers["min"] <= numbers["mean"] <= numbers["max"]
            assert 1 <= numbers["distinct_episodes"] <= 8
            assert sum(numbers["return_counts"].values()) == 8
            assert sum(numbers["ball_lost"]["bricks_left"].values()) == numbers["terminated"]
    # a deterministic game: one per ball start
    assert summary["eval"]["greedy"]["distinct_episodes"] <= 2
    assert summary["eval_episodes"] == 8
    for key in ("compile_seconds", "train_seconds", "sps", "wall_seconds"):
        assert summary[key] > 0
    assert summary["args"]["num_envs"] == 16 and summary["args"]["batch_size"] == 2048
    # the data-parallel path ran (conftest.py: 2 devices)
    assert summary["args"]["num_devices"] == 2
    assert summary["model"] == os.path.join("runs", os.path.basename(run_dir), "model.safetensors")


def test_same_seed_and_arguments_replay_the_run_bit_for_bit(tiny_run, tmp_path):
    _, first_dir = tiny_run
    result = run_in_process(tmp_path, *TINY)  # no evaluation during training: it changes nothing
    assert result.returncode == 0, result.stderr
    second_dir = only_run_dir(tmp_path)
    first, second = read_scalars(first_dir), read_scalars(second_dir)
    del first["charts/SPS"], second["charts/SPS"]  # wall-clock speed, the one thing that may differ
    first = {tag: [point for point in points if not tag.startswith("eval/") or point[0] == 4096]
             for tag, points in first.items()}
    assert first == second
    assert read_summary(first_dir)["eval"] == read_summary(second_dir)["eval"]


def test_diagnostics_observe_training_without_changing_it(tiny_run, tmp_path):
    _, with_dir = tiny_run
    result = run_in_process(tmp_path, *TINY, "--eval-every", "1", "--no-diagnostics")
    assert result.returncode == 0, result.stderr
    without_dir = only_run_dir(tmp_path)
    with_, without = read_scalars(with_dir), read_scalars(without_dir)
    assert not any(tag.startswith("diagnostics/") for tag in without)
    # Equal to float32's last digits: the diagnostics' outputs make another program, which XLA may
    # fuse, and so sum, in another order (under the suite's compiler flags, conftest.py). The policy
    # loss, a mean of terms of both signs near 0, moved by 5e-8 there.
    for tag in without:
        if tag != "charts/SPS":
            (steps, values), (steps_with, values_with) = zip(*without[tag]), zip(*with_[tag])
            assert steps == steps_with, tag
            assert values == pytest.approx(values_with, rel=1e-5, abs=1e-6), tag


# --------------------------------------------------------------------------------------------------
# ppo_breakout.py learns: Breakout against the random policy
# --------------------------------------------------------------------------------------------------
def random_policy_return(env_id: str, episodes: int = 256) -> float:
    env, env_params = gymnax.make(env_id)
    def uniform(params, obs, key, greedy):
        return jax.random.randint(key, obs.shape[:1], 0, env.num_actions)

    result = evaluate(jax.random.key(0), None, False, env=env, env_params=env_params,
                      act=uniform, num_episodes=episodes,
                      max_steps=env_params.max_steps_in_episode + 1)
    return float(result.returns.mean())


def test_short_breakout_run_learns_what_correct_code_reaches(tmp_path):
    # At 250k steps the correct code's sampled return was 13.0-16.7 over seeds 1-7, and a rollout
    # that stores v(next observation) scored 4.3-5.8 (docs/ppo_breakout.md, "Tests"): the bar sits
    # between. The bar was measured without LayerNorm, sticky actions and the convolution: the test
    # pins those flags.
    result = run_in_process(tmp_path, "--total-timesteps", "250000", "--eval-episodes", "64",
                            "--no-save-model", "--no-layer-norm", "--sticky-action-prob", "0",
                            "--conv-channels", "0")
    assert result.returncode == 0, result.stderr
    summary = json.load(open(glob.glob(str(tmp_path / "runs" / "*" / "summary.json"))[0]))
    random_return = random_policy_return("Breakout-MinAtar")
    trained = summary["eval"]["sampled"]["mean"]
    assert random_return < 1.0 and trained > 10.0, (trained, random_return)


# --------------------------------------------------------------------------------------------------
# ppo_breakout.py on every game
# --------------------------------------------------------------------------------------------------
SMOKE = ["--total-timesteps", "512", "--num-envs", "8", "--num-steps", "32",
         "--num-minibatches", "2", "--update-epochs", "1", "--eval-episodes", "4",
         "--no-diagnostics"]


# MinAtar's protocol stops an endless episode at the safety bound, 100k steps: an untrained
# Seaquest submarine reaches it (a minute of play). Lowered here, still past gymnax's 1000 steps,
# and on Freeway past the game's own end (step 2501), which comes first.
def smoke_safety_bound(env_id: str) -> int:
    return 3000 if env_id == "Freeway-MinAtar" else 1200


@pytest.mark.parametrize("env_id", [*GAMES, "CartPole-v1"])
def test_each_game_trains_evaluates_and_is_drawn(env_id, tmp_path, monkeypatch):
    bound = smoke_safety_bound(env_id)
    monkeypatch.setattr(evaluation, "SAFETY_BOUND", bound)
    # Breakout's run also sets the convolution's width: the flag reaches the network it saves
    conv_flags = ["--conv-channels", "2"] if env_id == "Breakout-MinAtar" else []
    result = run_in_process(tmp_path, "--env-id", env_id, *SMOKE, *conv_flags)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    assert os.path.basename(run_dir).startswith(f"{env_id}__ppo_breakout__1__")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "completed" and summary["global_step"] == 512
    # the default convolution reads grids; CartPole's is a vector
    grid = env_id.endswith("-MinAtar")
    conv_channels = 2 if conv_flags else 8 if grid else 0
    assert summary["args"]["conv_channels"] == conv_channels
    tensors, header = files.read_safetensors(os.path.join(run_dir, "model.safetensors"),
                                             "--load-model")
    assert json.loads(header["conv_channels"]) == conv_channels
    if grid:
        height, width, _, channels = tensors["conv/w"].shape
        assert (height, width, channels) == (3, 3, conv_channels)
    else:
        assert "conv/w" not in tensors
    for protocol in (summary["eval"], summary["eval"]["sticky_0.1"]):
        assert np.isfinite(protocol["sampled"]["mean"]) and np.isfinite(protocol["greedy"]["mean"])
    # The episodes the safety bound stopped are counted: none if all ended before it, all if none
    # did (4 episodes: their shortest and longest lengths are the quartiles' ends).
    for mode in ("sampled", "greedy"):
        numbers = summary["eval"]["sticky_0.1"][mode]
        shortest, *_, longest = numbers["length_quartiles"]
        stopped = numbers["safety_bound_episodes"]
        assert longest <= bound and 0 <= stopped <= 4, (mode, numbers)
        assert (stopped == 0) == (longest < bound), (mode, numbers)
        assert (stopped == 4) == (shortest == bound), (mode, numbers)
    assert os.path.exists(os.path.join(run_dir, "play.gif")) == grid  # the GIF draws grids too
    assert os.path.exists(os.path.join(run_dir, "behaviour.png"))


# --------------------------------------------------------------------------------------------------
# ppo_breakout.py plays a model file back
# --------------------------------------------------------------------------------------------------
def test_a_saved_model_evaluates_to_the_training_runs_own_evaluation(tiny_run, tmp_path):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "8", "--seed", "3",
                        "--exp-name", "reloaded")
    assert result.returncode == 0, result.stderr
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["status"] == "completed" and summary["load_model"] == model
    assert summary["eval"] == read_summary(train_dir)["eval"]
    assert "model" not in summary  # evaluating a model never writes another one


def test_a_saved_model_brings_its_network_arguments_with_it(tmp_path):
    # A model of another width, activation, convolution and game evaluates without its flags: the
    # header gives them.
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "16", "--activation", "relu",
                                    "--env-id", "Asterix-MinAtar", "--conv-channels", "2"])
    env, env_params = ppo.make_env(args.env_id, 0.0)
    obs = jnp.zeros((1, *env.observation_space(env_params).shape))
    params = ppo.make_network(env.num_actions, args.hidden_sizes, args.activation,
                              args.layer_norm, args.conv_channels).init(jax.random.key(0), obs)
    model = str(tmp_path / "asterix.safetensors")
    model_file.save_model(model, params, network_args(args), {})
    result = run_in_process(tmp_path, "--load-model", model, "--eval-episodes", "4",
                            "--hidden-sizes", "16")
    assert result.returncode == 0, result.stderr
    saved = read_summary(only_run_dir(tmp_path))["args"]
    assert (saved["env_id"], saved["hidden_sizes"], saved["activation"],
            saved["conv_channels"]) == ("Asterix-MinAtar", [16], "relu", 2)


def test_a_model_file_from_before_the_convolution_evaluates_without_one(tmp_path):
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "16", "--conv-channels", "0"])
    older = str(tmp_path / "older.safetensors")
    header = {k: v for k, v in network_args(args).items() if k != "conv_channels"}
    model_file.save_model(older, tiny_network_params(args), header, {})
    result = run_in_process(tmp_path, "--load-model", older, "--eval-episodes", "4")
    assert result.returncode == 0, result.stderr
    assert read_summary(only_run_dir(tmp_path))["args"]["conv_channels"] == 0


def damaged_copies(model: str, folder) -> dict[str, str]:
    """Copies of a saved model, damaged in the ways files get damaged."""
    with open(model, "rb") as f:
        data = f.read()
    header_length = int.from_bytes(data[:8], "little")
    with_nan = bytearray(data)
    with_nan[8 + header_length:8 + header_length + 4] = np.array([np.nan], np.float32).tobytes()
    damaged = {"truncated": data[: len(data) // 2], "header only": data[:8 + header_length],
               "garbage": b"not a model at all", "empty": b"", "a NaN weight": bytes(with_nan)}
    paths = {}
    for name, content in damaged.items():
        paths[name] = str(folder / f"{name.replace(' ', '_')}.safetensors")
        with open(paths[name], "wb") as f:
            f.write(content)
    return paths


def run_main(monkeypatch, capsys, cwd, *flags) -> tuple[int, list[str]]:
    """main() in this process, as `python ppo_breakout.py FLAGS` run in cwd: (exit status, stderr
    lines)."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["ppo_breakout.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        ppo.main()
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


def test_a_damaged_or_mismatched_model_is_refused_with_one_line(tiny_run, tmp_path, monkeypatch,
                                                                capsys):
    _, train_dir = tiny_run
    model = os.path.join(train_dir, "model.safetensors")
    folder = tmp_path / "files"
    folder.mkdir()
    cases = {name: ([path], "not a readable safetensors file")
             for name, path in damaged_copies(model, folder).items()}
    cases["a NaN weight"] = (cases["a NaN weight"][0], "holds non-finite parameters")
    cases["missing"] = ([str(folder / "nothing.safetensors")], "no such file")
    cases["a directory"] = ([str(folder)], f"--load-model {folder} is a directory, not a file")
    garbled = str(folder / "garbled.safetensors")
    tensors, header = files.read_safetensors(model, "--load-model")
    safetensors.numpy.save_file(tensors, garbled, header | {"hidden_sizes": "[64,"})
    cases["a garbled header"] = (
        [garbled], f"{garbled}: the header's hidden_sizes is not valid JSON ('[64,')")
    # A flag given explicitly that contradicts the header (one the header agrees with is fine).
    cases["other widths"] = ([model, "--hidden-sizes", "64", "32"],
                             "--hidden-sizes 64 64, not 64 32")
    cases["other game"] = ([model, "--env-id", "Asterix-MinAtar", "--hidden-sizes", "64", "64"],
                           "--env-id Breakout-MinAtar, not Asterix-MinAtar")
    for name, (flags, message) in cases.items():
        status, err = run_main(monkeypatch, capsys, tmp_path, "--load-model", *flags)
        assert status == 2, name
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (name, err)
        assert not (tmp_path / "runs").exists(), name

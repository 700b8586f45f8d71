"""Tests of utils/model.py: a model file round-trips with the network's arguments in its header,
refuses another network, and a failed save leaves nothing behind."""

import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tyro

import ppo_breakout as ppo
from helpers import ROOT, network_args, run_main, tiny_network_params
from utils import checkpoint
from utils import model as model_file


def test_saved_model_round_trips_with_the_network_arguments_in_its_header(tmp_path):
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4", "--activation", "relu",
                                    "--conv-channels", "0"])
    params = tiny_network_params(args)
    path = str(tmp_path / "model.safetensors")
    model_file.save_model(path, params, network_args(args), {"global_step": "123"})
    assert os.listdir(tmp_path) == ["model.safetensors"]  # the temporary file was renamed, not left
    loaded = model_file.load_model(path, network_args(args), params)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    # Another width, activation or game is refused, naming the flag and both values.
    for flags, message in [(["--hidden-sizes", "8", "8"], "--hidden-sizes 8 4, not 8 8"),
                           (["--hidden-sizes", "8", "4"], "--activation relu, not crelu"),
                           (["--hidden-sizes", "8", "4", "--activation", "relu",
                             "--env-id", "Asterix-MinAtar"],
                            "--env-id Breakout-MinAtar, not Asterix-MinAtar")]:
        other = network_args(tyro.cli(ppo.Args, args=[*flags, "--conv-channels", "0"]))
        with pytest.raises(ValueError, match=message):
            model_file.load_model(path, other, params)
    # With a convolution, and without: the header says which.
    conv = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4", "--activation", "relu",
                                    "--conv-channels", "2"])
    conv_path = str(tmp_path / "conv.safetensors")
    model_file.save_model(conv_path, tiny_network_params(conv), network_args(conv), {})
    with pytest.raises(ValueError, match="--conv-channels 2, not 0"):
        model_file.load_model(conv_path, network_args(args), params, ppo.ADDED_ARGS)
    # A file saved before conv_channels existed has no convolution.
    older = str(tmp_path / "older.safetensors")
    older_args = {k: v for k, v in network_args(args).items() if k != "conv_channels"}
    model_file.save_model(older, params, older_args, {})
    older_header = model_file.read_network_args(older, ppo.NETWORK_ARGS, ppo.ADDED_ARGS)
    assert older_header["conv_channels"] == 0
    model_file.load_model(older, network_args(args), params, ppo.ADDED_ARGS)
    # A header that lies about the network: the tensors' shapes are checked too.
    other = ppo.make_network(3, (8, 5), "relu", False).init(jax.random.key(0),
                                                            jnp.zeros((1, 10, 10, 4)))
    with pytest.raises(ValueError, match="does not hold the parameters of this network"):
        model_file.load_model(path, network_args(args), other)


def test_a_column_major_parameter_is_saved_in_its_own_order(tmp_path):
    # A TPU hands some parameters to the host in column-major order (the (128, 3) policy layer):
    # safetensors writes memory as it lies, so the saved agent's layer was transposed and the
    # agent, played, scored 0.
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4", "--conv-channels", "0"])
    params = tiny_network_params(args)
    column_major = jax.tree.map(lambda x: np.asfortranarray(np.asarray(x)), params)
    assert not column_major["policy"]["w"].flags.c_contiguous
    path = str(tmp_path / "model.safetensors")
    model_file.save_model(path, column_major, network_args(args), {})
    jax.tree.map(np.testing.assert_array_equal,
                 model_file.load_model(path, network_args(args), params), params)


def test_a_failed_save_leaves_neither_a_model_nor_a_temporary_file(tmp_path, monkeypatch):
    args = tyro.cli(ppo.Args, args=["--hidden-sizes", "8", "4"])
    def full_disk(*_):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        model_file.save_model(str(tmp_path / "model.safetensors"), tiny_network_params(args),
                              network_args(args), {})

    assert os.listdir(tmp_path) == []


MODELS = {"ppo_breakout": "models/ppo_breakout__Breakout.safetensors",
          "pqn_minatar": "models/pqn_minatar__Breakout.safetensors",
          "dqn_minatar": "models/dqn_minatar__Breakout.safetensors"}


@pytest.mark.parametrize("script_name, writer", [(s, w) for s in MODELS for w in MODELS if s != w])
def test_every_script_refuses_another_scripts_model_file(script_name, writer, tmp_path):
    # PQN's and DQN's networks are alike: the file's writer, not its tensors, tells them apart.
    # PPO's and PQN's files predate the header's `script`, so their runs' arguments name the
    # writer; DQN's Breakout file, trained later, names its script in its header.
    script = importlib.import_module(script_name)
    result = run_main(script, tmp_path, "--load-model", os.path.join(ROOT, MODELS[writer]))
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(err) == 1, result.stderr[-400:]
    named = "was written by " + (f"{writer}.py, not {script_name}.py" if writer == "dqn_minatar"
                                 else "another script")
    assert err[0].startswith("error: ") and named in err[0], err
    assert not (tmp_path / "runs").exists()


def test_a_runs_model_file_names_its_script(tmp_path):
    path = model_file.save_run_model(str(tmp_path), "pqn_minatar", ppo.Args(),
                                     {"w": {"b": np.zeros(1, np.float32)}}, ("env_id",), 0)
    model_file.check_writer(path, "pqn_minatar", set())
    with pytest.raises(ValueError, match="was written by pqn_minatar.py, not dqn_minatar.py"):
        model_file.check_writer(path, "dqn_minatar", {"env_id"})

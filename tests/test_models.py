"""models/: each pretrained agent is listed in the models table (tools/tables.toml, where its
digest ties it to the run it came from) and loads into its script's network, as --load-model does,
giving finite outputs for every action."""

import glob
import importlib
import os

import jax
import numpy as np
import pytest

from tools import make_tables
from utils import model
from utils.env import make_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTED = {row["model"]: make_tables.load(row["file"])["script"]
          for table in make_tables.manifest()["table"] if table["kind"] == "models"
          for row in table["rows"]}


def test_every_model_file_is_listed_and_every_listed_one_is_there():
    on_disk = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "models", "*"))
               if not p.endswith("README.md")}
    assert on_disk == set(LISTED)


@pytest.mark.parametrize("path", sorted(LISTED))
def test_a_model_loads_into_its_scripts_network(path):
    script = importlib.import_module(LISTED[path])
    full = os.path.join(ROOT, path)
    # The header chooses the network, as --load-model reads it.
    before = getattr(script, "ADDED_ARGS", {})
    saved = model.read_network_args(full, script.NETWORK_ARGS, before)
    env, env_params = make_env(saved["env_id"], 0.0)
    num_actions = env.action_space(env_params).n
    saved = {name: tuple(v) if isinstance(v, list) else v for name, v in saved.items()}
    network = script.make_network(num_actions, **{
        name: value for name, value in saved.items() if name != "env_id"})
    obs, _ = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 4),
                                                     env_params)
    args = script.Args(**saved)
    params = model.load_params(full, network, jax.eval_shape(lambda o: o[0], obs), args,
                               script.NETWORK_ARGS, before)
    out = network.apply(params, obs)
    out = out[0] if isinstance(out, tuple) else out  # PPO's logits; PQN's Q-values
    assert out.shape == (4, num_actions) and np.isfinite(np.asarray(out)).all()

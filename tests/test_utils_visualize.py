"""Tests of utils/visualize.py: every game's channels named, the GIF showing every step of each
episode and the script's headline policy, and where Breakout's ball was lost."""

import io
import os

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image, ImageSequence

from helpers import GAMES
from utils import logger, visualize
from utils.checkpoint import History
from utils.evaluation import EVALUATION_PAIRS, EvalResult


@pytest.mark.parametrize("env_id", GAMES)
def test_gif_legend_names_every_channel_of_each_game(env_id):
    env, env_params = gymnax.make(env_id)
    obs, _ = env.reset(jax.random.key(0), env_params)
    names = visualize.GAME_CHANNELS[env_id]
    assert len(names) == obs.shape[-1] and len(set(names)) == len(names)


def test_play_gif_shows_every_step_of_each_episode():
    # Frames store only what changed (the rest is transparent); decoded, each must show every panel
    # whole.
    rng = np.random.default_rng(0)
    episodes = [rng.random((n, 10, 10, 4)) < 0.1 for n in (6, 4)]
    with Image.open(io.BytesIO(visualize.play_gif(episodes, ["a", "b"]))) as image:
        frames = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]
    assert len(frames) == 6  # the longer episode's length; the shorter one stays on its last step
    size = 10 * visualize.CELL
    for t, frame in enumerate(frames):
        for i, episode in enumerate(episodes):
            left = i * (size + 4)
            panel = frame[visualize.LABEL:visualize.LABEL + size, left:left + size]
            grid = episode[min(t, len(episode) - 1)]
            expected = visualize.PALETTE[visualize.grids_to_pixels(grid[None])[0]]

            np.testing.assert_array_equal(panel, expected, err_msg=f"frame {t}, episode {i}")


def recorded_pair(row: int, num_episodes: int = 6, length: int = 5) -> EvalResult:
    """A pair of evaluations (stacked, on the device) of Asterix-like 10x10x4 grids whose every
    frame shows a wall of channel 0 on `row`: which pair a GIF shows can be read off it."""
    obs = np.zeros((2, num_episodes, 10, 10, 4), np.float32)
    obs[..., row, :, 0] = 1
    frames = np.repeat(obs[:, :3, None], length + 1, axis=2)
    frames[:, :, :, 0, 0, 1] = np.arange(length + 1)[None, None, :] % 2  # a blinking cell
    return jax.device_put(EvalResult(
        returns=jnp.ones((2, num_episodes)), lengths=jnp.full((2, num_episodes), length),
        finished=jnp.ones((2, num_episodes), bool), terminated=jnp.ones((2, num_episodes), bool),
        final_obs=jnp.asarray(obs), fingerprint=jnp.arange(2 * num_episodes, dtype=jnp.uint32
                                                           ).reshape(2, -1),
        frames=jnp.asarray(frames)))


@pytest.mark.parametrize("headline", ["sampled", "greedy"])
def test_the_gif_plays_the_headline_policy_whose_frames_alone_are_fetched(tmp_path, monkeypatch,
                                                                          headline):
    rows = {"sampled": 2, "greedy": 7}
    played, fetched_frames = [], []

    def play(params, policy):
        played.append(policy)
        return recorded_pair(rows[policy])

    def device_get(tree):  # what comes to the host: the recorded frames of one pair only
        fetched_frames.extend(x for x in jax.tree.leaves(tree) if x.ndim == 6)
        return real_device_get(tree)

    real_device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", device_get)
    log = logger.RunLog(str(tmp_path))
    try:
        summary = visualize.evaluate_and_draw(play, {}, History([], [], []), log, str(tmp_path), 1,
                                              "probe", "Asterix-MinAtar", headline)
    finally:
        log.close()
    assert played[0] == headline and sorted(played) == sorted(EVALUATION_PAIRS)
    assert len(fetched_frames) == 1
    assert np.all(np.asarray(fetched_frames[0])[..., rows[headline], :, 0] == 1)
    assert summary["sampled"]["mean"] == 1.0 and summary["sticky_0.1"]["greedy"]["mean"] == 1.0
    with Image.open(os.path.join(tmp_path, "play.gif")) as image:
        first = np.asarray(image.convert("RGB"))
    size = 10 * visualize.CELL
    for panel in range(3):  # two episodes without sticky actions and one with, all the headline's
        left = panel * (size + 4)
        shown = first[visualize.LABEL:visualize.LABEL + size, left:left + size]
        grid = np.asarray(fetched_frames[0])[0 if panel < 2 else 1, 0, 0]
        expected = visualize.PALETTE[visualize.grids_to_pixels(grid[None])[0]]
        np.testing.assert_array_equal(shown, expected)
    with pytest.raises(ValueError, match="headline"):
        visualize.evaluate_and_draw(play, {}, History([], [], []), log, str(tmp_path), 1, "probe",
                                    "Asterix-MinAtar", "epsilon-greedy")


def test_breakout_behaviour_reads_where_the_ball_was_lost():
    obs = np.zeros((2, 10, 10, 4), np.float32)
    obs[:, 9, 6, visualize.BREAKOUT_PADDLE] = 1  # paddle at column 6
    obs[0, 9, 2, visualize.BREAKOUT_BALL] = 1  # ball lost at column 2
    obs[1, 9, 5, visualize.BREAKOUT_BALL] = 1
    obs[0, 1:4, :, visualize.BREAKOUT_BRICK] = 1  # a full wall: 30 bricks
    obs[1, 1, :7, visualize.BREAKOUT_BRICK] = 1
    lost = visualize.breakout_ball_lost(obs, np.array([True, True]))
    np.testing.assert_array_equal(lost["ball_column"], [2, 5])
    np.testing.assert_array_equal(lost["paddle_column"], [6, 6])
    np.testing.assert_array_equal(lost["bricks_left"], [30, 7])
    assert visualize.breakout_ball_lost(obs, np.array([False, True]))["bricks_left"].tolist() == [7]

"""Tests of utils/visualize.py: every game's channels named, the GIF showing every step of each
episode, and where Breakout's ball was lost."""

import io

import gymnax
import jax
import numpy as np
import pytest
from PIL import Image, ImageSequence

from helpers import GAMES
from utils import visualize


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

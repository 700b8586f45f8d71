"""Tests of utils/env.py: sticky actions against their definition, and the games make_env makes
against the original MinAtar (minatar 1.0.15, numpy), the reference that "MinAtar's protocol"
follows: the same actions and channels in all five games, Freeway's episodes ending on the same
step, and Breakout and SpaceInvaders played in lockstep."""

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.minatar import seaquest_helpers
from minatar import Environment

from probe_envs import ProbeEnv
from utils import evaluation, visualize
from utils.env import SEAQUEST_ROWS, StickyActions, StickyParams, make_env, set_seaquest_rows


# --------------------------------------------------------------------------------------------------
# Sticky actions
# --------------------------------------------------------------------------------------------------
def sticky_rollout(env, env_params, actions: np.ndarray, key: jax.Array):
    """Steps one environment through `actions`: (executed actions, observations, done flags)."""
    obs, state = env.reset(jax.random.key(0), env_params)

    def step(carry, action_and_key):
        state, _ = carry
        action, step_key = action_and_key
        obs, state, reward, terminated, truncated, _ = env.step(step_key, state, action, env_params)
        executed = state.last_action if hasattr(state, "last_action") else action
        return (state, obs), (executed, obs, terminated | truncated)

    _, out = jax.lax.scan(step, (state, obs),
                          (jnp.asarray(actions), jax.random.split(key, len(actions))))
    return jax.device_get(out)


def test_sticky_actions_at_zero_change_nothing():
    # The wrapper draws with a key of its own, so at probability 0 the game sees the same keys.
    actions = np.random.default_rng(0).integers(0, 3, 300)
    base, base_params = gymnax.make("Breakout-MinAtar")
    env, env_params = make_env("Breakout-MinAtar", 0.0)
    wrapped = sticky_rollout(env, env_params, actions, jax.random.key(5))
    plain = sticky_rollout(base, base_params, actions, jax.random.key(5))
    np.testing.assert_array_equal(wrapped[0], actions)
    np.testing.assert_array_equal(wrapped[1], plain[1])
    np.testing.assert_array_equal(wrapped[2], plain[2])


def test_sticky_actions_repeat_the_executed_action_with_the_given_probability():
    prob, num_steps = 0.25, 20_000
    actions = np.random.default_rng(0).integers(0, 2, num_steps)
    env = StickyActions(ProbeEnv())  # episodes of 2-4 steps: thousands of episode boundaries
    executed, _, done = sticky_rollout(env, StickyParams(ProbeEnv().default_params, prob),
                                       actions, jax.random.key(1))
    # the first episode starts from action 0 (no-op)
    previous = np.concatenate([[0], executed[:-1]])
    # Each step executes either the chosen action or the previous executed one, nothing else...
    assert np.all((executed == actions) | (executed == previous))
    # ... and repeats where the choice differs with probability prob (binomial: 4 standard errors).
    differs = actions != previous
    repeated = (executed == previous)[differs].mean()
    assert abs(repeated - prob) < 4 * np.sqrt(prob * (1 - prob) / differs.sum()), repeated
    # The last action carries over into the next episode, as in MinAtar: after a boundary the first
    # step repeats it as often as any other step.
    first = np.concatenate([[False], done[:-1]]) & differs
    assert first.sum() > 1000
    assert (abs((executed == previous)[first].mean() - prob)
            < 4 * np.sqrt(prob * (1 - prob) / first.sum()))



# --------------------------------------------------------------------------------------------------
# Seaquest in buffers of 32 rows, not gymnax's 100
# --------------------------------------------------------------------------------------------------
def play_seaquest(rows: int, env_params, num_envs: int = 16, steps: int = 150):
    """`steps` steps of `num_envs` Seaquest games with buffers of `rows` rows, from reset: half
    the games NOOP at every step, half play a uniform random action at half the steps. Returns
    (observations, rewards, dones) and the most alive at once of each kind of entity and of
    enemies."""
    env, _ = gymnax.make("Seaquest-MinAtar")
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    fire = jnp.arange(num_envs) % 2 * 0.5  # the chance of a random action

    def play(key):  # a new function each call: traced under the rows set now
        _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, num_envs),
                                                           env_params)

        def one(state, key):
            action_key, draw_key, step_key = jax.random.split(key, 3)
            action = jnp.where(jax.random.uniform(draw_key, (num_envs,)) < fire,
                               jax.random.randint(action_key, (num_envs,), 0, env.num_actions), 0)
            obs, state, reward, terminated, truncated, _ = step(
                jax.random.split(step_key, num_envs), state, action, env_params)
            alive = jnp.stack([state.f_bullet_count, state.e_bullet_count, state.e_fish_count,
                               state.e_subs_count, state.divers_count,
                               state.e_fish_count + state.e_subs_count])
            return state, (jnp.packbits(obs.astype(bool), axis=-1), reward,
                           terminated | truncated, alive.max(-1))

        _, out = jax.lax.scan(one, state, jax.random.split(key, steps))
        return out

    rows_before = seaquest_helpers.MAX_ENTITIES
    set_seaquest_rows(rows)
    try:
        obs, reward, done, alive = jax.device_get(jax.jit(play)(jax.random.key(3)))
    finally:
        set_seaquest_rows(rows_before)
    return (obs, reward, done), alive.max(0)


def test_seaquest_in_32_rows_plays_as_in_gymnaxs_100():
    # In the fastest regime, where a long episode ramps to (an enemy spawns every step and moves
    # every third), NOOP keeps the player on the surface, so nothing is shot and every enemy
    # crosses the whole board: the most the buffers ever hold.
    _, env_params = gymnax.make("Seaquest-MinAtar")
    fastest = env_params.replace(init_spawn_speed=1, init_move_interval=2)
    gymnax_own, alive = play_seaquest(100, fastest)
    ours, _ = play_seaquest(SEAQUEST_ROWS, fastest)
    for a, b in zip(gymnax_own, ours):
        np.testing.assert_array_equal(a, b)
    assert gymnax_own[2].any()  # episodes ended and restarted on the way
    # player's torpedoes, enemies' torpedoes, fish, subs, divers; enemies
    assert alive.max() <= 30, alive
    assert alive[-1] >= 20, alive  # crowded: the test reaches what 32 rows must hold


def test_make_env_plays_seaquest_in_32_rows():
    env, env_params = make_env("Seaquest-MinAtar", 0.0)
    _, state = env.reset(jax.random.key(0), env_params)
    assert state.env_state.e_fish.shape[0] == SEAQUEST_ROWS


# --------------------------------------------------------------------------------------------------
# The original MinAtar's five games: actions, channels, Freeway's episode length
# --------------------------------------------------------------------------------------------------
ORIGINAL_NAMES = {"Asterix-MinAtar": "asterix", "Breakout-MinAtar": "breakout",
                  "Freeway-MinAtar": "freeway", "SpaceInvaders-MinAtar": "space_invaders",
                  "Seaquest-MinAtar": "seaquest"}
# The channels whose first observation is drawn at random: Breakout's side the ball starts from,
# Freeway's car speeds and directions.
DRAWN_AT_START = {"Breakout-MinAtar": ["ball", "trail"],
                  "Freeway-MinAtar": ["speed 1", "speed 2", "speed 3", "speed 4", "speed 5"]}


def spelling(name: str) -> str:
    """A channel's name as both spell it ("oxygen_guage" in the original, "oxygen gauge" here)."""
    return name.replace("_", "").replace(" ", "").replace("guage", "gauge")


def original_channels(original: Environment) -> list[str]:
    channels = original.env.channels
    return [spelling(name) for name in sorted(channels, key=channels.get)]


@pytest.mark.parametrize("env_id", ORIGINAL_NAMES)
def test_actions_are_the_originals_minimal_action_set(env_id):
    env, env_params = make_env(env_id, 0.0)
    original = Environment(ORIGINAL_NAMES[env_id], sticky_action_prob=0.0)
    # Both number the full set ['n','l','u','r','d','f'] alike; action i plays action_set[i].
    assert original.env.action_map == ["n", "l", "u", "r", "d", "f"]
    assert env.action_space(env_params.env_params).n == len(original.minimal_action_set())
    assert np.asarray(env.action_set).tolist() == original.minimal_action_set()


@pytest.mark.parametrize("env_id", ORIGINAL_NAMES)
def test_channels_are_the_originals_in_its_order(env_id):
    """GAME_CHANNELS names gymnax's channels with the original's names in its order, and the first
    observations agree channel by channel where they are not drawn at random."""
    env, env_params = make_env(env_id, 0.0)
    original = Environment(ORIGINAL_NAMES[env_id], sticky_action_prob=0.0)
    names = visualize.GAME_CHANNELS[env_id]
    assert [spelling(name) for name in names] == original_channels(original)
    obs, _ = env.reset(jax.random.key(0), env_params)
    original.reset()
    for channel, name in enumerate(names):
        if name not in DRAWN_AT_START.get(env_id, []):
            np.testing.assert_array_equal(obs[..., channel], original.state()[..., channel],
                                          err_msg=f"{env_id}'s first observation, channel {name}")


def test_freeway_episodes_end_where_the_originals_do():
    """The original's freeway.py ends an episode when its timer, counted down from 2500, goes below
    0: on step 2501. Under MinAtar's protocol ours ends on the same step, and only there."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 3, 2600)  # any: Freeway's episodes end on time
    original = Environment("freeway", sticky_action_prob=0.0)
    original.seed(0)
    original.reset()
    action_set = original.minimal_action_set()
    original_length = next(t for t, a in enumerate(actions, 1) if original.act(action_set[a])[1])

    env, env_params = make_env("Freeway-MinAtar", 0.0)
    params = evaluation.protocol_params("Freeway-MinAtar", env_params, "minatar")

    def step(state, key_and_action):
        _, state, _, terminated, truncated, _ = env.step(key_and_action[0], state,
                                                         key_and_action[1], params)
        return state, terminated | truncated

    _, state = env.reset(jax.random.key(0), params)
    keys = jax.random.split(jax.random.key(1), len(actions))
    done = jax.jit(lambda state, keys, actions: jax.lax.scan(step, state, (keys, actions))[1])(
        state, keys, jnp.asarray(actions))
    assert original_length == 2501
    assert np.flatnonzero(done).tolist() == [original_length - 1]


# --------------------------------------------------------------------------------------------------
# Breakout and SpaceInvaders in lockstep with the original
# --------------------------------------------------------------------------------------------------
def follow_the_ball(obs: np.ndarray, rng: np.random.Generator) -> int:
    """Breakout: steer the paddle to where the ball goes next (n, l, r), at random 1 time in 10."""
    if rng.random() < 0.1:
        return int(rng.integers(3))
    ball, trail = obs[..., 1].any(axis=0).argmax(), obs[..., 2].any(axis=0).argmax()
    target, paddle = 2 * ball - trail, obs[9, :, 0].argmax()
    return 0 if target == paddle else (1 if target < paddle else 2)


def shoot_the_nearest_alien(obs: np.ndarray, rng: np.random.Generator) -> int:
    """SpaceInvaders: fire under an alien, dodge a bullet about to land, else move to the nearest
    alien's column (n, l, r, f), at random 1 time in 10."""
    if rng.random() < 0.1:
        return int(rng.integers(4))
    cannon = obs[9, :, 0].argmax()
    if obs[8, cannon, 5]:
        return 1 if cannon > 0 else 2
    if obs[:, cannon, 1].any():
        return 3
    columns = np.flatnonzero(obs[..., 1].any(axis=0))
    return 1 if columns[np.abs(columns - cannon).argmin()] < cannon else 2


LOCKSTEP = {"Breakout-MinAtar": follow_the_ball, "SpaceInvaders-MinAtar": shoot_the_nearest_alien}


def play_original(env_id: str, num_episodes: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Whole episodes of the original under MinAtar's protocol (sticky actions 0.1): the actions it
    executed (indices into the minimal set), its observations, rewards and terminations."""
    original = Environment(ORIGINAL_NAMES[env_id], sticky_action_prob=0.1)
    original.seed(seed)
    rng = np.random.default_rng(seed)
    action_set = original.minimal_action_set()
    episodes = []
    for _ in range(num_episodes):
        original.reset()
        obs, actions, rewards, terminals = [original.state()], [], [], []
        while not (terminals and terminals[-1]):
            reward, terminal = original.act(action_set[LOCKSTEP[env_id](obs[-1], rng)])
            actions.append(action_set.index(original.last_action))  # after the sticky draw
            obs.append(original.state())
            rewards.append(reward)
            terminals.append(terminal)
        episodes.append({"obs": np.array(obs), "actions": np.array(actions),
                         "rewards": np.array(rewards, np.float32),
                         "terminals": np.array(terminals)})
    return episodes


@pytest.mark.parametrize("env_id", LOCKSTEP)
def test_gymnax_replays_the_originals_episodes_in_lockstep(env_id):
    """The original draws its sticky actions; gymnax replays the actions it executed, unsticky. Both
    games are deterministic but for Breakout's starting side, so each episode's gymnax reset key is
    the first of a few whose first observation is the original's."""
    episodes = play_original(env_id, num_episodes=8, seed=0)
    env, env_params = make_env(env_id, 0.0)
    params = evaluation.protocol_params(env_id, env_params, "minatar").replace(
        sticky_action_prob=0.0)
    reset_keys = jax.random.split(jax.random.key(0), 8)
    starts = np.array([env.reset(key, params)[0] for key in reset_keys])
    matches = [np.flatnonzero((starts == e["obs"][0]).all(axis=(1, 2, 3))) for e in episodes]
    assert all(len(match) for match in matches), "no reset key gives the original's start"
    num_steps = max(len(e["actions"]) for e in episodes)
    actions = np.array([np.pad(e["actions"], (0, num_steps - len(e["actions"]))) for e in episodes])

    def replay(reset_key, actions):
        def step(state, key_and_action):
            _, state, reward, terminated, truncated, info = env.step(
                key_and_action[0], state, key_and_action[1], params)
            return state, (info["final_observation"], reward, terminated, truncated)

        step_keys = jax.random.split(jax.random.fold_in(reset_key, 1), len(actions))
        return jax.lax.scan(step, env.reset(reset_key, params)[1], (step_keys, actions))[1]

    obs, rewards, terminated, truncated = jax.tree.map(np.asarray, jax.jit(jax.vmap(replay))(
        reset_keys[np.array([match[0] for match in matches])], jnp.asarray(actions)))
    names = visualize.GAME_CHANNELS[env_id]
    for i, episode in enumerate(episodes):
        length = len(episode["actions"])
        for channel, name in enumerate(names):
            differ = (obs[i, :length, ..., channel] != episode["obs"][1:, ..., channel]).any((1, 2))
            if differ.any():
                pytest.fail(f"{env_id} episode {i}, step {differ.argmax() + 1}: {name} differs")
        np.testing.assert_array_equal(rewards[i, :length], episode["rewards"])
        np.testing.assert_array_equal(terminated[i, :length], episode["terminals"])
        assert not truncated[i, :length].any()
    assert sum(e["rewards"].sum() for e in episodes) >= 10  # the policies score: deep into the game

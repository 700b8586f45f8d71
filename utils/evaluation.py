"""Run complete episodes of a discrete-action policy in a gymnax environment.

`evaluate` plays `num_episodes` episodes in a pool of `width` environments under `vmap`, in one
`jax.lax.while_loop`: when an episode ends, its slot starts the next episode not yet played. So no
slot idles while episodes are left, and a long episode holds up only its own slot. Each episode
draws its randomness from its own keys, fold_in(key, episode), so its outcome does not depend on
which slot, pool or device plays it; and every episode is played to its end, however long (counting
the first episodes to end would favour short ones).

An episode ends when the environment says `terminated` or `truncated` (e.g. Breakout-MinAtar's
1000-step limit): both count as finished. Besides returns and lengths it keeps what behaviour
diagnostics need: each episode's last observation (before gymnax's auto-reset), whether it
terminated, a fingerprint of its observation sequence (equal fingerprints: the same episode), and
the first `record_steps` frames of the first `num_recorded` episodes (grids as uint8: which
cells are on, what a picture draws; other observations as they are).

`evaluate_each` plays several evaluations (policy, sticky actions, time limit) with one copy of
the episode loop. `make_evaluate_pair` compiles a script's final evaluations, both protocols and
both policies, into one program that plays them two at a time; `compile_final_evaluation` names
the pairs.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class EvalResult(NamedTuple):
    returns: jax.Array  # (num_episodes,) undiscounted return of each episode
    lengths: jax.Array  # (num_episodes,) steps in each episode
    finished: jax.Array  # (num_episodes,) True where the episode ended before `max_steps`
    terminated: jax.Array  # (num_episodes,) True where the game's rule ended it, not the time limit
    final_obs: jax.Array  # (num_episodes, *obs_shape) the observation the episode ended on
    fingerprint: jax.Array  # (num_episodes,) uint32 hash of the episode's observation sequence
    frames: jax.Array  # (num_recorded, record_steps + 1, *obs_shape) first episodes' observations


class _Slots(NamedTuple):
    """The episodes being played, one per slot of the pool."""
    episode: jax.Array  # (width,) the episode each slot plays (num_episodes: none)
    running: jax.Array  # (width,) False once it has ended or reached `max_steps`
    key: jax.Array  # (width,) the episode's own stream of keys
    obs: jax.Array
    env_state: Any
    so_far: EvalResult  # the episode's numbers so far (frames: None)


class _Pool(NamedTuple):
    slots: _Slots
    next_episode: jax.Array  # the first episode not started yet
    results: EvalResult  # the episodes' numbers, each written when it ends; the recorded frames


# The pool's width. On a CPU a step of 32 environments costs about 15% more per environment than
# one of 256, and a narrow pool leaves fewer slots idle while its last episodes end.
POOL_WIDTH = 32


def _observation_hash(obs: jax.Array) -> jax.Array:
    """A uint32 hash of each observation's exact bits:
    a fixed random weighting, summed with wrap-around."""
    flat = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(flat, jnp.uint32)
    weights = jax.random.bits(jax.random.key(0), bits.shape[1:], jnp.uint32) | 1
    return jnp.sum(bits * weights, axis=-1, dtype=jnp.uint32)


@functools.partial(jax.jit, static_argnames=("env", "act", "num_episodes", "max_steps",
                                             "num_recorded", "record_steps", "width"))
def evaluate(
    key: jax.Array,
    policy_params: Any,
    greedy: jax.Array | bool,
    *,
    env: Any,
    env_params: Any,
    act: Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array],
    num_episodes: int,
    max_steps: int,
    num_recorded: int = 0,
    record_steps: int | None = None,
    width: int = POOL_WIDTH,
    first_episode: int | jax.Array = 0,
) -> EvalResult:
    """Plays `num_episodes` episodes with the policy `act(params, obs_batch, key, greedy)`, in a
    pool of `width` slots (at most num_episodes), which changes how fast, not what it computes.

    `greedy` is traced, so greedy and sampled evaluation share one compiled program, as do any
    `env_params` of one structure. An episode still running after `max_steps` steps is stopped and
    reported with `finished=False`. Frames are kept of episodes 0 to num_recorded - 1, for their
    first `record_steps` steps (all `max_steps` if None). The episodes played are numbers
    `first_episode` on (it may be traced), so that devices can share out one evaluation's episodes.
    """
    record_steps = max_steps if record_steps is None else min(record_steps, max_steps)
    vmap_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    # `act` sees one episode at a time, with that episode's key.
    act_each = jax.vmap(lambda obs, key: act(policy_params, obs[None], key, greedy)[0])
    broadcast = lambda where, x: where.reshape(-1, *[1] * (x.ndim - 1))  # noqa: E731

    def start(episode: jax.Array) -> _Slots:
        """Slots that start `episode` (num_episodes: none) from its own reset."""
        reset_key, stream = jnp.moveaxis(jax.vmap(lambda i: jax.random.split(
            jax.random.fold_in(key, first_episode + i)))(episode), 1, 0)
        obs, env_state = vmap_reset(reset_key, env_params)
        zeros = jnp.zeros(len(episode), jnp.int32)
        return _Slots(episode, episode < num_episodes, stream, obs, env_state, EvalResult(
            returns=zeros.astype(jnp.float32), lengths=zeros, finished=zeros.astype(bool),
            terminated=zeros.astype(bool), final_obs=jnp.zeros_like(obs),
            fingerprint=_observation_hash(obs), frames=None))

    def as_frame(obs: jax.Array) -> jax.Array:
        """A recorded frame: a grid's cells on or off as uint8 (a quarter of float32's memory, and
        Seaquest's 1001 recorded steps are 32 MB a device in float32); other observations kept."""
        return (obs > 0).astype(jnp.uint8) if obs.ndim == 4 else obs

    def recording(running: jax.Array, episode: jax.Array, at: jax.Array) -> jax.Array:
        """Each slot's row in `frames` where its episode is running and recorded, and frame `at`
        is kept; out of range (its write dropped) elsewhere."""
        episode = first_episode + episode
        keep = running & (episode < num_recorded) & (at <= record_steps)
        return jnp.where(keep, episode, num_recorded)

    def step(pool: _Pool) -> _Pool:
        slots, so_far = pool.slots, pool.slots.so_far
        key, action_key, step_key = jnp.moveaxis(jax.vmap(
            lambda k: jax.random.split(k, 3))(slots.key), 1, 0)
        obs, env_state, reward, terminated, truncated, info = vmap_step(
            step_key, slots.env_state, act_each(slots.obs, action_key), env_params)
        running = slots.running
        ends = running & (terminated | truncated)
        final_obs = info["final_observation"]  # before the auto-reset
        lengths = so_far.lengths + running
        so_far = EvalResult(
            returns=so_far.returns + jnp.where(running, reward, 0.0),
            lengths=lengths,
            finished=so_far.finished | ends,
            terminated=so_far.terminated | (ends & terminated),
            final_obs=jnp.where(broadcast(ends, final_obs), final_obs, so_far.final_obs),
            fingerprint=jnp.where(running, so_far.fingerprint * jnp.uint32(16777619)
                                  ^ _observation_hash(final_obs), so_far.fingerprint),
            frames=None,
        )
        slots = _Slots(slots.episode, running & ~ends & (lengths < max_steps), key, obs,
                       env_state, so_far)
        # Frame t + 1 of a recorded episode is what its step t led to (at its end, the pre-reset
        # one). The episodes that stopped go into the results (the other slots' writes are
        # dropped), and their slots start the next ones, whose first frames are recorded.
        frames = pool.results.frames.at[recording(running, slots.episode, lengths), lengths].set(
            as_frame(final_obs), mode="drop")
        stopped = jnp.where(running & ~slots.running, slots.episode, num_episodes)
        results = jax.tree.map(lambda r, x: r.at[stopped].set(x, mode="drop"),
                               pool.results._replace(frames=None), so_far)
        slots, next_episode = jax.lax.cond(jnp.any(running & ~slots.running), next_episodes,
                                           lambda *pool: pool, slots, pool.next_episode)
        starts = slots.running & (slots.so_far.lengths == 0)
        frames = frames.at[recording(starts, slots.episode, 0), 0].set(as_frame(slots.obs),
                                                                        mode="drop")
        return _Pool(slots, next_episode, results._replace(frames=frames))

    def next_episodes(slots: _Slots, next_episode: jax.Array) -> tuple[_Slots, jax.Array]:
        """The slots whose episodes stopped, given the next episodes not started yet."""
        free = ~slots.running
        new = start(jnp.minimum(next_episode + jnp.cumsum(free) - 1, num_episodes))
        slots = jax.tree.map(lambda n, s: jnp.where(broadcast(free, n), n, s), new, slots)
        return slots, next_episode + jnp.sum(free & new.running)

    slots = start(jnp.arange(min(width, num_episodes)))
    frames = jnp.zeros((num_recorded, record_steps + 1, *slots.obs.shape[1:]),
                       jnp.uint8 if slots.obs.ndim == 4 else slots.obs.dtype)
    results = jax.tree.map(lambda x: jnp.zeros((num_episodes, *x.shape[1:]), x.dtype),
                           slots.so_far)
    frames = frames.at[recording(slots.running, slots.episode, 0), 0].set(as_frame(slots.obs),
                                                                          mode="drop")
    pool = _Pool(slots, jnp.int32(len(slots.episode)), results._replace(frames=frames))
    return jax.lax.while_loop(lambda pool: jnp.any(pool.slots.running), step, pool).results


# The two evaluation protocols. gymnax's: no sticky actions and gymnax's time limit (1000 steps,
# 2500 on Freeway), as in gymnax's published baselines. MinAtar's (Young & Tian 2019): sticky
# actions 0.1 and no time limit but the game's own (Freeway's: 2501 steps); SAFETY_BOUND stops an
# endless episode.
SAFETY_BOUND = 100_000
# MinAtar's freeway.py counts a timer down from 2500 and ends when it goes below 0: on step 2501.
GAME_TIME_LIMITS = {"Freeway-MinAtar": 2501}
PROTOCOLS = ("gymnax", "minatar")


def protocol_params(env_id: str, env_params: Any, protocol: str) -> Any:
    """`env_params` (utils.env.StickyParams) set to play under `protocol`."""
    if protocol == "gymnax":
        return env_params.replace(sticky_action_prob=0.0)
    own_limit = env_params.env_params.max_steps_in_episode  # other environments keep their own
    default_limit = SAFETY_BOUND if env_id.endswith("-MinAtar") else own_limit
    time_limit = GAME_TIME_LIMITS.get(env_id, default_limit)
    return env_params.replace(sticky_action_prob=0.1, env_params=env_params.env_params.replace(
        max_steps_in_episode=time_limit))


def evaluate_each(key: jax.Array, policy_params: Any, greedy: jax.Array, sticky: jax.Array,
                  limit: jax.Array, *, env: Any, env_params: Any, **kwargs) -> EvalResult:
    """`evaluate` of every (greedy, sticky-action probability, time limit) along the three
    arrays' one axis, each with `key`, so each gives the numbers it gives alone; the results
    stacked on that axis. One lax.map: the episode loop is compiled once for all of them, not once
    each (the largest part of an evaluation's compile). `kwargs` go to `evaluate`; its
    `max_steps` must exceed every limit for a time limit to end an episode as the game's own does.
    `env_params` must have a `sticky_action_prob` field (utils.env.StickyParams)."""
    def one(config):
        played = env_params.replace(
            sticky_action_prob=config[1],
            env_params=env_params.env_params.replace(max_steps_in_episode=config[2]))
        return evaluate(key, policy_params, config[0], env=env, env_params=played, **kwargs)
    return jax.lax.map(one, (greedy, sticky, limit))


def protocol_settings(env_id: str, env_params: Any, protocols) -> tuple[np.ndarray, np.ndarray]:
    """(sticky-action probabilities, time limits) of `protocols`, for evaluate_each."""
    played = [protocol_params(env_id, env_params, protocol) for protocol in protocols]
    return (np.array([p.sticky_action_prob for p in played], np.float32),
            np.array([p.env_params.max_steps_in_episode for p in played], np.int32))


# The final evaluations: gymnax's protocol (key "") and MinAtar's ("sticky_0.1"), each with sampled
# actions (the policy `act` samples from: PPO's policy, PQN's epsilon-greedy) and greedy ones,
# whatever the training used. They are played in pairs of indices into EVALUATIONS, one pair per
# policy; play.gif shows the script's headline pair.
EVALUATIONS = [("", "sampled"), ("", "greedy"), ("sticky_0.1", "sampled"), ("sticky_0.1", "greedy")]
EVALUATION_PAIRS = {"sampled": (0, 2), "greedy": (1, 3)}
PROTOCOL_OF = {"": "gymnax", "sticky_0.1": "minatar"}
RECORD_STEPS = 1001  # the GIF's frames per episode, at most: a 1000-step episode whole


def return_tag(protocol: str, mode: str) -> str:
    """The TensorBoard tag of an evaluation's mean return: eval/greedy_return under gymnax's
    protocol, eval/sticky_0.1/greedy_return under MinAtar's."""
    return f"eval/{protocol}/{mode}_return" if protocol else f"eval/{mode}_return"


def make_evaluate_pair(env: Any, env_id: str, env_params: Any, act: Callable,
                       num_episodes: int, num_devices: int, width: int = POOL_WIDTH
                       ) -> tuple[Callable, Mesh]:
    """A program that plays the `pair`-th of EVALUATION_PAIRS, each evaluation with the same key,
    so each gives the numbers it gives alone. Each of `num_devices` devices plays its share of
    both evaluations' episodes, which are the same episodes on any number of devices. Compiled
    once and called per pair, so the host can read the first pair while the second plays.
    `env_params` must have a `sticky_action_prob` field (utils.env.StickyParams). The GIF's
    episodes are recorded for RECORD_STEPS steps. `width`: each device's pool (`evaluate`)."""
    mesh = Mesh(np.array(jax.devices()[:num_devices]), ("data",))
    pairs = list(EVALUATION_PAIRS.values())
    greedy = np.array([[EVALUATIONS[i][1] == "greedy" for i in pair] for pair in pairs])
    sticky, limits = (np.stack(x) for x in zip(*[protocol_settings(
        env_id, env_params, [PROTOCOL_OF[EVALUATIONS[i][0]] for i in pair]) for pair in pairs]))
    share = -(-num_episodes // mesh.size)  # each device's episodes; the last may play extra ones
    num_recorded = min(8, num_episodes)

    def evaluate_share(key, params, greedy, sticky, limit):
        results = evaluate_each(key, params, greedy, sticky, limit, env=env,
                                env_params=env_params, act=act, num_episodes=share,
                                max_steps=int(limits.max()) + 1, num_recorded=num_recorded,
                                record_steps=RECORD_STEPS,
                                first_episode=jax.lax.axis_index("data") * share, width=width)
        return results._replace(frames=results.frames[None])  # one device's recordings

    evaluate_split = jax.shard_map(
        evaluate_share, mesh=mesh, in_specs=(P(),) * 5,
        out_specs=EvalResult(*[P(None, "data")] * 6, frames=P("data")), check_vma=False)

    def evaluate_pair(key, params, pair):
        results = evaluate_split(key, params, jnp.asarray(greedy)[pair],
                                 jnp.asarray(sticky)[pair], jnp.asarray(limits)[pair])
        # Each recorded episode from the device that played it.
        recorded = jnp.arange(num_recorded)
        frames = jnp.moveaxis(results.frames[recorded // share, :, recorded], 0, 1)
        return jax.tree.map(lambda x: x[:, :num_episodes], results._replace(frames=None)
                            )._replace(frames=frames)

    return jax.jit(evaluate_pair), mesh


def compile_final_evaluation(env: Any, env_id: str, env_params: Any, act: Callable,
                             num_episodes: int, num_devices: int, key: jax.Array,
                             params: Any, width: int = POOL_WIDTH) -> Callable:
    """`make_evaluate_pair` compiled ahead of time for `params`' shapes (arrays or
    jax.ShapeDtypeStructs): play(params, policy) starts the pair of EVALUATION_PAIRS[policy]
    ("sampled" or "greedy") with `key` and returns at once."""
    evaluate_pair, mesh = make_evaluate_pair(env, env_id, env_params, act, num_episodes,
                                             num_devices, width)
    replicated = NamedSharding(mesh, P())
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                        params)
    compiled = evaluate_pair.lower(key, like, 0).compile()
    index = {policy: i for i, policy in enumerate(EVALUATION_PAIRS)}
    return lambda params, policy: compiled(key, jax.device_put(params, replicated), index[policy])

"""Run complete episodes of a discrete-action policy in a gymnax environment.

`evaluate` plays `num_episodes` episodes side by side (one environment each, under `vmap`) in
`jax.lax.while_loop`s. An episode ends when the environment says `terminated` or `truncated` (e.g.
Breakout-MinAtar's 1000-step limit): both count as finished. gymnax auto-resets an environment the
step it ends, so an ended episode's numbers are frozen and whatever follows is ignored.

No episode waits for the longest one: whenever at most a quarter of the batch still plays, those
episodes move to a batch a quarter as wide, so each step costs about as many environment steps as
there are episodes still playing. Every episode is played to its end (or the bound) and counted
once, whatever its length; each draws from its own keys, fold_in(key, episode), so its outcome does
not depend on which slot or batch width plays it.

Besides returns and lengths it keeps what behaviour diagnostics need: each episode's last
observation (before the auto-reset), whether it terminated, a fingerprint of its observation
sequence (equal fingerprints: the same episode), and the first `record_steps` frames of the first
`num_recorded` episodes.

`make_evaluate_pair` compiles a script's final evaluations, both protocols and both policies,
into one program that plays them two at a time; `compile_final_evaluation` names the pairs.
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


class _Batch(NamedTuple):
    """The episodes being played, one per slot; `episode` is num_episodes in a slot with none."""
    episode: jax.Array  # (width,) which episode each slot plays
    running: jax.Array  # (width,) False once the episode has ended or reached `max_steps`
    key: jax.Array  # (width,) the episode's own key stream
    obs: jax.Array
    env_state: Any
    result: EvalResult  # the episode's numbers so far (frames None: kept for the whole evaluation)


SHRINK = 4  # the batch moves to one SHRINK times narrower when at most 1 / SHRINK of it plays


def batch_widths(num_episodes: int) -> tuple[int, ...]:
    """The widths the batch shrinks through: num_episodes, a quarter of it, ..., down to 1."""
    widths = [num_episodes]
    while widths[-1] > 1:
        widths.append(-(-widths[-1] // SHRINK))
    return tuple(widths)


def _observation_hash(obs: jax.Array) -> jax.Array:
    """A uint32 hash of each observation's exact bits:
    a fixed random weighting, summed with wrap-around."""
    flat = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(flat, jnp.uint32)
    weights = jax.random.bits(jax.random.key(0), bits.shape[1:], jnp.uint32) | 1
    return jnp.sum(bits * weights, axis=-1, dtype=jnp.uint32)


@functools.partial(jax.jit, static_argnames=("env", "act", "num_episodes", "max_steps",
                                             "num_recorded", "record_steps", "widths"))
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
    widths: tuple[int, ...] | None = None,
) -> EvalResult:
    """Plays `num_episodes` episodes with the policy `act(params, obs_batch, key, greedy)`.

    `greedy` is traced, so greedy and sampled evaluation share one compiled program, as do any
    `env_params` of one structure. An episode still running after `max_steps` steps is stopped and
    reported with `finished=False`. Frames are kept for the first `record_steps` steps (all
    `max_steps` if None). `widths`: the batch's widths (batch_widths(num_episodes) if None), the
    first num_episodes; they change how fast it runs, not what it computes.
    """
    record_steps = max_steps if record_steps is None else min(record_steps, max_steps)
    widths = batch_widths(num_episodes) if widths is None else widths
    assert widths[0] == num_episodes, "every episode starts in the first batch"
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    # Each episode's own stream: one key for its reset, then three a step (the next, its action's,
    # its environment step's), whichever slot it is in. `act` sees one episode at a time.
    episode = jnp.arange(num_episodes)
    reset_key, stream = jnp.moveaxis(jax.vmap(lambda i: jax.random.split(
        jax.random.fold_in(key, i)))(episode), 1, 0)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_key, env_params)
    act_one = jax.vmap(lambda o, k: act(policy_params, o[None], k, greedy)[0])

    def step(carry: tuple[_Batch, jax.Array]) -> tuple[_Batch, jax.Array]:
        batch, frames = carry
        key, action_key, step_key = jnp.moveaxis(jax.vmap(
            lambda k: jax.random.split(k, 3))(batch.key), 1, 0)
        obs, env_state, reward, terminated, truncated, info = vmap_step(
            step_key, batch.env_state, act_one(batch.obs, action_key), env_params)
        running, done = batch.running, batch.result
        ends = running & (terminated | truncated)
        final_obs = info["final_observation"]  # before the auto-reset
        # Frame t + 1 of a recorded episode is what its step t led to (the pre-reset one at its
        # end); the other slots' writes fall outside `frames` and are dropped.
        recorded = running & (batch.episode < num_recorded) & (done.lengths < record_steps)
        frames = frames.at[jnp.where(recorded, batch.episode, num_recorded),
                           done.lengths + 1].set(final_obs, mode="drop")
        lengths = done.lengths + running
        result = EvalResult(
            returns=done.returns + jnp.where(running, reward, 0.0),
            lengths=lengths,
            finished=done.finished | ends,
            terminated=done.terminated | (ends & terminated),
            final_obs=jnp.where(ends.reshape(-1, *[1] * (obs.ndim - 1)), final_obs,
                                done.final_obs),
            fingerprint=jnp.where(running, done.fingerprint * jnp.uint32(16777619)
                                  ^ _observation_hash(final_obs), done.fingerprint),
            frames=None,
        )
        running = running & ~ends & (lengths < max_steps)
        return _Batch(batch.episode, running, key, obs, env_state, result), frames

    def write(results: EvalResult, batch: _Batch) -> EvalResult:
        """`results` with the numbers of the episodes that `batch` has played to their end."""
        index = jnp.where(batch.running, num_episodes, batch.episode)  # out of range: dropped
        return jax.tree.map(lambda r, b: r.at[index].set(b, mode="drop"), results, batch.result)

    batch = _Batch(episode=episode, running=jnp.ones(num_episodes, bool), key=stream, obs=obs,
                   env_state=env_state, result=EvalResult(
                       returns=jnp.zeros(num_episodes, jnp.float32),
                       lengths=jnp.zeros(num_episodes, jnp.int32),
                       finished=jnp.zeros(num_episodes, bool),
                       terminated=jnp.zeros(num_episodes, bool),
                       final_obs=jnp.zeros_like(obs),
                       fingerprint=_observation_hash(obs),
                       frames=None))
    results = batch.result
    frames = jnp.zeros((num_recorded, record_steps + 1, *obs.shape[1:]), obs.dtype).at[:, 0].set(
        obs[:num_recorded])
    for next_width in (*widths[1:], 0):
        batch, frames = jax.lax.while_loop(lambda c, n=next_width: c[0].running.sum() > n, step,
                                           (batch, frames))
        results = write(results, batch)
        # The episodes still running move, in order, to the front of a narrower batch.
        keep = jnp.argsort(~batch.running, stable=True)[:next_width]
        batch = jax.tree.map(lambda x: x[keep], batch._replace(
            episode=jnp.where(batch.running, batch.episode, num_episodes)))
    return results._replace(frames=frames)


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
                       num_episodes: int, num_devices: int) -> tuple[Callable, Mesh]:
    """A program that plays the `pair`-th of EVALUATION_PAIRS, split over up to two devices, each
    evaluation with the same key, so each gives the numbers it gives alone. Compiled once and called
    per pair, so the host can read the first pair while the second plays. `env_params` must have a
    `sticky_action_prob` field (utils.env.StickyParams). The GIF's episodes are recorded for
    RECORD_STEPS steps."""
    mesh = Mesh(np.array(jax.devices()[:min(num_devices, 2)]), ("data",))
    pairs = list(EVALUATION_PAIRS.values())
    protocols = [[protocol_params(env_id, env_params, PROTOCOL_OF[EVALUATIONS[i][0]]) for i in pair]
                 for pair in pairs]
    greedy = np.array([[EVALUATIONS[i][1] == "greedy" for i in pair] for pair in pairs])
    sticky = np.array([[p.sticky_action_prob for p in pair] for pair in protocols], np.float32)
    limits = np.array([[p.env_params.max_steps_in_episode for p in pair] for pair in protocols],
                      np.int32)

    def evaluate_share(key, params, greedy, sticky, limit):
        def one(config):
            params_one = env_params.replace(
                sticky_action_prob=config[1],
                env_params=env_params.env_params.replace(max_steps_in_episode=config[2]))
            return evaluate(key, params, config[0], env=env, env_params=params_one,
                            act=act, num_episodes=num_episodes,
                            max_steps=int(limits.max()) + 1, num_recorded=min(8, num_episodes),
                            record_steps=RECORD_STEPS)
        return jax.lax.map(one, (greedy, sticky, limit))

    evaluate_split = jax.shard_map(evaluate_share, mesh=mesh,
                                   in_specs=(P(), P(), *[P("data")] * 3), out_specs=P("data"),
                                   check_vma=False)

    def evaluate_pair(key, params, pair):
        return evaluate_split(key, params, jnp.asarray(greedy)[pair], jnp.asarray(sticky)[pair],
                              jnp.asarray(limits)[pair])

    return jax.jit(evaluate_pair), mesh


def compile_final_evaluation(env: Any, env_id: str, env_params: Any, act: Callable,
                             num_episodes: int, num_devices: int, key: jax.Array,
                             params: Any) -> Callable:
    """`make_evaluate_pair` compiled ahead of time for `params`' shapes: play(params, policy) starts
    the pair of EVALUATION_PAIRS[policy] ("sampled" or "greedy") with `key` and returns at once."""
    evaluate_pair, mesh = make_evaluate_pair(env, env_id, env_params, act, num_episodes,
                                             num_devices)
    replicated = NamedSharding(mesh, P())
    compiled = evaluate_pair.lower(key, jax.device_put(params, replicated), 0).compile()
    index = {policy: i for i, policy in enumerate(EVALUATION_PAIRS)}
    return lambda params, policy: compiled(key, jax.device_put(params, replicated), index[policy])

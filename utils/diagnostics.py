"""Training diagnostics of ppo_breakout.py (--diagnostics): summaries of each iteration's rollout and update,
computed inside the jitted step so that only a few numbers and fixed-bin histograms reach the host."""

import jax
import jax.numpy as jnp

HISTOGRAM_BINS = 30
LOG_RATIO_RANGE = 1.0  # log-ratio histograms span [-1, 1]; values beyond count in the end bins
DIAGNOSTICS = ("grad_norm", "logit_gap_max", "log_ratio_min", "log_ratio_max", "advantage_mean", "advantage_std",
               "value_error", "silent_units")


def bin_counts(x: jax.Array, low: jax.Array | float, high: jax.Array | float) -> jax.Array:
    """Counts of `x` in HISTOGRAM_BINS equal bins over [low, high], values outside in the end bins (one
    comparison per bin: on a CPU far cheaper than jnp.histogram's search)."""
    bins = jnp.clip(jnp.floor((x.ravel() - low) / (high - low) * HISTOGRAM_BINS), 0, HISTOGRAM_BINS - 1)
    return (bins.astype(jnp.int32)[:, None] == jnp.arange(HISTOGRAM_BINS)).sum(0)


def training_diagnostics(batch, active_units: jax.Array, update_stats: dict[str, jax.Array], over_devices) -> dict:
    """The diagnostics/ scalars and histograms of one iteration: the logit gap (what loss_stability.py
    sweeps), the log-ratio range, advantage and value statistics, torso units silent on the whole
    rollout, action frequencies. `batch` is the update's Batch, `active_units` which torso features fired
    on some observation of the rollout; `over_devices(collective, x)` reduces across the devices (x itself
    on one). The reductions are packed: one max, one sum, one mean."""
    data = {"logits": batch.logits, "advantage": batch.advantage, "value": batch.value}
    maxima = over_devices(jax.lax.pmax, jnp.concatenate([
        jnp.stack([m for x in data.values() for m in (-x.min(), x.max())]),  # each histogram's range
        jnp.stack([(batch.logits.max(-1) - batch.logits.min(-1)).max(), -update_stats["log_ratio_min"].min(),
                   update_stats["log_ratio_max"].max()]),
        active_units.astype(jnp.float32)]))
    edges = {name: jnp.linspace(-maxima[2 * i], jnp.maximum(maxima[2 * i + 1], 1e-6 - maxima[2 * i]),
                                HISTOGRAM_BINS + 1) for i, name in enumerate(data)}
    counts = [bin_counts(x, edges[name][0], edges[name][-1]) for name, x in data.items()]
    sums = over_devices(jax.lax.psum, jnp.concatenate(counts + [
        update_stats["log_ratio_counts"].sum((0, 1)), jnp.bincount(batch.action, length=batch.logits.shape[-1])]))
    means = over_devices(jax.lax.pmean, jnp.stack([batch.advantage.mean(), jnp.square(batch.advantage).mean(),
                                                   jnp.square(batch.target - batch.value).mean()]))
    edges["log_ratio"] = jnp.linspace(-LOG_RATIO_RANGE, LOG_RATIO_RANGE, HISTOGRAM_BINS + 1)
    histograms = {name: {"counts": sums[i * HISTOGRAM_BINS:(i + 1) * HISTOGRAM_BINS], "edges": edges[name]}
                  for i, name in enumerate(edges)}
    action_counts = sums[4 * HISTOGRAM_BINS:]
    return {"logit_gap_max": maxima[6], "log_ratio_min": -maxima[7], "log_ratio_max": maxima[8],
            "advantage_mean": means[0], "advantage_std": jnp.sqrt(jnp.maximum(means[1] - jnp.square(means[0]), 0.0)),
            "value_error": jnp.sqrt(means[2]), "silent_units": 1.0 - maxima[9:].mean(),
            "action_frequency": action_counts / action_counts.sum(), "histograms": histograms}

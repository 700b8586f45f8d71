"""Training diagnostics of ppo_breakout.py (--diagnostics): summaries of each iteration's rollout
and update, computed inside the jitted step so that only a few numbers and fixed-bin histograms
reach the host."""

import jax
import jax.numpy as jnp

HISTOGRAM_BINS = 30
LOG_RATIO_RANGE = 1.0  # log-ratio histograms span [-1, 1]; values beyond count in the end bins
DIAGNOSTICS = ("grad_norm", "logit_gap_max", "log_ratio_min", "log_ratio_max", "advantage_mean",
               "advantage_std", "value_error", "silent_units")


def bin_counts(x: jax.Array, low: jax.Array | float, high: jax.Array | float) -> jax.Array:
    """Counts of `x` in HISTOGRAM_BINS equal bins over [low, high], values outside in the end bins
    (one comparison per bin: on a CPU far cheaper than jnp.histogram's search)."""
    bins = jnp.floor((x.ravel() - low) / (high - low) * HISTOGRAM_BINS)
    bins = jnp.clip(bins, 0, HISTOGRAM_BINS - 1).astype(jnp.int32)
    return (bins[:, None] == jnp.arange(HISTOGRAM_BINS)).sum(0)


def histogram(x: jax.Array, low: jax.Array | float, high: jax.Array | float, total=None) -> dict:
    """Counts of `x` in HISTOGRAM_BINS equal bins over [low, high], and the bins' edges; `total`
    adds up the counts of copies that run side by side."""
    counts = bin_counts(x, low, high)
    return {"counts": counts if total is None else total(counts),
            "edges": jnp.linspace(low, high, HISTOGRAM_BINS + 1)}


def training_diagnostics(batch, active_units: jax.Array, log_ratio: jax.Array,
                         replicas=None) -> dict:
    """The diagnostics/ scalars and histograms of one iteration: the logit gap (what
    loss_stability.py sweeps), the log-ratio range, advantage and value statistics, torso units
    silent on the whole rollout, action frequencies. `batch` is the update's Batch, `active_units`
    which torso features fired on some observation of the rollout, `log_ratio` the update's
    log-ratios of every minibatch step. Copies of the update that run side by side (ppo_breakout's
    Replicas) combine theirs with `replicas.mean`, `.sum` and `.max`."""
    same = lambda x: x  # noqa: E731
    mean, total, largest = (replicas.mean, replicas.sum, replicas.max) if replicas else (same,) * 3
    spread = {"logits": batch.logits, "advantage": batch.advantage, "value": batch.value}
    histograms = {}
    for name, x in spread.items():
        low, high = -largest(-x.min()), largest(x.max())
        histograms[name] = histogram(x, low, jnp.maximum(high, low + 1e-6), total)
    histograms["log_ratio"] = histogram(log_ratio, -LOG_RATIO_RANGE, LOG_RATIO_RANGE, total)
    action_counts = total(jnp.bincount(batch.action, length=batch.logits.shape[-1]))
    advantage_mean = mean(batch.advantage.mean())
    advantage_sq = mean(jnp.square(batch.advantage).mean())
    return {"logit_gap_max": largest((batch.logits.max(-1) - batch.logits.min(-1)).max()),
            "log_ratio_min": -largest(-log_ratio.min()), "log_ratio_max": largest(log_ratio.max()),
            "advantage_mean": advantage_mean,
            "advantage_std": jnp.sqrt(jnp.maximum(advantage_sq - jnp.square(advantage_mean), 0.0)),
            "value_error": jnp.sqrt(mean(jnp.square(batch.target - batch.value).mean())),
            "silent_units": 1.0 - largest(active_units.astype(jnp.float32)).mean(),
            "action_frequency": action_counts / action_counts.sum(), "histograms": histograms}

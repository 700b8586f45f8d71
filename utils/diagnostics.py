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


def training_diagnostics(batch, active_units: jax.Array, log_ratio: jax.Array) -> dict:
    """The diagnostics/ scalars and histograms of one iteration: the logit gap (what
    loss_stability.py sweeps), the log-ratio range, advantage and value statistics, torso units
    silent on the whole rollout, action frequencies. `batch` is the update's Batch, `active_units`
    which torso features fired on some observation of the rollout, `log_ratio` the update's
    log-ratios of every minibatch step."""
    spread = {"logits": batch.logits, "advantage": batch.advantage, "value": batch.value}
    edges = {name: (x.min(), jnp.maximum(x.max(), x.min() + 1e-6)) for name, x in spread.items()}
    edges["log_ratio"] = (-LOG_RATIO_RANGE, LOG_RATIO_RANGE)
    data = spread | {"log_ratio": log_ratio}
    histograms = {name: {"counts": bin_counts(data[name], *edges[name]),
                         "edges": jnp.linspace(*edges[name], HISTOGRAM_BINS + 1)} for name in edges}
    actions = jnp.bincount(batch.action, length=batch.logits.shape[-1])
    return {"logit_gap_max": (batch.logits.max(-1) - batch.logits.min(-1)).max(),
            "log_ratio_min": log_ratio.min(), "log_ratio_max": log_ratio.max(),
            "advantage_mean": batch.advantage.mean(), "advantage_std": batch.advantage.std(),
            "value_error": jnp.sqrt(jnp.square(batch.target - batch.value).mean()),
            "silent_units": 1.0 - active_units.mean(),
            "action_frequency": actions / actions.sum(),
            "histograms": histograms}

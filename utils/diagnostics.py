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


def training_diagnostics(batch, active_units: jax.Array, log_ratio: jax.Array,
                         replicas=None) -> dict:
    """The diagnostics/ scalars and histograms of one iteration: the logit gap (what
    loss_stability.py sweeps), the log-ratio range, advantage and value statistics, torso units
    silent on the whole rollout, action frequencies. `batch` is the update's Batch, `active_units`
    which torso features fired on some observation of the rollout, `log_ratio` the update's
    log-ratios of every minibatch step. Copies of the update that run side by side (ppo_breakout's
    Replicas) combine theirs with `replicas.max`, `.sum` and `.mean`, one call of each for a dict
    of values (one collective each)."""
    same = lambda x: x  # noqa: E731
    largest, total, mean = (replicas.max, replicas.sum, replicas.mean) if replicas else (same,) * 3
    spread = {"logits": batch.logits, "advantage": batch.advantage, "value": batch.value}
    maxima = largest({"low": {name: -x.min() for name, x in spread.items()},
                      "high": {name: x.max() for name, x in spread.items()},
                      "logit_gap": (batch.logits.max(-1) - batch.logits.min(-1)).max(),
                      "log_ratio_low": -log_ratio.min(), "log_ratio_high": log_ratio.max(),
                      "active": active_units.astype(jnp.float32)})
    edges = {}
    for name in spread:
        low = -maxima["low"][name]
        edges[name] = (low, jnp.maximum(maxima["high"][name], low + 1e-6))
    edges["log_ratio"] = (-LOG_RATIO_RANGE, LOG_RATIO_RANGE)
    data = spread | {"log_ratio": log_ratio}
    counts = total({"histograms": {name: bin_counts(data[name], *edges[name]) for name in edges},
                    "actions": jnp.bincount(batch.action, length=batch.logits.shape[-1])})
    moments = mean({"advantage": batch.advantage.mean(),
                    "advantage_sq": jnp.square(batch.advantage).mean(),
                    "value_error_sq": jnp.square(batch.target - batch.value).mean()})
    histograms = {name: {"counts": counts["histograms"][name],
                         "edges": jnp.linspace(*edges[name], HISTOGRAM_BINS + 1)} for name in edges}
    advantage_var = moments["advantage_sq"] - jnp.square(moments["advantage"])
    return {"logit_gap_max": maxima["logit_gap"],
            "log_ratio_min": -maxima["log_ratio_low"], "log_ratio_max": maxima["log_ratio_high"],
            "advantage_mean": moments["advantage"],
            "advantage_std": jnp.sqrt(jnp.maximum(advantage_var, 0.0)),
            "value_error": jnp.sqrt(moments["value_error_sq"]),
            "silent_units": 1.0 - maxima["active"].mean(),
            "action_frequency": counts["actions"] / counts["actions"].sum(),
            "histograms": histograms}

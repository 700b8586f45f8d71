"""Why PPO computes its ratio in log space: the same clipped loss four ways, pushed until it breaks.

The PPO paper writes the ratio as p / p_old; implementations compute exp(log p - log p_old) from
`log_softmax`. This script computes the same clipped PPO loss for the same inputs four ways,

  (a) direct-naive:     p = exp(z) / sum(exp(z)),            ratio = p / p_old
                        (the paper, as written)
  (b) direct-softmax:   p = jax.nn.softmax(z) (max removed), ratio = p / p_old
                        (overflow fixed)
  (c) log-space:        logp = jax.nn.log_softmax(z),        ratio = exp(logp - logp_old)
  (d) log-space-paired: log ratio = (z_a - z'_a) - (max z - max z') - (log1p(rest) - log1p(rest')),
                        each new term minus its old twin first (log space without the cancellation)

and holds each against a 50-digit mpmath reference, in float32 and in float64:

  sweep 1  logits (m, 0) and old logits k * (m, 0) for m far into the hundreds, both signs: the
           first m at which the loss and its gradient turn wrong or non-finite, next to where the
           float format alone says the direct methods must break (an independent check), and the
           direct ratio once more in numpy, whose exp keeps subnormals where XLA flushes them to
           zero;
  sweep 2  the safe zone (small |m|): each method's error in ulps, with the mean, spread, sign and
           neighbour correlation that tell a systematic error from a noisy one, overall and per
           window.

Run it (about 8 s on a 2-core CPU); figures, CSVs and summary.json land in --out-dir:

    python loss_stability.py
    python loss_stability.py --out-dir docs/figures/loss_stability   # the copies the docs show

What the figures show: docs/loss_stability.md
"""

import csv
import dataclasses
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")  # write files, never open a window
import matplotlib.pyplot as plt
import mpmath
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from utils import cli


@dataclasses.dataclass
class Args:
    out_dir: str = "runs/loss_stability"
    """directory for the figures, the CSVs and summary.json (created if missing)"""
    min_logit: float = -1000.0
    """sweep 1: most negative logit magnitude m (the logits are (m, 0))"""
    max_logit: float = 1000.0
    """sweep 1: most positive logit magnitude m"""
    num_points: int = 2001
    """number of evenly spaced magnitudes in each sweep (sweep 1's default steps by 1);
    at least 65"""
    safe_logit: float = 20.0
    """sweep 2: the safe zone is m in [-safe_logit, safe_logit]"""
    old_logit_ratio: float = 0.99
    """old logits = old_logit_ratio * logits: the fixed ratio between them that the post's
    sweep keeps"""
    clip_coef: float = 0.2
    """PPO's clipping range: the ratio is clipped to [1 - eps, 1 + eps]"""
    wrong_tolerance: float = 1e-3
    """a loss or gradient counts as wrong once its relative error exceeds this"""


# One state seen twice, both times taking action 0, the action whose logit is swept (the post's
# (-750, 0) example). Advantages of both signs keep one sample on the unclipped side of PPO's min
# whichever way the ratio moves, and |-2| > |1| keeps the loss away from zero, so that relative
# errors mean something everywhere.
ACTIONS = np.array([0, 0])
ADVANTAGES = np.array([1.0, -2.0])
DTYPES = (np.float32, np.float64)
REFERENCE_DIGITS = 50
NUM_WINDOWS = 16  # equal windows of m per sweep, for the per-window statistics
MIN_POINTS = 4 * NUM_WINDOWS + 1  # per sweep: every window gets the points its statistics need


# --------------------------------------------------------------------------------------------------
# The same clipped PPO loss, three ways. Only the ratio differs.
# --------------------------------------------------------------------------------------------------
def clipped_surrogate_loss(ratio, advantages, clip_coef):
    """PPO's L^CLIP as a loss to minimise: -mean(min(r A, clip(r, 1 - eps, 1 + eps) A))."""
    clipped_ratio = jnp.clip(ratio, 1 - clip_coef, 1 + clip_coef)
    return -jnp.mean(jnp.minimum(ratio * advantages, clipped_ratio * advantages))


def at_actions(per_action, actions):
    """The entry of each row that belongs to the action taken: [batch, num_actions] -> [batch]."""
    return jnp.take_along_axis(per_action, actions[:, None], axis=-1)[:, 0]


def loss_direct_naive(logits, old_logits, actions, advantages, clip_coef):
    """(a) The paper as written: softmax from its definition, ratio = p / p_old."""

    def naive_softmax(z):
        exp_z = jnp.exp(z)
        return exp_z / jnp.sum(exp_z, axis=-1, keepdims=True)

    ratio = at_actions(naive_softmax(logits), actions) / at_actions(
        naive_softmax(old_logits), actions
    )
    return clipped_surrogate_loss(ratio, advantages, clip_coef)


def loss_direct_softmax(logits, old_logits, actions, advantages, clip_coef):
    """(b) jax.nn.softmax subtracts max(z) first: exp never overflows; tiny p still round to 0."""
    ratio = at_actions(jax.nn.softmax(logits), actions) / at_actions(
        jax.nn.softmax(old_logits), actions
    )
    return clipped_surrogate_loss(ratio, advantages, clip_coef)


def loss_log_space(logits, old_logits, actions, advantages, clip_coef):
    """(c) The blog's `policy_loss`: log-sum-exp in log_softmax, ratio = exp(logp - logp_old)."""
    log_probs, old_log_probs = jax.nn.log_softmax(logits), jax.nn.log_softmax(old_logits)
    ratio = jnp.exp(at_actions(log_probs, actions) - at_actions(old_log_probs, actions))
    return clipped_surrogate_loss(ratio, advantages, clip_coef)


def log_normaliser_parts(logits):
    """logsumexp(z) in two parts: max(z) + log1p(sum of exp(z_j - max) over j other than the max).

    log1p of the small rest keeps digits that log(1 + rest) rounds away. The max keeps its gradient:
    the parts add up to logsumexp only with it.
    """
    top = jnp.argmax(logits, axis=-1)
    top_logit = at_actions(logits, top)
    is_top = jnp.arange(logits.shape[-1]) == top[..., None]
    rest = jnp.sum(jnp.where(is_top, 0, jnp.exp(logits - top_logit[..., None])), axis=-1)
    return top_logit, jnp.log1p(rest)


def loss_log_space_paired(logits, old_logits, actions, advantages, clip_coef):
    """(d) Log space without the cancellation: log ratio = (z_a - z'_a) - (lse(z) - lse(z')), with
    each new term minus its old twin taken first, so that no logit-sized number is subtracted at the
    end."""
    top, log_rest = log_normaliser_parts(logits)
    old_top, old_log_rest = log_normaliser_parts(old_logits)
    log_ratio = (
        (at_actions(logits, actions) - at_actions(old_logits, actions))
        - (top - old_top)
        - (log_rest - old_log_rest)
    )
    return clipped_surrogate_loss(jnp.exp(log_ratio), advantages, clip_coef)


METHODS = {
    "direct-naive": loss_direct_naive,
    "direct-softmax": loss_direct_softmax,
    "log-space": loss_log_space,
    "log-space-paired": loss_log_space_paired,
}


def sweep_inputs(magnitudes, old_logit_ratio, dtype):
    """Logits (m, 0) for each magnitude, one row per sample, and old logits k * (m, 0), both
    rounded to dtype."""
    state = np.stack([magnitudes, np.zeros_like(magnitudes)], axis=-1)
    logits = np.repeat(state[:, None, :], len(ACTIONS), axis=1)
    return logits.astype(dtype), (old_logit_ratio * logits).astype(dtype)


@functools.partial(jax.jit, static_argnames=("method", "clip_coef"))
def loss_and_grad_sweep(logits, old_logits, method, clip_coef):
    """Loss and d loss / d logits (old logits are constants) at every sweep point, in the
    logits' dtype."""
    value_and_grad = jax.value_and_grad(METHODS[method])
    # with x64 on, a float64 constant would promote float32
    advantages = jnp.asarray(ADVANTAGES, logits.dtype)

    def one_point(point_logits, point_old_logits):
        return value_and_grad(
            point_logits, point_old_logits, jnp.asarray(ACTIONS), advantages, clip_coef
        )

    return jax.vmap(one_point)(logits, old_logits)


# --------------------------------------------------------------------------------------------------
# Reference: the same loss at 50 digits from the exact float inputs, so that it measures how each
# method computes, not how the inputs were rounded. The gradient is derived by hand, not autodiff:
#   d ratio_i / d z_ij = ratio_i * (1[j = a_i] - p_ij), and PPO's min passes it on
#   (times -A_i / batch) only where the unclipped term r A is the smaller one; clip is flat outside
#   [1 - eps, 1 + eps].
# --------------------------------------------------------------------------------------------------
def reference_loss_and_grad(logits, old_logits, actions, advantages, clip_low, clip_high):
    """Loss (an mpf), its gradient w.r.t. logits (float64) and the ratios (mpf) for one batch, at
    REFERENCE_DIGITS digits."""
    batch_size = len(actions)
    grad, ratios = np.zeros(np.shape(logits)), []
    with mpmath.workdps(REFERENCE_DIGITS):
        loss = mpmath.mpf(0)
        for i, (action, advantage) in enumerate(zip(actions, advantages)):
            z, z_old = ([mpmath.mpf(float(v)) for v in row] for row in (logits[i], old_logits[i]))
            log_norm, log_norm_old = (
                mpmath.log(mpmath.fsum(map(mpmath.exp, row))) for row in (z, z_old)
            )
            ratio = mpmath.exp((z[action] - log_norm) - (z_old[action] - log_norm_old))
            ratios.append(ratio)
            clipped_ratio = min(max(ratio, clip_low), clip_high)
            loss -= min(ratio * advantage, clipped_ratio * advantage) / batch_size
            if ratio * advantage <= clipped_ratio * advantage:
                for j, z_j in enumerate(z):
                    p_j = mpmath.exp(z_j - log_norm)
                    grad[i, j] = float(-advantage / batch_size * ratio * ((j == action) - p_j))
    return loss, grad, ratios


def reference_sweep(logits, old_logits, clip_coef):
    """Reference losses (mpf), gradients (float64) and ratios (mpf, one row per point) at every
    sweep point, for inputs of one dtype."""
    # The clip bounds as the float computation sees them: 1 -/+ eps rounded to the working dtype.
    clip_low, clip_high = (
        mpmath.mpf(float(logits.dtype.type(1 + s * clip_coef))) for s in (-1, 1)
    )
    results = [
        reference_loss_and_grad(z, z_old, ACTIONS, ADVANTAGES, clip_low, clip_high)
        for z, z_old in zip(logits, old_logits)
    ]
    losses, grads, ratios = zip(*results)
    return list(losses), np.stack(grads), list(ratios)


def relative_errors(values, reference, dtype):
    """|x - ref| / |ref| per entry, from 50 digits; inf where x is not finite.
    Shapes: [n] or [n, batch]."""
    # no float of this dtype holds a smaller reference
    floor = mpmath.mpf(float(np.finfo(dtype).tiny))
    values = np.asarray(values)
    flat_reference = np.ravel(np.array(reference, dtype=object))
    errors = [
        float(abs(mpmath.mpf(float(x)) - ref) / max(abs(ref), floor)) if np.isfinite(x) else np.inf
        for x, ref in zip(values.ravel(), flat_reference)
    ]
    return np.array(errors).reshape(values.shape)


def gradient_errors(grads, reference_grads):
    """||g - g_ref|| / max(||g_ref||, ||A|| / batch) per point; inf where any entry is not finite.

    ||A|| / batch is roughly the gradient's size while the ratio is near 1 and no probability
    saturates. Below it, errors count in its units (like np.isclose's atol): an error of 1e-9 in a
    gradient of 1e-9 vanishes next to any ordinary sample's gradient; an error of 0.5 does not.
    """
    grads, reference_grads = (
        g.reshape(len(g), -1).astype(np.float64) for g in (grads, reference_grads)
    )
    ordinary_size = np.linalg.norm(ADVANTAGES) / len(ADVANTAGES)
    errors = np.linalg.norm(grads - reference_grads, axis=-1)
    errors /= np.maximum(np.linalg.norm(reference_grads, axis=-1), ordinary_size)
    return np.where(np.all(np.isfinite(grads), axis=-1), errors, np.inf)


def ulp_errors(losses, reference):
    """(loss - ref) in units of the spacing of floats of the loss's dtype at ref, from 50 digits."""
    spacing = np.spacing(np.array([abs(float(ref)) for ref in reference], dtype=losses.dtype))
    return np.array([
        float((mpmath.mpf(float(x)) - ref) / float(ulp))
        for x, ref, ulp in zip(losses, reference, spacing)
    ])


def ulp_error_stats(ulps):
    """Systematic error shows as a mean far from 0 with one sign; noise as mean ~ 0, mixed signs and
    no correlation between neighbouring m (a smooth, predictable error's neighbours agree)."""
    neighbours = np.corrcoef(ulps[:-1], ulps[1:])[0, 1] if ulps.std() > 0 else 0.0
    return {
        "mean": float(ulps.mean()),
        "std": float(ulps.std()),
        "max_abs": float(np.abs(ulps).max()),
        "share_positive": float((ulps > 0).mean()),
        "share_negative": float((ulps < 0).mean()),
        "neighbour_correlation": float(neighbours),
    }


def window_edges(magnitudes):
    """NUM_WINDOWS equal windows of m across a sweep: where a method is worst, not only how bad
    it is overall."""
    return np.linspace(magnitudes[0], magnitudes[-1], NUM_WINDOWS + 1)


def per_window(magnitudes, values, reduce):
    """reduce(values of the points in each window [lo, hi));
    the sweep's last point joins the last window."""
    window = np.searchsorted(window_edges(magnitudes), magnitudes, side="right") - 1
    window = np.minimum(window, NUM_WINDOWS - 1)
    return [float(reduce(values[window == w])) for w in range(NUM_WINDOWS)]


def window_maxima(magnitudes, errors):
    """The largest |error| in each window; None where the window holds a non-finite result
    (JSON has no inf)."""
    return [None if np.isinf(x) else x for x in per_window(magnitudes, np.abs(errors), np.max)]


def windows_not_worse(windows, key, method="log-space-paired"):
    """Per other method: in how many windows `method`'s largest error (windows[m][key])
    is no larger."""

    def largest(m):
        return [np.inf if x is None else x for x in windows[m][key]]

    return {
        other: sum(ours <= theirs for ours, theirs in zip(largest(method), largest(other)))
        for other in METHODS if other != method
    }


# --------------------------------------------------------------------------------------------------
# Thresholds, and the independent check: where the float format alone says each method must break.
# --------------------------------------------------------------------------------------------------
def first_break(magnitudes, broken):
    """The m closest to zero on each side where `broken` holds: (negative side, positive side);
    None: never."""
    negative = magnitudes[(magnitudes < 0) & broken]
    positive = magnitudes[(magnitudes > 0) & broken]
    return (
        float(negative.max()) if negative.size else None,
        float(positive.min()) if positive.size else None,
    )


def exp_flushes_subnormals(dtype):
    """Whether exp returns 0 rather than a subnormal here (XLA on CPU flushes denormals to zero)."""
    just_below_normal = np.log(np.finfo(dtype).tiny) - 1
    return float(jax.jit(jnp.exp)(jnp.asarray(just_below_normal, dtype))) == 0.0


def predicted_breaks(dtype, old_logit_ratio, flushes_subnormals):
    """Per method, the m (negative side, positive side) from which the loss may be wrong and at
    which it must turn non-finite, from the float format alone (mpmath, no sweep).

    Negative side: action 0's exp(m) (new) or exp(k m) (old) leaves the normal range; new p = 0
    makes the ratio 0 (finite, maybe wrong), old p = 0 makes it x / 0 or 0 / 0. Positive side, naive
    only: XLA computes exp(z) / sum as exp(z) * (1 / sum), and 1 / sum underflows once
    sum > 1 / smallest, a little before exp(m) itself overflows. Log space never forms a tiny p; its
    ratio, about exp((1 - k) m), can only overflow, and only for k > 1.
    """
    info, k = np.finfo(dtype), mpmath.mpf(old_logit_ratio)
    # exp below this is subnormal (precision goes) or flushed
    log_normal = mpmath.log(float(info.tiny))
    if flushes_subnormals:
        log_zero = log_normal
    else:
        log_zero = mpmath.log(mpmath.mpf(float(info.smallest_subnormal)) / 2)
    log_overflow = mpmath.log(float(info.max))
    first_p_leaves_normal, old_p_is_zero = log_normal / max(k, 1), log_zero / k
    naive_nonfinite = min(-log_zero / k, log_overflow / max(k, 1))
    naive_wrong_from = min(-log_normal / max(k, 1), naive_nonfinite)
    log_space_nonfinite = log_overflow / (1 - k) if k > 1 else None

    def sides(negative, positive):
        return tuple(None if m is None else float(m) for m in (negative, positive))

    log_space = (sides(log_space_nonfinite, None), sides(log_space_nonfinite, None))
    wrong_from_and_nonfinite = {  # per method: (negative side, positive side) for each
        "direct-naive": (
            sides(first_p_leaves_normal, naive_wrong_from), sides(old_p_is_zero, naive_nonfinite)
        ),
        "direct-softmax": (sides(first_p_leaves_normal, None), sides(old_p_is_zero, None)),
        "log-space": log_space,
        "log-space-paired": log_space,
    }
    return {m: {"wrong_from": w, "nonfinite": n} for m, (w, n) in wrong_from_and_nonfinite.items()}


def matches_prediction(magnitudes, measured, predicted):
    """Non-finite at the first grid point past the predicted m;
    wrong no closer to 0 than predicted."""

    def on_grid(pair):
        negative, positive = (side * np.inf if m is None else m for m, side in zip(pair, (-1, 1)))
        return first_break(magnitudes, (magnitudes <= negative) | (magnitudes >= positive))

    def size(m):
        return np.inf if m is None else abs(m)

    sides = zip(
        on_grid(predicted["wrong_from"]), measured["loss_wrong"], measured["loss_nonfinite"]
    )
    return measured["loss_nonfinite"] == on_grid(predicted["nonfinite"]) and all(
        size(start) <= size(wrong) <= size(nonfinite) for start, wrong, nonfinite in sides
    )


def ieee_direct_softmax(logits, old_logits, clip_coef):
    """direct-softmax's ratios [n, batch] and losses [n] in numpy, whose exp keeps subnormals (IEEE
    gradual underflow) where XLA flushes them to zero: the arithmetic of a plot made with numpy."""

    def softmax(z):
        exp_z = np.exp(z - z.max(axis=-1, keepdims=True))
        return exp_z / exp_z.sum(axis=-1, keepdims=True)

    def at_action(p):
        return np.take_along_axis(p, ACTIONS[None, :, None], axis=-1)[..., 0]

    dtype = logits.dtype.type
    # 0 / 0 is what is measured
    with np.errstate(under="ignore", divide="ignore", invalid="ignore"):
        ratio = at_action(softmax(logits)) / at_action(softmax(old_logits))
        clipped_ratio = np.clip(ratio, dtype(1 - clip_coef), dtype(1 + clip_coef))
        advantages = ADVANTAGES.astype(dtype)
        loss = -np.mean(np.minimum(ratio * advantages, clipped_ratio * advantages), axis=-1)
    return ratio, loss


# --------------------------------------------------------------------------------------------------
# The two sweeps, for one dtype
# --------------------------------------------------------------------------------------------------
def large_sweep(args, magnitudes, dtype, predicted):
    """Sweep 1: per method the loss, the relative errors of loss and gradient (their largest per
    window), and where they break; then direct-softmax again in numpy's IEEE arithmetic (where it
    breaks)."""
    logits, old_logits = sweep_inputs(magnitudes, args.old_logit_ratio, dtype)
    ref_losses, ref_grads, ref_ratios = reference_sweep(logits, old_logits, args.clip_coef)
    curves = {"reference": {"loss": np.array([float(r) for r in ref_losses])}}
    thresholds, windows = {}, {}
    for method in METHODS:
        losses, grads = map(
            np.asarray, loss_and_grad_sweep(logits, old_logits, method, args.clip_coef)
        )
        assert losses.dtype == grads.dtype == dtype, (
            "the sweep must compute in the dtype it reports"
        )
        loss_err = relative_errors(losses, ref_losses, dtype)
        grad_err = gradient_errors(grads, ref_grads)
        curves[method] = {"loss": losses, "loss_rel_error": loss_err, "grad_error": grad_err}
        windows[method] = {
            "loss": window_maxima(magnitudes, loss_err), "grad": window_maxima(magnitudes, grad_err)
        }
        measured = {
            # non-finite: error inf
            "loss_wrong": first_break(magnitudes, loss_err > args.wrong_tolerance),
            "loss_nonfinite": first_break(magnitudes, ~np.isfinite(losses)),
            "grad_wrong": first_break(magnitudes, grad_err > args.wrong_tolerance),
            "grad_nonfinite": first_break(magnitudes, ~np.all(np.isfinite(grads), axis=(1, 2))),
        }
        measured["matches_prediction"] = matches_prediction(magnitudes, measured, predicted[method])
        finite = np.isfinite(loss_err) & np.isfinite(grad_err)
        measured["largest_finite_error"] = {
            "loss": float(loss_err[finite].max()), "grad": float(grad_err[finite].max())
        }
        thresholds[method] = {**measured, "predicted": predicted[method]}

    ieee_ratios, ieee_losses = ieee_direct_softmax(logits, old_logits, args.clip_coef)
    ratio_err = relative_errors(ieee_ratios, ref_ratios, dtype).max(axis=-1)
    ieee = {
        "ratio_wrong": first_break(magnitudes, ratio_err > args.wrong_tolerance),
        "loss_wrong": first_break(
            magnitudes, relative_errors(ieee_losses, ref_losses, dtype) > args.wrong_tolerance
        ),
        "loss_nonfinite": first_break(magnitudes, ~np.isfinite(ieee_losses)),
    }
    ieee_predicted = predicted_breaks(
        dtype, args.old_logit_ratio, flushes_subnormals=False
    )["direct-softmax"]
    ieee["matches_prediction"] = matches_prediction(magnitudes, ieee, ieee_predicted)
    return curves, thresholds, windows, {**ieee, "predicted": ieee_predicted}


def safe_sweep(args, magnitudes, dtype):
    """Sweep 2: per method the loss error in ulps of the reference and the gradient error, with the
    statistics of the ulps, overall and per window."""
    logits, old_logits = sweep_inputs(magnitudes, args.old_logit_ratio, dtype)
    ref_losses, ref_grads, _ = reference_sweep(logits, old_logits, args.clip_coef)
    curves, stats, windows = {}, {}, {}
    for method in METHODS:
        losses, grads = map(
            np.asarray, loss_and_grad_sweep(logits, old_logits, method, args.clip_coef)
        )
        ulps = ulp_errors(losses, ref_losses)
        curves[method] = {"ulp_error": ulps, "grad_error": gradient_errors(grads, ref_grads)}
        largest_loss_error = max(
            abs(mpmath.mpf(float(x)) - ref) for x, ref in zip(losses, ref_losses)
        )
        stats[method] = {
            **ulp_error_stats(ulps),
            "max_abs_loss_error": float(largest_loss_error),
            "max_grad_error": float(curves[method]["grad_error"].max()),
        }
        windows[method] = {
            "ulps": window_maxima(magnitudes, ulps),
            "ulps_neighbour_correlation": per_window(
                magnitudes, ulps, lambda u: ulp_error_stats(u)["neighbour_correlation"]
            ),
            "grad": window_maxima(magnitudes, curves[method]["grad_error"]),
        }
    return curves, stats, windows


# --------------------------------------------------------------------------------------------------
# Outputs: figures, CSVs, terminal tables (all of them from summary.json's numbers)
# --------------------------------------------------------------------------------------------------
COLORS = {"direct-naive": "tab:red", "direct-softmax": "tab:orange", "log-space": "tab:blue",
          "log-space-paired": "tab:green"}
# smaller errors (exact 0 included) are drawn in a band at the bottom of the panel
ERROR_FLOOR = 1e-20
FIGURE_STYLE = {"font.size": 12, "axes.titlesize": 12, "legend.fontsize": 12}


def marker_legend(fig, entries):
    """One legend for the figure that says what each marker and line means, drawn in black."""
    handles = [Line2D([], [], **{"color": "black", **style}) for _, style in entries]
    fig.legend(handles, [label for label, _ in entries], loc="upper center", ncol=3, markerscale=2,
               frameon=False)


def large_sweep_figure(magnitudes, curves, thresholds, error_key, ylabel, tolerance):
    """Sweep 1's error for one quantity: a panel per method (rows) and dtype (columns), so that no
    method hides another. Non-finite points sit in a grey band at the top, errors below ERROR_FLOOR
    in one at the bottom: neither is drawn at an error value it does not have."""
    dtypes = list(curves)
    with plt.rc_context(FIGURE_STYLE):
        fig, axes = plt.subplots(
            len(METHODS), len(dtypes), figsize=(12, 13.5), sharex="col", sharey=True, squeeze=False
        )
        for col, name in enumerate(dtypes):
            for row, method in enumerate(METHODS):
                ax, errors, color = axes[row, col], curves[name][method][error_key], COLORS[method]
                finite = np.isfinite(errors)
                shown, tiny = finite & (errors >= ERROR_FLOOR), finite & (errors < ERROR_FLOOR)
                # x in data units, y as a fraction of the panel's height
                band = ax.get_xaxis_transform()
                for low in (0, 0.9):
                    height = 0.1 - 0.04 * (low == 0)
                    ax.add_patch(
                        Rectangle((0, low), 1, height, transform=ax.transAxes, color="0.9", lw=0)
                    )
                ax.plot(magnitudes[shown], errors[shown], ".", ms=3, color=color, label="error")
                ax.plot(magnitudes[tiny], np.full(tiny.sum(), 0.03), "_", ms=6, color=color,
                        transform=band, label="error below floor")
                ax.plot(magnitudes[~finite], np.full((~finite).sum(), 0.95), "x", ms=5, color=color,
                        transform=band, label="not finite")
                for m in thresholds[name][method]["predicted"]["nonfinite"]:
                    if m is not None:
                        ax.axvline(m, color="gray", ls=":", lw=1.5)
                ax.axhline(tolerance, color="black", ls="--", lw=1)
                # before the log scale, which would autoscale first
                ax.set_ylim(ERROR_FLOOR / 100, 1e4)
                ax.set(yscale="log", title=f"{method}, {name}")
                ax.set_yticks([1e-18, 1e-12, 1e-6, 1e0])
            axes[-1, col].set_xlabel("logit magnitude m  (logits (m, 0))")
        fig.supylabel(ylabel)
        marker_legend(fig, [
            ("error (colour: method)", {"marker": ".", "ls": ""}),
            (f"error below {ERROR_FLOOR:g} or exactly 0 (bottom band)", {"marker": "_", "ls": ""}),
            ("not finite: NaN or inf (top band)", {"marker": "x", "ls": ""}),
            (f"wrong: error > {tolerance:g}", {"ls": "--"}),
            ("first non-finite m, predicted", {"ls": ":", "color": "gray"}),
        ])
        fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def safe_zone_figure(magnitudes, curves, stats, windows):
    """Sweep 2's loss error in ulps: a panel per method (rows) and dtype (columns), one scale for
    all, with the largest |error| of each window drawn as a step line."""
    dtypes = list(curves)
    edges = window_edges(magnitudes)
    with plt.rc_context(FIGURE_STYLE):
        fig, axes = plt.subplots(
            len(METHODS), len(dtypes), figsize=(12, 13.5), sharex="col", sharey=True, squeeze=False
        )
        for col, name in enumerate(dtypes):
            for row, method in enumerate(METHODS):
                ax, s = axes[row, col], stats[name][method]
                ax.plot(magnitudes, curves[name][method]["ulp_error"], ".", ms=3,
                        color=COLORS[method], label="error")
                window_ulps = windows[name][method]["ulps"]
                largest = np.append(window_ulps, window_ulps[-1])
                for sign in (1, -1):
                    ax.step(edges, sign * largest, where="post", color="black", lw=1,
                            label="window max")
                ax.axhline(0, color="gray", lw=0.8)
                ax.set_title(f"{method}, {name}: mean {s['mean']:+.2f}, std {s['std']:.2f}")
            axes[-1, col].set_xlabel("logit magnitude m  (logits (m, 0))")
        fig.supylabel("loss - reference  (ulps of the reference)")
        marker_legend(fig, [
            ("error at one m (colour: method)", {"marker": ".", "ls": ""}),
            (f"+/- largest |error| in each window of {edges[1] - edges[0]:g}", {"lw": 1}),
        ])
        fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def save_figure(fig, path):
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_csv(path, magnitudes, curves):
    """One row per magnitude, one column per dtype/method/quantity."""
    columns = {"m": magnitudes}
    for name, per_method in curves.items():
        for method, quantities in per_method.items():
            columns.update({f"{name}/{method}/{q}": values for q, values in quantities.items()})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*(["%.6g" % v for v in values] for values in columns.values())))


def format_tables(summary):
    """The tables the run prints and the docs page shows, from summary.json's numbers alone."""
    args = summary["args"]

    def pair(p, fmt="{:+g}"):
        return " / ".join("-" if m is None else fmt.format(m) for m in p)

    step = (args["max_logit"] - args["min_logit"]) / (args["num_points"] - 1)
    sweep_1 = [
        "Sweep 1: first m at which each method breaks (negative side / positive side); "
        f"logits (m, 0), old logits {args['old_logit_ratio']:g} * (m, 0), "
        f"m from {args['min_logit']:g} to {args['max_logit']:g} by {step:g}"
    ]
    row = "{:<17}{:<9}{:<16}{:<17}{:<19}{:<7}{:<16}{}"
    sweep_1.append(row.format("method", "dtype", "loss wrong", "loss non-finite", "predicted",
                              "check", "grad wrong", "grad non-finite"))
    for name, per_method in summary["thresholds"].items():
        for method, t in per_method.items():
            sweep_1.append(row.format(method, name, pair(t["loss_wrong"]),
                                      pair(t["loss_nonfinite"]),
                                      pair(t["predicted"]["nonfinite"], "{:+.2f}"),
                                      "ok" if t["matches_prediction"] else "MISS",
                                      pair(t["grad_wrong"]), pair(t["grad_nonfinite"])))
    flushes = summary["exp_flushes_subnormals"]
    sweep_1.append("predicted: non-finite m from the float format alone; "
                   "exp flushes subnormals to zero here: "
                   + ", ".join(f"{name} {'yes' if f else 'no'}" for name, f in flushes.items()))

    ieee = ["direct-softmax once more in numpy, which keeps subnormals (IEEE gradual underflow), "
            "negative side"]
    row = "{:<9}{:<13}{:<12}{:<17}{:<11}{}"
    ieee.append(row.format("dtype", "ratio wrong", "loss wrong", "loss non-finite", "predicted",
                           "check"))
    for name, t in summary["ieee_subnormals"].items():
        ieee.append(row.format(name, pair(t["ratio_wrong"][:1]), pair(t["loss_wrong"][:1]),
                               pair(t["loss_nonfinite"][:1]),
                               pair(t["predicted"]["nonfinite"][:1], "{:+.2f}"),
                               "ok" if t["matches_prediction"] else "MISS"))

    largest = ["Sweep 1: largest error at any m where the result is finite "
               "(loss: relative; gradient: as plotted)"]
    row = "{:<17}{:>13}{:>13}{:>13}{:>13}"
    largest.append(row.format("method", "loss f32", "grad f32", "loss f64", "grad f64"))
    for method in summary["thresholds"]["float32"]:
        cells = [f"{summary['thresholds'][name][method]['largest_finite_error'][q]:.2g}"
                 for name in summary["thresholds"] for q in ("loss", "grad")]
        largest.append(row.format(method, *cells))

    safe = [f"Sweep 2: loss error in ulps of the reference, m from {-args['safe_logit']:g} to "
            f"{args['safe_logit']:g}, {args['num_points']} points"]
    row = "{:<17}{:<9}{:>7}{:>7}{:>10}{:>7}{:>7}{:>16}{:>16}{:>10}"
    safe.append(row.format("method", "dtype", "mean", "std", "max|err|", "> 0", "< 0",
                           "neighbour corr", "max |loss err|", "max grad"))
    for name, per_method in summary["safe_zone_ulp_error"].items():
        for method, s in per_method.items():
            safe.append(row.format(method, name, f"{s['mean']:+.2f}", f"{s['std']:.2f}",
                                   f"{s['max_abs']:.2f}", f"{s['share_positive']:.0%}",
                                   f"{s['share_negative']:.0%}",
                                   f"{s['neighbour_correlation']:.2f}",
                                   f"{s['max_abs_loss_error']:.2g}", f"{s['max_grad_error']:.2g}"))

    windows = summary["windows"]["sweep 2"]
    per_window_table = ["Sweep 2 per window of m: largest |error| in ulps / neighbour correlation"]
    row = "{:<9}{:<16}" + "{:>19}" * len(METHODS)
    per_window_table.append(row.format("dtype", "m", *windows["float32"]))
    for name in summary["safe_zone_ulp_error"]:
        for w, (low, high) in enumerate(zip(windows["edges"][:-1], windows["edges"][1:])):
            cells = [f"{s['ulps'][w]:.2f} / {s['ulps_neighbour_correlation'][w]:+.2f}"
                     for s in windows[name].values()]
            per_window_table.append(row.format(name, f"[{low:+g}, {high:+g})", *cells))

    not_worse = summary["log_space_paired_not_worse"]
    comparison = [f"log-space-paired against each other method: in how many of the {NUM_WINDOWS} "
                  "windows of m its largest error is no larger"]
    others = list(next(iter(next(iter(not_worse.values())).values())))
    row = "{:<9}{:<22}" + "{:>16}" * len(others)
    comparison.append(row.format("dtype", "error", *others))
    for name, per_error in not_worse.items():
        for error, counts in per_error.items():
            cells = (f"{counts[o]}/{NUM_WINDOWS}" for o in others)
            comparison.append(row.format(name, error, *cells))
    tables = (sweep_1, ieee, largest, safe, per_window_table, comparison)
    return ["\n".join(table) for table in tables]


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------
def check_args(args):
    """The first thing wrong with args as one line, or None. Runs before any work and any write."""
    if not -np.inf < args.min_logit < args.max_logit < np.inf:
        return (f"--min-logit ({args.min_logit:g}) must be below --max-logit ({args.max_logit:g}), "
                "both finite")
    if args.num_points < MIN_POINTS:
        return f"--num-points must be at least {MIN_POINTS} (4 per window), got {args.num_points}"
    must_be_positive = {
        "safe-logit": args.safe_logit,
        "old-logit-ratio": args.old_logit_ratio,
        "wrong-tolerance": args.wrong_tolerance,
    }
    for flag, value in must_be_positive.items():
        if not 0 < value < np.inf:
            return f"--{flag} must be positive and finite, got {value:g}"
    if not 0 < args.clip_coef < 1:
        return f"--clip-epsilon must be between 0 and 1, got {args.clip_coef:g}"
    existing = os.path.abspath(args.out_dir)
    # the nearest existing ancestor decides whether we can create it
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"--out-dir {args.out_dir}: {existing} is a file, not a directory"
    if not os.access(existing, os.W_OK):
        return f"--out-dir {args.out_dir}: {existing} is not writable"
    return None


def run_study(args):
    """Both sweeps in both dtypes; writes the figures, CSVs and summary.json, prints the tables."""
    magnitudes = np.linspace(args.min_logit, args.max_logit, args.num_points)
    # Equal point counts in both sweeps: same array shapes, so each method compiles once per dtype.
    safe_magnitudes = np.linspace(-args.safe_logit, args.safe_logit, args.num_points)
    large_curves, thresholds, ieee, flushes = {}, {}, {}, {}
    safe_curves, safe_stats, not_worse = {}, {}, {}
    windows = {"sweep 1": {"edges": window_edges(magnitudes).tolist()},
               "sweep 2": {"edges": window_edges(safe_magnitudes).tolist()}}
    for dtype in DTYPES:
        name = np.dtype(dtype).name
        flushes[name] = exp_flushes_subnormals(dtype)
        predicted = predicted_breaks(dtype, args.old_logit_ratio, flushes[name])
        large_curves[name], thresholds[name], windows["sweep 1"][name], ieee[name] = large_sweep(
            args, magnitudes, dtype, predicted
        )
        safe_curves[name], safe_stats[name], windows["sweep 2"][name] = safe_sweep(
            args, safe_magnitudes, dtype
        )
        not_worse[name] = {
            "sweep 1 loss": windows_not_worse(windows["sweep 1"][name], "loss"),
            "sweep 1 gradient": windows_not_worse(windows["sweep 1"][name], "grad"),
            "sweep 2 loss (ulps)": windows_not_worse(windows["sweep 2"][name], "ulps"),
            "sweep 2 gradient": windows_not_worse(windows["sweep 2"][name], "grad"),
        }

    def out(filename):
        return os.path.join(args.out_dir, filename)

    for filename, error_key, ylabel in [
        ("loss_sweep.png", "loss_rel_error", "relative error of the loss"),
        ("gradient_sweep.png", "grad_error", "gradient error / max(||ref||, ||A|| / batch)"),
    ]:
        fig = large_sweep_figure(magnitudes, large_curves, thresholds, error_key, ylabel,
                                 args.wrong_tolerance)
        save_figure(fig, out(filename))
    safe_figure = safe_zone_figure(safe_magnitudes, safe_curves, safe_stats, windows["sweep 2"])
    save_figure(safe_figure, out("safe_zone_ulps.png"))
    write_csv(out("sweep_large.csv"), magnitudes, large_curves)
    write_csv(out("sweep_safe.csv"), safe_magnitudes, safe_curves)
    summary = {"args": dataclasses.asdict(args), "exp_flushes_subnormals": flushes,
               "thresholds": thresholds, "ieee_subnormals": ieee, "safe_zone_ulp_error": safe_stats,
               "windows": windows, "log_space_paired_not_worse": not_worse}
    with open(out("summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("\n\n".join(format_tables(summary)))
    print("\nwrote loss_sweep.png, gradient_sweep.png, safe_zone_ulps.png, sweep_large.csv, "
          f"sweep_safe.csv, summary.json to {args.out_dir}")


def main():
    args = cli.parse_args(Args, check_args, __doc__.split("\n\n")[0])
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as error:
        print(f"error: --out-dir {args.out_dir}: {error.strerror}", file=sys.stderr)
        sys.exit(2)
    # float64 next to float32 for this run only; every array is cast explicitly
    with jax.enable_x64(True):
        run_study(args)


if __name__ == "__main__":
    main()

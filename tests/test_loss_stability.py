"""loss_stability.py: the four losses agree where they should and break where the float format says
they must; the log-space losses are rlax's; the reference is exact far beyond float64 and its
hand-derived gradient is autodiff's; the published conclusions hold; each figure draws each method
under its own name; the docs page shows the committed numbers; check_args names the flag at its
boundaries. The script run the way a user runs it: test_loss_stability_run.py."""

import csv
import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import matplotlib.colors
import matplotlib.text
import mpmath
import numpy as np
import pytest
import rlax

import loss_stability as ls

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE_DIR = os.path.join(REPO_ROOT, "docs", "figures", "loss_stability")
# The study puts float32 and float64 side by side (conftest.py's float64_available).
pytestmark = pytest.mark.usefixtures("float64_available")


def random_batch(seed, batch_size=64, num_actions=4):
    """Moderate logits, old logits far enough away that many ratios leave [0.8, 1.2], both
    advantage signs."""
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal((batch_size, num_actions))
    old_logits = logits + 0.5 * rng.standard_normal((batch_size, num_actions))
    return (logits, old_logits, rng.integers(0, num_actions, batch_size),
            rng.standard_normal(batch_size))


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-13)])
def test_methods_agree_with_reference_in_safe_zone(dtype, rtol):
    logits, old_logits = ls.sweep_inputs(np.linspace(-20, 20, 41), 0.99, dtype)
    reference, reference_grads, _ = ls.reference_sweep(logits, old_logits, 0.2)
    for method in ls.METHODS:
        losses, grads = map(np.asarray, ls.loss_and_grad_sweep(logits, old_logits, method, 0.2))
        assert losses.dtype == grads.dtype == dtype  # float32 really computed in float32
        np.testing.assert_allclose(losses, [float(r) for r in reference], rtol=rtol, err_msg=method)
        # Saturated gradients (1 - p cancels) are tiny and only absolutely right.
        np.testing.assert_allclose(grads, reference_grads, rtol=1e-3, atol=rtol, err_msg=method)


@pytest.mark.parametrize("dtype, inside, beyond",
                         [(np.float32, 80.0, 120.0), (np.float64, 700.0, 800.0)])
def test_direct_methods_break_beyond_underflow_while_log_space_holds(dtype, inside, beyond):
    magnitudes = np.array([-beyond, -inside, inside, beyond])
    logits, old_logits = ls.sweep_inputs(magnitudes, 0.99, dtype)
    reference, reference_grads, _ = ls.reference_sweep(logits, old_logits, 0.2)
    finite = {}
    for method in ls.METHODS:
        losses, grads = map(np.asarray, ls.loss_and_grad_sweep(logits, old_logits, method, 0.2))
        finite[method] = np.isfinite(losses).tolist()
        assert np.all(np.isfinite(grads[finite[method]])), method
    # underflow below; 1 / sum, then exp above
    assert finite["direct-naive"] == [False, True, True, False]
    # max subtracted: only underflow left
    assert finite["direct-softmax"] == [False, True, True, True]
    for method in ["log-space", "log-space-paired"]:
        assert finite[method] == [True, True, True, True]
        losses, grads = ls.loss_and_grad_sweep(logits, old_logits, method, 0.2)
        np.testing.assert_allclose(losses, [float(r) for r in reference],
                                   rtol=10 * np.finfo(dtype).eps)
        np.testing.assert_allclose(grads, reference_grads, rtol=1e-3, atol=10 * np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sweep_thresholds_agree_with_float_format(dtype):
    # Independently of the script's prediction: exp(x) is 0 below log(smallest), so the old
    # probability exp(0.99 m) / (exp(0.99 m) + 1) is 0 from m = log(smallest) / 0.99 on: p / 0 or
    # 0 / 0. The naive softmax multiplies by 1 / sum, which is 0 once sum > 1 / smallest, unless
    # exp(m) overflows first.
    flushes = ls.exp_flushes_subnormals(dtype)
    info = np.finfo(dtype)
    log_zero = math.log(info.tiny) if flushes else math.log(info.smallest_subnormal) - math.log(2)
    negative, positive = log_zero / 0.99, min(-log_zero / 0.99, math.log(info.max))
    # A coarse grid, refined to steps of 0.05 around both breaks.
    fine = [np.round(np.arange(-3, 3, 0.05) + round(x, 1), 2) for x in (negative, positive)]
    magnitudes = np.unique(np.concatenate([np.linspace(-1000, 1000, 201), *fine]))

    args = ls.Args()
    predicted = ls.predicted_breaks(dtype, args.old_logit_ratio, flushes)
    _, thresholds, _, ieee = ls.large_sweep(args, magnitudes, dtype, predicted)
    first_past = (magnitudes[magnitudes <= negative].max(),
                  magnitudes[magnitudes >= positive].min())
    assert thresholds["direct-naive"]["loss_nonfinite"] == first_past
    assert thresholds["direct-softmax"]["loss_nonfinite"] == (first_past[0], None)
    for method in ["log-space", "log-space-paired"]:
        for key in ["loss_nonfinite", "loss_wrong", "grad_nonfinite", "grad_wrong"]:
            assert thresholds[method][key] == (None, None), (method, key)
    assert all(t["matches_prediction"] for t in thresholds.values())
    if dtype is np.float32:  # far earlier than the post's float64 example at -750
        assert -95 < negative < -85 if flushes else -110 < negative < -100

    # numpy keeps subnormals: its exp is 0 only below log(smallest subnormal / 2), and the ratio
    # loses digits (subnormal p) before the loss turns NaN there.
    log_zero_ieee = math.log(info.smallest_subnormal) - math.log(2)
    assert ieee["loss_nonfinite"] == (magnitudes[magnitudes <= log_zero_ieee / 0.99].max(), None)
    assert ieee["matches_prediction"]
    assert (ieee["loss_nonfinite"][0] <= ieee["loss_wrong"][0] <= ieee["ratio_wrong"][0]
            < math.log(info.tiny))


def test_predicted_thresholds_with_gradual_underflow():
    # Where subnormals are kept (numpy, the post's plots), exp reaches 0 at log(2^-150) and
    # log(2^-1075).
    for dtype, log_zero in [(np.float32, -150 * math.log(2)), (np.float64, -1075 * math.log(2))]:
        predicted = ls.predicted_breaks(dtype, 0.99, flushes_subnormals=False)
        assert (predicted["direct-softmax"]["nonfinite"][0]
                == pytest.approx(log_zero / 0.99, rel=1e-12))
        log_overflow = math.log(np.finfo(dtype).max)
        assert predicted["direct-naive"]["nonfinite"][1] == pytest.approx(log_overflow, rel=1e-12)


def test_log_space_loss_is_rlax_clipped_surrogate():
    logits, old_logits, actions, advantages = random_batch(seed=0)

    def rlax_loss(logits):
        log_probs, old_log_probs = jax.nn.log_softmax(logits), jax.nn.log_softmax(old_logits)
        ratio = jnp.exp(ls.at_actions(log_probs, actions) - ls.at_actions(old_log_probs, actions))
        return rlax.clipped_surrogate_pg_loss(ratio, advantages, 0.2)

    ours, our_grad = jax.jit(jax.value_and_grad(ls.loss_log_space), static_argnums=4)(
        logits, old_logits, actions, advantages, 0.2
    )
    theirs, their_grad = jax.jit(jax.value_and_grad(rlax_loss))(logits)
    np.testing.assert_allclose(ours, theirs, rtol=1e-14)
    np.testing.assert_allclose(our_grad, their_grad, rtol=1e-12, atol=1e-15)


def test_log_space_paired_is_the_same_loss_and_gradient():
    # Same maths as log_softmax: on moderate random logits the two agree to float64 rounding.
    logits, old_logits, actions, advantages = random_batch(seed=2)

    def value_and_grad(loss):
        return jax.jit(jax.value_and_grad(loss), static_argnums=4)(
            logits, old_logits, actions, advantages, 0.2
        )

    ours, our_grad = value_and_grad(ls.loss_log_space_paired)
    theirs, their_grad = value_and_grad(ls.loss_log_space)
    np.testing.assert_allclose(ours, theirs, rtol=1e-14)
    np.testing.assert_allclose(our_grad, their_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_space_paired_with_tied_and_far_apart_logits(dtype):
    # Ties for the max (the argmax picks one), the action at, below and far below the max, 4
    # actions.
    logits = np.array([[2.0, 2.0, -1.0, 0.5], [0.0, 3.0, 3.0, -40.0], [-300.0, 5.0, 5.0, 5.0],
                       [7.0, -2.0, -2.0, 7.0]], dtype)
    old_logits = (logits + np.array([0.3, -0.2, 0.1, 0.0], dtype)).astype(dtype)
    actions, advantages = np.array([1, 3, 0, 2]), np.array([1.0, -0.5, 2.0, -1.0], dtype)
    clip_low, clip_high = (mpmath.mpf(float(dtype(1 + s * 0.2))) for s in (-1, 1))
    loss, grad, _ = ls.reference_loss_and_grad(logits, old_logits, actions, advantages, clip_low,
                                               clip_high)
    ours, our_grad = jax.jit(jax.value_and_grad(ls.loss_log_space_paired), static_argnums=4)(
        logits, old_logits, actions, advantages, 0.2
    )
    assert ours.dtype == our_grad.dtype == dtype
    np.testing.assert_allclose(ours, float(loss), rtol=4 * np.finfo(dtype).eps)
    np.testing.assert_allclose(our_grad, grad, rtol=1e-4, atol=4 * np.finfo(dtype).eps)


def test_reference_is_exact_far_beyond_float64():
    # An independent closed form at 100 digits: with logits (m, 0), p = e^m / (e^m + 1), so the
    # ratio of action 0 is e^(m - m') (1 + e^m') / (1 + e^m). A reference at float64's ~16 digits
    # fails here.
    magnitudes = np.array([-700.5, -15.25, -0.75, 0.0, 3.125, 19.5, 650.0])
    logits, old_logits = ls.sweep_inputs(magnitudes, 0.99, np.float64)
    reference, _, ratios = ls.reference_sweep(logits, old_logits, 0.2)
    with mpmath.workdps(100):
        for z, z_old, loss, ratio in zip(logits[:, 0, 0], old_logits[:, 0, 0], reference, ratios):
            z, z_old = mpmath.mpf(float(z)), mpmath.mpf(float(z_old))
            exact_ratio = mpmath.exp(z - z_old) * (1 + mpmath.exp(z_old)) / (1 + mpmath.exp(z))
            clipped = min(max(exact_ratio, mpmath.mpf(0.8)), mpmath.mpf(1.2))
            surrogate = [min(exact_ratio * a, clipped * a) for a in ls.ADVANTAGES]
            exact_loss = -(surrogate[0] + surrogate[1]) / 2
            assert all(abs(r / exact_ratio - 1) < mpmath.mpf("1e-40") for r in ratio)
            assert abs(loss / exact_loss - 1) < mpmath.mpf("1e-40")


def test_reference_gradient_is_autodiff_of_log_space_float64():
    logits, old_logits, actions, advantages = random_batch(seed=1)
    clip_low, clip_high = (mpmath.mpf(float(np.float64(1 + s * 0.2))) for s in (-1, 1))
    loss, grad, _ = ls.reference_loss_and_grad(logits, old_logits, actions, advantages, clip_low,
                                               clip_high)
    jax_loss, jax_grad = jax.jit(jax.value_and_grad(ls.loss_log_space), static_argnums=4)(
        logits, old_logits, actions, advantages, 0.2
    )
    np.testing.assert_allclose(float(loss), jax_loss, rtol=1e-13)
    np.testing.assert_allclose(grad, jax_grad, rtol=1e-10, atol=1e-15)
    clipped_rows = np.all(grad == 0, axis=-1)
    assert 0 < clipped_rows.sum() < len(grad)  # both branches of PPO's min are exercised


def test_relative_errors_floor_a_zero_reference_at_the_dtypes_smallest_normal():
    tiny32 = np.finfo(np.float32).tiny
    values = np.array([[2.0, np.nan], [tiny32, 0.0]], np.float32)
    reference = [[mpmath.mpf(1), mpmath.mpf(1)], [mpmath.mpf(0), mpmath.mpf(0)]]
    errors = ls.relative_errors(values, reference, np.float32)
    assert errors.shape == (2, 2) and errors[0, 0] == 1.0 and errors[0, 1] == np.inf
    # |tiny - 0| / tiny: the float32 floor, not float64's
    assert errors[1, 0] == 1.0 and errors[1, 1] == 0.0


def test_ulp_stats_tell_systematic_from_noisy():
    systematic = ls.ulp_error_stats(np.full(100, 2.0) + np.linspace(0, 0.1, 100))
    noisy = ls.ulp_error_stats(np.tile([1.0, -1.0], 50))
    assert systematic["mean"] > 1 and systematic["share_positive"] == 1
    assert systematic["neighbour_correlation"] > 0.9
    assert (noisy["mean"] == 0 and noisy["share_positive"] == 0.5
            and noisy["neighbour_correlation"] < -0.9)


def test_windows_split_the_sweep_evenly_and_compare_maxima():
    # 16 windows of width 1, two points each, 8.0 in the last
    magnitudes = np.linspace(-8.0, 8.0, 33)
    assert np.array_equal(ls.window_edges(magnitudes), np.arange(-8.0, 9.0))
    largest = ls.per_window(magnitudes, magnitudes, np.max)
    assert largest == [-7.5 + w for w in range(15)] + [8.0]
    errors = np.abs(np.sin(magnitudes))
    errors_of = {method: errors for method in ls.METHODS}
    # better in two windows only
    errors_of["log-space"] = np.where(magnitudes < -6, errors / 2, errors)
    # |error| counts; inf: None
    errors_of["direct-naive"] = np.where(magnitudes >= 6, np.inf, -2 * errors)
    windows = {method: {"e": ls.window_maxima(magnitudes, e)} for method, e in errors_of.items()}
    assert (windows["direct-naive"]["e"][-2:] == [None, None]
            and None not in windows["log-space"]["e"])
    assert ls.windows_not_worse(windows, "e") == {"direct-naive": 16, "direct-softmax": 16,
                                                  "log-space": 14}


def test_published_safe_zone_conclusions_hold_on_a_coarse_sweep():
    # What the docs page concludes from sweep 2, on 401 points: no method is biased; log space is
    # the noisiest (cancellation); log-space-paired is the least noisy and never worse than log
    # space.
    args = ls.Args(num_points=401)
    magnitudes = np.linspace(-args.safe_logit, args.safe_logit, args.num_points)
    for dtype in ls.DTYPES:
        _, stats, windows = ls.safe_sweep(args, magnitudes, dtype)
        std = {method: s["std"] for method, s in stats.items()}
        assert all(abs(s["mean"]) < 0.3 for s in stats.values()), stats
        assert std["log-space"] > 2.5 * max(std["direct-naive"], std["direct-softmax"]), std
        assert std["log-space-paired"] < 0.5 * min(std["direct-naive"], std["direct-softmax"]), std
        assert stats["log-space-paired"]["max_abs"] < 2, stats
        paired, log_space = windows["log-space-paired"]["ulps"], windows["log-space"]["ulps"]
        assert all(p <= s for p, s in zip(paired, log_space))


def synthetic_curves(magnitudes, key, names=("float32", "float64")):
    """Per dtype and method an error curve no other has (a distinct level), with exact zeros, infs,
    an error right at the floor and one below it."""
    curves = {}
    for d, name in enumerate(names):
        curves[name] = {}
        for i, method in enumerate(ls.METHODS):
            errors = np.full(len(magnitudes), 10.0 ** -(3 + 4 * i + d))
            errors[i::7], errors[(i + 3)::11] = 0.0, np.inf
            errors[5], errors[6] = ls.ERROR_FLOOR, 1e-30

            curves[name][method] = {key: errors}
    return curves


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def assert_readable(fig):
    # 12 pt, not just 10: the PNGs are 1200 px wide and the docs page shows them scaled down.
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
    small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < 12]
    assert not small, small


def axes_fraction(ax, y):
    """Where the error value y sits on the panel's height, 0 at the bottom and 1 at the top."""
    return ax.transAxes.inverted().transform(ax.transData.transform((0, y)))[1]


def test_sweep_figure_draws_each_method_in_its_own_panel():
    magnitudes = np.linspace(-100, 100, 101)
    curves = synthetic_curves(magnitudes, "loss_rel_error")
    predicted_breaks = ls.predicted_breaks(np.float32, 0.99, True)
    thresholds = {name: {m: {"predicted": p} for m, p in predicted_breaks.items()}
                  for name in curves}
    fig = ls.large_sweep_figure(magnitudes, curves, thresholds, "loss_rel_error", "error", 1e-3)
    assert len(fig.axes) == 2 * len(ls.METHODS)
    legend = dict(zip(["error", "error below floor", "not finite", "wrong", "predicted"],
                      fig.legends[0].legend_handles))
    for ax in fig.axes:
        method, name = ax.get_title().split(", ")
        errors, lines = curves[name][method]["loss_rel_error"], lines_by_label(ax)
        shown = np.isfinite(errors) & (errors >= ls.ERROR_FLOOR)
        np.testing.assert_array_equal(lines["error"].get_xdata(), magnitudes[shown])
        np.testing.assert_array_equal(lines["error"].get_ydata(), errors[shown])
        np.testing.assert_array_equal(lines["not finite"].get_xdata(), magnitudes[np.isinf(errors)])
        np.testing.assert_array_equal(lines["error below floor"].get_xdata(),
                                      magnitudes[errors < ls.ERROR_FLOOR])
        assert ({line.get_color() for line in lines.values() if line.get_label()[0] != "_"}
                == {ls.COLORS[method]})
        for label in ["error", "error below floor", "not finite"]:  # drawn as the legend says
            assert lines[label].get_marker() == legend[label].get_marker(), label
            assert lines[label].get_linestyle() == legend[label].get_linestyle() == "None", label
        # Non-finite and tiny errors sit inside grey bands across the panel (axes fractions), clear
        # of every error value from the floor up to 1.
        bottom, top = sorted(ax.patches, key=lambda p: p.get_y())
        assert all(p.get_data_transform() is ax.transAxes and (p.get_x(), p.get_width()) == (0, 1)
                   for p in (bottom, top))
        assert bottom.get_y() == 0 and bottom.get_height() < axes_fraction(ax, ls.ERROR_FLOOR)
        assert top.get_y() > axes_fraction(ax, 1.0) and top.get_y() + top.get_height() == 1
        for label, band in [("not finite", top), ("error below floor", bottom)]:
            assert lines[label].get_transform() is ax.get_xaxis_transform()
            y = lines[label].get_ydata()
            assert np.all((band.get_y() < y) & (y < band.get_y() + band.get_height())), label
        assert (ax.get_yscale() == "log" and ax.get_ylim()[0] < ls.ERROR_FLOOR
                and ax.get_ylim()[1] > 1)
        guides = [line for line in ax.get_lines() if line.get_label()[0] == "_"]
        for label, style in [("wrong", "--"), ("predicted", ":")]:
            for guide in [g for g in guides if g.get_linestyle() == style]:
                assert guide.get_linestyle() == legend[label].get_linestyle()
                assert matplotlib.colors.same_color(guide.get_color(),
                                                    legend[label].get_color()), label
        assert [tuple(g.get_ydata()) for g in guides if g.get_linestyle() == "--"] == [(1e-3, 1e-3)]
        predicted = [m for m in thresholds[name][method]["predicted"]["nonfinite"] if m is not None]
        assert [g.get_xdata()[0] for g in guides if g.get_linestyle() == ":"] == predicted
    legend_text = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    for meaning in ["not finite", "exactly 0", "wrong: error > 0.001", "predicted",
                    f"{ls.ERROR_FLOOR:g}"]:
        assert meaning in legend_text
    assert fig.get_supylabel() == "error" and "logit magnitude m" in fig.axes[-1].get_xlabel()
    assert_readable(fig)
    ls.plt.close(fig)
    one_dtype = {"float64": curves["float64"]}
    fig = ls.large_sweep_figure(magnitudes, one_dtype, thresholds, "loss_rel_error", "error", 1e-3)
    assert [ax.get_title() for ax in fig.axes] == [f"{m}, float64" for m in ls.METHODS]
    ls.plt.close(fig)


def test_safe_zone_figure_draws_each_method_in_its_own_panel():
    magnitudes = np.linspace(-20, 20, 161)
    curves = {name: {m: {"ulp_error": (i + 1) * np.sin(magnitudes + d)}
                     for i, m in enumerate(ls.METHODS)}
              for d, name in enumerate(["float32", "float64"])}
    stats = {name: {m: ls.ulp_error_stats(c["ulp_error"]) for m, c in per.items()}
             for name, per in curves.items()}
    windows = {name: {m: {"ulps": ls.window_maxima(magnitudes, c["ulp_error"])}
                      for m, c in per.items()} for name, per in curves.items()}
    fig = ls.safe_zone_figure(magnitudes, curves, stats, windows)
    assert len(fig.axes) == 2 * len(ls.METHODS)
    dot, step_line = fig.legends[0].legend_handles
    for ax in fig.axes:
        method, rest = ax.get_title().split(", ", 1)
        name = rest.split(":")[0]
        assert f"std {stats[name][method]['std']:.2f}" in rest
        line = lines_by_label(ax)["error"]
        np.testing.assert_array_equal(line.get_xdata(), magnitudes)
        np.testing.assert_array_equal(line.get_ydata(), curves[name][method]["ulp_error"])
        # one scale for all panels, as the page says
        assert ax.get_ylim() == fig.axes[0].get_ylim()
        guides = [g for g in ax.get_lines() if g.get_label()[0] == "_"]
        assert [tuple(g.get_ydata()) for g in guides] == [(0, 0)]
        assert line.get_color() == ls.COLORS[method]
        assert (line.get_marker() == dot.get_marker()
                and line.get_linestyle() == dot.get_linestyle() == "None")
        # +/- the largest |error|
        steps = [drawn for drawn in ax.get_lines() if drawn.get_label() == "window max"]
        assert len(steps) == 2 and all(
            matplotlib.colors.same_color(s.get_color(), step_line.get_color())
            and s.get_linestyle() == step_line.get_linestyle() for s in steps)
        for step, sign in zip(steps, (1, -1)):
            assert step.get_drawstyle() == "steps-post"  # each window's value from its left edge on
            np.testing.assert_array_equal(step.get_xdata(), ls.window_edges(magnitudes))
            ulps = sign * np.array(windows[name][method]["ulps"])
            # the last edge too
            np.testing.assert_array_equal(step.get_ydata(), np.append(ulps, ulps[-1]))
    assert "ulps" in fig.get_supylabel() and "logit magnitude m" in fig.axes[-1].get_xlabel()
    assert "window of 2.5" in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert_readable(fig)
    ls.plt.close(fig)
    fig = ls.safe_zone_figure(magnitudes, {"float32": curves["float32"]}, stats, windows)
    assert ([ax.get_title().split(":")[0] for ax in fig.axes]
            == [f"{m}, float32" for m in ls.METHODS])

    ls.plt.close(fig)


def prose(x, fmt="g"):
    """A number as the page's prose writes it: Unicode minus, no zero-padded exponent."""
    return format(x, fmt).replace("e-0", "e-").replace("e+0", "e+").replace("-", "\u2212")


def page_numbers(summary, large_rows):
    """Every number the page's prose quotes, from the committed summary.json and sweep_large.csv."""
    thresholds, ieee = summary["thresholds"], summary["ieee_subnormals"]
    safe = summary["safe_zone_ulp_error"]
    windows_1, windows_2 = summary["windows"]["sweep 1"], summary["windows"]["sweep 2"]
    soft32, soft64 = (thresholds["float32"]["direct-softmax"],
                      thresholds["float64"]["direct-softmax"])
    naive32, naive64 = thresholds["float32"]["direct-naive"], thresholds["float64"]["direct-naive"]

    def largest(name, method, q):
        return prose(thresholds[name][method]["largest_finite_error"][q], ".2g")

    direct = [safe[name][m] for name in safe for m in ("direct-naive", "direct-softmax")]
    log_space = [safe[name]["log-space"] for name in safe]
    paired = [safe[name]["log-space-paired"] for name in safe]

    def span(stats, key, fmt):
        return " to ".join(prose(f(s[key] for s in stats), fmt) for f in (min, max))

    def both(stats, key, fmt):
        return " and ".join(prose(s[key], fmt) for s in stats)

    def signs(s):
        return f"{s['share_positive']:.0%} / {s['share_negative']:.0%}".replace("%", "") + " %"

    def csv_at(m, column):
        return large_rows[m][column]

    widest_direct = [max(safe[name][m]["std"] for m in ("direct-naive", "direct-softmax"))
                     for name in safe]
    # windows from m = 12.5 on where a float32 error is smooth (correlation > 0.5)
    smooth_above_12 = [c for per in windows_2["float32"].values()
                       for c in per["ulps_neighbour_correlation"][13:] if c > 0.5]
    return {
        "WRONG_FROM_32": " / ".join(prose(m, "+.2f") for m in naive32["predicted"]["wrong_from"]),
        "WRONG_FROM_64": " / ".join(prose(m, "+.2f") for m in naive64["predicted"]["wrong_from"]),
        "NORMAL_32": prose(naive32["predicted"]["wrong_from"][1], ".2f"),
        "OVERFLOW_64": prose(naive64["predicted"]["nonfinite"][1], ".2f"),
        "IEEE_RATIO_32": prose(ieee["float32"]["ratio_wrong"][0]),
        "IEEE_RATIO_64": prose(ieee["float64"]["ratio_wrong"][0]),
        "IEEE_LOSS_32": prose(ieee["float32"]["loss_wrong"][0]),
        "IEEE_NAN_32": prose(ieee["float32"]["loss_nonfinite"][0]),
        "IEEE_NAN_64": prose(ieee["float64"]["loss_nonfinite"][0]),
        "T32_WRONG": prose(soft32["loss_wrong"][0]), "T32_NAN": prose(soft32["loss_nonfinite"][0]),
        "T64_NAN": prose(soft64["loss_nonfinite"][0]),
        "N32_WRONG_POS": prose(naive32["loss_wrong"][1], "+g"),
        "N32_NAN_POS": prose(naive32["loss_nonfinite"][1], "+g"),
        "N64_WRONG_POS": prose(naive64["loss_wrong"][1], "+g"),
        "N64_NAN_POS": prose(naive64["loss_nonfinite"][1], "+g"),
        "G32_WRONG": prose(soft32["grad_wrong"][0]), "G32_NAN": prose(soft32["grad_nonfinite"][0]),
        "G64_NAN": prose(soft64["grad_nonfinite"][0]),
        "NG32_WRONG_POS": prose(naive32["grad_wrong"][1], "+g"),
        "NG64_WRONG_POS": prose(naive64["grad_wrong"][1], "+g"),
        "LOSS_88": csv_at(-88, "float32/direct-softmax/loss"),
        "REF_88": csv_at(-88, "float32/reference/loss"),
        "ERR_88": prose(float(csv_at(-88, "float32/direct-softmax/loss_rel_error")), ".2g"),
        "LOSS_709": csv_at(-709, "float64/direct-softmax/loss"),
        "REF_709": csv_at(-709, "float64/reference/loss"),
        "ERR_709": prose(float(csv_at(-709, "float64/direct-softmax/loss_rel_error")), ".1e"),
        "GERR_88": prose(float(csv_at(-88, "float32/direct-softmax/grad_error")), ".2g"),
        "GERR_709": prose(float(csv_at(-709, "float64/direct-softmax/grad_error")), ".1e"),
        "GERR_44": prose(float(csv_at(44, "float32/direct-naive/grad_error")), ".3g"),
        "GERR_354": prose(float(csv_at(354, "float64/direct-naive/grad_error")), ".3g"),
        "D_MEAN": span(direct, "mean", "+.2f").replace(" to ", " and "),
        "D_STD": span(direct, "std", ".2f"),
        "D_MAX": span(direct, "max_abs", ".2f"),
        "D_CORR": span(direct, "neighbour_correlation", ".2f"),
        "L_MEAN": both(log_space, "mean", "+.2f"), "L_STD": both(log_space, "std", ".2f"),
        "L_MAX": both(log_space, "max_abs", ".2f"),
        "F32_LOG_MAX": prose(log_space[0]["max_abs"], ".2f"),
        "L_SIGNS_32": signs(log_space[0]), "L_SIGNS_64": signs(log_space[1]),
        "L_WIDER": " to ".join(f"{s['std'] / direct_std:.0f}"
                               for s, direct_std in zip(log_space, widest_direct)),
        "SMOOTH_POS": f"{min(smooth_above_12):.2f} to {max(smooth_above_12):.2f}",
        "P_STD": both(paired, "std", ".2f"), "P_MAX": both(paired, "max_abs", ".2f"),
        "P_NARROWER": " and ".join(f"{s['std'] / p['std']:.0f}" for s, p in zip(log_space, paired)),
        "F64_LOG_W7": prose(windows_2["float64"]["log-space"]["ulps"][7], ".2f"),
        "F64_LOG_W0": prose(windows_2["float64"]["log-space"]["ulps"][0], ".2f"),
        **{f"F32_LOG_W{w}": prose(windows_2["float32"]["log-space"]["ulps"][w], ".2f")
           for w in (0, 1, 2, 4)},
        "F32_LOG_C2": prose(
            windows_2["float32"]["log-space"]["ulps_neighbour_correlation"][2], ".2f"),
        "F32_NAIVE_C1": prose(
            windows_2["float32"]["direct-naive"]["ulps_neighbour_correlation"][1], ".2f"),
        "F32_SOFT_C1": prose(
            windows_2["float32"]["direct-softmax"]["ulps_neighbour_correlation"][1], ".2f"),
        "F32_NAIVE_W1": prose(windows_2["float32"]["direct-naive"]["ulps"][1], ".2f"),
        "F32_ABS_SPAN": span(list(safe["float32"].values()), "max_abs_loss_error", ".2g"),
        "F64_LOG_ABS": prose(safe["float64"]["log-space"]["max_abs_loss_error"], ".2g"),
        "F64_NAIVE_ABS": prose(safe["float64"]["direct-naive"]["max_abs_loss_error"], ".2g"),
        "F64_SOFT_ABS": prose(safe["float64"]["direct-softmax"]["max_abs_loss_error"], ".2g"),
        "R_LOG": f"{round(6e-14 / safe['float64']['log-space']['max_abs_loss_error'], -1):.0f}",
        "R_DIRECT":
            f"{round(6e-14 / safe['float64']['direct-naive']['max_abs_loss_error'], -2):.0f}",

        **{f"{p}_LOSS_{n[-2:]}": largest(n, m, "loss")
           for p, m in (("P", "log-space-paired"), ("L", "log-space"))
           for n in ("float32", "float64")},
        **{f"{p}_G8_{n[-2:]}": prose(windows_2[n][m]["grad"][8], ".2g")
           for p, m in (("P", "log-space-paired"), ("L", "log-space"))
           for n in ("float32", "float64")},

        "S_W6_64": prose(windows_1["float64"]["direct-softmax"]["loss"][6], ".2g"),
        "P_W6_64": prose(windows_1["float64"]["log-space-paired"]["loss"][6], ".2g"),
        "S_G10_64": prose(windows_1["float64"]["direct-softmax"]["grad"][10], ".2g"),
        "P_G10_64": prose(windows_1["float64"]["log-space-paired"]["grad"][10], ".2g"),
    }


def large_csv_rows(path):
    """sweep_large.csv as {m: {column: the CSV's text}}: the page quotes values as written there."""
    with open(path) as f:
        return {float(row["m"]): row for row in csv.DictReader(f)}


def test_tables_show_a_missed_prediction():
    # On another backend the check can fail; the tables must say so rather than print "ok".
    with open(os.path.join(FIGURE_DIR, "summary.json")) as f:
        summary = json.load(f)
    summary["thresholds"]["float32"]["direct-naive"]["matches_prediction"] = False
    summary["ieee_subnormals"]["float64"]["matches_prediction"] = False
    summary["exp_flushes_subnormals"]["float64"] = False
    sweep_1, ieee = ls.format_tables(summary)[:2]
    rows = {tuple(line.split()[:2]): line.split() for line in sweep_1.splitlines()[2:]}
    assert ("MISS" in rows[("direct-naive", "float32")]
            and "ok" in rows[("direct-softmax", "float32")])
    ieee_rows = {line.split()[0]: line.split() for line in ieee.splitlines()[2:]}
    assert ieee_rows["float64"][-1] == "MISS" and ieee_rows["float32"][-1] == "ok"
    assert sweep_1.endswith("float32 yes, float64 no")


def test_docs_page_shows_the_committed_summary():
    # The tables on the page are what format_tables makes of the committed summary.json, character
    # for character, and every number in the prose is the committed one, so a rerun that changes a
    # number fails here until the page shows the new one.
    with open(os.path.join(FIGURE_DIR, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(REPO_ROOT, "docs", "loss_stability.md")) as f:
        page = f.read()
    assert set(summary["thresholds"]["float32"]) == set(ls.METHODS)
    assert summary["args"] == {**dataclasses.asdict(ls.Args()),
                               "out_dir": "docs/figures/loss_stability"}
    for table in ls.format_tables(summary):
        assert table in page, table.splitlines()[0]
    numbers = page_numbers(summary, large_csv_rows(os.path.join(FIGURE_DIR, "sweep_large.csv")))
    for name, number in numbers.items():
        assert number in page, (name, number)
    # Claims the prose makes in words: all four gradients in [0, 2.5) under 1.3 eps; no smooth
    # float64 window.
    windows = summary["windows"]["sweep 2"]
    for name, eps in [("float32", np.finfo(np.float32).eps), ("float64", np.finfo(np.float64).eps)]:
        assert all(windows[name][m]["grad"][8] < 1.3 * eps
                   for m in ("log-space", "log-space-paired"))
        # where direct-softmax beats the paired form
        sweep_1 = summary["windows"]["sweep 1"]["float64"]
        assert max(sweep_1["log-space-paired"]["loss"][6],
                   sweep_1["log-space-paired"]["grad"][10]) < eps

    assert max(max(w["ulps_neighbour_correlation"]) for w in windows["float64"].values()) < 0.3


def test_check_args_names_the_flag_at_the_boundaries():
    for good in [ls.Args(out_dir="runs/does/not/exist/yet"), ls.Args(num_points=ls.MIN_POINTS),
                 ls.Args(min_logit=-1e300, max_logit=-1e299), ls.Args(clip_coef=0.999)]:
        assert ls.check_args(good) is None, good
    for bad, flag in [
        (ls.Args(min_logit=1.0, max_logit=-1.0), "--min-logit"),
        (ls.Args(min_logit=5.0, max_logit=5.0), "--min-logit"),
        (ls.Args(min_logit=-np.inf), "--min-logit"),
        (ls.Args(max_logit=np.inf), "--min-logit"),
        (ls.Args(num_points=ls.MIN_POINTS - 1), "--num-points"),
        (ls.Args(safe_logit=0.0), "--safe-logit"),
        (ls.Args(safe_logit=np.inf), "--safe-logit"),
        (ls.Args(old_logit_ratio=-1.0), "--old-logit-ratio"),
        (ls.Args(wrong_tolerance=0.0), "--wrong-tolerance"),
        (ls.Args(clip_coef=0.0), "--clip-epsilon"),
        (ls.Args(clip_coef=1.0), "--clip-epsilon"),
    ]:
        problem = ls.check_args(bad)
        assert problem and "\n" not in problem and problem.startswith(flag + " "), (bad, problem)

"""Statistics for comparing training settings over seeds, after Agarwal et al. 2021, "Deep RL at the
Edge of the Statistical Precipice" (arXiv:2108.13264): interquartile means, percentile-bootstrap
confidence intervals and the probability of improvement.

With one task (Breakout), their stratified bootstrap is the plain bootstrap over seeds. The
resampling is scipy.stats.bootstrap's (rliable 1.2.0 does not import with the pinned pandas and
arch); every interval uses a fixed generator, so the same JSON always gives the same digits.
"""

import numpy as np
import scipy.stats

CONFIDENCE = 0.95
N_RESAMPLES = 9999  # scipy's default
FIRST_WALL = 30.0  # Breakout-MinAtar's first wall holds 30 bricks: a return >= 30 got past it


def iqm(x, axis=-1):
    """Interquartile mean: the mean of the middle 50% of the values (25% trimmed from each end)."""
    return scipy.stats.trim_mean(x, 0.25, axis=axis)


def mean(x, axis=-1):
    return np.mean(x, axis=axis)


def _interval(result) -> list[float]:
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def bootstrap_ci(x, statistic, n_resamples: int = N_RESAMPLES, seed: int = 0) -> np.ndarray:
    """95% percentile-bootstrap interval of `statistic` over the last axis of `x` (seeds), as
    [low, high] along a new last axis. Percentile, as Agarwal et al. use; it stays defined when
    every value is equal, where BCa is not. One seed has no interval: [nan, nan]."""
    if np.shape(x)[-1] < 2:  # scipy refuses to resample a single value
        return np.full((*np.shape(x)[:-1], 2), np.nan)
    result = scipy.stats.bootstrap((np.asarray(x, float),), statistic, axis=-1, method="percentile",
                                   confidence_level=CONFIDENCE, n_resamples=n_resamples,
                                   rng=np.random.default_rng(seed))
    return np.stack([result.confidence_interval.low, result.confidence_interval.high], axis=-1)


def pooled_curve(return_sums, episodes, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """The learning curve pooled over seeds, with a 95% band from resampling seeds.

    return_sums and episodes are (seeds, points): the summed returns and the count of the training
    episodes that ended in each stretch of training. A point is sum(returns) / sum(episodes) over
    the seeds; the band resamples whole seeds, each seed's sums and count together.
    """
    return_sums = np.asarray(return_sums, float).T  # (points, seeds)
    episodes = np.asarray(episodes, float).T

    def ratio(r, e, axis=-1):
        total = e.sum(axis=axis)
        return np.where(total > 0, r.sum(axis=axis) / np.maximum(total, 1), np.nan)

    if return_sums.shape[-1] < 2:  # one seed: no band
        return {"return": ratio(return_sums, episodes).tolist(), "low": None, "high": None}
    result = scipy.stats.bootstrap((return_sums, episodes), ratio, paired=True, axis=-1,
                                   method="percentile", confidence_level=CONFIDENCE,
                                   n_resamples=n_resamples, rng=np.random.default_rng(seed))
    return {"return": ratio(return_sums, episodes).tolist(),
            "low": np.asarray(result.confidence_interval.low).tolist(),
            "high": np.asarray(result.confidence_interval.high).tolist()}


def share_past_wall(returns, wall: float = FIRST_WALL) -> dict:
    """The share of seeds whose return reached `wall`, with a 95% Wilson interval."""
    returns = np.asarray(returns, float)
    count = int((returns >= wall).sum())
    ci = scipy.stats.binomtest(count, returns.size).proportion_ci(CONFIDENCE, method="wilson")
    return {"wall": wall, "count": count, "of": int(returns.size), "value": count / returns.size,
            "ci": [float(ci.low), float(ci.high)]}


def summarize(returns, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Mean and IQM of per-seed returns, each with its 95% bootstrap interval, and the share of
    seeds past the first wall."""
    returns = np.asarray(returns, float)
    one = returns.size < 2  # one seed: no interval (None)
    return {
        "seeds": int(returns.size),
        "mean": {"value": float(mean(returns)),
                 "ci": None if one else bootstrap_ci(returns, mean, n_resamples, seed).tolist()},
        "iqm": {"value": float(iqm(returns)),
                "ci": None if one else bootstrap_ci(returns, iqm, n_resamples, seed).tolist()},
        "share_past_wall": share_past_wall(returns),
        "min": float(returns.min()), "max": float(returns.max()),
    }


def probability_of_improvement(x, y, axis=-1):
    """P(X > Y) + P(X = Y) / 2 for a run X of one setting and a run Y of the other (Agarwal et al.),
    over all pairs of runs: the Mann-Whitney U statistic over n * m."""
    x, y = np.asarray(x), np.asarray(y)
    # method="asymptotic": only U is used; the exact p-value would cost a distribution per resample
    u = scipy.stats.mannwhitneyu(x, y, axis=axis, method="asymptotic").statistic
    return u / (x.shape[axis] * y.shape[axis])


def compare(baseline, candidate, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Candidate against baseline, trained on the same seeds in the same order.

    The differences (candidate - baseline) of the mean and of the IQM get paired-bootstrap
    intervals: a resample draws seeds, and both settings' returns of each drawn seed. The
    probability of improvement, P(candidate run > baseline run), resamples each setting's seeds on
    their own, as Agarwal et al. do. One seed: the values, no intervals (None).
    """
    baseline, candidate = np.asarray(baseline, float), np.asarray(candidate, float)
    if baseline.shape != candidate.shape:
        raise ValueError(f"the settings must share their seeds; got {baseline.size} and "
                         f"{candidate.size} returns")

    one = baseline.size < 2

    def paired(statistic):
        def difference(b, c, axis=-1):
            return statistic(c, axis=axis) - statistic(b, axis=axis)
        if one:
            return {"value": float(difference(baseline, candidate)), "ci": None}
        result = scipy.stats.bootstrap((baseline, candidate), difference, paired=True,
                                       method="percentile", confidence_level=CONFIDENCE,
                                       n_resamples=n_resamples, rng=np.random.default_rng(seed))
        return {"value": float(difference(baseline, candidate)), "ci": _interval(result)}

    poi = None if one else _interval(scipy.stats.bootstrap(
        (candidate, baseline), probability_of_improvement, method="percentile",
        confidence_level=CONFIDENCE, n_resamples=n_resamples, rng=np.random.default_rng(seed)))
    return {
        "seeds": int(baseline.size),
        "mean_difference": paired(mean),
        "iqm_difference": paired(iqm),
        "probability_of_improvement": {
            "value": float(probability_of_improvement(candidate, baseline)),
            "ci": poi,
        },
    }

"""Tests of tools/stats.py: intervals that cover what they claim to, paired comparisons, the
share past the wall and the pooled curve."""

import numpy as np
import pytest

from tools import stats


@pytest.mark.parametrize("statistic", [stats.mean, stats.iqm])
def test_bootstrap_interval_covers_the_truth_about_95_percent_of_draws_and_narrows_with_seeds(
    statistic,
):
    rng = np.random.default_rng(0)
    # 1000 draws of 40 seeds from a normal distribution, whose mean and IQM are both 35.
    low, high = stats.bootstrap_ci(rng.normal(35, 10, (1000, 40)), statistic, n_resamples=2000).T
    assert 0.92 <= ((low <= 35) & (35 <= high)).mean() <= 0.975
    widths = [np.diff(stats.bootstrap_ci(rng.normal(35, 10, (300, n)), statistic,
                                         n_resamples=2000)).mean()
              for n in (10, 40)]
    assert 0.4 <= widths[1] / widths[0] <= 0.6  # the 1/sqrt(n) of a standard error


def test_identical_settings_give_a_probability_of_improvement_near_half():
    rng = np.random.default_rng(1)
    draws = [stats.compare(rng.normal(35, 10, 40), rng.normal(35, 10, 40), n_resamples=1000)
             for _ in range(100)]
    values = np.array([d["probability_of_improvement"]["value"] for d in draws])
    assert abs(values.mean() - 0.5) < 0.02
    intervals = [d["probability_of_improvement"]["ci"] for d in draws]
    covered = [ci[0] <= 0.5 <= ci[1] for ci in intervals]
    assert np.mean(covered) >= 0.9

    returns = rng.normal(35, 10, 16)
    same = stats.compare(returns, returns)
    assert same["probability_of_improvement"]["value"] == 0.5
    assert same["mean_difference"] == same["iqm_difference"] == {"value": 0.0, "ci": [0.0, 0.0]}


def test_comparison_pairs_seeds_and_counts_every_pair_of_runs():
    baseline = np.array([20.0, 25.0, 30.0, 60.0])
    # Every seed 5 better: the paired interval is exactly 5.
    shifted = stats.compare(baseline, baseline + 5)
    assert (shifted["mean_difference"] == shifted["iqm_difference"]
            == {"value": 5.0, "ci": [5.0, 5.0]})
    # Of the 16 pairs (candidate run, baseline run) the candidate wins 10 and ties 2:
    # (10 + 2 / 2) / 16.
    assert shifted["probability_of_improvement"]["value"] == pytest.approx(11 / 16)
    with pytest.raises(ValueError):
        stats.compare(baseline, baseline[:3])


def test_share_past_the_wall_and_the_pooled_curve():
    share = stats.share_past_wall([29.9, 30.0, 45.0, 12.0])
    assert (share["count"], share["of"], share["value"]) == (2, 4, 0.5)
    assert share["ci"][0] < 0.5 < share["ci"][1]
    return_sums = np.array([[10.0, 40.0], [60.0, 80.0]])  # 2 seeds x 2 points
    episodes = np.array([[1, 2], [3, 6]])
    curve = stats.pooled_curve(return_sums, episodes, n_resamples=500)
    # pooled episodes, not a mean of ratios
    np.testing.assert_allclose(curve["return"], [70 / 4, 120 / 8])

    assert all(lo <= r <= hi for lo, r, hi in zip(curve["low"], curve["return"], curve["high"]))


def test_one_seed_has_no_interval_but_its_values():
    # scipy's bootstrap refuses one value; a one-seed result (the harness's --num-seeds 1, a first
    # 10M run) keeps its mean and IQM and has no interval.
    summary = stats.summarize([42.0])
    assert summary["mean"] == summary["iqm"] == {"value": 42.0, "ci": None}
    curve = stats.pooled_curve(np.array([[10.0, 40.0]]), np.array([[1, 2]]))
    assert curve == {"return": [10.0, 20.0], "low": None, "high": None}
    # tune.py --num-seeds 1 --baseline B: the paired difference of its one seed
    comparison = stats.compare([40.0], [42.5])
    difference = {"value": 2.5, "ci": None}
    assert comparison["mean_difference"] == comparison["iqm_difference"] == difference
    assert comparison["probability_of_improvement"] == {"value": 1.0, "ci": None}

"""Quantiles of histogram buckets, computed client-side as PromQL's histogram_quantile does.

The same figures are checked against the real Prometheus in test_prometheus_provider.py
(``test_workload_quantiles_equal_prometheus_histogram_quantile``).
"""

from __future__ import annotations

import math

import pytest

from kvoffload.analysis.histograms import bucket_quantile

INF = math.inf
# 60 requests of about 800 prompt tokens, 40 of about 1,500, in vLLM's 1-2-5 buckets.
PROMPTS = [(200.0, 0.0), (500.0, 0.0), (1000.0, 60.0), (2000.0, 100.0), (5000.0, 100.0), (INF, 100.0)]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.50, 500 + 500 * 50 / 60),  # rank 50 of 100 falls 50/60 into (500, 1000]
        (0.95, 1000 + 1000 * 35 / 40),  # rank 95: 35 of the 40 in (1000, 2000]
        (0.99, 1000 + 1000 * 39 / 40),
        (0.60, 1000.0),  # exactly the top of a bucket
    ],
)
def test_the_rank_is_interpolated_linearly_inside_its_bucket(q: float, expected: float) -> None:
    assert bucket_quantile(q, PROMPTS) == pytest.approx(expected)


def test_the_order_of_the_buckets_does_not_matter_and_equal_bounds_add_up() -> None:
    shuffled = list(reversed(PROMPTS))
    assert bucket_quantile(0.5, shuffled) == pytest.approx(bucket_quantile(0.5, PROMPTS))
    # Two engines' series with the same bound (le="1000" and le="1000.0") are one bucket.
    doubled = PROMPTS + PROMPTS
    assert bucket_quantile(0.5, doubled) == pytest.approx(bucket_quantile(0.5, PROMPTS))


def test_the_lowest_bucket_starts_at_zero() -> None:
    assert bucket_quantile(0.5, [(0.1, 10.0), (INF, 10.0)]) == pytest.approx(0.05)


def test_a_rank_in_the_inf_bucket_gives_the_highest_finite_bound() -> None:
    assert bucket_quantile(0.99, [(1.0, 50.0), (2.0, 90.0), (INF, 100.0)]) == 2.0


def test_counts_that_fall_are_lifted_as_promql_does() -> None:
    # A cumulative count below the one before it (rate() of scrapes from different moments)
    # is lifted to it: le=2 counts 10, not 5, so rank 15 lies 5/10 into (2, 4], not 10/15.
    wobbly = [(1.0, 10.0), (2.0, 5.0), (4.0, 20.0), (INF, 20.0)]
    assert bucket_quantile(0.75, wobbly) == pytest.approx(3.0)
    assert bucket_quantile(0.5, wobbly) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "buckets",
    [
        [],
        [(INF, 10.0)],  # one bucket
        [(1.0, 5.0), (2.0, 10.0)],  # no +Inf bucket
        [(1.0, 0.0), (INF, 0.0)],  # no observations in the window
    ],
)
def test_no_data_is_none_not_a_number(buckets: list[tuple[float, float]]) -> None:
    assert bucket_quantile(0.5, buckets) is None


def test_a_quantile_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        bucket_quantile(1.5, PROMPTS)

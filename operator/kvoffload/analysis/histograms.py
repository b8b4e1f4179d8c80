"""Quantiles of a Prometheus histogram, computed here the way PromQL's ``histogram_quantile`` does.

The baseline needs p50, p95 and p99 of four histograms. Asking Prometheus for each
quantile would be twelve queries; asking for the bucket rates once per histogram and
interpolating here is four, and gives the same numbers: this is Prometheus's
``bucketQuantile`` (promql/quantile.go): buckets sorted by upper bound, equal bounds
merged, counts forced monotonic, the rank found by linear interpolation inside its
bucket, the lowest bucket starting at 0 (unless its bound is not positive), and a rank
in the +Inf bucket answered with the highest finite bound.

Pure: numbers in, a number (or None for "no data") out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of cumulative ``(upper bound, count)`` buckets, as PromQL computes it.

    None where PromQL gives NaN: no +Inf bucket, fewer than two buckets, or no observations.
    """
    if not 0.0 <= q <= 1.0 or math.isnan(q):
        raise ValueError(f"quantile {q} is not within 0..1")
    merged: dict[float, float] = {}
    for upper, count in buckets:
        if math.isnan(upper) or math.isnan(count):
            continue
        merged[upper] = merged.get(upper, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return None
    # Counts of a cumulative histogram never fall; rate() over scrapes taken at slightly
    # different moments can make them, and PromQL lifts each to the highest before it.
    bounds: list[float] = []
    counts: list[float] = []
    highest = -math.inf
    for upper, count in ordered:
        highest = max(highest, count)
        bounds.append(upper)
        counts.append(highest)
    observations = counts[-1]
    if observations <= 0:
        return None
    rank = q * observations
    b = next(i for i in range(len(counts)) if i == len(counts) - 1 or counts[i] >= rank)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count <= 0:
        return None  # q = 0 on an empty lowest bucket: NaN in PromQL too
    return start + (end - start) * (rank / count)

"""The settings of the project's differential fuzz tests: a case count of their own, a fixed seed (CI reproduces a
failure as it was), no example database, and no health check that a slow real part (an API server, Prometheus)
would fail."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings


def fixed_seed(cases: int) -> Callable[[Any], Any]:
    """``@fixed_seed(CASES)`` over a ``@given`` test."""
    return settings(
        max_examples=cases,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )

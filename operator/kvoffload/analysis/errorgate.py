"""The built-in error gate: the share of finished requests the engines failed, canary against stable.

vLLM counts every finished request in ``vllm:request_success_total`` by its ``finished_reason``; the gate counts
``FAILED_REASONS`` (abort, error) as failed, over all reasons as finished, in the analysis window:

- ``errorShare``: the subject's failed share, held to ``analysis.errors.maxShare`` (an absolute budget: the canary's
  during a step, the fleet's under the Stable guard and in the baseline);
- ``errorShareIncrease``: the canary's share minus the stable's, held to ``maxIncrease`` while a stable side runs. A
  difference, not a ratio: a ratio has no bound when the stable fails nothing, which is the usual case.

Each needs ``minRequests`` finished requests on each side it reads, else it is not judged (Inconclusive, never Pass).
An engine that exports no such series at all gets the row reported, not gated. Failed requests are no cold-cache
artefact, so the comparison is gated during the canary's warm-up too.

HTTP 5xx (``http_requests_total{status="5xx"}``, from prometheus-fastapi-instrumentator in vLLM's API server) is not
read: vLLM turns every ``error`` into a 500 (``FinishReason``'s invariant), so adding the two would count those
requests twice, and a streamed request that fails is answered 200 before it fails, so 5xx alone misses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvoffload.analysis.dialects import FAILED_REASONS
from kvoffload.api.types import ErrorsSpec, MetricResult

ERROR_SHARE = "errorShare"
ERROR_SHARE_INCREASE = "errorShareIncrease"


@dataclass(frozen=True)
class FailedShare:
    """One variant's failed and finished requests over the window."""

    failed: float
    finished: float

    @property
    def share(self) -> float | None:
        return self.failed / self.finished if self.finished > 0 else None

    def describe(self) -> str:
        share = self.share
        figure = "no share" if share is None else f"{share:.1%}"
        return f"{figure} ({self.failed:.0f} of {self.finished:.0f} finished requests failed)"


def failed_share(finished: Mapping[str, float]) -> FailedShare | None:
    """Failed and finished requests from the per-reason counts; None when the engine exported none."""
    if not finished:
        return None
    total = sum(max(0.0, v) for v in finished.values())
    failed = sum(max(0.0, finished.get(reason, 0.0)) for reason in FAILED_REASONS)
    return FailedShare(failed=failed, finished=total)


@dataclass(frozen=True)
class ErrorRow:
    result: MetricResult
    gated: bool


def error_rows(
    errors: ErrorsSpec,
    *,
    canary: Mapping[str, float] | None,
    stable: Mapping[str, float],
    min_requests: int,
    stable_side: bool,
) -> list[ErrorRow]:
    """The error gate's rows. ``canary`` None: no canary runs, the stable variant is the subject (guard, baseline).

    ``stable_side=False``: no stable engine shares the window (the last step with ``maxSurge: 0``), so only the
    absolute budget applies.
    """
    c = failed_share(canary) if canary is not None else None
    s = failed_share(stable)
    subject = c if canary is not None else s
    who = "canary" if canary is not None else "stable"
    c_value = c.share if c else None
    s_value = s.share if s else None
    rows: list[ErrorRow] = []

    def add(name: str, threshold: float, passed: bool | None, message: str, *, gated: bool) -> None:
        # The increase row shows the difference where the ratio rows show their ratio: in ``canary``.
        if name == ERROR_SHARE_INCREASE:
            difference = c_value - s_value if c_value is not None and s_value is not None else None
            values: tuple[float | None, float | None] = (difference, None)
        else:
            values = (c_value, s_value)
        result = MetricResult(
            name=name, canary=values[0], stable=values[1], threshold=threshold, passed=passed, message=message
        )
        rows.append(ErrorRow(result, gated))

    budget = errors.max_share
    if subject is None:
        add(ERROR_SHARE, budget, None, f"no vllm:request_success_total for the {who} (not gated)", gated=False)
    elif subject.finished < min_requests or subject.share is None:
        add(
            ERROR_SHARE,
            budget,
            None,
            f"{who} finished {subject.finished:.0f} requests, fewer than minRequests {min_requests}: not judged",
            gated=True,
        )
    else:
        share = subject.share
        ok = share <= budget
        add(
            ERROR_SHARE,
            budget,
            ok,
            f"{who} failed {subject.describe()}, {'within' if ok else 'over'} maxShare {budget:.1%}",
            gated=True,
        )

    if canary is None or not stable_side:
        return rows
    limit = errors.max_increase
    if c is None or s is None:
        add(
            ERROR_SHARE_INCREASE,
            limit,
            None,
            "canary - stable failed share needs vllm:request_success_total on both (not gated)",
            gated=False,
        )
    elif c.share is None or s.share is None or c.finished < min_requests or s.finished < min_requests:
        add(
            ERROR_SHARE_INCREASE,
            limit,
            None,
            f"canary finished {c.finished:.0f}, stable {s.finished:.0f} requests: fewer than minRequests "
            f"{min_requests} on a side, not judged",
            gated=True,
        )
    else:
        increase = c.share - s.share
        ok = increase <= limit
        add(
            ERROR_SHARE_INCREASE,
            limit,
            ok,
            f"canary failed {c.share:.1%}, stable {s.share:.1%}: {increase * 100:+.1f} points, "
            f"{'at most' if ok else 'over'} maxIncrease {limit * 100:.1f} points",
            gated=True,
        )
    return rows

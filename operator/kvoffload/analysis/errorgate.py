"""The built-in error gate: the share of requests the engines failed, canary against stable.

Two counts, each a share of its own total over the analysis window:

- the engine's: ``vllm:request_success_total`` counts every finished request by its ``finished_reason``; abort and
  error (``FAILED_REASONS``) are failed, every reason is finished;
- the API server's, where it is exported: ``http_requests_total`` (prometheus-fastapi-instrumentator in vLLM's API
  server, ``entrypoints/serve/instrumentator/metrics.py``), 5xx over every answer it counted.

The figure a side is judged on is the larger of the two shares, never their sum: vLLM answers every ``error`` with
a 500 ("Invariant: always converted to 500 Internal Server Error", ``FinishReason``), so a sum would count those
requests twice. Each count catches what the other misses: a streamed request that fails was answered 200 before it
failed (the engine counts it), and a 500 raised before a request reaches the engine is only the API server's.
Where the two fail disjoint requests at once, the larger share is at most half their sum too low.

- ``errorShare``: the subject's figure, held to ``analysis.errors.maxShare`` (an absolute budget: the canary's during
  a step, the fleet's under the Stable guard and in the baseline);
- ``errorShareIncrease``: the canary's figure minus the stable's, held to ``maxIncrease`` while a stable side runs. A
  difference, not a ratio: a ratio has no bound when the stable fails nothing, which is the usual case.

``errorShare`` counts a breach only with evidence (``analysis/evidence.py``): a binomial test of the share over
``maxShare`` with a p-value under the look's ``alpha``; a share over the budget without it is Inconclusive and says
how many requests would settle it. ``errorShareIncrease`` is judged on ``maxIncrease`` alone, with the p-value of
"the canary fails more than the stable" shown beside it: failed requests are too rare for a window to carry the
evidence a step's spread ``alpha`` asks (see the comment where it is judged).

A count is judged only with ``minRequests`` in its total, on each side it reads, else the row is not judged
(Inconclusive, never Pass). An engine that exports neither count gets the rows reported, not gated. Failed
requests are no cold-cache artefact, so the comparison is gated during the canary's warm-up too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvoffload.analysis.evidence import (
    Sureness,
    difference_test,
    requests_needed,
    share_interval,
    share_test,
    z_for,
    z_of,
)
from kvoffload.api.rollout import ErrorsSpec
from kvoffload.api.status import MetricResult
from kvoffload.engines.dialect import FAILED_REASONS, HTTP_SERVER_ERROR

ERROR_SHARE = "errorShare"
ERROR_SHARE_INCREASE = "errorShareIncrease"

Counts = tuple[Mapping[str, float], Mapping[str, float]]
"""One variant's (finished requests by ``finished_reason``, API server answers by status class) in the window."""


@dataclass(frozen=True)
class FailedShare:
    """Failed requests out of a total, as one count sees them."""

    failed: float
    total: float
    what: str
    """How the total reads in a message: ``finished requests failed``, ``HTTP answers were 5xx``."""

    @property
    def share(self) -> float | None:
        return self.failed / self.total if self.total > 0 else None

    def describe(self) -> str:
        return f"{self.failed:.0f} of {self.total:.0f} {self.what}"


def failed_share(finished: Mapping[str, float]) -> FailedShare | None:
    """The engine's count: abort and error over every finished request; None when the engine exported none."""
    if not finished:
        return None
    total = sum(max(0.0, v) for v in finished.values())
    failed = sum(max(0.0, finished.get(reason, 0.0)) for reason in FAILED_REASONS)
    return FailedShare(failed=failed, total=total, what="finished requests failed")


def http_failed_share(answers: Mapping[str, float]) -> FailedShare | None:
    """The API server's count: 5xx over every answer; None where ``http_requests_total`` is not exported."""
    if not answers:
        return None
    total = sum(max(0.0, v) for v in answers.values())
    return FailedShare(failed=max(0.0, answers.get(HTTP_SERVER_ERROR, 0.0)), total=total, what="HTTP answers were 5xx")


@dataclass(frozen=True)
class _Side:
    counts: tuple[FailedShare, ...]
    """The counts this variant exports (none, one or both)."""
    judged: FailedShare | None
    """The count with the larger share among those with ``minRequests`` in their total; None if none has."""

    @property
    def share(self) -> float | None:
        """The figure shown: the judged count's share, else the largest share seen (on too few requests)."""
        if self.judged is not None:
            return self.judged.share
        shares = [c.share for c in self.counts if c.share is not None]
        return max(shares) if shares else None

    def describe(self) -> str:
        return "; ".join(c.describe() for c in self.counts)


def _side(counts: Counts, min_requests: int) -> _Side:
    seen = tuple(c for c in (failed_share(counts[0]), http_failed_share(counts[1])) if c is not None)
    enough = [c for c in seen if c.total >= min_requests and c.share is not None]
    judged = max(enough, key=lambda c: c.share or 0.0) if enough else None
    return _Side(seen, judged)


@dataclass(frozen=True)
class ErrorRow:
    result: MetricResult
    gated: bool


def error_rows(
    errors: ErrorsSpec,
    *,
    canary: Counts | None,
    stable: Counts,
    min_requests: int,
    stable_side: bool,
    alpha: float | None = None,
) -> list[ErrorRow]:
    """The error gate's rows. ``canary`` None: no canary runs, the stable variant is the subject (guard, baseline).

    ``stable_side=False``: no stable engine shares the window (the last step with ``maxSurge: 0``), so only the
    absolute budget applies. ``alpha``: the p-value a breach must come under (None: any breach counts, as a
    point estimate).
    """
    c = _side(canary, min_requests) if canary is not None else None
    s = _side(stable, min_requests)
    subject = c if c is not None else s
    who = "canary" if c is not None else "stable"
    rows: list[ErrorRow] = []

    def add(
        name: str,
        values: tuple[float | None, float | None],
        limit: float,
        passed: bool | None,
        msg: str,
        *,
        gated: bool = True,
        evidence: Sureness | None = None,
    ) -> None:
        result = MetricResult(
            name=name,
            canary=values[0],
            stable=values[1],
            threshold=limit,
            passed=passed,
            message=msg,
            **(evidence or {}),
        )
        rows.append(ErrorRow(result, gated))

    def judged(breach: bool, p_value: float | None, n: float, z: float | None) -> tuple[bool | None, str, Sureness]:
        """(passed, how sure, evidence fields) of a row whose point estimate is ``breach``."""
        if alpha is None or p_value is None:
            return not breach, "", {}
        evidence: Sureness = {"p_value": p_value, "alpha": alpha}
        if not breach:
            return True, "", evidence
        if p_value < alpha:
            return False, f", p={p_value:.2g}", evidence
        needed = requests_needed(n, z, z_for(alpha))
        evidence["requests_needed"] = needed
        more = f"; about {needed} requests would settle it" if needed is not None else ""
        return None, f", not yet beyond chance: p={p_value:.2g} (a breach needs under {alpha:.2g}){more}", evidence

    shares = (c.share if c is not None else None, s.share)
    budget = errors.max_share
    if not subject.counts:
        # Nothing to judge, ever, where the engines export neither count.
        add(ERROR_SHARE, shares, budget, None, f"no finished-request counts for the {who} (not gated)", gated=False)
    elif subject.judged is None:
        add(
            ERROR_SHARE,
            shares,
            budget,
            None,
            f"{who}: {subject.describe()}, fewer than minRequests {min_requests}: not judged",
        )
    else:
        count = subject.judged
        share = count.share or 0.0
        verdict = "within" if share <= budget else "over"
        p_value = share_test(count.failed, count.total, budget)
        passed, sure, evidence = judged(
            share > budget, p_value, count.total, None if p_value is None else z_of(p_value)
        )
        interval = share_interval(count.failed, count.total)
        if interval is not None and evidence:
            evidence["interval"] = list(interval)
        add(
            ERROR_SHARE,
            shares,
            budget,
            passed,
            f"{who} failed {share:.1%} ({subject.describe()}), {verdict} maxShare {budget:.1%}{sure}",
            evidence=evidence,
        )

    if c is None or not stable_side:
        return rows
    limit = errors.max_increase
    if not c.counts or not s.counts:
        msg = "canary - stable failed share needs finished-request counts on both (not gated)"
        add(ERROR_SHARE_INCREASE, (None, None), limit, None, msg, gated=False)
    elif c.judged is None or s.judged is None:
        msg = (
            f"canary: {c.describe()}; stable: {s.describe()}: fewer than minRequests {min_requests} on a side, "
            "not judged"
        )
        add(ERROR_SHARE_INCREASE, (None, None), limit, None, msg)
    else:
        c_share, s_share = c.judged.share or 0.0, s.judged.share or 0.0
        increase = c_share - s_share
        ok = increase <= limit
        # The increase is judged on maxIncrease alone; its p-value is shown. Failed requests are rare: a window of a
        # hundred canary requests failing 5 % against 0.5 % is 2.2 standard errors from chance, short of any alpha
        # spread over a step's looks, so gating on it would promote most canaries that fail one request in twenty
        # (bench/judgement/README.md), while the 2-point floor alone rolls back 0.13 % of identical steps there.
        p_value = difference_test(c.judged.failed, c.judged.total, s.judged.failed, s.judged.total, 0.0)
        shown: Sureness = {} if p_value is None else {"p_value": p_value}
        add(
            ERROR_SHARE_INCREASE,
            (increase, None),
            limit,
            ok,
            f"canary failed {c_share:.1%}, stable {s_share:.1%}: {increase * 100:+.1f} points, "
            f"{'at most' if ok else 'over'} maxIncrease {limit * 100:.1f} points"
            + ("" if p_value is None else f" (p={p_value:.2g} that it fails more than the stable)"),
            evidence=shown,
        )
    return rows

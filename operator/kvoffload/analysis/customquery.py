"""Reading custom metrics: each template rendered for the canary's and the stable's engines, asked of Prometheus.

Unlike the built-in metrics, which one query answers for a whole batch of policies, a custom metric is the
policy's own PromQL: it costs one query per variant it needs, per policy, per cycle (the subject's for an
absolute bound; canary and stable for a ratio). Each answer must be one number: a scalar, or a vector of
exactly one series (aggregate it: ``sum(...)``, ``max(...)``); anything else is read as "not judged".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from kvoffload.analysis.custom import CustomReading
from kvoffload.analysis.queries import LabelNames, Target, promql_duration
from kvoffload.api.analysistemplate import Comparison, MetricSource
from kvoffload.api.promql import Selection, TemplateError, render


@runtime_checkable
class InstantQueries(Protocol):
    """What reading custom metrics needs of a provider (``PrometheusProvider.instant``)."""

    def instant(self, exprs: Sequence[str]) -> list[list[dict[str, Any]] | str]: ...


def selection(target: Target, config_hash: str, labels: LabelNames) -> Selection:
    """What ``{{ selector }}`` selects for one variant of ``target`` (for an observed fleet, its pods, whatever the
    variant: the same engines answer for both roles)."""
    return Selection(
        namespace_label=labels.namespace,
        namespace=target.namespace,
        policy_label=labels.policy,
        policy=target.policy,
        config_hash_label=labels.config_hash,
        config_hash=config_hash,
        extra_matchers=target.extra_matchers,
        pods=target.pods,  # an observed fleet: selected by its pods, as the built-in queries select it
        pod_label=labels.pod,
    )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def one_number(answer: list[dict[str, Any]] | list[Any] | str) -> tuple[float | None, str | None]:
    """(value, None), (None, None) for an empty answer (no data), or (None, why) for an error or several series.

    A vector answers as a list of series (``{"metric": ..., "value": [t, "v"]}``); a scalar as the pair
    ``[t, "v"]`` itself. ``+Inf`` and ``-Inf`` are values (a breach of a max, of a min); ``NaN`` is none."""
    if isinstance(answer, str):
        return None, answer
    if not answer:
        return None, None
    if len(answer) == 2 and _is_number(answer[0]) and isinstance(answer[1], str):
        raw: object = answer[1]  # a scalar
    elif len(answer) > 1:
        return None, f"the query gave {len(answer)} series, not one number: aggregate it (sum, max, ...)"
    else:
        try:
            raw = answer[0]["value"][1]
        except (KeyError, IndexError, TypeError):
            return None, "the answer is not an instant vector or scalar"
    try:
        number = float(raw)  # type: ignore[arg-type]  # Prometheus writes numbers as strings: "1.5", "+Inf", "NaN"
    except (TypeError, ValueError):
        return None, "the answer is not an instant vector or scalar"
    return (None, None) if math.isnan(number) else (number, None)


def read_custom(
    provider: object, sources: Sequence[MetricSource], target: Target, labels: LabelNames | None = None
) -> list[CustomReading]:
    """This cycle's readings of ``sources`` for ``target`` (blocking; never raises)."""
    if not sources:
        return []
    if not isinstance(provider, InstantQueries):
        return [CustomReading(s, error="this metrics provider cannot run custom queries") for s in sources]
    labels = labels or LabelNames()
    window = promql_duration(target.window)
    subject = target.canary_hash if target.canary_hash is not None else target.stable_hash
    wanted: list[tuple[int, str, str]] = []  # (source index, variant, expr)
    failed: dict[int, str] = {}
    for i, source in enumerate(sources):
        variants = {"canary": target.canary_hash, "stable": target.stable_hash}
        if source.metric.comparison is Comparison.ABSOLUTE:
            variants = {("canary" if target.canary_hash is not None else "stable"): subject}
        for variant, config_hash in variants.items():
            if config_hash is None:
                continue
            try:
                wanted.append((i, variant, render(source.metric.query, selection(target, config_hash, labels), window)))
            except TemplateError as exc:
                failed[i] = str(exc)
    answers = provider.instant([expr for _, _, expr in wanted]) if wanted else []
    values: dict[tuple[int, str], float | None] = {}
    for (i, variant, _), answer in zip(wanted, answers, strict=True):
        value, error = one_number(answer)
        values[(i, variant)] = value
        if error is not None:
            failed.setdefault(i, f"{variant}: {error}")
    return [
        CustomReading(source, values.get((i, "canary")), values.get((i, "stable")), failed.get(i))
        for i, source in enumerate(sources)
    ]

"""Custom metric queries judged by Prometheus's own parser, naming the field of each that does not parse.

The operator image carries no promtool and no PromQL parser: Prometheus is asked, through
``/api/v1/format_query`` (Prometheus 2.31 on; it parses and prints, and evaluates nothing). Each query is
asked with the placeholders filled by stand-ins (``api/promql.py``'s ``for_checking``), so what is
judged is the query as the operator will send it, up to the label values.

Where Prometheus cannot be asked (unreachable, credentials refused, a Prometheus without the endpoint),
``ParserUnavailable`` is raised: the webhook then admits the object (its failurePolicy is Ignore anyway),
and the operator asks again at the policy's next analysis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvoffload.api.analysistemplate import CustomMetric
from kvoffload.api.errors import FieldError
from kvoffload.api.promql import TemplateError, for_checking

Parser = Callable[[str], "str | None"]
"""A query in, None when it parses or the parser's message (``PrometheusProvider.format_query``)."""


def query_problems(metrics: Sequence[CustomMetric], path: str, parse: Parser) -> list[FieldError]:
    """One FieldError per query of ``metrics`` that Prometheus does not parse, at ``<path>[i].query``.

    Raises ``ParserUnavailable`` (``analysis/prometheus.py``) when Prometheus cannot be asked."""
    found: list[FieldError] = []
    for i, metric in enumerate(metrics):
        try:
            expr = for_checking(metric.query)
        except TemplateError as exc:
            found.append(FieldError(f"{path}[{i}].query", str(exc)))
            continue
        problem = parse(expr)
        if problem is not None:
            found.append(FieldError(f"{path}[{i}].query", f"Prometheus does not parse it: {problem}"))
    return found


PARSE_TIMEOUT_SECONDS = 2.0
"""How long admission and ``kvoffload plan`` wait for Prometheus to parse: well within the webhook's 5 s."""


def policy_query_problems(metrics: Sequence[CustomMetric], url: str) -> tuple[list[FieldError], str | None]:
    """The custom metrics of a policy (``spec.analysis.metrics``) judged by the Prometheus at ``url``, asked with
    no credentials: (the queries it does not parse, None), or ([], why it could not be asked)."""
    if not metrics:
        return [], None
    from kvoffload.analysis.prometheus import ParserUnavailable, PrometheusProvider

    provider = PrometheusProvider(url, timeout=PARSE_TIMEOUT_SECONDS, retries=0)
    try:
        return query_problems(metrics, "spec.analysis.metrics", provider.format_query), None
    except ParserUnavailable as exc:
        return [], str(exc)
    finally:
        provider.close()

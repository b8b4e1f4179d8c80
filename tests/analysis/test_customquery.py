"""Reading custom metrics without Prometheus: what one answer means, and what ``{{ selector }}`` selects."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from kvoffload.analysis.custom import CustomReading, judge_custom
from kvoffload.analysis.customquery import one_number, read_custom
from kvoffload.analysis.queries import LabelNames, Target, build_queries, fleet_matcher
from kvoffload.api.analysistemplate import CustomMetric, MetricSource
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.engines.vllm.dialect import NEWEST

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def series(value: str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1_700_000_000.5, value]}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ([1_700_000_000.5, "3"], (3.0, None)),  # a scalar: the pair itself, not two series
        ([1_700_000_000, "0.25"], (0.25, None)),
        ([series("2.5")], (2.5, None)),
        ([series("+Inf")], (math.inf, None)),
        ([series("-Inf")], (-math.inf, None)),
        ([1_700_000_000.5, "+Inf"], (math.inf, None)),
        ([series("NaN")], (None, None)),
        ([1_700_000_000.5, "NaN"], (None, None)),
        ([], (None, None)),
        ("Prometheus timed out", (None, "Prometheus timed out")),
    ],
)
def test_one_number_reads_a_scalar_a_single_series_and_infinities(answer: Any, expected: tuple[Any, Any]) -> None:
    assert one_number(answer) == expected


def test_one_number_refuses_several_series_and_a_range_vector() -> None:
    value, error = one_number([series("1", pod="a"), series("2", pod="b")])
    assert value is None
    assert error is not None
    assert "2 series" in error
    value, error = one_number([{"metric": {}, "values": [[1, "1"], [2, "2"]]}])
    assert (value, error) == (None, "the answer is not an instant vector or scalar")
    value, error = one_number([series("1"), series("2"), series("3")])
    assert error is not None
    assert "3 series" in error


def custom(name: str, **fields: object) -> MetricSource:
    return MetricSource(
        metric=CustomMetric.model_validate({"name": name, "query": "sum(x{ {{ selector }} })", **fields})
    )


def test_an_infinite_reading_is_a_breach_of_a_max_or_a_min_and_the_status_stays_json() -> None:
    readings = [
        CustomReading(custom("high", max=5), canary=math.inf),
        CustomReading(custom("low", min=1), canary=-math.inf),
        CustomReading(custom("ratio", max=2, comparison="ratio"), canary=math.inf, stable=1.0),
        CustomReading(custom("both", max=2, comparison="ratio"), canary=math.inf, stable=math.inf),
    ]
    results = {r.result.name: r.result for r in judge_custom(readings, None, AnalysisSpec(), NOW, has_canary=True)}
    assert results["high"].passed is False
    assert "inf" in results["high"].message
    assert results["low"].passed is False
    assert results["ratio"].passed is False
    assert results["both"].passed is None  # inf/inf: no ratio, not judged
    for result in results.values():
        # JSON has no Infinity: the API server would refuse the whole status.
        json.dumps(result.model_dump(mode="json", by_alias=True), allow_nan=False)
        json.loads(result.model_dump_json(by_alias=True))
    assert results["high"].model_dump(mode="json")["canary"] is None


class Recorder:
    """A provider that answers every query with one series and keeps what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def instant(self, exprs: Sequence[str]) -> list[list[dict[str, Any]] | str]:
        self.asked.extend(exprs)
        return [[series("1")] for _ in exprs]


QUERY = "sum(rate(vllm:time_to_first_token_seconds_count{ {{ selector }} }[{{ window }}]))"


def test_an_observed_fleets_custom_metrics_select_its_pods_as_the_built_in_queries_do() -> None:
    fleet = Target(
        "llm",
        "team",
        "2m",
        dialect=NEWEST,
        extra_matchers='cluster="prod"',
        stable_hash="h1",
        canary_hash="h2",
        pods=("vllm-0", "v.1"),
    )
    provider = Recorder()
    (reading,) = read_custom(provider, [custom("ttft", max=5, comparison="ratio", query=QUERY)], fleet)
    assert reading.error is None
    assert (reading.canary, reading.stable) == (1.0, 1.0)
    selector = 'namespace="llm", pod=~"v\\\\.1|vllm-0", cluster="prod"'
    assert (
        provider.asked == [f"sum(rate(vllm:time_to_first_token_seconds_count{{ {selector} }}[120s]))"] * 2
    )  # the same engines answer for both roles
    for expr in provider.asked:
        assert "kvoffload_io" not in expr  # no label the observed fleet's series lack
    # The same series the built-in queries select: namespace and pods by name (a raw string there).
    built = build_queries("2m", NEWEST, 'cluster="prod"', scope=fleet_matcher(fleet), fleet=True)[0].expr
    assert 'namespace="llm", pod=~`v\\.1|vllm-0`, cluster="prod"' in built
    # Renamed labels follow the operator's settings.
    renamed = Recorder()
    read_custom(renamed, [custom("ttft", max=5, query=QUERY)], fleet, LabelNames(namespace="ns", pod="instance"))
    assert renamed.asked == [
        'sum(rate(vllm:time_to_first_token_seconds_count{ ns="llm", instance=~"v\\\\.1|vllm-0", '
        'cluster="prod" }[120s]))'
    ]


def test_a_rendered_variant_is_still_selected_by_the_policys_labels() -> None:
    target = Target("llm", "chat", "2m", dialect=NEWEST, stable_hash="h1", canary_hash="h2")
    provider = Recorder()
    read_custom(provider, [custom("ttft", max=5, comparison="ratio", query=QUERY)], target)
    assert provider.asked == [
        'sum(rate(vllm:time_to_first_token_seconds_count{ namespace="llm", kvoffload_io_policy="chat", '
        f'kvoffload_io_config_hash="{h}" }}[120s]))'
        for h in ("h2", "h1")
    ]

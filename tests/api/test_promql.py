"""Custom metric templates: the placeholders the operator fills, the escaping, and the selector check."""

from __future__ import annotations

import pytest

from kvoffload.api.promql import (
    SENTINEL_LABEL,
    Selection,
    TemplateError,
    escape_label_value,
    for_checking,
    parse_matchers,
    render,
    render_matchers,
    selector_problems,
)

GOOD = [
    'sum(rate(vllm:request_success_total{ {{ selector }}, finished_reason="abort"}[{{ window }}]))'
    " / sum(rate(vllm:request_success_total{ {{selector}} }[{{window}}]))",
    "histogram_quantile(0.99, sum by (le)"
    " (rate(vllm:e2e_request_latency_seconds_bucket{{{ selector }}}[{{ window }}])))",
    "max_over_time(x{ {{ selector }} }[{{window}}:1s] offset 1m) > bool 3 AND ON() vector(1)",
    "sum(x{ {{ selector }} }) without (pod) / on() group_left()"
    ' count(label_replace(y{ {{selector}} }, "a", "$1", "b", "(.*)"))',
    '{__name__=~"vllm:.+", {{ selector }}}',
    # Keywords where the grammar reads them as keywords.
    "sum by (le) (rate(x_bucket{ {{ selector }} }[{{ window }}]))",
    "topk(3, x{ {{ selector }} })",
    "a{ {{ selector }} } and on (pod) b{ {{ selector }} }",
    "x{ {{ selector }} } offset 5m",
    "count(x{ {{ selector }} }) > bool 3",
    'count_values without (pod) ("v", x{ {{ selector }} }) > bool on (v) group_left (a) y{ {{ selector }} }',
    "-SUM BY (a) (x{ {{ selector }} } offset -1m) * IGNORING (b) GROUP_RIGHT z{ {{ selector }} } ^ -Inf",
    "max_over_time(rate(x{ {{ selector }} }[{{ window }}])[5m:1m] @ end()) unless quantile(0.9, x{ {{ selector }} })"
    " atan2 NaN",
]

ESCAPES = [
    ("up", "the metric up is selected without"),
    ('sum(rate(x{a="b"}[5m]))', "the metric x is selected without"),
    ("x{ {{selector}} } or y", "the metric y"),
    ('x{ {{selector}} } or on(pod) {__name__="z"}', 'the selector {__name__="z"} is selected without'),
    ("vector(1)", "selects no series"),
    ("x{ {{selector}} } {{ nope }}", "unknown placeholder"),
    (f'x{{ {SENTINEL_LABEL}="1" }}', "reserved"),
    ('x{ {{selector}} } unless Sum(other{namespace="team-b"})', "the metric other is selected without"),
    ('x{ {{selector}}, namespace="team-b" }', 'names its own namespace (namespace="team-b")'),
    ("x{ {{selector}} } + 0x0e-kube_secret_info", "the metric kube_secret_info"),  # 14 - kube_secret_info
    ("max_over_time(x[5m:1m]) or y{ {{selector}} }", "the metric x"),  # a subquery's selector
]

KEYWORD_METRICS = [
    ("sum(x{ {{ selector }} }) + count", "count"),
    ("max(x{ {{ selector }} }) or sum", "sum"),
    ("sum(x{ {{ selector }} }) > bool offset", "offset"),
    ("x{ {{ selector }} } and or", "or"),
    ("x{ {{ selector }} } + - topk", "topk"),
    ("x{ {{ selector }} } / (without)", "without"),
    ("topk(3, by)", "by"),
    ("x{ {{ selector }} } unless start", "start"),
    ("x{ {{ selector }} } * on (pod) group_left (a) end", "end"),
    ("count_values", "count_values"),
]
"""Keywords in an operand's place, where Prometheus's grammar (metric_identifier) reads a metric name with no
matchers: each selects that series across every namespace."""


@pytest.mark.parametrize("template", GOOD)
def test_a_template_whose_every_selector_carries_the_placeholder_is_accepted(template: str) -> None:
    assert selector_problems(template) == []


@pytest.mark.parametrize(("template", "why"), ESCAPES)
def test_a_template_that_could_read_other_series_is_refused_saying_where(template: str, why: str) -> None:
    problems = selector_problems(template)
    assert problems
    assert any(why in p for p in problems), problems


@pytest.mark.parametrize(("template", "keyword"), KEYWORD_METRICS)
def test_a_keyword_where_an_operand_stands_is_a_metric_name_and_refused(template: str, keyword: str) -> None:
    assert f"the metric {keyword} is selected without" in "; ".join(selector_problems(template))


@pytest.mark.parametrize(
    "template",
    [
        "x{ {{ selector }} } + on",  # a modifier with no label list
        "x{ {{ selector }} } + bool 3",  # bool after no comparison
        "x{ {{ selector }} } + atan2",
        "sum by (a)",  # an aggregation with no body
        "x{ {{ selector }} } by (a)",  # by after no aggregation
        "x{ {{ selector }} } offset y",
        "x{ {{ selector }} } offset (5m)",
        "x{ {{ selector }} } @ start",
        "x{ {{ selector }} } * on (pod) group_left (a{ {{ selector }} })",
        "x{ {{ selector }} })",
        "x{ {{ selector }} } y",
    ],
)
def test_a_keyword_or_token_the_grammar_does_not_place_there_is_refused(template: str) -> None:
    assert selector_problems(template)


def selection(namespace: str = "llm", policy: str = "chat", extra: str | None = None) -> Selection:
    return Selection("namespace", namespace, "kvoffload_io_policy", policy, "kvoffload_io_config_hash", "abc", extra)


def test_the_operator_fills_in_its_own_matchers_and_the_window() -> None:
    query = render("sum(rate(x{ {{ selector }} }[{{ window }}]))", selection(), "6s")
    assert query == 'sum(rate(x{ namespace="llm", kvoffload_io_policy="chat", kvoffload_io_config_hash="abc" }[6s]))'


@pytest.mark.parametrize(
    "hostile",
    ['a"} or vector(1) or x{b="', "x\\", "{{ window }}", "a\nb", 'ns" or on() up{job="'],
)
def test_names_with_quotes_braces_or_placeholders_stay_inside_their_string_literals(hostile: str) -> None:
    query = render("x{ {{ selector }} }", selection(namespace=hostile, policy=hostile), "1m")
    literal = escape_label_value(hostile)
    assert query == (f'x{{ namespace={literal}, kvoffload_io_policy={literal}, kvoffload_io_config_hash="abc" }}')
    # One pass: a value that spells a placeholder is not filled in again.
    assert "1m" not in query
    # The literal reads back, by PromQL's grammar, as exactly the value: nothing of it left the string.
    assert parse_matchers(f"a={literal}") == [("a", "=", hostile)]


def test_extra_matchers_are_decoded_and_written_again_not_pasted() -> None:
    assert parse_matchers('cluster="prod", zone=~"eu-\\\\.*"') == [("cluster", "=", "prod"), ("zone", "=~", "eu-\\.*")]
    query = render("x{ {{ selector }} }", selection(extra='cluster="a\\"b"'), "1m")
    assert query.endswith('cluster="a\\"b" }')
    for bad in ('cluster="a\\"', 'cluster="x\\q"', 'cluster="a"} or up{b="c"'):
        with pytest.raises(TemplateError):
            render("x{ {{ selector }} }", selection(extra=bad), "1m")


def test_a_window_must_be_a_promql_duration() -> None:
    with pytest.raises(TemplateError, match="not a PromQL duration"):
        render("x{ {{ selector }} }", selection(), "1m] or up[1m")


def test_the_stand_ins_make_plain_promql() -> None:
    assert for_checking("rate(x{ {{selector}} }[{{ window }}])") == f'rate(x{{ {SENTINEL_LABEL}="1" }}[1m])'


def test_extra_matchers_whose_value_ends_in_a_backslash_are_refused_by_the_policy() -> None:
    from pydantic import ValidationError

    from kvoffload.api.types import PrometheusSpec
    from tests.analysis.test_prometheus_provider import INJECTION

    # A backslash escapes the quote after it, in the pattern as in PromQL: the literal does not end there.
    for bad in (INJECTION, 'a="x\\"', 'a="x\\", b="y"', 'a="\\q"'):
        with pytest.raises(ValidationError):
            PrometheusSpec.model_validate({"extraMatchers": bad})
    # An escaped backslash or quote is a value like any other, decoded and written again as the same literal.
    good = PrometheusSpec.model_validate({"extraMatchers": 'a="x\\\\", b=~"y\\"z"'})
    assert good.extra_matchers is not None
    assert parse_matchers(good.extra_matchers) == [("a", "=", "x\\"), ("b", "=~", 'y"z')]
    assert render_matchers(good.extra_matchers) == 'a="x\\\\", b=~"y\\"z"'

"""promql-parser, which judges every custom metric query (api/promql.py), against Prometheus 2.42's own parser.

Prometheus is asked through ``/api/v1/format_query``: it parses a query and prints its tree back, evaluating
nothing. For every query both parsers take, the vector selectors promql-parser finds in the query must be the ones
it finds in Prometheus' printing of it: a query one of them reads differently (``0x0e-x``: one number to a greedy
lexer, ``14 - x`` to Prometheus) has other selectors in Prometheus' printing. The queries are generated to be
hostile: number forms run into names, keywords as metric names, ``offset``, ``@``, ``bool``, subqueries,
``or``/``unless``, comments, unicode and escapes in label values. The case count is printed in the test summary
(``KVOFFLOAD_PROMQL_CASES`` sets it; the seed is fixed so CI is reproducible).

Where the two disagree on whether a query parses, promql-parser refusing is stricter (the policy is refused at
admission, naming the field), and Prometheus refusing what it took is a query Prometheus refuses at analysis (the
metric is not judged): neither reads a series of another namespace. Those cases are counted and shown, not failed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from kvoffload.api.promql import (
    SENTINEL_LABEL,
    TemplateError,
    VectorSelector,
    for_checking,
    selector_problems,
    vector_selectors,
)
from tests.api.test_promql import ESCAPES, GOOD, KEYWORD_METRICS
from tests.support.fuzz import fixed_seed
from tests.support.prometheus import PrometheusServer, require_prometheus
from tests.support.summary import report

pytestmark = pytest.mark.prometheus

CASES = int(os.environ.get("KVOFFLOAD_PROMQL_CASES", "3000"))


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_prometheus()
    server = PrometheusServer(Path(tmp_path_factory.mktemp("promql")) / "prometheus")
    server.workdir.mkdir()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def prometheus_parse(url: str, query: str) -> tuple[str | None, str | None]:
    """(Prometheus' printing of the query, None), or (None, its parser's message)."""
    answer = requests.post(f"{url}/api/v1/format_query", data={"query": query}, timeout=10).json()
    if answer["status"] == "success":
        return answer["data"], None
    assert answer["errorType"] == "bad_data", answer
    return None, answer["error"]


def key(selector: VectorSelector) -> str:
    """A selector as both printings agree on it: matchers in order, a name written as ``__name__="x"`` as a name.

    A ``__name__=""`` matcher of a selector with no name outside its braces is left out: Prometheus 2.42's printer
    (``VectorSelector.String``) skips every ``__name__`` equality matcher whose value is the outer name, and that
    name is then empty, so ``{__name__="", a="1"}`` prints as ``{a="1"}``. Such a selector matches nothing either
    way; the parse is not what differs, the printing is."""
    name, matchers = selector.name, sorted(selector.matchers)
    if name is None:
        matchers = [m for m in matchers if m != ("__name__", "=", "")]
    names = [m for m in matchers if (m[0], m[1]) == ("__name__", "=")]
    if name is None and len(names) == 1:
        name, matchers = names[0][2], [m for m in matchers if m not in names]
    return str(VectorSelector(name, tuple(matchers), selector.alternatives))


def ours(query: str) -> tuple[Counter[str] | None, str | None]:
    """(the selectors promql-parser finds, None), or (None, why it refuses the query)."""
    try:
        return Counter(key(s) for s in vector_selectors(query)), None
    except TemplateError as exc:
        return None, str(exc)


@dataclass
class Tally:
    cases: int = 0
    both: int = 0
    refused_by_both: int = 0
    only_prometheus: list[str] = field(default_factory=list)
    only_ours: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)

    def judge(self, url: str, query: str) -> None:
        self.cases += 1
        printed, _ = prometheus_parse(url, query)
        found, _ = ours(query)
        if printed is None and found is None:
            self.refused_by_both += 1
        elif printed is None:
            self.only_ours.append(query)
        elif found is None:
            self.only_prometheus.append(query)
        else:
            self.both += 1
            theirs, why = ours(printed)
            if theirs != found:
                self.disagreements.append(f"{query!r}: ours {dict(found)}, Prometheus' {printed!r} {theirs or why}")


# --- the generator ------------------------------------------------------------------------------------------------

NAMES = st.sampled_from(
    [
        "x",
        "vllm:num_requests_waiting",
        "kube_secret_info",
        # Keywords, each a metric name where PromQL's grammar reads one.
        *("sum", "count", "by", "without", "on", "ignoring", "group_left", "bool", "offset", "start", "end"),
        *("and", "or", "unless", "atan2", "inf", "nan", "topk", "rate", "le", "e", "x1e3", "Inf", "NaN"),
    ]
)
NUMBERS = st.sampled_from(["1", "0x0e", "0X1F", "1e3", "1.5e-3", ".5", "5.", "0x0", "017", "Inf", "-Inf", "NaN"])
DURATIONS = st.sampled_from(["5m", "1m30s", "10s", "1h", "500ms", "0s", "1d"])
GAPS = st.sampled_from(["", " ", "  ", "\n", "\t", " # a comment\n", "#c\n"])
VALUES = st.lists(
    st.sampled_from([*"abé中\"\\\n}{,=~ '`", "\\u00e9", "\\x41", "\\n", '\\"', "\\\\", "\\101"]),
    max_size=6,
).map("".join)


@st.composite
def literal(draw: st.DrawFn) -> str:
    value = draw(VALUES)
    quote = draw(st.sampled_from(['"', "'", "`"]))
    return f"{quote}{value}{quote}"


@st.composite
def matcher(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(["a", "namespace", "__name__", SENTINEL_LABEL, "by", "on", "offset"]))
    op = draw(st.sampled_from(["=", "!=", "=~", "!~"]))
    return f"{name}{draw(GAPS)}{op}{draw(GAPS)}{draw(literal())}"


@st.composite
def selector(draw: st.DrawFn) -> str:
    name = draw(st.one_of(NAMES, st.just("")))
    matchers = draw(st.lists(matcher(), max_size=3))
    braces = (
        f"{{{', '.join(matchers)}{draw(st.sampled_from(['', ',']))}}}"
        if matchers or not name or draw(st.booleans())
        else ""
    )
    text = name + draw(st.sampled_from(["", " "])) + braces if braces else name
    if draw(st.booleans()):
        text += draw(
            st.sampled_from([f" offset {draw(DURATIONS)}", f" offset -{draw(DURATIONS)}", f"offset{draw(DURATIONS)}"])
        )
    if draw(st.booleans()):
        text += draw(st.sampled_from([" @ 100", " @ start()", " @ end()", "@1.5e3", " @ -1"]))
    return text


def expression() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        gap = GAPS
        return st.one_of(
            st.tuples(
                inner, gap, st.sampled_from(["+", "-", "*", "/", "%", "^", "and", "or", "unless", "atan2"]), gap, inner
            ).map("".join),
            st.tuples(inner, st.sampled_from([" > bool ", " == ", " != bool ", "<=", " >= "]), inner).map("".join),
            st.tuples(
                inner,
                st.sampled_from([" + on(a) ", " * ignoring (a) group_left ", " / on() group_right(b) ", " or on(a) "]),
                inner,
            ).map("".join),
            st.tuples(
                st.sampled_from(["sum", "count", "max", "topk(3, ", "sum by (a) ", "count without(a)"]), inner
            ).map(lambda t: f"{t[0]}({t[1]})" if not t[0].endswith(", ") else f"{t[0]}{t[1]})"),
            st.tuples(
                st.sampled_from(["sum", "max", "count"]), inner, st.sampled_from([" by (a)", " without (a)"])
            ).map(lambda t: f"{t[0]}({t[1]}){t[2]}"),
            st.tuples(
                st.sampled_from(["rate", "max_over_time", "count_over_time"]),
                inner,
                DURATIONS,
                st.sampled_from(["", ":", ":1m"]),
            ).map(lambda t: f"{t[0]}({t[1]}[{t[2]}{t[3]}])"),
            st.tuples(inner, DURATIONS, st.sampled_from([":", ":10s"])).map(lambda t: f"({t[0]})[{t[1]}{t[2]}]"),
            inner.map(lambda e: f"({e})"),
            inner.map(lambda e: f"-{e}"),
            st.tuples(inner, literal()).map(lambda t: f'label_replace({t[0]}, "a", {t[1]}, "b", "(.*)")'),
            inner.map(lambda e: f"histogram_quantile(0.99, {e})"),
            inner.map(lambda e: f"absent({e})"),
        )

    leaves = st.one_of(
        selector(), NUMBERS, st.tuples(NUMBERS, st.sampled_from(["-", "+", ""]), NAMES).map("".join), literal()
    )
    return st.recursive(leaves, extend, max_leaves=6)


HOSTILE = [
    "0x0e-kube_secret_info",
    "0x0e - kube_secret_info",
    "1e3-x",
    "x{a='1'} + 0x1f-e",
    "sum(x) + count",
    "x offset -1m",
    "x @ end() offset 5m",
    "x[5m:]",
    "max_over_time(x[5m:1m] @ start())",
    'x{a="q\\"}"}',
    "x # }\n + y",
    "vector(1) or on() kube_secret_info",
    'x{a="é", b=`raw"`}',
    "start",
    "x + start()",
]


def test_the_cases_written_out_read_alike(prometheus_url: str) -> None:
    tally = Tally()
    for query in HOSTILE + [for_checking(q) for q in GOOD] + [for_checking(t) for t, _ in KEYWORD_METRICS]:
        tally.judge(prometheus_url, query)
    for template, _ in ESCAPES:
        if "{{ nope }}" not in template and SENTINEL_LABEL not in template:
            tally.judge(prometheus_url, for_checking(template))
    assert not tally.disagreements, "\n".join(tally.disagreements)
    # Every good template parses for both; `x + start()` is the one promql-parser takes and Prometheus 2.42 does not.
    assert tally.only_ours == ["x + start()"], tally.only_ours
    assert tally.only_prometheus == [], tally.only_prometheus


def test_a_keyword_metric_is_a_selector_of_every_namespace_to_prometheus_and_refused(prometheus_url: str) -> None:
    for template, keyword in KEYWORD_METRICS:
        printed, why = prometheus_parse(prometheus_url, for_checking(template))
        assert printed is not None, why
        assert any(s.name == keyword and not s.matchers for s in vector_selectors(printed)), printed
        assert any(f"the metric {keyword} is selected without" in p for p in selector_problems(template)), template


def test_promql_parser_reads_every_generated_query_as_prometheus_does(
    prometheus_url: str, request: pytest.FixtureRequest
) -> None:
    tally = Tally()

    @fixed_seed(CASES)
    @given(expression())
    def case(query: str) -> None:
        tally.judge(prometheus_url, query)

    case()
    summary = (
        f"promql differential: {tally.cases} generated queries; {tally.both} parsed by both with "
        f"{len(tally.disagreements)} disagreements on their selectors, {tally.refused_by_both} refused by both, "
        f"{len(tally.only_prometheus)} refused by promql-parser alone, {len(tally.only_ours)} by Prometheus 2.42 alone"
    )
    report(request.config, summary)
    print(summary)
    for name, queries in (
        ("promql-parser alone refused", tally.only_prometheus),
        ("Prometheus alone refused", tally.only_ours),
    ):
        print(f"{name}, the first few: {queries[:5]!r}")
    assert not tally.disagreements, "\n".join(tally.disagreements[:20])
    assert tally.both > CASES // 10, summary  # the generator reaches queries both take

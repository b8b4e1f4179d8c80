"""The Prometheus provider: the queries it builds, the answers it reads from a real Prometheus,
and the errors it turns into Inconclusive instead of exceptions."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis import queries as queries_module
from kvoffload.analysis.evidence import count_above, total
from kvoffload.analysis.measurements import Measurements
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.promhttp import QUERY_CONCURRENCY
from kvoffload.analysis.queries import (
    HISTOGRAM_FIELDS,
    SCOPE_MAX_CHARS,
    WORKLOAD_QUERIES,
    LabelNames,
    build_queries,
    promql_duration,
    scope_matcher,
)
from kvoffload.api import promql
from kvoffload.engines.dialect import confirm_dialect
from kvoffload.engines.vllm.dialect import LEGACY_OFFLOAD, NEWEST, dialect_for
from tests.support import paths
from tests.support.prometheus import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    PrometheusServer,
    SyntheticEngine,
    SyntheticFleet,
    expected_p99,
    expected_quantile,
    require_prometheus,
    scraping,
    synthetic_target,
)

CAPTURE = paths.VLLM_CAPTURE
WINDOW = "10s"

# --- the queries --------------------------------------------------------------


def test_every_query_selects_all_policies_and_groups_by_policy_level_and_config_hash() -> None:
    queries = build_queries("2m", NEWEST)
    assert [q.field for q in queries] == [
        "requests",
        "ttft_p99",
        "itl_p99",
        "ttft_histogram",
        "itl_histogram",
        "kv_usage",
        "prefix_cache_hit_rate",
        "config",
        "finished",
        "http_responses",
        "external_share",
        "tier_hits",
        "tier_chunk_queries",
        "tier_chunk_hits",
        "offload_allocated",
        "load_bytes_per_second",
    ]
    for query in queries:
        assert 'kvoffload_io_policy!=""' in query.expr
        assert "namespace, kvoffload_io_policy, kvoffload_io_level, kvoffload_io_config_hash" in query.expr
        assert "[120s]" in query.expr or query.field in ("config", "offload_allocated")
    ttft = next(q for q in queries if q.field == "ttft_p99").expr
    assert ttft == (
        "histogram_quantile(0.99, sum by (le, namespace, kvoffload_io_policy, kvoffload_io_level, "
        "kvoffload_io_config_hash) "
        '(rate(vllm:time_to_first_token_seconds_bucket{kvoffload_io_policy!=""}[120s])))'
    )
    by = "namespace, kvoffload_io_policy, kvoffload_io_level, kvoffload_io_config_hash"
    fields = {q.field: q.expr for q in queries}
    assert fields["itl_histogram"] == (
        f'sum by (le, {by}) (increase(vllm:inter_token_latency_seconds_bucket{{kvoffload_io_policy!=""}}[120s]))'
    )
    hits = f'sum by ({by}) (increase(vllm:prefix_cache_hits_total{{kvoffload_io_policy!=""}}[120s]))'
    looked_up = f'sum by ({by}) (increase(vllm:prefix_cache_queries_total{{kvoffload_io_policy!=""}}[120s]))'
    assert fields["prefix_cache_hit_rate"] == f"({hits} or {looked_up} * 0) / {looked_up}"


def test_the_workload_flag_adds_its_queries_after_the_usual_ones() -> None:
    plain = build_queries("2m", NEWEST)
    with_workload = build_queries("2m", NEWEST, workload=True)
    assert with_workload[: len(plain)] == plain  # the cycle without the flag is untouched
    added = {q.field: q.expr for q in with_workload[len(plain) :]}
    assert len(added) == WORKLOAD_QUERIES == 8
    by = "namespace, kvoffload_io_policy, kvoffload_io_level, kvoffload_io_config_hash"
    sel = '{kvoffload_io_policy!=""}'
    # Four histograms, one query each: p50, p95 and p99 by histogram_quantile, each series labelled with its quantile.
    for field, name in (
        ("workload.prompt_tokens", "vllm:request_prompt_tokens_bucket"),
        ("workload.ttft", "vllm:time_to_first_token_seconds_bucket"),
        ("workload.itl", "vllm:inter_token_latency_seconds_bucket"),
        ("workload.e2e", "vllm:e2e_request_latency_seconds_bucket"),
    ):
        rates = f"sum by (le, {by}) (rate({name}{sel}[120s]))"
        assert added[field] == (
            f'label_replace(histogram_quantile(0.5, {rates}), "quantile", "0.5", "", "") or '
            f'label_replace(histogram_quantile(0.95, {rates}), "quantile", "0.95", "", "") or '
            f'label_replace(histogram_quantile(0.99, {rates}), "quantile", "0.99", "", "")'
        )
    assert added["workload.running_requests"] == f"avg by ({by}) (avg_over_time(vllm:num_requests_running{sel}[120s]))"
    assert added["workload.prefix_cache_hit_rate"] == (
        f"sum by ({by}) (increase(vllm:prefix_cache_hits_total{sel}[120s])) / "
        f"sum by ({by}) (increase(vllm:prefix_cache_queries_total{sel}[120s]))"
    )
    assert added["workload.kv_usage_max"] == f"max by ({by}) (max_over_time(vllm:kv_cache_usage_perc{sel}[120s]))"
    assert added["workload.preemptions_per_second"] == f"sum by ({by}) (rate(vllm:num_preemptions_total{sel}[120s]))"
    # An older engine's names come from its dialect.
    old = {q.field: q.expr for q in build_queries("2m", dialect_for("0.9.2"), workload=True)}
    assert "vllm:time_per_output_token_seconds_bucket" in old["workload.itl"]
    assert "vllm:gpu_cache_usage_perc" in old["workload.kv_usage_max"]


def test_renamed_labels_and_extra_matchers_reach_every_query() -> None:
    labels = LabelNames(policy="app_policy", level="tier", config_hash="build", namespace="ns")
    for query in build_queries("30s", NEWEST, 'cluster="prod"', labels, workload=True):
        assert 'app_policy!="", cluster="prod"' in query.expr
        assert "ns, app_policy, tier, build" in query.expr
        assert "kvoffload_io" not in query.expr


# spec.prometheus.extraMatchers as a review sent it: a value ending in a backslash, so that pasted into a selector
# the backslash escapes the closing quote and the rest of the text becomes PromQL reading another namespace.
INJECTION = (
    'a="\\", b="}[1m])) or sum by (namespace, kvoffload_io_policy, kvoffload_io_level, kvoffload_io_config_hash) '
    '(label_replace(vllm:time_to_first_token_seconds_count{namespace=`victim`}, `namespace`, `mine`, ``, ``)) #"'
)


def test_extra_matchers_that_would_break_out_of_their_string_are_refused_not_pasted() -> None:
    assert INJECTION.startswith('a="\\", b="')  # a=, a one-backslash value, then the payload
    with pytest.raises(promql.TemplateError):
        build_queries("2m", NEWEST, INJECTION)
    # The same text as an honest value (escaped): it stays inside one string literal of every selector.
    payload = INJECTION.split('b="', 1)[1][:-1]
    honest = f"b={promql.escape_label_value(payload)}"
    plain = build_queries("2m", NEWEST, 'b="x"', workload=True)
    for query, base in zip(build_queries("2m", NEWEST, honest, workload=True), plain, strict=True):
        # Read by PromQL's grammar (promql-parser): exactly the operator's vector selectors, each with the payload
        # as one decoded value.
        selectors = promql.vector_selectors(query.expr)
        assert len(selectors) == len(promql.vector_selectors(base.expr))
        wanted = (("kvoffload_io_policy", "!=", ""), ("b", "=", payload))
        assert all(sel.matchers[:2] == wanted for sel in selectors), selectors
        assert "victim" not in query.expr.replace(promql.escape_label_value(payload), "")  # only inside its literal
        assert "label_replace" not in query.expr.replace(promql.escape_label_value(payload), "") or (
            query.field.startswith("workload.")  # the workload quantiles label their series themselves
        )


def test_older_dialects_use_their_own_names_and_skip_what_they_lack() -> None:
    old = dialect_for("0.9.2")
    fields = {q.field: q.expr for q in build_queries("2m", old)}
    assert "vllm:time_per_output_token_seconds_bucket" in fields["itl_p99"]
    assert "vllm:gpu_cache_usage_perc" in fields["kv_usage"]
    assert "external_share" not in fields
    assert "tier_hits" not in fields
    legacy = {q.field: q.expr for q in build_queries("2m", replace(NEWEST, offload=LEGACY_OFFLOAD))}
    assert 'transfer_type="CPU_to_GPU"' in legacy["load_bytes_per_second"]


def test_every_series_the_queries_read_exists_in_a_real_vllm_capture() -> None:
    present: set[str] = set()
    for family in text_string_to_metric_families(CAPTURE.read_text()):
        present.update(sample.name for sample in family.samples)
    # Offload series exist only with offloading on, which vLLM for CPU refuses: checked against the dialect instead.
    offload = {*NEWEST.offload_families(), *NEWEST.tiering_families()}
    for query in build_queries("2m", NEWEST, workload=True):
        for name in re.findall(r"(vllm:[a-z_:]+)\{", query.expr):
            assert name in present or name in offload, f"{name} ({query.field}) is not in the vLLM 0.32 capture"
    # The one series of the API server's that a query reads (the error gate's HTTP count).
    assert f"{NEWEST.http_requests}" in present
    assert any(NEWEST.http_requests in q.expr for q in build_queries("2m", NEWEST))


def test_a_batch_is_scoped_to_its_own_namespaces_and_policies_and_a_too_large_one_asks_fleet_wide() -> None:
    assert scope_matcher([("llm", "chat")]) == 'namespace="llm", kvoffload_io_policy="chat"'
    # Dots are the one regex metacharacter a Kubernetes name can hold; a raw string keeps one backslash.
    assert scope_matcher([("llm", "chat"), ("other", "chat.v2"), ("llm", "code")]) == (
        "namespace=~`llm|other`, kvoffload_io_policy=~`chat|chat\\.v2|code`"
    )
    renamed = LabelNames(policy="app_policy", namespace="ns")
    assert scope_matcher([("a", "p")], renamed) == 'ns="a", app_policy="p"'
    assert scope_matcher([]) is None
    many = [("llm", f"policy-{i:04d}") for i in range(1000)]
    assert scope_matcher(many) is None  # most of a fleet: one fleet-wide answer is cheaper than naming it
    fits = many[: SCOPE_MAX_CHARS // 20]
    matcher = scope_matcher(fits)
    assert matcher is not None
    for query in build_queries("2m", NEWEST, 'cluster="prod"', workload=True, scope=matcher):
        assert f'{{{matcher}, cluster="prod"' in query.expr
        assert 'kvoffload_io_policy!=""' not in query.expr


@pytest.mark.parametrize(("window", "promql"), [("2m", "120s"), ("1m30s", "90s"), ("1500ms", "1500ms"), (10, "10s")])
def test_windows_become_single_unit_promql_durations(window: str | int, promql: str) -> None:
    assert promql_duration(window) == promql


# --- errors become Inconclusive, never exceptions -------------------------------


class _Canned(BaseHTTPRequestHandler):
    status = 200
    body = b""
    hang = False
    location = ""
    seen_headers: list[dict[str, str]] = []  # noqa: RUF012

    def do_GET(self) -> None:
        type(self).seen_headers.append(dict(self.headers))
        if self.hang:
            threading.Event().wait(5)  # longer than the provider's timeout
            return
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def serve(**attrs: object) -> tuple[ThreadingHTTPServer, str]:
    handler = type("Handler", (_Canned,), {**attrs, "seen_headers": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure_one(provider: PrometheusProvider) -> Measurements:
    return provider.measure([synthetic_target("llm", "chat", WINDOW)])[("llm", "chat")]


def test_a_refused_connection_gives_an_error_not_an_exception(closed_port: int) -> None:
    result = measure_one(PrometheusProvider(f"http://127.0.0.1:{closed_port}", retries=0))
    assert result.error is not None
    assert "unreachable" in result.error


@pytest.mark.parametrize(
    ("case", "attrs", "expected"),
    [
        ("HTTP 500", {"status": 500, "body": b'{"status":"error"}'}, "answered with an error"),
        ("HTTP 503", {"status": 503, "body": b"overloaded"}, "answered with an error"),
        ("bad JSON", {"status": 200, "body": b"<html>proxy login</html>"}, "not understood"),
        ("JSON without data", {"status": 200, "body": b'{"status":"success"}'}, "not understood"),
        ("a scalar answer", {"status": 200, "body": b'{"data":{"result":"1"}}'}, "not understood"),
        ("a timeout", {"hang": True}, "timed out"),
    ],
)
def test_a_broken_answer_gives_an_error(case: str, attrs: dict[str, object], expected: str) -> None:
    server, url = serve(**attrs)
    try:
        result = measure_one(PrometheusProvider(url, timeout=0.5, retries=0))
    finally:
        server.shutdown()
    assert result.error is not None, case
    assert expected in result.error, result.error
    assert result.canary is None
    assert result.stable is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"status":"success"}',  # KeyError in the client
        b'{"status":"success","data":{}}',
        b'{"status":"success","data":null}',  # TypeError
        b'{"status":"success","data":["result"]}',
        b'{"status":"success","data":{"result":"1"}}',
        b"[]",
    ],
)
def test_instant_reports_an_answer_without_a_result_as_no_answer_never_raises(body: bytes) -> None:
    server, url = serve(status=200, body=body)
    try:
        answers = PrometheusProvider(url, timeout=2, retries=0).instant(["sum(x)", "max(y)"])
    finally:
        server.shutdown()
    assert len(answers) == 2
    for answer in answers:
        assert isinstance(answer, str), answer
        assert "not understood" in answer


def test_bucket_counts_are_read_by_bound_and_a_series_without_a_bound_or_a_count_is_left_out() -> None:
    canary = {"namespace": "llm", "kvoffload_io_policy": "chat", "kvoffload_io_config_hash": "canary"}
    series = [
        ({"le": "+Inf", "kvoffload_io_level": "2"}, "12"),
        ({"le": "0.5", "kvoffload_io_level": "2"}, "7"),
        ({"le": "+Inf", "kvoffload_io_level": "1"}, "3"),  # an older level of the same config: the same variant
        ({"le": "0.1", "kvoffload_io_level": "2"}, "NaN"),
        ({"le": "fast", "kvoffload_io_level": "2"}, "5"),
        ({"kvoffload_io_level": "2"}, "4"),
    ]
    result = [{"metric": {**canary, **labels}, "value": [0, count]} for labels, count in series]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    server, url = serve(status=200, body=body)  # every query gets this answer
    try:
        got = measure_one(PrometheusProvider(url, retries=0))
    finally:
        server.shutdown()
    assert got.error is None
    assert got.canary is not None
    assert got.canary.ttft_histogram == got.canary.itl_histogram == ((0.5, 7.0), (math.inf, 15.0))


class _Recording(_Canned):
    paths: list[str] = []  # noqa: RUF012

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        super().do_GET()


def test_hostile_extra_matchers_reach_no_query_and_give_an_error() -> None:
    answer = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    handler = type("Handler", (_Recording,), {"body": answer, "seen_headers": [], "paths": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = PrometheusProvider(f"http://127.0.0.1:{server.server_address[1]}", retries=0)
        target = synthetic_target("llm", "chat", WINDOW, extra_matchers=INJECTION)
        result = provider.measure([target])[target.key]
        assert result.error is not None
        assert "extraMatchers" in result.error
        assert provider.present_metric_names(target) == frozenset()
        assert handler.paths == []  # nothing of it was sent
        # An honest extra matcher is written again, escaped, into the series lookup as into the queries.
        provider.present_metric_names(replace(target, extra_matchers='cluster = "a\\\\"'))
    finally:
        server.shutdown()
    (path,) = handler.paths
    match = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["match[]"]
    assert match == ['{__name__=~".+:.+", namespace="llm", kvoffload_io_policy="chat", cluster="a\\\\"}']


class _Slow(_Canned):
    """Answers every query after 0.5 s, and notes how many were in flight at once."""

    lock = threading.Lock()
    in_flight = 0
    most = 0

    def do_GET(self) -> None:
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
        threading.Event().wait(0.5)  # long enough for the four to overlap on a busy machine
        with cls.lock:
            cls.in_flight -= 1
        super().do_GET()


def test_the_queries_of_a_batch_are_in_flight_together_and_each_is_counted() -> None:
    answer = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    handler = type("Handler", (_Slow,), {"body": answer, "seen_headers": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = PrometheusProvider(f"http://127.0.0.1:{server.server_address[1]}")
        result = measure_one(provider)
    finally:
        server.shutdown()
    assert result.error is None
    assert provider.queries == len(handler.seen_headers) > QUERY_CONCURRENCY  # each one sent, and counted
    assert handler.most == QUERY_CONCURRENCY


def test_a_redirect_is_not_followed_so_no_query_reaches_an_address_nobody_judged() -> None:
    """A tenant's Prometheus answering 302 to the metadata service (here: another local server) gets an error
    for its policy; the place it points to receives nothing, token or not."""
    target, target_url = serve(status=200, body=b'{"status":"success","data":{"resultType":"vector","result":[]}}')
    for status in (301, 302, 307, 308):
        redirector, url = serve(status=status, location=f"{target_url}/api/v1/query")
        try:
            result = measure_one(PrometheusProvider(url, bearer_token="operator-s3cret", retries=0))
        finally:
            redirector.shutdown()
        assert result.error is not None, status
        assert redirector.RequestHandlerClass.seen_headers, status  # type: ignore[attr-defined]
    target.shutdown()
    assert target.RequestHandlerClass.seen_headers == []  # type: ignore[attr-defined]


def test_the_bearer_token_is_sent_and_a_token_file_is_reread(tmp_path: Path) -> None:
    server, url = serve(status=200, body=b'{"status":"success","data":{"resultType":"vector","result":[]}}')
    token = tmp_path / "token"
    token.write_text("first\n")
    try:
        provider = PrometheusProvider(url, bearer_token_file=token)
        measure_one(provider)
        token.write_text("rotated")
        result = measure_one(provider)
    finally:
        server.shutdown()
    seen = {h.get("Authorization") for h in server.RequestHandlerClass.seen_headers}  # type: ignore[attr-defined]
    assert seen == {"Bearer first", "Bearer rotated"}
    assert result.error is None
    assert result.canary is not None
    assert result.canary.requests is None


# --- against the real Prometheus ------------------------------------------------

CHAT_CANARY = SyntheticEngine(
    "chat",
    "canary",
    requests_per_s=10,
    ttft_s=0.3,
    itl_s=0.03,
    external_share=0.25,
    host_tokens_per_s=200,
    disk_tokens_per_s=50,
    kv_usage=0.7,
    failed_share=0.05,
    load_bytes_per_s=1e9,
    offloading_size="32.0",
    prefix_hit_rate=0.1,
)
CHAT_STABLE = SyntheticEngine(
    "chat", "stable", requests_per_s=20, ttft_s=0.1, itl_s=0.02, kv_usage=0.4, prefix_hit_rate=0.5
)
# A GPU-only fleet in its baseline, with a workload whose every figure is known.
WARM_STABLE = SyntheticEngine(
    "warm",
    "stable",
    requests_per_s=10,
    ttft_s=0.2,
    itl_s=0.02,
    e2e_s=1.2,
    prompt_lengths=((800.0, 0.6), (1500.0, 0.4)),
    running=6.5,
    prompt_tokens_per_s=4000,
    prefix_hit_rate=0.3,
    preemptions_per_s=0.5,
    kv_usage=0.4,
    kv_usage_peak=0.93,
)
FLEET = [
    CHAT_CANARY,
    CHAT_STABLE,
    WARM_STABLE,
    SyntheticEngine("chat", "stable", namespace="other", requests_per_s=5, ttft_s=2.0),
    SyntheticEngine("code", "canary", requests_per_s=3),
    SyntheticEngine("code", "stable", requests_per_s=3),
]


@pytest.fixture(scope="module")
def scraped_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    with scraping(FLEET, tmp_path_factory.mktemp("prometheus"), WINDOW) as server:
        yield server


@pytest.mark.prometheus
def test_the_provider_reads_each_variant_of_each_policy(scraped_fleet: PrometheusServer) -> None:
    provider = PrometheusProvider(scraped_fleet.url)
    got = provider.measure(
        [synthetic_target("llm", "chat", WINDOW), synthetic_target("other", "chat", WINDOW, with_canary=False)]
    )

    chat = got[("llm", "chat")]
    assert chat.error is None
    assert chat.canary is not None
    assert chat.stable is not None
    canary, stable = chat.canary, chat.stable
    assert canary.requests == pytest.approx(100, rel=0.15)
    assert canary.request_rate == pytest.approx(10, rel=0.15)
    assert stable.requests == pytest.approx(200, rel=0.15)
    assert canary.ttft_p99 == pytest.approx(expected_p99(0.3, TTFT_BUCKETS), rel=0.01)
    assert stable.ttft_p99 == pytest.approx(expected_p99(0.1, TTFT_BUCKETS), rel=0.01)
    assert canary.itl_p99 == pytest.approx(expected_p99(0.03, ITL_BUCKETS), rel=0.01)
    assert canary.external_share == pytest.approx(0.25, rel=0.01)
    assert stable.external_share == 0.0
    assert canary.tier_hits["host"] == pytest.approx(200 * 10, rel=0.15)
    assert canary.tier_hits["disk"] == pytest.approx(50 * 10, rel=0.15)
    assert set(canary.tier_hits) == {"host", "disk"}
    assert stable.tier_hits == {"host": 0.0, "disk": 0.0}
    assert canary.kv_usage == pytest.approx(0.7)
    # The error gate's counts: every finished request by its reason, failed ones among them.
    assert set(canary.finished) == {"stop", "length", "abort", "error"}
    assert canary.finished["error"] == pytest.approx(100 * 0.05, rel=0.15)
    assert canary.finished["error"] / sum(canary.finished.values()) == pytest.approx(0.05, rel=0.01)
    assert stable.finished["error"] == 0.0
    assert sum(stable.finished.values()) == pytest.approx(200, rel=0.15)
    assert set(canary.http_responses) == {"2xx", "5xx"}  # summed over handlers: /v1/models' GETs are 2xx
    assert canary.http_responses["5xx"] == pytest.approx(100 * 0.05, rel=0.15)
    assert canary.http_responses["2xx"] == pytest.approx(100 * 0.95 + 10, rel=0.15)
    assert canary.load_bytes_per_second == pytest.approx(12.6e9, rel=0.01)
    assert stable.load_bytes_per_second is None  # no offload counters on a GPU-only engine
    assert canary.config == {"kv_offloading_size": "32.0", "kv_offloading_backend": "native"}
    assert stable.config == {"kv_offloading_size": "None", "kv_offloading_backend": "native"}

    other = got[("other", "chat")]  # same policy name, another namespace: kept apart
    assert other.canary is None
    assert other.stable is not None
    assert other.stable.ttft_p99 == pytest.approx(expected_p99(2.0, TTFT_BUCKETS), rel=0.01)


@pytest.mark.prometheus
def test_the_provider_reads_each_variants_bucket_counts_and_gpu_prefix_cache_hit_rate(
    scraped_fleet: PrometheusServer,
) -> None:
    at = time.time()  # one instant for every query: the buckets and the p99s read the same window
    provider = PrometheusProvider(scraped_fleet.url, clock=lambda: at)
    got = provider.measure(
        [synthetic_target("llm", "chat", WINDOW), synthetic_target("llm", "warm", WINDOW, with_canary=False)]
    )
    chat, warm = got[("llm", "chat")], got[("llm", "warm")]
    assert chat.canary is not None
    assert chat.stable is not None
    assert warm.stable is not None
    for sample, engine in ((chat.canary, CHAT_CANARY), (chat.stable, CHAT_STABLE), (warm.stable, WARM_STABLE)):
        requests_seen = sample.requests
        assert requests_seen is not None
        for histogram, bounds, value, p99 in (
            (sample.ttft_histogram, TTFT_BUCKETS, engine.ttft_s, sample.ttft_p99),
            (sample.itl_histogram, ITL_BUCKETS, engine.itl_s, sample.itl_p99),
        ):
            edges = (*bounds, math.inf)
            assert [bound for bound, _ in histogram] == list(edges)
            # Cumulative: every request (the synthetic engine observes one ITL a request) from the bucket that holds
            # its latency up, the +Inf bucket among them.
            expected = [requests_seen if value <= bound else 0.0 for bound in edges]
            assert [count for _, count in histogram] == pytest.approx(expected, rel=1e-9)
            assert total(histogram) == pytest.approx(requests_seen, rel=1e-9)
            # Read through the buckets as histogram_quantile reads them, 1 % of the requests lie over its p99.
            assert p99 is not None
            assert count_above(histogram, p99) == pytest.approx(0.01 * requests_seen, rel=1e-6)
        assert sample.prefix_cache_hit_rate == pytest.approx(engine.prefix_hit_rate, rel=0.01)
    assert chat.canary.prefix_cache_hit_rate < chat.stable.prefix_cache_hit_rate  # a cold canary shows as one


@pytest.mark.prometheus
def test_a_baseline_target_gets_the_workload_figures_of_a_known_workload(scraped_fleet: PrometheusServer) -> None:
    provider = PrometheusProvider(scraped_fleet.url)
    provider.measure([synthetic_target("llm", "warm", WINDOW, with_canary=False)])
    plain = provider.series
    got = provider.measure([synthetic_target("llm", "warm", WINDOW, with_canary=False, workload=True)])[("llm", "warm")]
    # Three series a histogram, not one a bucket (10 to 23 of them): what a fleet-wide baseline decodes at once.
    assert provider.series - 2 * plain == len(HISTOGRAM_FIELDS) * 3 + (WORKLOAD_QUERIES - len(HISTOGRAM_FIELDS))

    assert got.error is None
    assert got.stable is not None
    w = got.stable.workload
    assert w is not None
    # 60% of prompts at 800 tokens (bucket 500-1000), 40% at 1,500 (bucket 1000-2000)
    assert w.prompt_tokens.p50 == pytest.approx(500 + 500 * 0.5 / 0.6, rel=0.01)
    assert w.prompt_tokens.p95 == pytest.approx(1000 + 1000 * 0.35 / 0.4, rel=0.01)
    assert w.prompt_tokens.p99 == pytest.approx(1000 + 1000 * 0.39 / 0.4, rel=0.01)
    for q, value in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        assert getattr(w.ttft, value) == pytest.approx(expected_quantile(q, 0.2, TTFT_BUCKETS), rel=0.01)
        assert getattr(w.itl, value) == pytest.approx(expected_quantile(q, 0.02, ITL_BUCKETS), rel=0.01)
        assert getattr(w.e2e, value) == pytest.approx(expected_quantile(q, 1.2, E2E_BUCKETS), rel=0.01)
    assert w.running_requests == pytest.approx(6.5)
    assert w.prefix_cache_hit_rate == pytest.approx(0.3, rel=0.01)
    assert w.preemptions_per_second == pytest.approx(0.5, rel=0.15)
    assert w.kv_usage_max == pytest.approx(0.93)  # the peak, not the 0.4 most scrapes show...
    assert got.stable.kv_usage is not None
    assert 0.4 < got.stable.kv_usage < 0.93  # ...which the average blurs
    assert got.stable.ttft_p99 == pytest.approx(w.ttft.p99, rel=1e-6)  # the guard's p99 and the workload's agree


@pytest.mark.prometheus
def test_workload_quantiles_equal_prometheus_histogram_quantile(scraped_fleet: PrometheusServer) -> None:
    at = time.time()  # one instant for both, so the windows are the same
    provider = PrometheusProvider(scraped_fleet.url, clock=lambda: at)
    w = provider.measure([synthetic_target("llm", "warm", WINDOW, with_canary=False, workload=True)])[("llm", "warm")]
    assert w.stable is not None
    assert w.stable.workload is not None
    for name, figures in (
        ("vllm:request_prompt_tokens_bucket", w.stable.workload.prompt_tokens),
        ("vllm:e2e_request_latency_seconds_bucket", w.stable.workload.e2e),
    ):
        for q, value in ((0.5, figures.p50), (0.95, figures.p95), (0.99, figures.p99)):
            expr = (
                f"histogram_quantile({q}, sum by (le) "
                f'(rate({name}{{kvoffload_io_policy="warm", namespace="llm"}}[{WINDOW}])))'
            )
            answer = requests.get(f"{scraped_fleet.url}/api/v1/query", params={"query": expr, "time": at}, timeout=10)
            (result,) = answer.json()["data"]["result"]
            assert value == pytest.approx(float(result["value"][1]), rel=1e-9), (name, q)


@pytest.mark.prometheus
def test_the_workload_queries_are_sent_once_per_group_and_only_when_asked(scraped_fleet: PrometheusServer) -> None:
    provider = PrometheusProvider(scraped_fleet.url)
    plain = len(build_queries(WINDOW, NEWEST))

    provider.measure([synthetic_target("llm", "chat", WINDOW), synthetic_target("llm", "code", WINDOW)])
    assert provider.queries == plain  # no target in its baseline: the cycle is what it always was

    before = provider.queries
    got = provider.measure(
        [
            synthetic_target("llm", "chat", WINDOW),
            synthetic_target("llm", "warm", WINDOW, with_canary=False, workload=True),
            synthetic_target("other", "chat", WINDOW, with_canary=False, workload=True),
        ]
    )
    assert provider.queries - before == plain + WORKLOAD_QUERIES  # one workload set for the whole group
    chat = got[("llm", "chat")]
    assert chat.stable is not None
    assert chat.stable.workload is None  # not asked for: not filled in
    other = got[("other", "chat")].stable
    assert other is not None
    assert other.workload is not None
    assert other.workload.running_requests == pytest.approx(4.0)


@pytest.mark.prometheus
def test_a_policy_without_series_has_empty_samples(scraped_fleet: PrometheusServer) -> None:
    result = PrometheusProvider(scraped_fleet.url).measure([synthetic_target("llm", "absent", WINDOW)])[
        ("llm", "absent")
    ]
    assert result.error is None
    assert result.canary is not None
    assert result.canary.requests is None
    assert result.stable is not None
    assert result.stable.ttft_p99 is None
    assert result.stable.ttft_histogram == result.stable.itl_histogram == ()
    assert result.stable.prefix_cache_hit_rate is None


@pytest.mark.prometheus
def test_queries_per_cycle_do_not_grow_with_the_number_of_policies(scraped_fleet: PrometheusServer) -> None:
    provider = PrometheusProvider(scraped_fleet.url)
    provider.measure([synthetic_target("llm", "chat", WINDOW)])
    one = provider.queries
    provider.measure(
        [
            synthetic_target("llm", "chat", WINDOW),
            synthetic_target("llm", "code", WINDOW),
            synthetic_target("other", "chat", WINDOW),
        ]
    )
    three = provider.queries - one
    assert one == three == len(build_queries(WINDOW, NEWEST))

    before = provider.queries
    provider.measure([synthetic_target("llm", "chat", WINDOW), synthetic_target("llm", "code", "20s")])
    assert provider.queries - before == 2 * one  # one set of queries per distinct window


@pytest.mark.prometheus
def test_a_scoped_batch_reads_only_its_policies_series_and_measures_what_a_fleet_wide_one_does(
    scraped_fleet: PrometheusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = time.time()
    # Two namespaces and two names: the matcher also selects llm/code and other/chat, which are not asked for.
    batch = [synthetic_target("llm", "chat", WINDOW), synthetic_target("other", "warm", WINDOW, workload=True)]
    scoped = PrometheusProvider(scraped_fleet.url, clock=lambda: at)
    got = scoped.measure(batch)
    monkeypatch.setattr(queries_module, "SCOPE_MAX_CHARS", 0)
    fleet_wide = PrometheusProvider(scraped_fleet.url, clock=lambda: at)
    assert fleet_wide.measure(batch) == got
    assert got[("llm", "chat")].canary is not None
    assert got[("llm", "chat")].canary.requests == pytest.approx(100, rel=0.15)
    assert scoped.queries == fleet_wide.queries
    assert 0 < scoped.series < fleet_wide.series  # llm/warm and both code engines were left in Prometheus


@pytest.mark.prometheus
def test_present_metric_names_confirm_the_dialect(scraped_fleet: PrometheusServer) -> None:
    provider = PrometheusProvider(scraped_fleet.url)
    names = provider.present_metric_names(synthetic_target("llm", "chat", WINDOW))
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "vllm:inter_token_latency_seconds_count" in names
    assert not any(n.startswith("up") for n in names)
    # An image tag that claims 0.10 is corrected to the names the engines really export.
    confirmed = confirm_dialect(dialect_for("0.10.0"), set(names))
    assert confirmed.itl == "vllm:inter_token_latency_seconds"
    assert provider.present_metric_names(synthetic_target("llm", "absent", WINDOW)) == frozenset()


@pytest.mark.prometheus
def test_a_stopped_prometheus_gives_an_error(tmp_path: Path) -> None:
    require_prometheus()
    server = PrometheusServer(tmp_path)
    server.start()
    provider = PrometheusProvider(server.url, retries=0, timeout=2)
    assert measure_one(provider).error is None
    server.stop()
    result = measure_one(provider)
    assert result.error is not None
    assert "unreachable" in result.error
    assert provider.present_metric_names() == frozenset()


def test_the_synthetic_fleet_stops_serving_a_variant_whose_pods_went() -> None:
    fleet = SyntheticFleet(FLEET[4:])  # code: canary and stable
    try:
        served = fleet.series
        gone = fleet.stop_serving("stable")
        text = fleet.exposition()
    finally:
        fleet.close()
    assert 0 < gone < served
    assert 'pod="code-stable-0"' not in text
    assert text.count('pod="code-canary-0"') == fleet.series == served - gone


def test_a_token_that_is_no_header_value_is_never_echoed_into_the_error() -> None:
    # Issue 33: a multi-line Secret value went into status through requests' InvalidHeader message.
    server, url = serve(status=200, body=b'{"status":"success","data":{"resultType":"vector","result":[]}}')
    try:
        result = measure_one(PrometheusProvider(url, bearer_token="s3cret-line-one\nline-two", retries=0))
    finally:
        server.shutdown()
    assert result.error is not None
    assert "s3cret" not in result.error
    assert "line-two" not in result.error
    assert "not a valid HTTP header value" in result.error
    assert result.error.isprintable()


def test_an_error_body_reaches_the_error_bounded_and_printable() -> None:
    body = b'{"status":"error","errorType":"internal","error":"' + b"x\\n\\u001b[31m" * 20_000 + b'"}'
    server, url = serve(status=500, body=body)
    try:
        result = measure_one(PrometheusProvider(url, retries=0))
    finally:
        server.shutdown()
    assert result.error is not None
    assert len(result.error) <= 300
    assert result.error.isprintable()

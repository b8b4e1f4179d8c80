"""The Prometheus provider: one cycle's measurements for every policy, in a fixed number of queries.

The queries it sends are built in ``analysis/queries.py``, and each is sent within the bounds of
``analysis/promhttp.py``; the answers are decoded here.

The provider never raises into its callers: connection errors, timeouts, HTTP
errors and unreadable answers become ``Measurements(error=...)``, which
``assess()`` turns into Inconclusive.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import requests
from urllib3.exceptions import InsecureRequestWarning
from urllib3.util.retry import Retry

from kvoffload.analysis.evidence import Histogram
from kvoffload.analysis.measurements import WORKLOAD_QUANTILES, Measurements, Percentiles, VariantSample, WorkloadSample
from kvoffload.analysis.payoff import SubWindow
from kvoffload.analysis.promhttp import (
    _BODIES,
    _DEADLINES,
    MAX_ANSWER_BYTES,
    MAX_ANSWER_SERIES,
    MAX_ERROR_BYTES,
    QUERY_CONCURRENCY,
    RETRY_STATUSES,
    AnswerTooLarge,
    Connection,
    PrometheusHTTPError,
    QueryDeadlineExceeded,
    _BoundedAdapter,
    _Call,
    _current,
    _describe,
    _in_turn,
    _mib,
    _read_capped,
    query_pool,
)
from kvoffload.analysis.queries import (
    BUCKET_FIELDS,
    HISTOGRAM_FIELDS,
    MAX_PAYOFF_POINTS,
    PAYOFF_LABEL,
    PAYOFF_SERIES,
    QUANTILE_LABEL,
    LabelNames,
    PolicyKey,
    Query,
    Target,
    build_queries,
    fleet_matcher,
    payoff_query,
    promql_duration,
    scope_matcher,
)
from kvoffload.api.promql import escape_label_value, render_matchers
from kvoffload.api.quantity import parse_duration
from kvoffload.engines.dialect import (
    LABEL_CPU_NUM_CHUNKS,
    LABEL_CPU_SIZE_BYTES,
    LABEL_FINISHED_REASON,
    LABEL_HTTP_STATUS,
    LABEL_OFFLOADING_BACKEND,
    LABEL_OFFLOADING_SIZE,
    LABEL_TIER,
    Dialect,
)

log = logging.getLogger(__name__)


class MetricsProvider(Protocol):
    """Where analysis gets its evidence; the operator and ``kvoffload analyze`` depend only on this."""

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        """Measurements for every target, keyed by (namespace, policy); never raises."""
        ...

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        """The vLLM series names Prometheus holds (for a target's engines, or all); empty on error."""
        ...


def _value(item: Mapping[str, Any]) -> float | None:
    number = float(item["value"][1])
    return None if math.isnan(number) or math.isinf(number) else number


@dataclass
class _Collected:
    """Per (namespace, policy, variant): the fields read so far."""

    values: dict[str, float | None] = field(default_factory=dict)
    tier_hits: dict[str, float] = field(default_factory=dict)
    tier_chunk_queries: dict[str, float] = field(default_factory=dict)
    tier_chunk_hits: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    http_responses: dict[str, float] = field(default_factory=dict)
    allocated: list[dict[str, str]] = field(default_factory=list)
    config: dict[str, set[str]] = field(default_factory=dict)
    quantiles: dict[str, dict[float, float | None]] = field(default_factory=dict)
    """Per histogram field: each quantile's value (None where Prometheus answered NaN)."""
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    """Per ``BUCKET_FIELDS`` field: each bucket's upper bound and its count."""


def _bound(le: object) -> float | None:
    """A bucket's ``le`` as a number (``+Inf`` is ``inf``); None for a series without one, or with one not a number."""
    if not isinstance(le, str):
        return None
    try:
        bound = float(le)
    except ValueError:  # an exporter's label, not Prometheus's: one odd series must not fail the batch
        return None
    return None if math.isnan(bound) else bound


def _histogram(counts: Mapping[float, float] | None) -> Histogram:
    return tuple(sorted(counts.items())) if counts else ()


class PrometheusProvider:
    """Measurements from Prometheus over its HTTP API, every request bounded (issue 33): a total deadline per query,
    a cap on what of a body is read, errors included, and threads from the process's query pool."""

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        bearer_token_file: Path | None = None,
        verify: bool | str = True,
        connection: Connection | None = None,
        timeout: float = 10.0,
        retries: int = 1,
        labels: LabelNames | None = None,
        clock: Any = time.time,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_error_bytes: int = MAX_ERROR_BYTES,
        max_answer_series: int = MAX_ANSWER_SERIES,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        """``verify``: True, False (skip TLS verification) or a CA bundle path; a ``connection`` decides it instead.

        ``bearer_token_file`` is re-read every cycle, so a rotated service-account token is picked up. A
        ``connection``'s headers go with every query, and its basic auth with every query that carries no bearer
        token (both would be the Authorization header).

        ``timeout`` is each query's total deadline: connecting, the headers, the whole body and any retry, not one
        read. ``pool``: the threads that send the queries (the process's ``query_pool()`` unless given).
        """
        self.url = url.rstrip("/")
        self.labels = labels or LabelNames()
        self.queries = 0
        """HTTP queries sent so far (tests and the bench check that a cycle's count is constant)."""
        self.series = 0
        """Series read from the answers so far (what a batch's scope saves shows here)."""
        self.timeout = timeout
        self.retries = retries
        self.max_answer_bytes = max_answer_bytes
        self.max_error_bytes = max_error_bytes
        self.max_answer_series = max_answer_series
        self.closed = False
        self._token = bearer_token
        self._token_file = bearer_token_file
        self._clock = clock
        self._connection = connection or Connection()
        self._headers: dict[str, str] = {}
        self._auth: tuple[str, str] | None = None
        self._pool = pool or query_pool()
        if connection is not None:
            verify = connection.verify
        if verify is False:
            log.warning("TLS verification of Prometheus at %s is OFF (opted in): anyone on the path can answer", url)
            warnings.simplefilter("ignore", InsecureRequestWarning)  # said once above, not on every query
        session = requests.Session()
        session.verify = verify
        # A redirect would take the operator's query (a tenant's URL) to an address nobody judged; requests is also
        # never let to follow one, as it would read the redirect's whole body first.
        session.max_redirects = 0
        # Connection errors are retried here; statuses by _get, which closes an error answer instead of draining it.
        retry = Retry(total=retries, backoff_factor=0.1, status_forcelist=(), respect_retry_after_header=False)
        # A bounded pool: no more kept-alive connections than queries in flight.
        adapter = _BoundedAdapter(pool_connections=1, pool_maxsize=QUERY_CONCURRENCY, max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        self._session = session

    def close(self) -> None:
        """Close its kept-alive connections (a connection in use closes when its query ends); the pool's threads are
        the process's, not its own."""
        self.closed = True
        self._session.close()

    def _authenticate(self) -> None:
        """Set this batch's headers and basic auth (files are read again: rotated Secrets)."""
        token = self._token
        if self._token_file is not None:
            token = self._token_file.read_text().strip()
        headers = dict(self._connection.headers)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._headers = headers
        conn = self._connection
        if conn.username is not None and conn.password_file is not None and not token:
            self._auth = (conn.username, conn.password_file.read_text().rstrip("\r\n"))
        else:
            self._auth = None

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        """The ``data`` of one API answer, within the deadline and the caps; raises ``requests.RequestException``
        (this module's included), ``ValueError``, ``KeyError`` or ``TypeError``."""
        call = _Call(time.monotonic() + self.timeout)
        _DEADLINES.watch(call)
        _current.call = call
        try:
            try:
                body = self._fetch(call, path, params)
            except QueryDeadlineExceeded:
                raise
            except Exception:
                if call.expired:  # the deadline cut the socket: whatever broke, that is why
                    raise QueryDeadlineExceeded(self._overdue()) from None
                raise
            finally:
                _current.call = None
                call.finish()
            if call.expired:  # the body may have been cut short
                raise QueryDeadlineExceeded(self._overdue())
            # Each series is one "metric" key (one inside a label value would be escaped): counted before decoding,
            # as a body of tiny series decodes to some 12 times its size.
            if body.count(b'"metric"') > self.max_answer_series:
                raise AnswerTooLarge(f"more than {self.max_answer_series} series")
            return json.loads(body)["data"]
        finally:
            _BODIES.give(call.held)  # the body is decoded, or refused: room for the next query's

    def _overdue(self) -> str:
        return f"no whole answer within the {self.timeout:g} s deadline of a query"

    def _fetch(self, call: _Call, path: str, params: Mapping[str, str]) -> bytearray:
        attempt = 0
        while True:
            left = call.deadline - time.monotonic()
            if left <= 0:
                raise QueryDeadlineExceeded(self._overdue())
            response = self._session.get(
                f"{self.url}{path}",
                params=params,
                headers=self._headers,
                auth=self._auth,
                verify=self._session.verify,  # given, or requests would take $REQUESTS_CA_BUNDLE over the session's
                timeout=left,
                stream=True,  # read below, a chunk at a time, up to a cap
                allow_redirects=False,
            )
            try:
                status = response.status_code
                if status in RETRY_STATUSES and attempt < self.retries:
                    attempt += 1
                    time.sleep(min(0.1 * attempt, max(0.0, call.deadline - time.monotonic())))
                    continue
                if status != 200:
                    body, _ = _read_capped(response, self.max_error_bytes, call)
                    raise PrometheusHTTPError(status, bytes(body))
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > self.max_answer_bytes:
                    raise AnswerTooLarge(f"{_mib(int(declared))} declared")
                body, more = _read_capped(response, self.max_answer_bytes, call)
                if more:
                    raise AnswerTooLarge(f"over {_mib(self.max_answer_bytes)}")
                return body
            finally:
                response.close()  # an answer cut short closes its connection; a whole one went back to the pool

    def _query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """One query's answer (the caller counts it and sets the headers: this runs in the query threads)."""
        result = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})["result"]
        if not isinstance(result, list):
            raise ValueError(f"unexpected answer: {str(result)[:200]}")
        return result

    def measure(self, targets: Sequence[Target]) -> dict[PolicyKey, Measurements]:
        """One cycle: the same queries for every group of targets, all evaluated at one instant."""
        at = float(self._clock())
        groups: dict[tuple[str, Dialect, str | None, PolicyKey | None], list[Target]] = defaultdict(list)
        for target in targets:
            # An observed fleet is selected by its pods, not by labels it shares with others: a group of its own.
            fleet = target.key if target.pods is not None else None
            groups[(promql_duration(target.window), target.dialect, target.extra_matchers, fleet)].append(target)
        out: dict[PolicyKey, Measurements] = {}
        for (window, dialect, extra, fleet), members in groups.items():
            # One set of workload queries per group, and only when someone in it asks.
            workload = any(t.workload for t in members)
            if fleet is not None:
                scope: str | None = fleet_matcher(members[0], self.labels)
            else:
                scope = scope_matcher([t.key for t in members], self.labels)
            try:
                queries = build_queries(
                    window, dialect, extra, self.labels, workload=workload, scope=scope, fleet=fleet is not None
                )
                collected = self._collect(queries, at)
                payoff = {} if fleet is not None else self._payoff(members, dialect, extra, scope, at)
            except (
                requests.RequestException,
                OSError,
                ValueError,
                KeyError,
                TypeError,
                IndexError,
            ) as exc:
                error = _describe(exc)
                out.update({t.key: Measurements(canary=None, stable=None, error=error) for t in members})
                continue
            window_s = parse_duration(window)
            for t in members:
                if fleet is not None:  # grouped by namespace alone: one sample, both roles
                    stable = _sample(collected.get((t.namespace, "", "")), window_s, t.workload)
                    out[t.key] = Measurements(
                        canary=stable if t.canary_hash is not None else None, stable=stable, no_itl=_no_itl(t)
                    )
                    continue
                stable_key = (t.namespace, t.policy, t.stable_hash or "")
                stable = _sample(collected.get(stable_key), window_s, t.workload, _sub_windows(payoff, t, stable_key))
                canary = None
                if t.canary_hash is not None:
                    canary_key = (t.namespace, t.policy, t.canary_hash)
                    canary = _sample(
                        collected.get(canary_key), window_s, t.workload, _sub_windows(payoff, t, canary_key)
                    )
                out[t.key] = Measurements(canary=canary, stable=stable, no_itl=_no_itl(t))
        return out

    def _payoff(
        self, members: Sequence[Target], dialect: Dialect, extra: str | None, scope: str | None, at: float
    ) -> dict[tuple[float, str, str, str], dict[float, dict[str, float]]]:
        """The live payoff's sub-windows of the group's targets that ask (``Target.payoff_since``): one range query
        per sub-window length, over the longest step asked; (step, namespace, policy, hash) -> end time -> fields.
        Nothing is sent when no target asks."""
        asking = [t for t in members if t.payoff_since is not None and t.canary_hash is not None]
        out: dict[tuple[float, str, str, str], dict[float, dict[str, float]]] = {}
        for step in sorted({t.payoff_step for t in asking}):
            expr = payoff_query(promql_duration(step), dialect, extra, self.labels, scope=scope)
            if expr is None:
                break
            since = min(t.payoff_since or at for t in asking if t.payoff_step == step)
            points = min(MAX_PAYOFF_POINTS, math.floor((at - since) / step))
            if points < 1:
                continue
            # Ending now, a sub-window apart: each point's increase covers the sub-window before it.
            start = at - (points - 1) * step
            self.queries += 1
            params = {"query": expr, "start": f"{start:.3f}", "end": f"{at:.3f}", "step": f"{step:g}"}
            result = self._get("/api/v1/query_range", params)["result"]
            if not isinstance(result, list):
                raise ValueError(f"unexpected answer: {str(result)[:200]}")
            self.series += len(result)
            for item in result:
                metric = item["metric"]
                key = (
                    step,
                    metric.get(self.labels.namespace, ""),
                    metric.get(self.labels.policy, ""),
                    metric.get(self.labels.config_hash, ""),
                )
                which = metric.get(PAYOFF_LABEL, "")
                for when, text in item["values"]:
                    number = float(text)
                    if which in PAYOFF_SERIES and math.isfinite(number):
                        fields = out.setdefault(key, {}).setdefault(float(when), {})
                        # Two levels of one config hash are one variant: their increments add up.
                        fields[which] = fields.get(which, 0.0) + number
        return out

    def _collect(self, queries: Iterable[Query], at: float) -> dict[tuple[str, str, str], _Collected]:
        labels = self.labels
        found: dict[tuple[str, str, str], _Collected] = defaultdict(_Collected)
        queries = list(queries)
        self.queries += len(queries)
        self._authenticate()
        # In order, as each answer comes; the first failure ends the batch, as it did one query at a time.
        answers = _in_turn(self._pool, lambda query: self._query(query.expr, at), queries, QUERY_CONCURRENCY)
        for query, answer in zip(queries, answers, strict=True):
            self.series += len(answer)
            for item in answer:
                metric = item["metric"]
                key = (
                    metric.get(labels.namespace, ""),
                    metric.get(labels.policy, ""),
                    metric.get(labels.config_hash, ""),
                )
                entry = found[key]
                if query.field == "tier_hits":
                    number = _value(item)
                    if number is not None:
                        entry.tier_hits[metric.get("source", "")] = number
                elif query.field in ("finished", "http_responses"):
                    number = _value(item)
                    label = LABEL_FINISHED_REASON if query.field == "finished" else LABEL_HTTP_STATUS
                    if number is not None:
                        getattr(entry, query.field)[metric.get(label, "")] = number
                elif query.field in ("tier_chunk_queries", "tier_chunk_hits"):
                    number = _value(item)
                    if number is not None:
                        getattr(entry, query.field)[metric.get(LABEL_TIER, "")] = number
                elif query.field == "offload_allocated":
                    entry.allocated.append(
                        {
                            k: str(metric.get(k, ""))
                            for k in ("pod", LABEL_TIER, LABEL_CPU_SIZE_BYTES, LABEL_CPU_NUM_CHUNKS)
                        }
                    )
                elif query.field == "config":
                    for name in (LABEL_OFFLOADING_SIZE, LABEL_OFFLOADING_BACKEND):
                        entry.config.setdefault(name, set()).add(metric.get(name, "None"))
                elif query.field in HISTOGRAM_FIELDS:
                    entry.quantiles.setdefault(query.field, {})[float(metric[QUANTILE_LABEL])] = _value(item)
                elif query.field in BUCKET_FIELDS:
                    bound, count = _bound(metric.get("le")), float(item["value"][1])
                    if bound is not None and math.isfinite(count):
                        counts = entry.buckets.setdefault(query.field, {})
                        # Two levels of one config hash are one variant: their buckets add up.
                        counts[bound] = counts.get(bound, 0.0) + count
                else:
                    entry.values[query.field] = _value(item)
        return found

    def instant(self, exprs: Sequence[str]) -> list[list[dict[str, Any]] | str]:
        """Each expression's answer now (custom metrics: ``analysis/customquery.py``), or why there is none, in
        order; never raises. Four in flight at once, like a batch's queries."""
        at = float(self._clock())
        self.queries += len(exprs)

        def one(expr: str) -> list[dict[str, Any]] | str:
            try:
                return self._query(expr, at)
            except (
                requests.RequestException,
                OSError,
                ValueError,
                TypeError,
                KeyError,  # a 200 without data.result
                IndexError,
            ) as exc:
                return _describe(exc)

        try:
            self._authenticate()
        except OSError as exc:
            return [_describe(exc)] * len(exprs)
        return list(_in_turn(self._pool, one, exprs, QUERY_CONCURRENCY))

    def present_metric_names(self, target: Target | None = None) -> frozenset[str]:
        """The engine series names in Prometheus (those namespaced with a colon, as ``vllm:`` and ``sglang:`` are),
        for one target's engines when given; empty on error. ``confirm_dialect`` reads those of its dialect."""
        matcher = '__name__=~".+:.+"'
        if target is not None:
            matcher += (
                f", {self.labels.namespace}={escape_label_value(target.namespace)}"
                f", {self.labels.policy}={escape_label_value(target.policy)}"
            )
        self.queries += 1
        try:
            if target is not None and target.extra_matchers:
                matcher += f", {render_matchers(target.extra_matchers)}"  # TemplateError is a ValueError
            self._authenticate()
            names = self._get("/api/v1/label/__name__/values", {"match[]": "{" + matcher + "}"})
        except (requests.RequestException, OSError, ValueError, KeyError, TypeError):
            return frozenset()
        if not isinstance(names, list):
            return frozenset()
        return frozenset(str(n) for n in names)


def _no_itl(target: Target) -> str | None:
    """Why ``target``'s engines show no inter-token latency, or None when they do."""
    if target.dialect.itl is not None:
        return None
    return f"the {target.dialect.name} series have no inter-token latency"


def _sub_windows(
    payoff: Mapping[tuple[float, str, str, str], Mapping[float, Mapping[str, float]]],
    target: Target,
    key: tuple[str, str, str],
) -> tuple[SubWindow, ...]:
    """One variant's sub-windows wholly after ``target.payoff_since``, oldest first. A missing token source is 0
    (vLLM shows a source from its first token); a sub-window without requests or TTFT is left out."""
    if target.payoff_since is None:
        return ()
    found = payoff.get((target.payoff_step, *key), {})
    rows = []
    for when in sorted(found):
        f = found[when]
        if when - target.payoff_step < target.payoff_since - 1e-3 or "requests" not in f or "ttft_seconds" not in f:
            continue
        local, external = f.get("local_hit", 0.0), f.get("external", 0.0)
        computed = f["computed"] if "computed" in f else max(0.0, f.get("prompt", 0.0) - local - external)
        rows.append(SubWindow(f["requests"], f["ttft_seconds"], computed, local, external))
    return tuple(rows)


def _sample(
    entry: _Collected | None, window_s: float, workload: bool = False, payoff_rows: tuple[SubWindow, ...] = ()
) -> VariantSample:
    if entry is None:
        return VariantSample(workload=WorkloadSample() if workload else None, payoff_rows=payoff_rows)
    v = entry.values
    requests_seen = v.get("requests")
    config = {k: ",".join(sorted(vals)) for k, vals in entry.config.items()} or None
    return VariantSample(
        requests=requests_seen,
        request_rate=None if requests_seen is None else requests_seen / window_s,
        ttft_p99=v.get("ttft_p99"),
        itl_p99=v.get("itl_p99"),
        ttft_histogram=_histogram(entry.buckets.get("ttft_histogram")),
        itl_histogram=_histogram(entry.buckets.get("itl_histogram")),
        prefix_cache_hit_rate=v.get("prefix_cache_hit_rate"),
        external_share=v.get("external_share"),
        tier_hits=dict(entry.tier_hits),
        tier_chunk_queries=dict(entry.tier_chunk_queries),
        tier_chunk_hits=dict(entry.tier_chunk_hits),
        finished=dict(entry.finished),
        http_responses=dict(entry.http_responses),
        offload_allocated=tuple(sorted((dict(a) for a in entry.allocated), key=lambda a: sorted(a.items()))),
        kv_usage=v.get("kv_usage"),
        load_bytes_per_second=v.get("load_bytes_per_second"),
        config=config,
        workload=_workload(entry) if workload else None,
        payoff_rows=payoff_rows,
    )


def _percentiles(quantiles: dict[float, float | None] | None) -> Percentiles:
    if not quantiles:
        return Percentiles()
    p50, p95, p99 = (quantiles.get(q) for q in WORKLOAD_QUANTILES)
    return Percentiles(p50=p50, p95=p95, p99=p99)


def _workload(entry: _Collected) -> WorkloadSample:
    v, b = entry.values, entry.quantiles
    return WorkloadSample(
        prompt_tokens=_percentiles(b.get("workload.prompt_tokens")),
        ttft=_percentiles(b.get("workload.ttft")),
        itl=_percentiles(b.get("workload.itl")),
        e2e=_percentiles(b.get("workload.e2e")),
        running_requests=v.get("workload.running_requests"),
        prefix_cache_hit_rate=v.get("workload.prefix_cache_hit_rate"),
        kv_usage_max=v.get("workload.kv_usage_max"),
        preemptions_per_second=v.get("workload.preemptions_per_second"),
    )

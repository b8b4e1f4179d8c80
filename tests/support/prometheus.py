"""pytest fixtures: the real Prometheus (Debian's /usr/bin/prometheus), started per test.

The server itself lives in the package (:mod:`kvoffload.promserver`, used by the demo too);
this module wraps it so a timeout fails the test, and adds a synthetic fleet exporter.

Targets are added at runtime through ``file_sd_configs``; each target carries
the labels the rendered PodMonitor would give its series (``namespace``,
``pod``, ``kvoffload_io_policy``, ``kvoffload_io_level``, ``kvoffload_io_config_hash``), so queries run
against the same label layout as in a cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kvoffload.analysis.queries import Target
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.vllm.dialect import NEWEST
from kvoffload_lab import promserver
from kvoffload_lab.engine import families
from kvoffload_lab.promserver import PROMETHEUS_BIN, SCRAPE_INTERVAL_S, PrometheusError, free_port  # noqa: F401  (re-exported)

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], deadline: float, what: str, poll: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy, or fail the test naming ``what`` after ``deadline`` s."""
    try:
        return promserver.wait_until(check, deadline, what, poll)
    except PrometheusError as exc:
        pytest.fail(str(exc))


class PrometheusServer(promserver.PrometheusServer):
    """The package's :class:`kvoffload.promserver.PrometheusServer`, failing the test instead of raising."""

    def start(self, deadline: float = 30.0, *, port: int | None = None) -> None:
        try:
            super().start(deadline, port=port)
        except PrometheusError as exc:
            pytest.fail(str(exc))

    def wait_for_series(
        self,
        expr: str,
        deadline: float = 30.0,
        count: int = 1,
        check: Callable[[list[dict[str, Any]]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        try:
            return super().wait_for_series(expr, deadline, count, check)
        except PrometheusError as exc:
            pytest.fail(str(exc))


def require_prometheus() -> None:
    """Skip without the binary on a workstation; fail in CI, where .ci/run installs it."""
    if shutil.which(PROMETHEUS_BIN) or Path(PROMETHEUS_BIN).exists():
        return
    message = f"{PROMETHEUS_BIN} not found (apt-get install prometheus)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    """A fresh real Prometheus for one test, stopped afterwards."""
    require_prometheus()
    server = PrometheusServer(tmp_path / "prometheus")
    server.workdir.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --- a synthetic fleet: many engines' vLLM series from one small exporter --------

# Bucket bounds of real vLLM 0.32 (shared/fixtures/vllm-0.32.0-cpu-metrics.txt).
TTFT_BUCKETS = families.TTFT_BUCKETS
ITL_BUCKETS = families.TOKEN_LATENCY_BUCKETS
E2E_BUCKETS = families.REQUEST_TIME_BUCKETS
PROMPT_TOKEN_BUCKETS = families.build_1_2_5_buckets(32768)
"""vLLM's 1-2-5 buckets of ``vllm:request_prompt_tokens`` for --max-model-len 32768."""


def expected_p99(value: float, bounds: Sequence[float]) -> float:
    """What histogram_quantile(0.99) gives when every observation equals ``value``."""
    return expected_quantile(0.99, value, bounds)


def expected_quantile(q: float, value: float, bounds: Sequence[float]) -> float:
    """What histogram_quantile(q) gives when every observation equals ``value``."""
    lower = 0.0
    for upper in bounds:
        if value <= upper:
            return lower + (upper - lower) * q
        lower = upper
    return lower


@dataclass(frozen=True)
class SyntheticEngine:
    """One (policy, variant) whose series grow at fixed rates, so every query has a known answer."""

    policy: str
    variant: str
    namespace: str = "llm"
    requests_per_s: float = 10.0
    ttft_s: float = 0.2
    """Every request's TTFT (all land in one bucket)."""
    itl_s: float = 0.02
    prompt_tokens_per_s: float = 1000.0
    external_share: float = 0.0
    host_tokens_per_s: float = 0.0
    disk_tokens_per_s: float = 0.0
    kv_usage: float = 0.5
    failed_share: float = 0.0
    """Share of the finished requests that end with finished_reason ``error`` (the rest: ``length``)."""
    load_bytes_per_s: float = 0.0
    load_throughput: float = 12.6e9
    """Bytes per transfer second; the load time counter grows by bytes / this."""
    offloading_size: str = "None"
    offloading_backend: str = "native"
    # The baseline's workload figures (each request lands in one bucket unless the test spreads it).
    e2e_s: float = 1.0
    """Every request's end-to-end latency."""
    prompt_lengths: tuple[tuple[float, float], ...] = ((1000.0, 1.0),)
    """(prompt tokens, share of the requests): the prompt-length distribution."""
    running: float = 4.0
    """vllm:num_requests_running."""
    prefix_hit_rate: float = 0.0
    """Share of the looked-up prompt tokens found in the GPU prefix cache."""
    preemptions_per_s: float = 0.0
    kv_usage_peak: float | None = None
    """When set, KV usage shows this instead of ``kv_usage`` during every odd second (a gauge that moves)."""
    tier_chunks: tuple[tuple[str, float, float], ...] = ()
    """Under tiering: (tier label, chunk lookups per second, hits per second) per tier (``0:primary``, ``1:fs``)."""
    allocated: tuple[tuple[str, int, int], ...] = ()
    """vLLM 0.33's vllm:kv_offload_config_info: (tier label or "", CPU bytes, chunks) per series."""
    level: str | None = None
    """The ``kvoffload_io_level`` label; default: ``variant``."""
    config_hash: str | None = None
    """The ``kvoffload_io_config_hash`` label; default: ``variant`` (what ``synthetic_target`` asks for)."""


def _level_labels(engine: SyntheticEngine) -> str:
    """The level and config-hash labels the PodMonitor copies; unless given, a synthetic engine's level and config
    hash are its variant's name (``synthetic_target`` asks for those)."""
    level = engine.level if engine.level is not None else engine.variant
    config_hash = engine.config_hash if engine.config_hash is not None else engine.variant
    return f'kvoffload_io_level="{level}",kvoffload_io_config_hash="{config_hash}"'


def synthetic_target(
    namespace: str,
    policy: str,
    window: str = "2m",
    dialect: Dialect = NEWEST,
    *args: Any,
    with_canary: bool = True,
    **kwargs: Any,
) -> Target:
    """A Target whose stable and canary are the synthetic engines of variant ``stable`` and ``canary``; vLLM's newest
    dialect unless given."""
    return Target(
        namespace,
        policy,
        window,
        *args,
        dialect=dialect,
        stable_hash="stable",
        canary_hash="canary" if with_canary else None,
        **kwargs,
    )


def _series(engine: SyntheticEngine, dialect: Dialect) -> list[tuple[str, float]]:
    """(series line prefix, growth per second or fixed value) for one engine."""
    base = (
        f'engine="0",kvoffload_io_policy="{engine.policy}",{_level_labels(engine)},'
        f'model_name="m",namespace="{engine.namespace}",pod="{engine.policy}-{engine.variant}-0"'
    )
    rows: list[tuple[str, float]] = []
    for name, bounds, value in ((dialect.ttft, TTFT_BUCKETS, engine.ttft_s), (dialect.itl, ITL_BUCKETS, engine.itl_s)):
        for upper in (*bounds, float("inf")):
            le = "+Inf" if upper == float("inf") else repr(upper)
            rows.append((f'{name}_bucket{{{base},le="{le}"}}', engine.requests_per_s if value <= upper else 0.0))
        rows.append((f"{name}_count{{{base}}}", engine.requests_per_s))
        rows.append((f"{name}_sum{{{base}}}", engine.requests_per_s * value))
    for name, bounds, shares in (
        (dialect.e2e, E2E_BUCKETS, ((engine.e2e_s, 1.0),)),
        (dialect.request_prompt_tokens, PROMPT_TOKEN_BUCKETS, engine.prompt_lengths),
    ):
        for upper in (*bounds, float("inf")):
            le = "+Inf" if upper == float("inf") else repr(upper)
            below = sum(share for value, share in shares if value <= upper)
            rows.append((f'{name}_bucket{{{base},le="{le}"}}', engine.requests_per_s * below))
        rows.append((f"{name}_count{{{base}}}", engine.requests_per_s))
        rows.append((f"{name}_sum{{{base}}}", engine.requests_per_s * sum(v * share for v, share in shares)))
    if dialect.request_success is None:
        return [*rows, *_sglang_series(engine, dialect, base)]
    finished = {"stop": 0.0, "length": 1.0 - engine.failed_share, "abort": 0.0, "error": engine.failed_share}
    for reason, share in finished.items():
        rows.append((f'{dialect.request_success}{{{base},finished_reason="{reason}"}}', engine.requests_per_s * share))
    # vLLM's API server answers each errored request with a 500, and one of /v1/models a second besides.
    handler = 'handler="/v1/completions",method="POST"'
    for status, share in (("2xx", 1.0 - engine.failed_share), ("5xx", engine.failed_share)):
        rows.append((f'{dialect.http_requests}{{{base},{handler},status="{status}"}}', engine.requests_per_s * share))
    rows.append((f'{dialect.http_requests}{{{base},handler="/v1/models",method="GET",status="2xx"}}', 1.0))
    rows.append((f"{dialect.prefix_cache_queries}{{{base}}}", engine.prompt_tokens_per_s))
    rows.append((f"{dialect.prefix_cache_hits}{{{base}}}", engine.prompt_tokens_per_s * engine.prefix_hit_rate))
    rows.append((f"{dialect.num_preemptions}{{{base}}}", engine.preemptions_per_s))
    external = engine.prompt_tokens_per_s * engine.external_share
    by_source = {
        "local_compute": engine.prompt_tokens_per_s - external,
        "local_cache_hit": 0.0,
        "external_kv_transfer": external,
    }
    if dialect.prompt_tokens_by_source:
        for source, per_s in by_source.items():
            rows.append((f'{dialect.prompt_tokens_by_source}{{{base},source="{source}"}}', per_s))
    if dialect.prompt_tokens_cached_by_source:
        cached = {
            "device": 0.0,
            "host": engine.host_tokens_per_s,
            "p2p": 0.0,
            "disk": engine.disk_tokens_per_s,
            "external_unspecified": 0.0,
        }
        for source, per_s in cached.items():
            rows.append((f'{dialect.prompt_tokens_cached_by_source}{{{base},source="{source}"}}', per_s))
    if dialect.tiering_chunk_queries and dialect.tiering_chunk_hits:
        for tier, queries_per_s, hits_per_s in engine.tier_chunks:
            rows.append((f'{dialect.tiering_chunk_queries}{{{base},tier="{tier}"}}', queries_per_s))
            rows.append((f'{dialect.tiering_chunk_hits}{{{base},tier="{tier}"}}', hits_per_s))
    if dialect.offload is not None and engine.load_bytes_per_s > 0:
        rows.append((f"{dialect.offload.load_bytes}{{{base}}}", engine.load_bytes_per_s))
        rows.append((f"{dialect.offload.load_time}{{{base}}}", engine.load_bytes_per_s / engine.load_throughput))
    return rows


def _sglang_series(engine: SyntheticEngine, dialect: Dialect, base: str) -> list[tuple[str, float]]:
    """The rest of an SGLang engine's counters, as SGLang 0.5.23 labels them: finished and aborted requests in two
    counters, HTTP answers by status code, cached tokens by ``cache_source``. Like prometheus_client in SGLang, a
    label set shows only once used: no abort counter before the first abort, no cached source before a hit."""
    assert dialect.requests_finished is not None
    assert dialect.requests_aborted is not None
    assert dialect.prompt_tokens_cached_by_source is not None
    rate, failed = engine.requests_per_s, engine.failed_share
    rows = [(f'{dialect.requests_finished}{{{base},is_streaming="false"}}', rate * (1.0 - failed))]
    if failed:
        rows.append((f"{dialect.requests_aborted}{{{base}}}", rate * failed))
    endpoint = 'endpoint="/v1/completions",method="POST"'
    for code, share in (("200", 1.0 - failed), ("500", failed)):
        if share:
            rows.append((f'{dialect.http_requests}{{{base},{endpoint},status_code="{code}"}}', rate * share))
    rows.append((f'{dialect.http_requests}{{{base},endpoint="/v1/models",method="GET",status_code="200"}}', 1.0))
    rows.append((f'{dialect.prompt_tokens}{{{base},is_streaming="false"}}', engine.prompt_tokens_per_s))
    gpu_hits = engine.prompt_tokens_per_s * engine.prefix_hit_rate
    for source, per_s in (
        ("device", gpu_hits),
        ("host", engine.host_tokens_per_s),
        ("storage", engine.disk_tokens_per_s),
    ):
        if per_s:
            rows.append((f'{dialect.prompt_tokens_cached_by_source}{{{base},cache_source="{source}"}}', per_s))
    if dialect.offload is not None and engine.load_bytes_per_s > 0:
        rows.append((f"{dialect.offload.load_bytes}{{{base}}}", engine.load_bytes_per_s))
        rows.append((f"{dialect.offload.load_time}{{{base}}}", engine.load_bytes_per_s / engine.load_throughput))
    return rows


class SyntheticFleet:
    """An HTTP exporter serving the vLLM series of many (policy, variant) engines at once.

    The policy, variant, namespace and pod labels are in the exposition itself (Prometheus keeps
    them: the scrape target carries none of them), so one target stands for a whole fleet.
    Counters grow linearly from the start; gauges are fixed. Classic text format, as vLLM serves.
    """

    def __init__(self, engines: Sequence[SyntheticEngine], dialect: Dialect = NEWEST) -> None:
        self.started = time.time()
        self._dialect = dialect
        self._serve(engines)
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = fleet.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="synthetic-fleet", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def series(self) -> int:
        return len(self._counters) + self._gauges.count("\n") + len(self._moving)

    def stop_serving(self, variant: str) -> int:
        """Leave out the series of every engine of ``variant`` from now on, as when its pods are gone: Prometheus
        marks them stale at its next scrape. Returns how many series went."""
        before = self.series
        self._serve([engine for engine in self._engines if engine.variant != variant])
        return before - self.series

    def _serve(self, engines: Sequence[SyntheticEngine]) -> None:
        """Serve the series of ``engines`` from the next scrape on."""
        self._engines = tuple(engines)
        dialect = self._dialect
        counters: list[tuple[str, float]] = []
        gauges: list[str] = []  # untyped, as families interleave across engines
        moving: list[tuple[str, float, float]] = []  # (series, even-second value, odd-second value)
        for engine in engines:
            counters.extend(_series(engine, dialect))
            labels = (
                f'kvoffload_io_policy="{engine.policy}",{_level_labels(engine)},'
                f'namespace="{engine.namespace}",pod="{engine.policy}-{engine.variant}-0"'
            )
            usage = f'{dialect.kv_cache_usage}{{engine="0",{labels}}}'
            if engine.kv_usage_peak is None:
                gauges.append(f"{usage} {engine.kv_usage}")
            else:
                moving.append((usage, engine.kv_usage, engine.kv_usage_peak))
            gauges.append(f'{dialect.num_requests_running}{{engine="0",{labels}}} {engine.running}')
            if dialect.cache_config_info:
                gauges.append(
                    f'{dialect.cache_config_info}{{engine="0",{labels},'
                    f'kv_offloading_backend="{engine.offloading_backend}",'
                    f'kv_offloading_size="{engine.offloading_size}"}} 1.0'
                )
            if dialect.offload_config_info:
                for tier, size, chunks in engine.allocated:
                    info = (
                        f'cpu_blocks_per_chunk="1",cpu_kv_cache_size_bytes="{size}",'
                        f'cpu_kv_cache_size_tokens="None",cpu_num_chunks="{chunks}",tier="{tier}"'
                    )
                    gauges.append(f'{dialect.offload_config_info}{{engine="0",{labels},{info}}} 1.0')
        self._counters, self._gauges, self._moving = counters, "\n".join(gauges) + "\n", moving

    def exposition(self) -> str:
        now = time.time()
        elapsed = now - self.started
        counters = "\n".join(f"{prefix} {per_s * elapsed:.6f}" for prefix, per_s in self._counters)
        odd = int(now) % 2 == 1
        moving = "".join(f"{name} {peak if odd else even}\n" for name, even, peak in self._moving)
        return counters + "\n" + self._gauges + moving

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def scraping(
    engines: Sequence[SyntheticEngine], workdir: Path, window: str, dialect: Dialect = NEWEST
) -> Iterator[PrometheusServer]:
    """A real Prometheus that has scraped ``engines`` (one synthetic fleet) for at least one whole ``window``:
    increase() needs samples across the whole window, or it extrapolates from a part of it."""
    require_prometheus()
    fleet = SyntheticFleet(engines, dialect)
    server = PrometheusServer(workdir)
    server.start()
    try:
        server.add_targets([(fleet.address, {})])
        policies = len({(e.namespace, e.policy, e.variant) for e in engines})
        server.wait_for_series(f"count_over_time({dialect.ttft}_count[{window}]) >= 10", deadline=60, count=policies)
        yield server
    finally:
        server.stop()
        fleet.close()

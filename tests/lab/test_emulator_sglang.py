"""The emulator speaking SGLang 0.5.23 (``--speak sglang``): SGLang's own families, filled from the same events.

Conformance is judged against tests/data/sglang-0.5.23-families.json: every family SGLang 0.5.23 registers,
with its type, label names (``le`` left out), stored sample names, help text and the file:line defining it,
obtained by instantiating SGLang's own collectors (``TokenizerMetricsCollector``, ``SchedulerMetricsCollector
.init_new`` with HiCache on, ``RadixCacheMetricsCollector``, the HTTP metrics...) against a fresh registry. It
was generated once, on 2026-12-06, with the SGLang branch's checker (``tests/sglang_argcheck.py --metrics``
of branch ``sglang-check``, not yet committed there; the version run had sha256 1dfb3e0f11326561...) over
the sglang-0.5.23 wheel's sources, as that checker's docstring says::

    cd /tmp && PYTHONPATH=<sglang-check worktree>/.sglang-05 HF_HUB_OFFLINE=1 \\
        <worktree>/.venv-vllm/bin/python <sglang-check worktree>/tests/sglang_argcheck.py --metrics \\
        > tests/data/sglang-0.5.23-families.json

and committed as it came out. Buckets are not in it: sglangmetrics.py copies them from SGLang's source.

Prices are the vLLM personality's (one cost model and block cache for both); only /metrics differs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvoffload_lab.engine.config import ConfigError, EngineConfig
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine
from kvoffload_lab.engine.server import Emulator
from kvoffload_lab.engine.sglangmetrics import SGLANG_FAMILIES, SGLangMetrics
from tests.support import paths
from tests.support.engines import Engine, EngineFactory

FIXTURE = paths.DATA / "sglang-0.5.23-families.json"
# SGLang's --enable-metrics and a 1 GB HiCache pool (--hicache-size 1) as the emulator takes them (what
# lab/cluster/sglangargs.py makes of an SGLang command line; tests/lab/test_sglang_translation.py).
QWEN = ["--speak", "sglang", "--enable-metrics", "--model", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"]
HICACHE_1GB = [*QWEN, "--kv-offloading-size", "0.931322574615478515625", "--kv-offloading-backend", "native"]
FILE_TIER = [
    "--kv-transfer-config",
    json.dumps(
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": 10**9,
                "eviction_policy": "lru",
                "secondary_tiers": [{"type": "fs", "root_dir": "/tmp/hicache"}],
            },
        }
    ),
]
TP2 = ["--tensor-parallel-size", "2", "--pinning-time-scale", "0"]
# As the vLLM tests (tests/lab/test_emulator.py): 184 GPU blocks of 16 tokens hold A and B, so C evicts A.
SMALL_GPU = ["--block-size", "16", "--gpu-kv-blocks", "184"]
RESTORED = 1472  # A's 92 whole blocks, less the last one a full hit recomputes


def prompt(seed: int, n: int = 1480) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


A, B, C = prompt(1), prompt(2), prompt(3)


def sglang_families() -> dict[str, dict[str, Any]]:
    """SGLang 0.5.23's families by the name Prometheus stores (a counter's with ``_total``)."""
    data = json.loads(FIXTURE.read_text())
    assert data["sglang_version"] == "0.5.23"
    return {f["name"]: f for f in data["families"]}


def stored_name(name: str, type_: str) -> str:
    """prometheus_client's parser names a counter family without ``_total``; the fixture keeps it."""
    return f"{name}_total" if type_ == "counter" else name


def families(text: str) -> dict[str, Any]:
    return {stored_name(f.name, f.type): f for f in text_string_to_metric_families(text)}


def sample(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def config_of(*options: str) -> EngineConfig:
    config, _, ignored = parse_argv([*options, *SMALL_GPU])
    assert ignored == []
    return config


def run_pattern(config: EngineConfig, prompts: Iterable[list[int]] = (A, A, B, C, A)) -> SGLangMetrics:
    """The prompts admitted one after another, each finishing with two tokens; the registry as it ends."""
    engine = KVEngine(config)
    metrics = SGLangMetrics(config, engine)
    for p in prompts:
        adm = engine.admit(p)
        metrics.record_admission(adm, 2)
        metrics.set_load(1, 1)
        metrics.record_finish(
            ttft=adm.price.ttft_s,
            itls=[0.01],
            e2e=adm.price.ttft_s + 0.01,
            generated=2,
            finished_reason="length",
            admission=adm,
        )
    return metrics


# --- the table -------------------------------------------------------------------------------


def test_every_family_of_the_table_is_sglangs_own_with_its_type_labels_and_help() -> None:
    theirs = sglang_families()
    for fam in SGLANG_FAMILIES:
        assert fam.name in theirs, fam.name
        real = theirs[fam.name]
        assert fam.type == real["type"], fam.name
        assert sorted(fam.labels) == sorted(real["labels"]), fam.name
        assert fam.doc == real["help"], fam.name
        assert real["defined_at"].endswith(f"sglang/srt/observability/{fam.where}"), fam.name


def test_what_the_engine_exposes_is_sglangs_own_family_by_family() -> None:
    """A scenario that fills every family but the aborted-request counter: HiCache with the file tier over two
    TP ranks, a failed request, and HTTP traffic; every family exposed, with SGLang's type, labels, samples and help."""
    config = config_of(*HICACHE_1GB, *FILE_TIER, *TP2)
    metrics = run_pattern(config)
    metrics.record_failure(e2e=0.1, queued=0.0, finished_reason="error", admission=KVEngine(config).admit(A))
    metrics.record_http_start(handler="/v1/completions", method="POST")
    metrics.record_http(handler="/v1/completions", method="POST", status=200)
    ours = families(metrics.exposition().decode())
    theirs = sglang_families()
    expected = {f.name for f in SGLANG_FAMILIES} - {"sglang:num_aborted_requests_total"}
    assert set(ours) == expected
    for name, fam in ours.items():
        real = theirs[name]
        assert fam.type == real["type"], name
        assert {k for s in fam.samples for k in s.labels if k != "le"} == set(real["labels"]), name
        assert {s.name for s in fam.samples} <= set(real["samples"]), name
        assert fam.documentation == real["help"], name


def test_a_family_shows_only_once_it_has_a_series_as_in_sglangs_multiprocess_exposition() -> None:
    config = config_of(*HICACHE_1GB)
    text = SGLangMetrics(config, KVEngine(config)).exposition().decode()
    assert text == ""
    text = run_pattern(config, [A]).exposition().decode()
    assert "_created" not in text
    assert "sglang:num_aborted_requests_total" not in text
    assert "sglang:load_back_bytes_total" not in text  # nothing restored yet
    assert sample(text, "sglang:hicache_backup_tokens_total", pool="kv", tp_rank="0") == 1472  # A's 92 whole blocks
    assert all(f.name.startswith("sglang:") for f in text_string_to_metric_families(text))


# --- the events ------------------------------------------------------------------------------


def test_a_restore_from_the_host_pool_counts_as_host_and_loads_back() -> None:
    config = config_of(*HICACHE_1GB)
    text = run_pattern(config).exposition().decode()
    tokenizer = {"model_name": "Qwen/Qwen3-0.6B", "engine_type": "unified"}
    assert sample(text, "sglang:cached_tokens_total", cache_source="device", **tokenizer) == RESTORED
    assert sample(text, "sglang:cached_tokens_total", cache_source="host", **tokenizer) == RESTORED
    assert sample(text, "sglang:cached_tokens_total", cache_source="storage") is None  # only counted above zero
    assert sample(text, "sglang:load_back_tokens_total", pool="kv", cache_type="UnifiedRadixCache") == RESTORED
    assert sample(text, "sglang:load_back_bytes_total") == RESTORED * config.kv_bytes_per_token
    assert sample(text, "sglang:num_requests_total", is_streaming="false") == 5
    assert sample(text, "sglang:prompt_tokens_total", is_streaming="false") == 5 * 1480
    host = config.cpu_tier()
    assert host is not None
    assert sample(text, "sglang:hicache_host_total_tokens", tp_rank="0") == host.capacity_blocks * 16


def test_a_restore_from_the_file_tier_counts_as_storage() -> None:
    # A host pool of 99 blocks (1 GB at 625,000 bytes a token) keeps less than A and B, so A comes from the file tier.
    config = config_of(*HICACHE_1GB, *FILE_TIER, "--kv-bytes-per-token", "625000")
    text = run_pattern(config).exposition().decode()
    assert sample(text, "sglang:cached_tokens_total", cache_source="storage") == RESTORED
    assert sample(text, "sglang:cached_tokens_total", cache_source="host") is None
    # SGLang prefetches a storage hit into the host pool, then loads it back to the GPU.
    assert sample(text, "sglang:load_back_tokens_total", pool="kv") == RESTORED


def test_each_tp_rank_reports_its_shard_of_the_bytes_and_every_token() -> None:
    config = config_of(*HICACHE_1GB, *TP2)
    text = run_pattern(config).exposition().decode()
    shards = [sample(text, "sglang:load_back_bytes_total", tp_rank=r) for r in ("0", "1")]
    assert shards == [RESTORED * config.kv_bytes_per_token / 2] * 2
    assert [sample(text, "sglang:load_back_tokens_total", tp_rank=r) for r in ("0", "1")] == [RESTORED] * 2
    assert sample(text, "sglang:num_running_reqs", tp_rank="1") is None  # the scheduler logs stats on rank 0


def test_without_hicache_no_host_families_and_no_transfers() -> None:
    config = config_of(*QWEN)
    text = run_pattern(config).exposition().decode()
    names = families(text)
    assert "sglang:hicache_host_total_tokens" not in names
    assert "sglang:load_back_bytes_total" not in names
    assert sample(text, "sglang:cached_tokens_total", cache_source="device") == RESTORED
    assert sample(text, "sglang:token_usage", tp_rank="0") is not None


def test_sglang_flags_are_refused_where_they_do_not_belong() -> None:
    with pytest.raises(ConfigError, match=r"^--enable-metrics"):
        parse_argv(["serve", "m", "--enable-metrics"])
    with pytest.raises(ConfigError, match=r"^--kv-offloading-backend"):
        parse_argv(["--speak", "sglang", "--kv-offloading-size", "1", "--kv-offloading-backend", "lmcache"])


async def test_without_enable_metrics_there_is_no_metrics_endpoint() -> None:
    config, faults, _ = parse_argv(["--speak", "sglang", "--model", "Qwen/Qwen3-0.6B"])
    async with TestClient(TestServer(Emulator(config, faults).app())) as client:
        assert (await client.get("/metrics")).status == 404
        assert (await client.get("/health")).status == 200
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["owned_by"] == "sglang"


# --- over HTTP, against `kvoffload emulate` processes ----------------------------------------


def scenario(*options: str) -> list[str]:
    return [*options, *SMALL_GPU]


def exposition(engine: Engine) -> str:
    return engine.get("/metrics")


def test_the_restore_pattern_over_http_speaks_sglang_only(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, scenario(*HICACHE_1GB))
    for p in (A, A, B, C):
        engine.complete(p, max_tokens=2)
    before = exposition(engine)
    assert sample(before, "sglang:cached_tokens_total", cache_source="host") is None
    engine.complete(A, max_tokens=2)
    text = exposition(engine)
    assert sample(text, "sglang:cached_tokens_total", cache_source="host") == RESTORED
    assert sample(text, "sglang:time_to_first_token_seconds_count", is_streaming="false") == 5
    assert sample(text, "sglang:inter_token_latency_seconds_count") == 5
    found = families(text)
    theirs = sglang_families()
    assert all(name.startswith("sglang:") for name in found)  # no vllm: family, no process_ or python_ ones
    for name, fam in found.items():
        assert fam.type == theirs[name]["type"], name
        assert {k for s in fam.samples for k in s.labels if k != "le"} == set(theirs[name]["labels"]), name
    # Every request is counted, the scrapes and probes too, by route and status code.
    completions = {"endpoint": "/v1/completions", "method": "POST"}
    assert sample(text, "sglang:http_responses_total", status_code="200", **completions) == 5
    assert sample(text, "sglang:http_requests_total", endpoint="/metrics", method="GET") == 2
    assert (sample(text, "sglang:http_requests_total", endpoint="/health", method="GET") or 0) >= 1


def test_a_failed_request_is_a_500_and_a_finished_request_but_not_an_abort(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, scenario(*QWEN))
    engine.set_faults(error_share=0.05)
    codes = []
    for _ in range(40):
        try:
            engine.complete(prompt(50, 64), max_tokens=2)
            codes.append(200)
        except Exception as exc:  # urllib's HTTPError
            codes.append(getattr(exc, "code", 0))
    assert codes.count(500) == 2
    text = exposition(engine)
    completions = {"endpoint": "/v1/completions", "method": "POST"}
    assert sample(text, "sglang:http_responses_total", status_code="500", **completions) == 2
    assert sample(text, "sglang:http_responses_total", status_code="200", **completions) == 38
    assert sample(text, "sglang:num_requests_total") == 40  # collect_metrics runs for an aborted finish too
    assert sample(text, "sglang:time_to_first_token_seconds_count") == 38  # but no TTFT for it
    assert sample(text, "sglang:e2e_request_latency_seconds_count") == 40
    assert sample(text, "sglang:num_aborted_requests_total") is None  # only a client's or an explicit abort

"""The emulator speaking TensorRT-LLM (``--speak trtllm``): ``trtllm-serve``'s own ``trtllm_`` families at
``/prometheus/metrics``, filled from the same events as vLLM's.

Conformance is judged against TensorRT-LLM's collector source as saved (``tools/trtllm-sources/050f80de``,
``MetricsCollector.__init__``), read here with ``ast``: each family's name, type, help text and label names (the
label dicts resolved as the constructor builds them, over the labels ``trtllm-serve`` passes, ``model_name`` and
``engine_type``); and against the metric dialect the operator reads (``engines/trtllm/dialect.py``): every series
it names is exposed once traffic has run.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.engines.trtllm.dialect import LABEL_CACHE_TIER, OFFLOAD_BYTES, ONBOARD_BYTES, TIER_HOST, TRTLLM
from kvoffload_lab.engine.config import EngineConfig
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine
from kvoffload_lab.engine.server import Emulator
from kvoffload_lab.engine.trtllmmetrics import COLLECTOR_COMMIT, TRTLLM_FAMILIES, TRTLLMMetrics

# The SGLang emulator tests' prompts and small GPU (C evicts A from it), read the same way.
from tests.lab.test_emulator_sglang import RESTORED, SMALL_GPU, A, B, C, config_of, sample
from tests.support.paths import ROOT

COLLECTOR = ROOT / "tools" / "trtllm-sources" / COLLECTOR_COMMIT[:8] / "tensorrt_llm" / "metrics"
SERVE_LABELS = ("model_name", "engine_type")
"""``MetricsCollector({"model_name": "undefined", "engine_type": "undefined"})`` in openai_server.py."""
# What lab/cluster/trtllmargs.py makes of a rendered level with a 1 GiB host cache on one rank.
QWEN = ["--speak", "trtllm", "--enable-metrics", "--model", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"]
HOST_1GIB = [*QWEN, "--kv-offloading-size", "1", "--kv-offloading-backend", "native"]


# --- the collector's source -----------------------------------------------------------------


def _constant_attributes(tree: ast.Module) -> dict[str, str]:
    """``labelname_*`` strings, set in the class body or on ``self``."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                if name and name.startswith("labelname"):
                    found[name] = node.value.value
    return found


def collector_families() -> dict[str, dict[str, Any]]:
    """Every family ``MetricsCollector.__init__`` declares: its exposed name (a counter's with ``_total``), type,
    help text and label names."""
    tree = ast.parse((COLLECTOR / "collector.excerpt.py").read_text())
    constants = _constant_attributes(tree)
    dicts: dict[str, tuple[str, ...]] = {"labels": SERVE_LABELS}

    def keys_of(node: ast.expr) -> tuple[str, ...]:
        assert isinstance(node, ast.Dict), ast.unparse(node)
        out: list[str] = []
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:  # **self.something
                assert isinstance(value, ast.Attribute)
                out += dicts[value.attr]
            else:
                assert isinstance(key, ast.Attribute)
                out.append(constants[key.attr])
        return tuple(out)

    families: dict[str, dict[str, Any]] = {}
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    for statement in ast.walk(init):
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Dict):
            target = statement.targets[0]
            if isinstance(target, ast.Attribute):
                dicts[target.attr] = keys_of(statement.value)
        if not (
            isinstance(statement, ast.Call) and getattr(statement.func, "id", None) in ("Counter", "Gauge", "Histogram")
        ):
            continue
        kw = {k.arg: k.value for k in statement.keywords}
        name_node = kw["name"]
        assert isinstance(name_node, ast.BinOp)
        assert isinstance(name_node.right, ast.Constant)
        name = "trtllm_" + str(name_node.right.value)
        labels_node = kw["labelnames"]
        assert isinstance(labels_node, ast.Call)
        assert isinstance(labels_node.func, ast.Attribute)
        assert isinstance(labels_node.func.value, ast.Attribute)
        kind = str(getattr(statement.func, "id", "")).lower()
        doc = kw["documentation"]
        assert isinstance(doc, ast.Constant)
        exposed = f"{name.removesuffix('_total')}_total" if kind == "counter" else name
        families[exposed] = {"type": kind, "help": doc.value, "labels": dicts[labels_node.func.value.attr]}
    return families


def exposed_name(name: str, type_: str) -> str:
    return f"{name.removesuffix('_total')}_total" if type_ == "counter" else name


def families(text: str) -> dict[str, Any]:
    return {exposed_name(f.name, f.type): f for f in text_string_to_metric_families(text)}


def run_pattern(config: EngineConfig, prompts: Iterable[list[int]] = (A, A, B, C, A)) -> TRTLLMMetrics:
    """The prompts admitted one after another, each finishing with two tokens; the registry as it ends."""
    engine = KVEngine(config)
    metrics = TRTLLMMetrics(config, engine)
    for p in prompts:
        adm = engine.admit(p)
        metrics.record_admission(adm, 2)
        metrics.set_load(1, 40)
        metrics.record_finish(
            ttft=adm.price.ttft_s,
            itls=[0.01],
            e2e=adm.price.ttft_s + 0.01,
            generated=2,
            finished_reason="length",
            queued=0.001,
            admission=adm,
        )
    return metrics


# --- the table ------------------------------------------------------------------------------


def test_the_source_reading_finds_every_family_the_collectors_docstring_lists() -> None:
    theirs = collector_families()
    assert len(theirs) == 60  # 64 Gauge/Counter/Histogram calls, less the 4 config info gauges made elsewhere
    assert theirs["trtllm_prompt_cache_hit_tokens_total"]["labels"] == (*SERVE_LABELS, "cache_level", "cache_tier")
    assert theirs["trtllm_request_success_total"]["labels"] == (*SERVE_LABELS, "finished_reason")
    assert theirs["trtllm_kv_cache_reused_blocks_total"]["type"] == "counter"


def test_every_family_of_the_table_is_the_collectors_own_with_its_type_labels_and_help() -> None:
    theirs = collector_families()
    for fam in TRTLLM_FAMILIES:
        name = exposed_name(fam.name, fam.type)
        assert name in theirs, name
        assert fam.type == theirs[name]["type"], name
        assert fam.labels == theirs[name]["labels"], name
        assert fam.doc == theirs[name]["help"], name


def test_what_the_engine_exposes_is_the_collectors_own_family_by_family() -> None:
    config = config_of(*HOST_1GIB)
    metrics = run_pattern(config)
    metrics.record_failure(e2e=0.1, queued=0.0, finished_reason="error")
    ours = families(metrics.exposition().decode())
    theirs = collector_families()
    assert set(ours) == {exposed_name(f.name, f.type) for f in TRTLLM_FAMILIES}
    for name, fam in ours.items():
        real = theirs[name]
        assert fam.type == real["type"], name
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        # A gauge of prometheus_client's multiprocess registry (mode "all") carries its process' pid.
        assert labels == set(real["labels"]) | ({"pid"} if fam.type == "gauge" else set()), name
        assert fam.documentation == real["help"], name
        assert all(not s.name.endswith("_created") for s in fam.samples), name
        assert {s.labels["model_name"] for s in fam.samples} == {"undefined"}, name


def test_every_series_the_operator_reads_is_exposed() -> None:
    config = config_of(*HOST_1GIB)
    text = run_pattern(config).exposition().decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    fields = dataclasses.asdict(TRTLLM).items()
    read = [v for k, v in fields if k != "series_prefix" and isinstance(v, str) and v.startswith("trtllm_")]
    assert len(read) >= 9
    for series in [*read, ONBOARD_BYTES, OFFLOAD_BYTES]:
        assert series in names or f"{series}_count" in names, series
    assert TRTLLM.http_requests not in names  # the instrumentator excludes every handler
    assert TRTLLM.itl is None  # no ITL: the gate is not judged, and nothing here pretends otherwise


# --- the events ------------------------------------------------------------------------------


def test_a_restore_from_the_host_cache_counts_as_host_and_onboards_its_bytes() -> None:
    config = config_of(*HOST_1GIB)
    text = run_pattern(config).exposition().decode()
    hits = "trtllm_prompt_cache_hit_tokens_total"
    assert sample(text, hits, cache_level="0", cache_tier="gpu") == RESTORED  # A's second run
    assert sample(text, hits, cache_level="1", **{LABEL_CACHE_TIER: TIER_HOST}) == RESTORED  # A after C evicted it
    assert sample(text, "trtllm_prompt_cached_tokens_total") == 2 * RESTORED
    assert sample(text, "trtllm_prompt_tokens_total") == 5 * 1480
    assert sample(text, ONBOARD_BYTES) == RESTORED * config.kv_bytes_per_token
    assert sample(text, OFFLOAD_BYTES) == 3 * 92 * config.block_bytes  # A, B and C stored once each
    assert sample(text, "trtllm_request_success_total", finished_reason="length") == 5
    assert sample(text, "trtllm_time_to_first_token_seconds_count") == 5
    assert sample(text, "trtllm_kv_cache_utilization") == 40 / 184
    host = sample(text, "trtllm_kv_cache_host_utilization")
    assert host is not None
    assert 0 < host < 1


def test_without_a_host_cache_only_the_gpu_level_and_no_transfers() -> None:
    config = config_of(*QWEN)
    text = run_pattern(config).exposition().decode()
    names = families(text)
    assert "trtllm_kv_cache_host_utilization" not in names
    assert ONBOARD_BYTES not in names
    assert OFFLOAD_BYTES not in names
    levels = {s.labels["cache_tier"] for s in names["trtllm_prompt_cache_hit_tokens_total"].samples}
    assert levels == {"gpu"}


def test_before_any_request_only_the_series_the_collector_makes_at_start_show() -> None:
    config = config_of(*HOST_1GIB)
    text = TRTLLMMetrics(config, KVEngine(config)).exposition().decode()
    assert set(families(text)) == {"trtllm_prompt_cached_tokens_total"}
    assert sample(text, "trtllm_prompt_cached_tokens_total") == 0


def test_a_failed_request_counts_only_as_an_http_error() -> None:
    config = config_of(*HOST_1GIB)
    metrics = TRTLLMMetrics(config, KVEngine(config))
    metrics.record_failure(e2e=0.1, queued=0.0, finished_reason="error")
    text = metrics.exposition().decode()
    assert sample(text, "trtllm_request_error_total", http_code="500") == 1
    assert sample(text, "trtllm_request_success_total") is None


# --- over HTTP --------------------------------------------------------------------------------


async def test_the_prometheus_text_is_at_its_own_path_and_metrics_answers_json() -> None:
    config, faults, _ = parse_argv([*HOST_1GIB, *SMALL_GPU])
    async with TestClient(TestServer(Emulator(config, faults).app())) as client:
        answer = await client.post("/v1/completions", json={"prompt": A, "max_tokens": 2})
        assert answer.status == 200
        metrics = await client.get("/prometheus/metrics")
        assert metrics.status == 200
        assert metrics.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await metrics.text()
        assert sample(text, "trtllm_prompt_tokens_total") == 1480
        stats = await (await client.get("/metrics")).json()
        assert stats[0]["kvCacheStats"]["maxNumBlocks"] == 184
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["owned_by"] == "trtllm"


async def test_without_return_perf_metrics_there_is_no_prometheus_endpoint() -> None:
    config, faults, _ = parse_argv(["--speak", "trtllm", "--model", "Qwen/Qwen3-0.6B"])
    async with TestClient(TestServer(Emulator(config, faults).app())) as client:
        assert (await client.get("/prometheus/metrics")).status == 404
        assert (await client.get("/metrics")).status == 200  # the iteration stats, always
        assert (await client.get("/health")).status == 200

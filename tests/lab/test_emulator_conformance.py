"""The emulator's /metrics speaks real vLLM 0.32: same families, types, label names and buckets.

0.33's offload additions (kv_offload_config_info, the tiering promotion latency) and the tiering chunk
counters cannot be captured from vLLM for CPU (it refuses offloading); they are checked against the
dialect table and the names, labels and buckets read from the 0.33.0 wheel.

Both sides are parsed with prometheus_client's classic-format parser, which
names a counter family without its ``_total`` suffix (``# TYPE
vllm:prompt_tokens_total counter`` becomes family ``vllm:prompt_tokens`` with
samples ``vllm:prompt_tokens_total``) and reports each ``_created`` series as a
family of its own (type gauge), because the classic format declares it with
its own ``# TYPE`` line. Parsing both sides the same way makes those quirks
cancel out; the sample names are compared too, so a ``_total`` that went
missing or doubled would still show.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.quantity import GIB
from kvoffload.engines import dialect as dialects
from kvoffload.engines.vllm import dialect as vllm_dialects
from kvoffload_lab.engine.costmodel import Price
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import Admission
from kvoffload_lab.engine.metrics import EngineMetrics
from tests.support import paths
from tests.support.engines import EngineFactory

FIXTURE = paths.VLLM_CAPTURE
# The capture was taken with --max-model-len 512, which sets the token-count buckets.
CAPTURE_ARGS = ["serve", "tiny-qwen3", "--max-model-len", "512"]


@dataclass(frozen=True)
class Shape:
    """What must match for one family: its type, label names, bucket bounds and sample names."""

    type: str
    labels: frozenset[str]
    buckets: frozenset[str]
    samples: frozenset[str]
    doc: str


def shapes(text: str, prefix: str = "vllm:") -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        out[fam.name] = Shape(
            type=fam.type,
            labels=frozenset(k for s in fam.samples for k in s.labels if k != "le"),
            buckets=frozenset(s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")),
            samples=frozenset(s.name for s in fam.samples),
            doc=fam.documentation,
        )
    return out


def is_offload(name: str) -> bool:
    return name.startswith("vllm:kv_offload_")


def emulator_text(*args: str) -> str:
    config, _, _ = parse_argv([*CAPTURE_ARGS, *args])
    return EngineMetrics(config).exposition().decode()


def assert_same_shapes(ours: dict[str, Shape], theirs: dict[str, Shape]) -> None:
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name] == theirs[name], name


def test_emulator_families_equal_the_real_capture_without_offload() -> None:
    assert_same_shapes(shapes(emulator_text()), shapes(FIXTURE.read_text()))


def test_with_offload_the_emulator_adds_only_offload_families() -> None:
    ours = shapes(emulator_text("--kv-offloading-size", "0.5"))
    theirs = shapes(FIXTURE.read_text())
    assert_same_shapes({n: s for n, s in ours.items() if not is_offload(n)}, theirs)
    extra = {n for n in ours if n not in theirs}
    assert extra
    assert all(is_offload(n) for n in extra)


def sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.parametrize("version", ["0.12.0", "0.16.0", "0.24.0", "0.32.0", "0.33.0", "0.34.0"])
def test_offload_series_match_the_dialect_table(version: str) -> None:
    present = sample_names(emulator_text("--kv-offloading-size", "0.5", "--vllm-version", version))
    dialect = vllm_dialects.dialect_for(version)
    for name in dialect.offload_families():
        assert dialects.has_family(name, present), name
    # What the emulator shows, confirmed, is what the table says for that version.
    assert dialects.confirm_dialect(dialect, present) == dialect


def test_older_dialects_rename_itl_and_kv_usage() -> None:
    present = sample_names(emulator_text("--vllm-version", "0.10.1"))
    assert "vllm:time_per_output_token_seconds_bucket" in present
    assert "vllm:inter_token_latency_seconds_bucket" not in present
    assert "vllm:kv_cache_usage_perc" in present
    assert "vllm:prompt_tokens_by_source_total" not in present
    confirmed = dialects.confirm_dialect(vllm_dialects.dialect_for(None), present)
    old = vllm_dialects.dialect_for("0.10.1")
    assert (confirmed.itl, confirmed.kv_cache_usage, confirmed.prompt_tokens_by_source) == (
        old.itl,
        old.kv_cache_usage,
        old.prompt_tokens_by_source,
    )


def test_gpu_only_engine_shows_no_offload_series() -> None:
    assert not any(is_offload(n) for n in sample_names(emulator_text()))


def test_cache_config_info_reflects_the_offload_flags() -> None:
    families = {f.name: f for f in text_string_to_metric_families(emulator_text("--kv-offloading-size", "0.5"))}
    (sample,) = families["vllm:cache_config_info"].samples
    assert sample.labels["kv_offloading_size"] == "0.5"
    assert sample.labels["kv_offloading_backend"] == "native"
    families = {f.name: f for f in text_string_to_metric_families(emulator_text())}
    (sample,) = families["vllm:cache_config_info"].samples
    assert sample.labels["kv_offloading_size"] == "None"


def test_served_metrics_equal_the_capture_over_http(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, CAPTURE_ARGS)
    assert_same_shapes(shapes(engine.get("/metrics")), shapes(FIXTURE.read_text()))


@pytest.mark.realvllm
def test_live_vllm_speaks_the_same_families_as_the_emulator(live_vllm: str) -> None:
    with urllib.request.urlopen(f"{live_vllm}/metrics", timeout=30) as response:
        live = response.read().decode()
    live_shapes = shapes(live)
    # The live engine's buckets follow its own --max-model-len (512 for the tiny model, like the capture).
    assert_same_shapes(shapes(emulator_text()), live_shapes)


# --- vLLM 0.33's offload families, and the tiering counters of 0.32 and 0.33 ------------------------

TIERED = (
    '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":'
    '{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":536870912,'
    '"secondary_tiers":[{"type":"fs","root_dir":"/mnt/kv"}]}}'
)


def families_of(*args: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(emulator_text(*args))}


def test_033_shows_the_cpu_tier_it_allocated_in_kv_offload_config_info() -> None:
    families = families_of("--kv-offloading-size", "0.5", "--vllm-version", "0.33.0")
    (sample,) = families["vllm:kv_offload_config_info"].samples
    labels = sample.labels
    assert set(labels) == {"engine", "model_name", *dialects.CPU_CONFIG_LABELS}
    size, chunks = int(labels["cpu_kv_cache_size_bytes"]), int(labels["cpu_num_chunks"])
    chunk = size // chunks
    assert chunk % 4096 == 0  # page-aligned chunks, as vLLM 0.33 allocates them
    assert 0 <= GIB // 2 - size < chunk  # whole chunks within the configured 0.5 GiB
    assert labels["cpu_blocks_per_chunk"] == "1"
    assert sample.value == 1.0
    # 0.32 has no such family.
    assert "vllm:kv_offload_config_info" not in families_of("--kv-offloading-size", "0.5")


def test_the_allocation_fault_makes_the_engine_allocate_another_size() -> None:
    families = families_of("--kv-offloading-size", "0.5", "--vllm-version", "0.33.0", "--allocate-cpu-gib", "0.25")
    (sample,) = families["vllm:kv_offload_config_info"].samples
    size, chunks = int(sample.labels["cpu_kv_cache_size_bytes"]), int(sample.labels["cpu_num_chunks"])
    assert 0 <= GIB // 4 - size < size // chunks
    # kv_offloading_size still says what the command line asked for: only the allocation differs.
    (config,) = families["vllm:cache_config_info"].samples
    assert config.labels["kv_offloading_size"] == "0.5"


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_under_tiering_the_chunk_counters_are_served_per_tier(version: str) -> None:
    families = families_of("--kv-transfer-config", TIERED, "--vllm-version", version)
    for family in ("vllm:kv_offload_tiering_chunk_queries", "vllm:kv_offload_tiering_chunk_hits"):
        samples = [s for s in families[family].samples if s.name.endswith("_total")]
        assert {s.labels["tier"] for s in samples} == {"0:primary", "1:fs"}
        assert families[family].type == "counter"
    present = sample_names(emulator_text("--kv-transfer-config", TIERED, "--vllm-version", version))
    dialect = vllm_dialects.dialect_for(version)
    assert dialects.confirm_dialect(dialect, present) == dialect
    info = families.get("vllm:kv_offload_config_info")
    if version == "0.32.0":
        assert info is None
    else:
        assert info is not None
        tiers = {s.labels["tier"]: s.labels for s in info.samples}
        assert set(tiers) == {"0:primary", "1:fs"}
        assert int(tiers["0:primary"]["cpu_kv_cache_size_bytes"]) > 0
        assert tiers["1:fs"]["cpu_kv_cache_size_bytes"] == ""


def test_no_tiering_no_tiering_counters() -> None:
    present = sample_names(emulator_text("--kv-offloading-size", "0.5", "--vllm-version", "0.33.0"))
    assert not any(n.startswith("vllm:kv_offload_tiering_") for n in present)


def test_tier_lookups_and_promotions_are_counted_from_each_admission() -> None:
    config, _, _ = parse_argv([*CAPTURE_ARGS, "--kv-transfer-config", TIERED, "--vllm-version", "0.33.0"])
    metrics = EngineMetrics(config)
    block = config.block_size
    cost = Price(0.1, 0.05, 0.05, 0.0, 0, 3 * block, 2 * block, 0.01, 0.04)
    # 10 blocks past the GPU hit: 3 from the CPU tier, 2 from fs, 5 computed.
    adm = Admission(12 * block, 2 * block, 3 * block, 2 * block, 5 * block, 0, cost)
    metrics.record_admission(adm, max_tokens=8)
    got = {
        (s.name, s.labels.get("tier"), s.labels.get("le")): s.value
        for f in text_string_to_metric_families(metrics.exposition().decode())
        for s in f.samples
        if f.name.startswith("vllm:kv_offload_tiering_")
    }
    assert got[("vllm:kv_offload_tiering_chunk_queries_total", "0:primary", None)] == 10
    assert got[("vllm:kv_offload_tiering_chunk_hits_total", "0:primary", None)] == 3
    assert got[("vllm:kv_offload_tiering_chunk_queries_total", "1:fs", None)] == 7
    assert got[("vllm:kv_offload_tiering_chunk_hits_total", "1:fs", None)] == 2
    assert got[("vllm:kv_offload_tiering_promotion_latency_seconds_count", "1:fs", None)] == 1
    assert got[("vllm:kv_offload_tiering_promotion_latency_seconds_bucket", "1:fs", "0.05")] == 1
    assert got[("vllm:kv_offload_tiering_promotion_latency_seconds_bucket", "1:fs", "0.025")] == 0

"""The emulator's /metrics speaks real vLLM 0.32: same families, types, label names and buckets.

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

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis import dialects
from kvoffload.lab.engine.flags import parse_argv
from kvoffload.lab.engine.metrics import EngineMetrics
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


@pytest.mark.parametrize("version", ["0.12.0", "0.16.0", "0.24.0", "0.32.0"])
def test_offload_series_match_the_dialect_table(version: str) -> None:
    present = sample_names(emulator_text("--kv-offloading-size", "0.5", "--vllm-version", version))
    dialect = dialects.dialect_for(version)
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
    confirmed = dialects.confirm_dialect(dialects.dialect_for(None), present)
    old = dialects.dialect_for("0.10.1")
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

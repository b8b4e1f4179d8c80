"""The metric dialect table: version parsing, dialect choice, confirmation against live series."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.versions import parse_version, version_from_image
from kvoffload.engines import dialect as dialects
from kvoffload.engines.dialect import confirm_dialect
from kvoffload.engines.vllm import dialect as vllm_dialects
from kvoffload.engines.vllm.dialect import FLAT_OFFLOAD, LEGACY_OFFLOAD, dialect_for
from tests.support import paths

FIXTURE = paths.VLLM_CAPTURE


def fixture_series_names() -> set[str]:
    """Every sample name (``__name__`` as Prometheus stores it) in the real 0.32 capture."""
    return {s.name for f in text_string_to_metric_families(FIXTURE.read_text()) for s in f.samples}


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.32.0", "0.32.0"),
        ("vllm/vllm-openai:v0.10.1.1", "0.10.1.1"),
        ("0.11.2", "0.11.2"),
        ("docker.io/vllm/vllm-openai:v0.11.0-cu128", "0.11.0"),
        ("localhost:5000/vllm:0.12.0rc1@sha256:" + "a" * 64, "0.12.0"),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai:nightly", None),
        ("vllm/vllm-openai@sha256:" + "b" * 64, None),
        ("vllm/vllm-openai", None),
        ("localhost:5000/vllm", None),
    ],
)
def test_version_from_image_reads_the_tag(image: str, version: str | None) -> None:
    assert version_from_image(image) == version


@pytest.mark.parametrize("bad", ["", "latest", "v1", "0.x.1", "1.2.3.4.5"])
def test_parse_version_refuses_what_is_not_a_version(bad: str) -> None:
    with pytest.raises(ValueError, match="not a vLLM version"):
        parse_version(bad)


def test_versions_compare_as_numbers_not_strings() -> None:
    assert parse_version("0.9.2") < parse_version("0.10.0") < parse_version("0.32.0")


@pytest.mark.parametrize(
    ("version", "itl", "kv_usage", "by_source", "cached_by_source", "offload"),
    [
        ("0.9.2", "vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc", None, None, None),
        ("0.10.1.1", "vllm:time_per_output_token_seconds", "vllm:kv_cache_usage_perc", None, None, None),
        ("0.11.0", "vllm:inter_token_latency_seconds", "vllm:kv_cache_usage_perc", None, None, None),
        ("0.12.0", "vllm:inter_token_latency_seconds", "vllm:kv_cache_usage_perc", None, None, LEGACY_OFFLOAD),
        (
            "0.16.0",
            "vllm:inter_token_latency_seconds",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_by_source_total",
            None,
            LEGACY_OFFLOAD,
        ),
        (
            "0.31.0",
            "vllm:inter_token_latency_seconds",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_by_source_total",
            None,
            FLAT_OFFLOAD,
        ),
        (
            "0.32.0",
            "vllm:inter_token_latency_seconds",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_by_source_total",
            "vllm:prompt_tokens_cached_by_source_total",
            FLAT_OFFLOAD,
        ),
    ],
)
def test_dialect_for_each_version(
    version: str,
    itl: str,
    kv_usage: str,
    by_source: str | None,
    cached_by_source: str | None,
    offload: dialects.OffloadSeries | None,
) -> None:
    d = dialect_for(version)
    assert d.ttft == "vllm:time_to_first_token_seconds"
    assert d.itl == itl
    assert d.kv_cache_usage == kv_usage
    assert d.prompt_tokens_by_source == by_source
    assert d.prompt_tokens_cached_by_source == cached_by_source
    assert d.offload == offload


def test_unknown_version_speaks_the_newest_dialect() -> None:
    assert dialect_for(None) == vllm_dialects.NEWEST == dialect_for("0.34.0")
    assert vllm_dialects.NEWEST.name == "0.34"
    assert dialect_for("0.32.0") != vllm_dialects.NEWEST
    assert dialect_for("9.0.0") == vllm_dialects.NEWEST


@pytest.mark.parametrize(
    ("version", "chunks", "config_info"),
    [
        ("0.31.0", False, False),
        ("0.32.0", True, False),
        ("0.33.0", True, True),
        ("0.33.1", True, True),
        ("0.34.0", True, True),
    ],
)
def test_tiering_counters_from_032_and_the_allocated_config_from_033(
    version: str, chunks: bool, config_info: bool
) -> None:
    d = dialect_for(version)
    assert (d.tiering_chunk_hits, d.tiering_chunk_queries) == (
        ("vllm:kv_offload_tiering_chunk_hits_total", "vllm:kv_offload_tiering_chunk_queries_total")
        if chunks
        else (None, None)
    )
    assert d.offload_config_info == ("vllm:kv_offload_config_info" if config_info else None)
    assert d.tiering_promotion_latency == ("vllm:kv_offload_tiering_promotion_latency_seconds" if config_info else None)
    assert (d.offload_config_info in d.offload_families()) is config_info
    # Nothing offload-related renamed or removed in 0.33.
    older = dialect_for("0.32.0")
    if config_info:
        assert (d.offload, d.offload_cpu_usage, d.required_families()) == (
            older.offload,
            older.offload_cpu_usage,
            older.required_families(),
        )


def test_confirm_adds_the_033_families_wherever_prometheus_holds_them() -> None:
    present = fixture_series_names() | {
        "vllm:kv_offload_config_info",
        "vllm:kv_offload_tiering_chunk_hits_total",
        "vllm:kv_offload_tiering_promotion_latency_seconds_bucket",
    }
    d = confirm_dialect(dialect_for("0.31.0"), present)
    assert d.offload_config_info == "vllm:kv_offload_config_info"
    assert d.tiering_chunk_hits == "vllm:kv_offload_tiering_chunk_hits_total"
    assert d.tiering_chunk_queries is None  # not seen: no evidence
    assert d.tiering_promotion_latency == "vllm:kv_offload_tiering_promotion_latency_seconds"
    # Absent from Prometheus (no connector, no tiering yet) is no evidence against the table.
    assert confirm_dialect(dialect_for("0.33.0"), fixture_series_names()) == dialect_for("0.33.0")


def test_legacy_offload_series_carry_the_double_total_and_a_transfer_type() -> None:
    # vLLM registers Counter("vllm:kv_offload_total_bytes"); prometheus_client adds "_total".
    assert LEGACY_OFFLOAD.load_bytes == "vllm:kv_offload_total_bytes_total"
    assert LEGACY_OFFLOAD.load_selector == 'transfer_type="CPU_to_GPU"'
    assert LEGACY_OFFLOAD.store_selector == 'transfer_type="GPU_to_CPU"'
    assert FLAT_OFFLOAD.load_selector == ""


def test_every_032_name_exists_in_the_real_capture_except_offload() -> None:
    present = fixture_series_names()
    d = dialect_for("0.32.0")
    missing = [n for n in d.required_families() if not dialects.has_family(n, present)]
    assert missing == []
    # vLLM for CPU refuses offloading at engine start, so its capture has none of these.
    assert [n for n in d.offload_families() if dialects.has_family(n, present)] == []


def test_capture_has_the_cache_config_labels_of_the_live_config_check() -> None:
    families = {f.name: f for f in text_string_to_metric_families(FIXTURE.read_text())}
    (sample,) = families["vllm:cache_config_info"].samples
    assert dialects.LABEL_OFFLOADING_SIZE in sample.labels
    assert dialects.LABEL_OFFLOADING_BACKEND in sample.labels


def test_confirm_keeps_a_dialect_that_matches_the_capture() -> None:
    d = dialect_for("0.32.0")
    assert confirm_dialect(d, fixture_series_names()) == d


def test_confirm_switches_to_time_per_output_token_when_only_that_exists() -> None:
    present = {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:gpu_cache_usage_perc",
    }
    d = confirm_dialect(dialect_for(None), present)
    assert d.itl == "vllm:time_per_output_token_seconds"
    assert d.kv_cache_usage == "vllm:gpu_cache_usage_perc"
    assert d.prompt_tokens_by_source is None  # scraped, and absent: this engine lacks it


def test_confirm_switches_an_old_tag_to_the_new_names_it_really_serves() -> None:
    present = fixture_series_names()
    d = confirm_dialect(dialect_for("0.10.0"), present)
    assert d.itl == "vllm:inter_token_latency_seconds"
    assert d.prompt_tokens_by_source == "vllm:prompt_tokens_by_source_total"
    assert d.prompt_tokens_cached_by_source == "vllm:prompt_tokens_cached_by_source_total"


def test_confirm_picks_legacy_offload_names_when_only_those_exist() -> None:
    present = fixture_series_names() | {"vllm:kv_offload_total_bytes_total", "vllm:kv_offload_total_time_total"}
    assert confirm_dialect(dialect_for("0.32.0"), present).offload == LEGACY_OFFLOAD


def test_confirm_prefers_flat_offload_names_when_both_exist() -> None:
    present = fixture_series_names() | {"vllm:kv_offload_total_bytes_total", "vllm:kv_offload_load_bytes_total"}
    assert confirm_dialect(dialect_for("0.16.0"), present).offload == FLAT_OFFLOAD


def test_confirm_keeps_offload_names_while_no_connector_runs() -> None:
    # GPU-only engines show no offload series; that is no evidence against the table.
    d = dialect_for("0.32.0")
    assert confirm_dialect(d, fixture_series_names()).offload == FLAT_OFFLOAD


def test_confirm_changes_nothing_without_vllm_series() -> None:
    d = dialect_for("0.32.0")
    assert confirm_dialect(d, set()) is d
    assert confirm_dialect(d, {"up", "process_cpu_seconds_total"}) is d


def test_every_table_row_names_its_evidence() -> None:
    for change in vllm_dialects.DIALECT_CHANGES:
        assert any(word in change.evidence for word in ("PR", "capture", "wheel"))
    rows = [since for since, _ in vllm_dialects.DIALECTS]
    assert rows == sorted(rows)

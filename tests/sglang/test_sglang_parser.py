"""SGLang 0.5.23's own parser, resolution steps and metrics, as ``tests/sglang_argcheck.py`` runs them.

All command lines go to the checker in one subprocess of the vLLM venv with SGLang's sources first on
``PYTHONPATH`` (``.sglang-05``, from ``scripts/setup-sglang-sources.sh``; importing SGLang takes seconds).
These tests pin what the SGLang renderer relies on: a HiCache command line SGLang takes as written, the
refusals (each naming its flag), the one silent rewrite, and the metric families the analysis reads.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.realsglang

SGLANG_VERSION = "0.5.23"
SGLANG_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SGLANG_SOURCES = ROOT / ".sglang-05"
ARGCHECK = ROOT / "tests" / "sglang_argcheck.py"

# Everything after `python3 -m sglang.launch_server`: HiCache with a 16 GB host pool per rank and the file L3.
GOOD_ARGS = [
    *("--model-path", "Qwen/Qwen3-0.6B", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000"),
    *("--context-length", "32768", "--tp-size", "2", "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.85"),
    *("--page-size", "64", "--enable-metrics", "--enable-hierarchical-cache", "--hicache-size", "16"),
    *("--hicache-write-policy", "write_through", "--hicache-io-backend", "kernel"),
    *("--hicache-mem-layout", "page_first", "--hicache-storage-backend", "file"),
]
GOOD_FIELDS = {
    "model_path": "Qwen/Qwen3-0.6B",
    "served_model_name": "chat",
    "host": "0.0.0.0",
    "port": 8000,
    "context_length": 32768,
    "tp_size": 2,
    "kv_cache_dtype": "fp8_e4m3",
    "mem_fraction_static": 0.85,
    "page_size": 64,
    "enable_metrics": True,
    "enable_hierarchical_cache": True,
    "hicache_host_memory_mode": "cache",
    "hicache_ratio": None,
    "hicache_size": 16,
    "hicache_write_policy": "write_through",
    "hicache_io_backend": "kernel",
    "hicache_mem_layout": "page_first",
    "hicache_storage_backend": "file",
}
HICACHE = ["--model-path", "m", "--enable-hierarchical-cache"]
# Refused command lines, each with the flag its error must name.
BAD_ARGS: dict[str, tuple[list[str], str]] = {
    "unknown-storage-backend": ([*HICACHE, "--hicache-storage-backend", "bogus"], "--hicache-storage-backend"),
    "size-not-a-number": ([*HICACHE, "--hicache-size", "lots"], "--hicache-size"),
    # Whole gigabytes (10^9 bytes) only: argparse's int.
    "size-not-whole": ([*HICACHE, "--hicache-size", "1.5"], "--hicache-size"),
    "size-with-unit": ([*HICACHE, "--hicache-size", "16G"], "--hicache-size"),
    "unknown-kv-cache-dtype": (["--model-path", "m", "--kv-cache-dtype", "bogus"], "--kv-cache-dtype"),
    "vllm-fp8-spelling": (["--model-path", "m", "--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),
    "unknown-write-policy": ([*HICACHE, "--hicache-write-policy", "write_around"], "--hicache-write-policy"),
    "unknown-flag": (["--model-path", "m", "--kv-offloading-size", "16"], "--kv-offloading-size"),
    "no-model": (["--enable-hierarchical-cache"], "--model-path"),
    # Refused by the resolution steps rather than by argparse.
    "buffer-only-no-storage": ([*HICACHE, "--hicache-host-memory-mode", "buffer_only"], "--hicache-storage-backend"),
    "host-fraction-over-one": ([*HICACHE, "--hicache-host-memory-fraction", "2"], "--hicache-host-memory-fraction"),
    "without-radix-cache": ([*HICACHE, "--disable-radix-cache"], "disable-radix-cache"),
    "with-lmcache": ([*HICACHE, "--enable-lmcache"], "--enable-lmcache"),
}
# SGLang takes it, with a warning, as page_first_direct (srt/arg_groups/hicache_hook.py:186-194).
REWRITTEN_ARGS = [*HICACHE, "--hicache-io-backend", "direct", "--hicache-mem-layout", "page_first"]

# The families the analysis reads, as Prometheus stores them: name -> (type, labels it must have). From
# .sglang-05/sglang/srt/observability/metrics_collector.py (the Counter/Histogram call's line):
REQUIRED_FAMILIES: dict[str, tuple[str, set[str]]] = {
    # :2040, TokenizerMetricsCollector; is_streaming "true"/"false".
    "sglang:time_to_first_token_seconds": ("histogram", {"model_name", "is_streaming"}),
    # :2050, per output token: a chunk of n tokens counts n observations of interval/n.
    "sglang:inter_token_latency_seconds": ("histogram", {"model_name"}),
    # :1855, named with _total in the source (prometheus_client does not double it).
    "sglang:prompt_tokens_total": ("counter", {"model_name", "is_streaming"}),
    # :1934, cache_source device | host | storage (| total without a breakdown), from :2112-2134.
    "sglang:cached_tokens_total": ("counter", {"model_name", "cache_source"}),
    # :1959, TokenizerMetricsCollector.observe_one_aborted_request.
    "sglang:num_aborted_requests_total": ("counter", {"model_name"}),
    # :2067.
    "sglang:e2e_request_latency_seconds": ("histogram", {"model_name", "is_streaming"}),
    # :2552, RadixCacheMetricsCollector: tokens loaded back from host memory (L2) to the GPU, per pool.
    "sglang:load_back_tokens_total": ("counter", {"pool", "tp_rank"}),
    # :770, :776, SchedulerMetricsCollector with HiCache on.
    "sglang:hicache_host_used_tokens": ("gauge", {"model_name", "tp_rank"}),
    "sglang:hicache_host_total_tokens": ("gauge", {"model_name", "tp_rank"}),
}


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing; CI must set it up (make setup)")
    pytest.skip(f"{what} is missing (make setup)")


def _run_checker(*options: str, stdin: str | None = None) -> str:
    if not SGLANG_PYTHON.exists():
        _missing(str(SGLANG_PYTHON))
    if not (SGLANG_SOURCES / "sglang" / "srt" / "server_args.py").exists():
        _missing(f"{SGLANG_SOURCES} (scripts/setup-sglang-sources.sh)")
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(ARGCHECK), *options],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(SGLANG_SOURCES)},
        cwd=ROOT,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"sglang_argcheck.py {' '.join(options)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def checked() -> dict[str, dict[str, Any]]:
    """Every command line's verdict, by id (one subprocess for all)."""
    requests = [{"id": "good", "args": GOOD_ARGS}, {"id": "rewritten", "args": REWRITTEN_ARGS}]
    requests += [{"id": f"bad:{name}", "args": args} for name, (args, _) in BAD_ARGS.items()]
    stdout = _run_checker(stdin=json.dumps(requests))
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert [r["id"] for r in results] == [r["id"] for r in requests]
    assert {r["sglang_version"] for r in results} == {SGLANG_VERSION}
    return {r["id"]: r for r in results}


@pytest.fixture(scope="module")
def families() -> dict[str, dict[str, Any]]:
    report = json.loads(_run_checker("--metrics"))
    assert report["sglang_version"] == SGLANG_VERSION
    assert report["method"] == "instantiated"
    return {f["name"]: f for f in report["families"]}


def test_the_checker_loads_sglang_0_5_23_from_the_sources_folder() -> None:
    where = json.loads(_run_checker("--where"))
    assert where["sglang_version"] == SGLANG_VERSION
    assert where["server_args_file"] == str(SGLANG_SOURCES.resolve() / "sglang" / "srt" / "server_args.py")
    assert [s.split(" ")[0] for s in where["stubbed"]] == ["triton", "IPython.display"]
    assert "handle_hicache (pipeline.py:272)" in where["steps_run"]
    assert where["steps_skipped"][0] == "handle_model_source_paths (pipeline.py:116)"


def test_sglang_takes_the_hicache_command_line_as_written(checked: dict[str, dict[str, Any]]) -> None:
    result = checked["good"]
    assert result["ok"], result["error"]
    assert result["warnings"] == []
    assert {k: result["server_args"][k] for k in GOOD_FIELDS} == GOOD_FIELDS
    resolved = result["resolved"]
    assert {k: resolved[k] for k in GOOD_FIELDS if k != "hicache_ratio"} == {
        k: v for k, v in GOOD_FIELDS.items() if k != "hicache_ratio"
    }
    # The ratio gets its cache-mode default, which --hicache-size overrides (pool_host/base.py:221-226);
    # an explicit size turns host-memory auto-sizing off (hicache_hook.py:123-124).
    assert resolved["hicache_ratio"] == 2.0
    assert resolved["hicache_host_memory_fraction"] is None


@pytest.mark.parametrize("name", list(BAD_ARGS))
def test_sglang_refuses_a_bad_command_line_naming_the_flag(checked: dict[str, dict[str, Any]], name: str) -> None:
    result = checked[f"bad:{name}"]
    assert not result["ok"]
    assert BAD_ARGS[name][1] in result["error"]
    assert not result["error"].startswith("not checked")


def test_sglang_rewrites_page_first_with_direct_io_and_only_warns(checked: dict[str, dict[str, Any]]) -> None:
    result = checked["rewritten"]
    assert result["ok"], result["error"]
    assert result["server_args"]["hicache_mem_layout"] == "page_first"
    assert result["resolved"]["hicache_mem_layout"] == "page_first_direct"
    assert result["resolved"]["hicache_io_backend"] == "direct"
    assert any("page first direct" in w for w in result["warnings"]), result["warnings"]


@pytest.mark.parametrize("name", list(REQUIRED_FAMILIES))
def test_sglang_registers_the_metric_family_the_analysis_reads(families: dict[str, dict[str, Any]], name: str) -> None:
    kind, labels = REQUIRED_FAMILIES[name]
    family = families.get(name)
    assert family is not None, sorted(families)
    assert family["source"] == "instantiated"
    assert family["type"] == kind
    assert labels <= set(family["labels"]), family["labels"]
    expected = [f"{name}_bucket", f"{name}_count", f"{name}_sum"] if kind == "histogram" else [name]
    assert family["samples"] == expected


def test_every_sglang_counter_is_stored_with_total_once(families: dict[str, dict[str, Any]]) -> None:
    counters = [f for f in families.values() if f["type"] == "counter"]
    assert counters
    assert all(f["name"].endswith("_total") and not f["name"].endswith("_total_total") for f in counters)
    assert all(f["name"].startswith("sglang:") for f in families.values())

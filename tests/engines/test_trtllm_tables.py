"""TensorRT-LLM's tables, taken from its own sources (tools/trtllm-sources), and the extra-options check.

TensorRT-LLM cannot be installed here (PyPI has only wheel-stub sdists), so these tests hold the shipped
table to what ``scripts/trtllm_options.py`` reads from the saved sources, and the check to that table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from kvoffload.engines.trtllm.extra_options import problems, tables, unjudged_types
from tests.support.paths import PACKAGE, ROOT

SHIPPED = PACKAGE / "engines" / "trtllm" / "data" / "trtllm-options.json"
SOURCES = ROOT / "tools" / "trtllm-sources"


@pytest.fixture(scope="module")
def table() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SHIPPED.read_text(encoding="utf-8"))
    return loaded


def test_the_shipped_table_is_what_the_script_reads_from_the_saved_sources(table: dict[str, Any]) -> None:
    made = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "trtllm_options.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(made.stdout) == table, "run scripts/trtllm_options.py again"


def test_every_saved_source_the_table_names_exists_at_its_commit(table: dict[str, Any]) -> None:
    for path, source in table["sources"].items():
        saved = SOURCES / source["saved"]
        assert saved.is_file(), path
        assert saved.parts[-len(path.split("/")) - 1] == source["commit"][:8], (path, source)
        assert "SPDX-License-Identifier: Apache-2.0" in saved.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("field", "declared", "default"),
    [
        ("host_cache_size", "Optional[int]", None),
        ("enable_block_reuse", "bool", True),
        ("secondary_offload_min_priority", "Optional[int]", None),
        ("free_gpu_memory_fraction", "Optional[float]", 0.9),
    ],
)
def test_kv_cache_config_fields_as_declared(table: dict[str, Any], field: str, declared: str, default: object) -> None:
    entry = table["kvCacheConfig"]["fields"][field]
    assert (entry["type"], entry["default"]) == (declared, default)


def test_host_cache_size_is_bytes_and_free_gpu_memory_fraction_is_bounded(table: dict[str, Any]) -> None:
    fields = table["kvCacheConfig"]["fields"]
    assert fields["host_cache_size"]["description"].startswith("Size of the host cache in bytes.")
    assert fields["free_gpu_memory_fraction"]["constraints"] == {"ge": 0, "le": 1}


def test_both_models_forbid_extra_keys(table: dict[str, Any]) -> None:
    assert (table["llmArgs"]["extra"], table["llmArgs"]["extraDeclaredBy"]) == ("forbid", "BaseLlmArgs.model_config")
    assert table["kvCacheConfig"]["bases"][0] == "StrictBaseModel"
    assert (table["kvCacheConfig"]["extra"], table["kvCacheConfig"]["extraDeclaredBy"]) == (
        "forbid",
        "StrictBaseModel (inherited)",
    )


def test_the_yaml_keys_are_torch_llm_args_fields_with_base_llm_args_ones(table: dict[str, Any]) -> None:
    fields = table["llmArgs"]["fields"]
    assert fields["kv_cache_config"] == {
        "type": "KvCacheConfig",
        "defaultFactory": "KvCacheConfig",
        "description": "KV cache config.",
    }
    # TorchLlmArgs redeclares backend: its Literal wins over BaseLlmArgs' Optional[str].
    assert fields["backend"]["type"] == "Literal['pytorch']"
    assert fields["enable_iter_perf_stats"]["type"] == "bool"
    assert fields["mpi_session"]["alias"] == "_mpi_session"


def test_serve_options_with_their_dests_types_and_defaults(table: dict[str, Any]) -> None:
    options = table["options"]
    assert options["--extra_llm_api_options"]["dest"] == options["--config"]["dest"] == "extra_llm_api_options"
    assert options["--tp_size"] == options["--tensor_parallel_size"]
    assert (options["--tp_size"]["type"], options["--tp_size"]["default"]) == ("int", 1)
    # Defaults that serve.py reads from TorchLlmArgs' fields are resolved from the saved llm_args.py.
    assert options["--max_batch_size"]["default"] == table["llmArgs"]["fields"]["max_batch_size"]["default"] == 2048
    assert options["--kv_cache_dtype"]["choices"] == ["auto", "fp8", "nvfp4"]
    assert (options["--no-telemetry"]["dest"], options["--no-telemetry"]["nargs"]) == ("telemetry", 0)
    assert options["--trust_remote_code"]["nargs"] == 0
    assert table["allowAbbrev"] is False
    assert table["arguments"] == [{"name": "model", "type": "str"}]


def test_the_collector_series_with_their_types(table: dict[str, Any]) -> None:
    metrics = table["metrics"]
    series = metrics["series"]
    assert series["trtllm_time_to_first_token_seconds"]["type"] == "histogram"
    assert series["trtllm_time_per_output_token_seconds"]["samples"][0] == "trtllm_time_per_output_token_seconds_bucket"
    assert series["trtllm_kv_cache_host_utilization"]["type"] == "gauge"
    assert series["trtllm_kv_cache_offload_bytes"]["samples"] == ["trtllm_kv_cache_offload_bytes_total"]
    assert series["trtllm_request_success"]["samples"] == ["trtllm_request_success_total"]
    assert metrics["itl"] == {
        "present": True,
        "series": ["trtllm_time_per_output_token_seconds"],
        "kind": "per-request time per output token (TPOT)",
    }
    assert metrics["hostCache"]["present"] is True
    assert "trtllm_kv_cache_host_utilization" in metrics["hostCache"]["series"]


# The lines docs/engines.md quotes for the host cache, as they stand in the saved sources.
CPP = "b35ac1b6/cpp/tensorrt_llm/batch_manager/kvCacheManager.excerpt.cpp"
RESOURCES = "b35ac1b6/tensorrt_llm/_torch/pyexecutor/resource_manager.excerpt.py"
CITED = [
    (CPP, 58, "mBufferManager.gpuSync(cacheShape"),
    (CPP, 66, "BufferManager::pinned(cacheShapeOffload"),
    (RESOURCES, 53, "(num_kv_heads + tp_size - 1) // tp_size"),
    (RESOURCES, 216, "self.impl.allocate_pools(False)"),
    (RESOURCES, 233, "self.kv_factor * sum("),
    (RESOURCES, 293, "host_cache_size / cache_size_bytes"),
    ("44373a31/tensorrt_llm/llmapi/llm_args.excerpt.py", 408, 'extra="forbid"'),
]


@pytest.mark.parametrize(("path", "line", "text"), CITED)
def test_the_lines_docs_cite_say_what_docs_say(path: str, line: int, text: str) -> None:
    assert text in (SOURCES / path).read_text(encoding="utf-8").splitlines()[line - 1]
    assert f"{path}:{line}" in (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")


GOOD = """
kv_cache_config:
  enable_block_reuse: true
  host_cache_size: 68719476736
  secondary_offload_min_priority: 35
  free_gpu_memory_fraction: 0.85
  use_kv_cache_manager_v2: auto
enable_iter_perf_stats: true
return_perf_metrics: true
max_batch_size: 64
"""


def test_a_good_document_has_no_problems() -> None:
    assert problems(yaml.safe_load(GOOD)) == []
    assert problems(None) == []  # an empty file, as trtllm-serve reads it


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("kv_cache_config: {host_cache_sise: 1}", ["kv_cache_config.host_cache_sise: unknown key; KvCacheConfig"]),
        ("kv_cachce_config: {}", ["kv_cachce_config: unknown key; TorchLlmArgs forbids extra fields"]),
        ("kv_cache_config: {host_cache_size: 64Gi}", ["kv_cache_config.host_cache_size: expected Optional[int]"]),
        ("kv_cache_config: {host_cache_size: 1.5}", ["kv_cache_config.host_cache_size: expected Optional[int]"]),
        ("kv_cache_config: {enable_block_reuse: 1}", ["kv_cache_config.enable_block_reuse: expected bool, got int"]),
        ("kv_cache_config: {secondary_offload_min_priority: '35'}", ["kv_cache_config.secondary_offload_min_priority"]),
        ("kv_cache_config: {free_gpu_memory_fraction: 1.5}", ["kv_cache_config.free_gpu_memory_fraction: must be"]),
        ("kv_cache_config: {use_kv_cache_manager_v2: maybe}", ["kv_cache_config.use_kv_cache_manager_v2: expected"]),
        ("kv_cache_config: [enable_block_reuse]", ["kv_cache_config: expected KvCacheConfig, got list"]),
        ("stream_interval: 0", ["stream_interval: expected PositiveInt, got int 0"]),
        ("backend: tensorrt", ["backend: expected Literal['pytorch'], got str 'tensorrt'"]),
        ("- kv_cache_config", ["(root): expected a mapping (TorchLlmArgs), got list"]),
    ],
)
def test_a_bad_document_is_refused_naming_the_key_path(document: str, expected: list[str]) -> None:
    found = problems(yaml.safe_load(document))
    assert len(found) == len(expected), found
    for problem, start in zip(found, expected, strict=True):
        assert problem.startswith(start), problem


def test_every_problem_is_reported_not_only_the_first() -> None:
    found = problems({"kv_cache_config": {"x": 1, "tokens_per_block": "32"}, "y": 2})
    assert [p.split(":")[0] for p in found] == ["kv_cache_config.x", "kv_cache_config.tokens_per_block", "y"]


def test_the_check_names_what_it_does_not_judge() -> None:
    unjudged = unjudged_types()
    # Nested models other than KvCacheConfig are defined outside the saved sources: taken as they come.
    assert {"MoeConfig", "SchedulerConfig", "MambaStateConfig"} <= unjudged
    assert unjudged.isdisjoint({"int", "bool", "str", "float", "KvCacheConfig", "LoadFormat", "Optional", "Literal"})
    assert tables().enums["LoadFormat"] == {"AUTO", "DUMMY", "VISION_ONLY", "GMS"}

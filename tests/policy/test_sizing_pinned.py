"""The pinned pool by engine version: vLLM before 0.27 pins one power-of-two-rounded tensor per layer and rank.

vLLM 0.26's single-tier CPUOffloadingSpec allocates ``torch.zeros(..., pin_memory=True)`` per KV tensor,
and PyTorch's CUDA host allocator rounds each up to a power of two; from 0.27 (vLLM PR 50094) the tier is
one /dev/shm region of at most the tier's bytes (docs/design.md, "The pinned pool and /dev/shm").
The 4 GiB figure was measured on an H100 (tests/gpu/README.md); the rule was read from vLLM's source,
not fitted to it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvoffload.api.quantity import GIB, MIB
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines.vllm.hostmemory import engine_version, per_layer_pinned_bytes, pins_per_layer
from kvoffload.policy.hostmemory import SHM_EXTRA_BYTES, engine_pinned_bytes, host_memory
from kvoffload.policy.ladder import build_ladder, find_level
from kvoffload.policy.nodefit import check_policy

BASE: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.26.0", "maxModelLen": 8192},
    "gpu": {"class": "nvidia-h100-80gb"},
    "replicas": 2,
    "resources": {"baseMemory": "8Gi", "headroom": "2Gi"},
    "offload": {"cpu": "4Gi"},
}


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def make_spec(**sections: dict[str, Any]) -> KVOffloadPolicySpec:
    raw = copy.deepcopy(BASE)
    _merge(raw, sections)
    return KVOffloadPolicySpec.model_validate(raw)


def cpu_level(spec: KVOffloadPolicySpec, name: str = "cpu"):  # type: ignore[no-untyped-def]
    return find_level(build_ladder(spec), name=name)


@pytest.mark.parametrize(
    ("tier", "tensors", "pinned"),
    [
        (4 * GIB, 28, 28 * 256 * MIB),  # Qwen3-0.6B, 4 GiB: 146 MiB a layer -> 256 MiB; 7 GiB measured
        (12 * GIB, 28, 28 * 512 * MIB),  # Qwen3-0.6B, 12 GiB: 439 MiB -> 512 MiB, 14 GiB
        (8 * GIB, 36, 36 * 256 * MIB),  # Qwen3-8B, 8 GiB: 228 MiB -> 256 MiB, 9 GiB
        (4 * GIB, 32, 4 * GIB),  # a power of two a layer: no rounding
        (int(4.5 * GIB), 32, 8 * GIB),  # 144 MiB a layer -> 256 MiB: 1.78x
        (32 * GIB, 28 * 4, 112 * 512 * MIB),  # 28 layers x TP 4 = 112 tensors of 293 MiB -> 512 MiB: 56 GiB
        (MIB, 1, MIB),
        (MIB + 1, 1, 2 * MIB),
    ],
)
def test_each_tensor_rounds_up_to_a_power_of_two(tier: int, tensors: int, pinned: int) -> None:
    assert per_layer_pinned_bytes(tier, tensors) == pinned


@pytest.mark.parametrize(
    ("image", "vllm_version", "version", "per_layer"),
    [
        ("vllm/vllm-openai:v0.26.0", None, (0, 26, 0), True),
        ("vllm/vllm-openai:v0.11.0", None, (0, 11, 0), True),
        ("registry:5000/vllm:0.26.1-cu130", None, (0, 26, 1), True),
        ("vllm/vllm-openai:v0.27.0", None, (0, 27, 0), False),  # PR 50094: the /dev/shm region
        ("vllm/vllm-openai:v0.32.0", None, (0, 32, 0), False),
        ("vllm/vllm-openai:v0.34.0", None, (0, 34, 0), False),
        ("vllm/vllm-openai:latest", None, None, False),  # unknown: the newest engine, as the dialect
        ("vllm/vllm-openai:latest", "0.26.0", (0, 26, 0), True),  # model.vllmVersion tells
        ("vllm/vllm-openai:v0.26.0", "0.32.0", (0, 32, 0), False),  # and wins over the tag
        ("vllm/vllm-openai:v0.27.0rc1", None, (0, 27, 0), False),
    ],
)
def test_the_rule_keys_on_the_version_the_dialect_table_resolves(
    image: str, vllm_version: str | None, version: tuple[int, ...] | None, per_layer: bool
) -> None:
    model: dict[str, Any] = {"image": image}
    if vllm_version is not None:
        model["vllmVersion"] = vllm_version
    spec = make_spec(model=model)
    assert engine_version(spec) == version
    assert pins_per_layer(spec, cpu_level(spec)) is per_layer


@pytest.mark.parametrize(
    ("policy", "old_pinned", "new_pinned", "old_request", "new_request"),
    [
        # tests/gpu/policies: the rendered request before this rule, and after it
        ({"offload": {"cpu": "4Gi"}}, 4 * GIB, 7 * GIB, 14 * GIB, 17 * GIB),
        ({"offload": {"cpu": "12Gi"}}, 12 * GIB, 14 * GIB, 22 * GIB, 24 * GIB),
        (
            {
                "model": {"name": "Qwen/Qwen3-8B"},
                "resources": {"baseMemory": "24Gi", "headroom": "4Gi"},
                "offload": {"cpu": "8Gi"},
            },
            8 * GIB,
            9 * GIB,
            36 * GIB,
            37 * GIB,
        ),
    ],
)
def test_a_0_26_engine_is_sized_for_what_it_pins(
    policy: dict[str, Any], old_pinned: int, new_pinned: int, old_request: int, new_request: int
) -> None:
    old = make_spec(**{**policy, "model": {**policy.get("model", {}), "image": "vllm/vllm-openai:v0.27.0"}})
    new = make_spec(**policy)
    old_mem, new_mem = host_memory(old, cpu_level(old)), host_memory(new, cpu_level(new))
    assert (old_mem.pinned, old_mem.request) == (old_pinned, old_request)
    assert (new_mem.pinned, new_mem.request) == (new_pinned, new_request)


def test_a_0_26_engine_keeps_nothing_of_the_pool_in_dev_shm() -> None:
    spec = make_spec()
    assert host_memory(spec, cpu_level(spec)).shm == 0  # render gives the 1 GiB every pod gets
    newer = make_spec(model={"image": "vllm/vllm-openai:v0.32.0"})
    assert host_memory(newer, cpu_level(newer)).shm == 4 * GIB + SHM_EXTRA_BYTES


def test_the_overhead_factor_multiplies_what_the_engine_pins() -> None:
    spec = make_spec(offload={"cpu": "4Gi", "overheadFactor": 1.5})
    assert host_memory(spec, cpu_level(spec)).pinned == int(7 * GIB * 1.5)


def test_tensor_parallel_ranks_each_pin_their_own_layers() -> None:
    spec = make_spec(
        model={"name": "meta-llama/Llama-3.1-70B-Instruct", "tensorParallelSize": 4},
        gpu={"count": 4},
        offload={"cpu": "32Gi"},
    )
    # 80 layers x 4 ranks = 320 tensors of 102.4 MiB -> 128 MiB: 40 GiB
    assert engine_pinned_bytes(spec, cpu_level(spec)) == 320 * 128 * MIB


def test_the_pilot_level_is_rounded_too() -> None:
    spec = make_spec(rollout={"pilotCpu": "1Gi"})
    # 1 GiB / 28 = 36.6 MiB -> 64 MiB a layer
    assert engine_pinned_bytes(spec, cpu_level(spec, "cpu-pilot")) == 28 * 64 * MIB


def test_tiered_and_lmcache_levels_are_not_per_layer() -> None:
    tiered = make_spec(
        offload={
            "cpu": "4Gi",
            "secondaryTiers": [
                {"name": "disk", "type": "fs", "size": "100Gi", "path": "/kv", "volume": {"emptyDir": {}}}
            ],
        }
    )
    top = build_ladder(tiered)[-1]
    assert top.secondary_tiers
    assert not pins_per_layer(tiered, top)  # TieringOffloadingSpec: the /dev/shm region
    assert engine_pinned_bytes(tiered, top) == 4 * GIB
    lmcache = make_spec(offload={"cpu": "4Gi", "backend": "lmcache"})
    assert not pins_per_layer(lmcache, cpu_level(lmcache))


def test_an_unread_config_map_bounds_the_pool_at_twice_the_tier() -> None:
    spec = make_spec(model={"name": "acme/unknown", "configMap": {"name": "cfg"}})
    assert engine_pinned_bytes(spec, cpu_level(spec)) == 8 * GIB
    assert check_policy_errors(spec) == []


def check_policy_errors(spec: KVOffloadPolicySpec) -> list[str]:
    policy = KVOffloadPolicy.model_validate(
        {
            "apiVersion": "kvoffload.io/v1alpha1",
            "kind": "KVOffloadPolicy",
            "metadata": {"name": "p"},
            "spec": spec.model_dump(by_alias=True, exclude_none=True),
        }
    )
    return [str(e) for e in check_policy(policy)]

"""Sizing: KV bytes per token, tokens per tier, the pinned pool, /dev/shm, host memory, time and warnings."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.api.errors import PolicyError
from kvoffload.api.quantity import GIB, MIB
from kvoffload.api.serving import Architecture
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.policy.catalog import GPU_CLASSES, MODELS, find_gpu_class
from kvoffload.policy.hostmemory import host_memory
from kvoffload.policy.kvshape import (
    SizingError,
    kv_bytes_per_token,
    stored_bytes_per_token,
    tokens_held,
    with_architecture,
)
from kvoffload.policy.ladder import build_ladder, find_level
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.nodefit import check_policy
from kvoffload.policy.sizing import WarningCode, plan_spec
from kvoffload.policy.startup import (
    MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS,
    PIN_SECONDS_PER_GIB,
    PROGRESS_DEADLINE_MARGIN_SECONDS,
    progress_deadline_seconds,
    startup_seconds,
)

BASE: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
    "gpu": {"class": "nvidia-h100-80gb"},
    "replicas": 4,
    "resources": {"baseMemory": "24Gi", "headroom": "4Gi"},
    "offload": {"cpu": "32Gi"},
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


def make_policy(**sections: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    _merge(raw, sections)
    return {"apiVersion": "kvoffload.io/v1alpha1", "kind": "KVOffloadPolicy", "metadata": {"name": "p"}, "spec": raw}


def level(spec: KVOffloadPolicySpec, name: str):  # type: ignore[no-untyped-def]
    return find_level(build_ladder(spec), name=name)


def codes(spec: KVOffloadPolicySpec) -> list[WarningCode]:
    return [w.code for w in plan_spec(spec).warnings]


# --- the seed figures (docs/design.md, "Seed figures") -----------------------------------------------------


def test_qwen3_0_6b_bf16_takes_114688_bytes_per_token() -> None:
    assert kv_bytes_per_token(make_spec()) == 28 * 8 * 128 * 2 * 2 == 114_688


def test_half_a_gib_cpu_tier_holds_about_4681_qwen3_0_6b_tokens() -> None:
    spec = make_spec(offload={"cpu": "512Mi"})
    assert tokens_held(GIB // 2, kv_bytes_per_token(spec)) == 4_681
    assert plan_spec(spec).levels[-1].cpu_tokens == 4_681


def test_a_1480_token_prefix_is_about_170_mb_of_qwen3_0_6b_kv() -> None:
    restored = 1_480 * kv_bytes_per_token(make_spec())
    assert restored == 169_738_240
    assert restored == pytest.approx(169.7e6, rel=1e-3)


@pytest.mark.parametrize(
    ("model", "per_token"),
    [
        ("Qwen/Qwen3-0.6B", 114_688),
        ("Qwen/Qwen3-8B", 147_456),  # 36 × 8 × 128 × 2 × 2
        ("Qwen/Qwen3-32B", 262_144),  # 64 × 8 × 128 × 2 × 2
        ("meta-llama/Llama-3.1-8B", 131_072),  # 32 × 8 × 128 × 2 × 2
        ("meta-llama/Llama-3.1-70B", 327_680),  # 80 × 8 × 128 × 2 × 2
        ("mistralai/Mistral-7B-v0.3", 131_072),
        ("Qwen/Qwen2.5-7B-Instruct", 57_344),  # 28 × 4 × 128 × 2 × 2
        ("openai/gpt-oss-20b", 49_152),  # 24 × 8 × 64 × 2 × 2, all layers counted as full
        ("deepseek-ai/DeepSeek-V3", 70_272),  # MLA: 61 × (512 + 64) × 2
    ],
)
def test_kv_bytes_per_token_of_catalog_models(model: str, per_token: int) -> None:
    assert kv_bytes_per_token(make_spec(model={"name": model})) == per_token


def test_deepseek_v3_mla_stores_the_latent_not_per_head_kv() -> None:
    spec = make_spec(model={"name": "deepseek-ai/DeepSeek-V3"})
    # Per-head K and V (128 heads × (128 + 64) + 128 × 128) would be ~70× more.
    assert kv_bytes_per_token(spec) == 61 * (512 + 64) * 2


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_cache_halves_the_bytes_and_doubles_the_tokens(dtype: str) -> None:
    bf16 = make_spec(model={"name": "Qwen/Qwen3-8B"})
    fp8 = make_spec(model={"name": "Qwen/Qwen3-8B", "kvCacheDtype": dtype})
    assert kv_bytes_per_token(fp8) * 2 == kv_bytes_per_token(bf16) == 147_456
    assert plan_spec(bf16).levels[-1].cpu_tokens == 32 * GIB // 147_456 == 233_016
    assert plan_spec(fp8).levels[-1].cpu_tokens == 32 * GIB // 73_728 == 466_033  # twice, give or take the floor


def test_an_explicit_float16_kv_cache_on_an_fp8_architecture_is_two_bytes() -> None:
    arch = {"numLayers": 2, "numKVHeads": 2, "headDim": 64, "dtypeBytes": 1}
    assert kv_bytes_per_token(make_spec(model={"name": "local/tiny", "architecture": arch})) == 2 * 2 * 2 * 64 * 1
    spec = make_spec(model={"name": "local/tiny", "architecture": arch, "kvCacheDtype": "float16"})
    assert kv_bytes_per_token(spec) == 2 * 2 * 2 * 64 * 2


def test_llama_3_1_70b_on_tp4_shares_one_cpu_tier_across_the_ranks() -> None:
    spec = make_spec(
        model={"name": "meta-llama/Llama-3.1-70B", "tensorParallelSize": 4},
        gpu={"count": 4},
        offload={"cpu": "32Gi"},
    )
    plan = plan_spec(spec)
    # --kv-offloading-size is the total over the 4 ranks; 8 KV heads split 2 per rank, no copies.
    assert plan.kv_bytes_per_token == plan.stored_bytes_per_token == 327_680
    assert plan.levels[-1].cpu_tokens == 32 * GIB // 327_680 == 104_857
    assert plan.weight_bytes == round(70.6e9 * 2)
    assert WarningCode.TP_REPLICATES_KV not in codes(spec)


def test_tp_beyond_the_kv_heads_replicates_them_and_the_tiers_hold_fewer_tokens() -> None:
    spec = make_spec(
        model={"name": "Qwen/Qwen2.5-7B-Instruct", "tensorParallelSize": 8},  # 4 KV heads
        gpu={"count": 8},
    )
    assert stored_bytes_per_token(spec) == 2 * kv_bytes_per_token(spec)
    assert WarningCode.TP_REPLICATES_KV in codes(spec)


def test_mla_under_tp_keeps_the_latent_on_every_rank() -> None:
    spec = make_spec(
        model={"name": "deepseek-ai/DeepSeek-V3", "tensorParallelSize": 8},
        gpu={"class": "nvidia-h200-141gb", "count": 8},
        offload={"cpu": "256Gi"},
    )
    plan = plan_spec(spec)
    assert plan.stored_bytes_per_token == 8 * 70_272
    assert plan.levels[-1].cpu_tokens == 256 * GIB // (8 * 70_272)
    assert WarningCode.TP_REPLICATES_KV in [w.code for w in plan.warnings]


def test_a_tp_size_that_does_not_divide_the_kv_heads_warns_but_is_not_an_error() -> None:
    arch = {"numLayers": 4, "numKVHeads": 8, "headDim": 128}
    raw = make_policy(model={"name": "local/odd", "architecture": arch, "tensorParallelSize": 3}, gpu={"count": 3})
    policy = parse_policy(raw)  # check_policy does not refuse it
    assert WarningCode.TP_DOES_NOT_DIVIDE_KV_HEADS in codes(policy.spec)


# --- host memory -------------------------------------------------------------------------


def test_gpu_only_needs_base_plus_headroom_and_no_pool() -> None:
    spec = make_spec()
    mem = host_memory(spec, level(spec, "gpu-only"))
    assert (mem.pinned, mem.shm, mem.request, mem.limit) == (0, 0, 28 * GIB, 28 * GIB)


def test_a_32gi_cpu_tier_pins_32gi_with_33gi_of_shm_and_counts_the_pool_once() -> None:
    spec = make_spec()
    mem = host_memory(spec, level(spec, "cpu"))
    assert mem.pinned == 32 * GIB
    assert mem.shm == 33 * GIB
    assert mem.request == mem.limit == (24 + 32 + 4) * GIB  # not + shm: tmpfs pages are the pool


def test_the_pilot_level_pins_only_the_pilot_size() -> None:
    spec = make_spec(rollout={"pilotCpu": "4Gi"})
    mem = host_memory(spec, level(spec, "cpu-pilot"))
    assert (mem.pinned, mem.shm, mem.request) == (4 * GIB, 5 * GIB, 32 * GIB)


def test_an_overhead_factor_grows_the_pool_rounded_up_to_whole_mib() -> None:
    spec = make_spec(offload={"cpu": "32Gi", "overheadFactor": 1.92})  # vLLM issue 53042, hybrid model
    mem = host_memory(spec, level(spec, "cpu"))
    assert mem.pinned % MIB == 0
    assert 0 <= mem.pinned - 32 * GIB * 1.92 < MIB
    assert mem.request == 24 * GIB + mem.pinned + 4 * GIB


def test_a_memory_backed_secondary_tier_counts_against_the_limit() -> None:
    tier = {"name": "ram", "size": "8Gi", "path": "/kv", "volume": {"emptyDir": {"medium": "Memory"}}}
    spec = make_spec(offload={"cpu": "16Gi", "secondaryTiers": [tier]})
    assert host_memory(spec, level(spec, "ram")).request == (24 + 16 + 4 + 8) * GIB
    assert host_memory(spec, level(spec, "cpu")).request == (24 + 16 + 4) * GIB
    assert WarningCode.MEMORY_BACKED_TIER in codes(spec)


def test_a_disk_secondary_tier_adds_no_host_memory() -> None:
    tier = {"name": "nvme", "size": "500Gi", "path": "/mnt/kv"}
    spec = make_spec(offload={"secondaryTiers": [tier]})
    assert host_memory(spec, level(spec, "nvme")) == host_memory(spec, level(spec, "cpu"))
    assert plan_spec(spec).levels[-1].secondary_tiers[0].tokens == 500 * GIB // 114_688


# --- time ---------------------------------------------------------------------------------


def test_startup_budget_grows_by_the_pinning_rate_times_the_safety_factor() -> None:
    small = make_spec(offload={"cpu": "1Gi"})
    large = make_spec(offload={"cpu": "65Gi"})
    grown = startup_seconds(large, level(large, "cpu")) - startup_seconds(small, level(small, "cpu"))
    # 64 GiB more at 0.8 s/GiB, doubled: ~102 s, give or take the 10 s rounding.
    assert abs(grown - 64 * PIN_SECONDS_PER_GIB * 2) <= 10


def test_a_bigger_model_gets_a_longer_startup_budget() -> None:
    small = make_spec()
    big = make_spec(model={"name": "meta-llama/Llama-3.1-70B"}, gpu={"class": "nvidia-h200-141gb"})
    assert startup_seconds(big, level(big, "gpu-only")) > startup_seconds(small, level(small, "gpu-only"))


def test_progress_deadline_stays_as_written_when_startup_fits() -> None:
    spec = make_spec(rollout={"progressDeadline": "20m"})
    assert progress_deadline_seconds(spec, level(spec, "cpu")) == 1200
    assert WarningCode.PROGRESS_DEADLINE_STRETCHED not in codes(spec)


def test_progress_deadline_stretches_past_a_short_one_for_a_big_pool() -> None:
    spec = make_spec(offload={"cpu": "1000Gi"}, rollout={"progressDeadline": "5m"})
    cpu = level(spec, "cpu")
    assert progress_deadline_seconds(spec, cpu) == startup_seconds(spec, cpu) + PROGRESS_DEADLINE_MARGIN_SECONDS
    assert progress_deadline_seconds(spec, cpu) > 300
    assert WarningCode.PROGRESS_DEADLINE_STRETCHED in codes(spec)


def test_the_stretch_has_a_cap_and_a_longer_deadline_the_spec_sets_is_kept() -> None:
    # 8 TiB: no node holds it (check_policy refuses it), but the sizing functions still must not run away.
    spec = make_spec(offload={"cpu": "8Ti"}, rollout={"progressDeadline": "5m"})
    cpu = level(spec, "cpu")
    assert startup_seconds(spec, cpu) + PROGRESS_DEADLINE_MARGIN_SECONDS > MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS
    assert progress_deadline_seconds(spec, cpu) == MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS == 7200
    [warning] = [w for w in plan_spec(spec).warnings if w.code == WarningCode.PROGRESS_DEADLINE_STRETCHED]
    assert "the stretch stops at 2h" in warning.message
    longer = make_spec(offload={"cpu": "8Ti"}, rollout={"progressDeadline": "3h"})
    assert progress_deadline_seconds(longer, level(longer, "cpu")) == 3 * 3600


@pytest.mark.parametrize("gpu", GPU_CLASSES, ids=lambda g: g.name)
def test_the_cap_is_above_every_budget_a_policy_that_fits_the_node_can_need(gpu: Any) -> None:
    # The largest pool that passes check_policy (the whole node, less base and headroom) with the
    # heaviest catalog model on one GPU: the cap must not cut such a budget short.
    heaviest = max(MODELS, key=lambda m: m.weight_bytes)
    node_mib = gpu.host_ram_per_node_bytes // MIB
    raw = make_policy(
        model={"name": heaviest.name},
        gpu={"class": gpu.name, "count": 1},
        resources={"baseMemory": "1Mi", "headroom": "0"},
        offload={"cpu": f"{node_mib - 1}Mi"},
    )
    policy = parse_policy(raw)
    top = build_ladder(policy.spec)[-1]
    assert (
        startup_seconds(policy.spec, top) + PROGRESS_DEADLINE_MARGIN_SECONDS < MAX_STRETCHED_PROGRESS_DEADLINE_SECONDS
    )


# --- checks (errors) ----------------------------------------------------------------------------


def test_the_new_user_case_a_cpu_tier_larger_than_the_whole_node_is_an_error_naming_the_field() -> None:
    """offload.cpu 900Ti on an H100 (under the schema's 1Pi cap): 99999999Ti used to render with two warnings,
    a memory request of 104857598955008Mi and a progress deadline of 45,511,110 hours."""
    with pytest.raises(PolicyError) as caught:
        parse_policy(make_policy(offload={"cpu": "900Ti"}))
    [error] = caught.value.errors
    assert error.path == "spec.offload.cpu"
    assert "larger than a whole nvidia-h100-80gb node's host memory, 2.0 TiB" in error.message
    assert "NVIDIA DGX H100" in error.message


def test_the_overhead_factor_counts_in_the_tier_that_must_fit() -> None:
    gpu = find_gpu_class("nvidia-l4")
    assert gpu is not None
    node_gib = gpu.host_ram_per_node_bytes // GIB  # 768 GiB
    fits = make_policy(gpu={"class": "nvidia-l4"}, resources={"baseMemory": "1Gi", "headroom": "0"})
    fits["spec"]["offload"] = {"cpu": f"{node_gib // 2}Gi", "overheadFactor": 1.5}
    assert check_policy(KVOffloadPolicy.model_validate(fits)) == []
    fits["spec"]["offload"]["overheadFactor"] = 2.5
    [error] = check_policy(KVOffloadPolicy.model_validate(fits))
    assert error.path == "spec.offload.cpu"
    assert "with overheadFactor 2.5" in error.message


def test_a_memory_backed_tier_larger_than_the_node_is_an_error_at_its_size() -> None:
    tier = {"name": "ram", "size": "3Ti", "path": "/mnt/ram", "volume": {"emptyDir": {"medium": "Memory"}}}
    policy = KVOffloadPolicy.model_validate(make_policy(offload={"secondaryTiers": [tier]}))
    [error] = check_policy(policy)
    assert error.path == "spec.offload.secondaryTiers[0].size"
    disk = {**tier, "volume": {"emptyDir": {}}}  # on disk: not host memory
    assert check_policy(KVOffloadPolicy.model_validate(make_policy(offload={"secondaryTiers": [disk]}))) == []


def test_a_request_that_no_node_can_schedule_names_its_biggest_part() -> None:
    # Each part fits a 2 TiB node; together they do not.
    policy = KVOffloadPolicy.model_validate(
        make_policy(resources={"baseMemory": "1200Gi", "headroom": "4Gi"}, offload={"cpu": "1000Gi"})
    )
    [error] = check_policy(policy)
    assert error.path == "spec.resources.baseMemory"
    assert "no node can schedule it" in error.message
    assert "baseMemory 1.2 TiB + pinned pool 1000.0 GiB + headroom 4.0 GiB" in error.message


def test_more_gpus_per_engine_than_a_node_has_is_an_error() -> None:
    policy = KVOffloadPolicy.model_validate(make_policy(gpu={"count": 16}, model={"tensorParallelSize": 16}))
    assert [e.path for e in check_policy(policy)] == ["spec.gpu.count"]


def test_an_unknown_gpu_class_is_refused_at_its_path_listing_the_known_ones() -> None:
    policy = KVOffloadPolicy.model_validate(make_policy(gpu={"class": "nvidia-h100"}))
    [error] = check_policy(policy)
    assert error.path == "spec.gpu.class"
    assert "nvidia-h100-80gb" in error.message
    assert "amd-mi300x" in error.message


def test_a_model_outside_the_catalog_without_a_shape_is_refused_at_spec_model_name() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(make_policy(model={"name": "acme/secret-model"}))
    assert [e.path for e in caught.value.errors] == ["spec.model.name"]
    assert "spec.model.architecture" in caught.value.errors[0].message


def test_a_model_outside_the_catalog_with_an_architecture_is_accepted() -> None:
    arch = {"numLayers": 2, "numKVHeads": 2, "headDim": 64}
    policy = parse_policy(make_policy(model={"name": "acme/secret-model", "architecture": arch}))
    assert kv_bytes_per_token(policy.spec) == 2 * 2 * 2 * 64 * 2
    assert WarningCode.GPU_KV_CACHE_UNKNOWN in codes(policy.spec)


def test_a_model_outside_the_catalog_with_a_config_map_is_accepted_and_sized_once_read() -> None:
    policy = parse_policy(make_policy(model={"name": "acme/secret-model", "configMap": {"name": "acme-config"}}))
    with pytest.raises(SizingError, match=r"spec\.model\.configMap"):
        kv_bytes_per_token(policy.spec)
    arch = Architecture(num_layers=4, num_kv_heads=4, head_dim=64)
    assert kv_bytes_per_token(with_architecture(policy.spec, arch)) == 2 * 4 * 4 * 64 * 2


def test_both_errors_are_reported_together() -> None:
    policy = KVOffloadPolicy.model_validate(make_policy(model={"name": "acme/x"}, gpu={"class": "tpu-v5"}))
    assert sorted(e.path for e in check_policy(policy)) == ["spec.gpu.class", "spec.model.name"]


def test_mla_without_a_rope_dimension_is_refused() -> None:
    arch = {"numLayers": 2, "kvLoraRank": 512}
    policy = KVOffloadPolicy.model_validate(make_policy(model={"name": "acme/mla", "architecture": arch}))
    assert [e.path for e in check_policy(policy)] == ["spec.model.architecture.qkRopeHeadDim"]


# --- warnings -----------------------------------------------------------------------------------


def test_host_memory_over_the_nodes_share_warns_per_level() -> None:
    # L4 nodes: 96 GiB host RAM per GPU; 24 + 100 + 4 GiB does not fit.
    spec = make_spec(gpu={"class": "nvidia-l4"}, offload={"cpu": "100Gi"}, rollout={"pilotCpu": "4Gi"})
    over = [w for w in plan_spec(spec).warnings if w.code == WarningCode.HOST_MEMORY_OVER_NODE_SHARE]
    assert [w.level for w in over] == ["cpu"]
    assert "128.0 GiB" in over[0].message
    assert "96.0 GiB" in over[0].message


def test_a_cpu_tier_smaller_than_the_gpu_kv_cache_warns() -> None:
    # H100 80 GiB × 0.9 − 16.4 GB of Qwen3-8B weights ≈ 56.7 GiB of GPU KV cache.
    spec = make_spec(model={"name": "Qwen/Qwen3-8B"}, offload={"cpu": "32Gi"})
    plan = plan_spec(spec)
    assert plan.gpu_kv_cache_bytes == int(80 * GIB * 0.9) - round(8.2e9 * 2)
    assert WarningCode.CPU_TIER_BELOW_GPU_KV_CACHE in [w.code for w in plan.warnings]
    roomy = make_spec(model={"name": "Qwen/Qwen3-8B"}, offload={"cpu": "64Gi"})
    assert WarningCode.CPU_TIER_BELOW_GPU_KV_CACHE not in codes(roomy)


def test_a_tier_that_cannot_hold_one_max_model_len_prompt_warns() -> None:
    spec = make_spec(model={"maxModelLen": 32768}, offload={"cpu": "512Mi"})
    small = [w for w in plan_spec(spec).warnings if w.code == WarningCode.TIER_BELOW_MAX_MODEL_LEN]
    assert [w.level for w in small] == ["cpu"]
    assert "4,681 tokens" in small[0].message


def test_weights_that_fill_the_gpus_leave_no_kv_cache() -> None:
    spec = make_spec(model={"name": "meta-llama/Llama-3.1-70B"}, gpu={"class": "nvidia-l4"})
    plan = plan_spec(spec)
    assert plan.gpu_kv_cache_tokens == 0
    assert WarningCode.WEIGHTS_FILL_GPU in [w.code for w in plan.warnings]


def test_sliding_window_models_warn_that_the_figure_is_an_upper_bound() -> None:
    assert WarningCode.SLIDING_WINDOW_UPPER_BOUND in codes(make_spec(model={"name": "openai/gpt-oss-120b"}))
    assert WarningCode.SLIDING_WINDOW_UPPER_BOUND not in codes(make_spec())


def test_lmcache_warns_that_its_pool_figures_are_assumed() -> None:
    assert WarningCode.LMCACHE_SIZING in codes(make_spec(offload={"backend": "lmcache"}))
    assert WarningCode.LMCACHE_SIZING not in codes(make_spec())


def test_a_comfortable_policy_has_no_warnings() -> None:
    spec = make_spec(model={"name": "Qwen/Qwen3-8B", "maxModelLen": 32768}, offload={"cpu": "96Gi"})
    assert codes(spec) == []


# --- properties ------------------------------------------------------------------------------------

sizes_mib = st.integers(min_value=1, max_value=4 * 1024 * 1024)  # 1 MiB .. 4 TiB


@settings(max_examples=60, deadline=None)
@given(
    cpu=sizes_mib,
    base=st.integers(min_value=1, max_value=512 * 1024),
    headroom=st.integers(min_value=0, max_value=64 * 1024),
    factor=st.floats(min_value=1.0, max_value=4.0),
)
def test_request_is_base_plus_pool_plus_headroom_and_shm_covers_the_pool(
    cpu: int, base: int, headroom: int, factor: float
) -> None:
    spec = make_spec(
        resources={"baseMemory": f"{base}Mi", "headroom": f"{headroom}Mi"},
        offload={"cpu": f"{cpu}Mi", "overheadFactor": factor},
    )
    mem = host_memory(spec, level(spec, "cpu"))
    assert mem.request == mem.limit == (base + headroom) * MIB + mem.pinned
    assert mem.pinned >= cpu * MIB * factor
    assert mem.shm >= mem.pinned + GIB


@settings(max_examples=60, deadline=None)
@given(a=sizes_mib, b=sizes_mib)
def test_a_bigger_cpu_tier_never_holds_fewer_tokens_nor_starts_faster(a: int, b: int) -> None:
    small, big = sorted((a, b))
    s, g = make_spec(offload={"cpu": f"{small}Mi"}), make_spec(offload={"cpu": f"{big}Mi"})
    ps, pg = plan_spec(s).levels[-1], plan_spec(g).levels[-1]
    assert ps.cpu_tokens is not None
    assert pg.cpu_tokens is not None
    assert ps.cpu_tokens <= pg.cpu_tokens
    assert ps.startup_seconds <= pg.startup_seconds
    assert ps.progress_deadline_seconds <= pg.progress_deadline_seconds

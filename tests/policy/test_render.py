"""Rendering: golden manifests per policy and level, the engine flags per backend and tier,
the pod shape, the config hash, render-time refusals, and `kvoffload render`.

Regenerate the golden files after an intended change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/policy/test_render.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.api.errors import PolicyError
from kvoffload.api.quantity import GIB, quantity_bytes
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.main import main
from kvoffload.engines.vllm.command import gib, kv_transfer_config
from kvoffload.policy.engine_config import config_hash, engine_args, engine_env
from kvoffload.policy.hostmemory import host_memory
from kvoffload.policy.ladder import Level, build_ladder, find_level
from kvoffload.policy.render import SAMPLE_LIMIT, dump_yaml, render, render_level, render_pod_monitor
from kvoffload.policy.startup import startup_seconds
from tests.policy.render_policies import (
    BASE,
    DATA,
    EXAMPLES,
    GOLDEN,
    LevelCase,
    case_id,
    level_cases,
    make_policy,
    merge,
    policy_files,
    policy_object,
)

LEVEL_CASES = level_cases()
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))


def level(policy: KVOffloadPolicy, name: str) -> Level:
    return find_level(build_ladder(policy.spec), name=name)


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = deployment(docs)["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "vllm")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --- golden files ---------------------------------------------------------------------


def golden_path(case: LevelCase, variant: str = "stable") -> Path:
    prefix = "" if variant == "stable" else f"{variant}-"
    return GOLDEN / case_id(case.file) / f"{prefix}{case.level.index}-{case.level.name}.yaml"


def golden_cases() -> list[tuple[LevelCase, str]]:
    """Every level as GitOps renders it, plus each policy's top level as a canary."""
    cases = [(c, "stable") for c in LEVEL_CASES]
    tops: dict[Path, LevelCase] = {}
    for c in LEVEL_CASES:
        tops[c.file] = c  # ladders are bottom first: the last one wins
    return cases + [(c, "canary") for c in tops.values()]


GOLDEN_CASES = golden_cases()


@pytest.mark.parametrize(("case", "variant"), GOLDEN_CASES, ids=[f"{v}:{c.id}" for c, v in GOLDEN_CASES])
def test_rendered_manifests_match_the_golden_files(case: LevelCase, variant: str) -> None:
    docs = render_level(case.policy, case.level) if variant == "stable" else render(case.policy, case.level, "canary")
    text = dump_yaml(docs)
    path = golden_path(case, variant)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}; run UPDATE_GOLDEN=1 pytest tests/policy/test_render.py"
    assert text == path.read_text(), f"{path} differs; if intended, regenerate with UPDATE_GOLDEN=1"


def test_every_golden_file_belongs_to_a_rendered_case() -> None:
    expected = {golden_path(c, v) for c, v in GOLDEN_CASES}
    stale = sorted(p for p in GOLDEN.rglob("*.yaml") if p not in expected)
    if UPDATE:
        for p in stale:
            p.unlink()
        return
    assert not stale, f"golden files without a case (delete them or rerun with UPDATE_GOLDEN=1): {stale}"


def test_the_policies_under_test_include_the_examples() -> None:
    folders = {p.parent for p in policy_files()}
    assert DATA in folders
    if any(EXAMPLES.glob("*.yaml")):
        assert EXAMPLES in folders


# --- the engine command line per backend and tier ---------------------------------------


def test_gpu_only_level_has_no_offload_flags() -> None:
    policy = make_policy(
        offload={"cpu": "32Gi", "secondaryTiers": [{"name": "nvme", "size": "1Ti", "path": "/mnt/kv"}]}
    )
    args = engine_args(policy, level(policy, "gpu-only"))
    assert [a for a in args if a.startswith("--kv-")] == ["--kv-cache-dtype"]
    assert engine_env(policy.spec, level(policy, "gpu-only")) == []


@pytest.mark.parametrize(
    ("cpu", "expected_gib"),
    [
        ("512Mi", "0.5"),
        ("32Gi", "32"),
        ("1.5G", "1.3969838619232177734375"),  # decimal gigabytes: exact in binary GiB too
        ("536870913", "0.500000000931322574615478515625"),  # one byte over 0.5 GiB survives
    ],
)
def test_native_cpu_tier_alone_uses_the_plain_flags_with_exact_gib(cpu: str, expected_gib: str) -> None:
    policy = make_policy(offload={"cpu": cpu})
    args = engine_args(policy, level(policy, "cpu"))
    assert args[args.index("--kv-offloading-size") : args.index("--kv-offloading-size") + 4] == [
        "--kv-offloading-size",
        expected_gib,
        "--kv-offloading-backend",
        "native",
    ]
    assert flag(args, "--kv-transfer-config") is None
    # vLLM takes float(size) * 2**30; the decimal must land on the configured bytes.
    assert float(expected_gib) * GIB == quantity_bytes(cpu)


@pytest.mark.parametrize(
    ("offload", "extra"),
    [
        ({"evictionPolicy": "arc"}, {"eviction_policy": "arc"}),
        ({"blockSize": 64}, {"block_size": 64}),
        ({"storeThreshold": 2}, {"store_threshold": 2}),
    ],
    ids=["arc-eviction", "block-size", "store-threshold"],
)
def test_native_cpu_tier_settings_go_into_a_cpu_offloading_spec(offload: dict[str, Any], extra: dict[str, Any]) -> None:
    policy = make_policy(offload={"cpu": "32Gi", **offload})
    args = engine_args(policy, level(policy, "cpu"))
    config = json.loads(flag(args, "--kv-transfer-config") or "null")
    assert config["kv_connector"] == "OffloadingConnector"
    assert config["kv_role"] == "kv_both"
    assert config["kv_connector_extra_config"] == {
        "spec_name": "CPUOffloadingSpec",
        "cpu_bytes_to_use": 32 * GIB,
        "eviction_policy": "lru",
        **extra,
    }
    assert flag(args, "--kv-offloading-size") == "32"  # keeps vllm:cache_config_info telling the tier


def test_native_secondary_tiers_go_into_a_tiering_offloading_spec_level_by_level() -> None:
    tiers = [
        {"name": "nvme", "size": "1Ti", "path": "/mnt/kv-nvme", "readThreads": 32, "writeThreads": 16},
        {
            "name": "shared",
            "size": "4Ti",
            "path": "/mnt/kv-shared",
            "volume": {"persistentVolumeClaim": {"claimName": "kv"}},
        },
    ]
    policy = make_policy(offload={"cpu": "64Gi", "secondaryTiers": tiers})
    nvme = json.loads(flag(engine_args(policy, level(policy, "nvme")), "--kv-transfer-config") or "null")
    shared = json.loads(flag(engine_args(policy, level(policy, "shared")), "--kv-transfer-config") or "null")
    assert nvme["kv_connector_extra_config"] == {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 64 * GIB,
        "eviction_policy": "lru",
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv-nvme", "n_read_threads": 32, "n_write_threads": 16}],
    }
    assert [t["root_dir"] for t in shared["kv_connector_extra_config"]["secondary_tiers"]] == [
        "/mnt/kv-nvme",
        "/mnt/kv-shared",
    ]
    assert shared["kv_connector_extra_config"]["secondary_tiers"][1]["n_read_threads"] == 16  # the model's default


def test_cpu_pilot_level_offloads_the_pilot_size_only() -> None:
    policy = make_policy(offload={"cpu": "32Gi", "evictionPolicy": "arc"}, rollout={"pilotCpu": "4Gi"})
    args = engine_args(policy, level(policy, "cpu-pilot"))
    assert flag(args, "--kv-offloading-size") == "4"
    config = kv_transfer_config(policy.spec, level(policy, "cpu-pilot"))
    assert config is not None
    assert config["kv_connector_extra_config"]["cpu_bytes_to_use"] == 4 * GIB


def test_lmcache_cpu_tier_uses_the_v1_connector_and_per_rank_gib() -> None:
    policy = make_policy(
        model={"tensorParallelSize": 2},
        gpu={"count": 2},
        offload={"backend": "lmcache", "cpu": "40Gi", "blockSize": 256},
    )
    cpu = level(policy, "cpu")
    args = engine_args(policy, cpu)
    assert json.loads(flag(args, "--kv-transfer-config") or "null") == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
    }
    # --kv-offloading-backend lmcache would select LMCacheMPConnector (a separate server).
    assert flag(args, "--kv-offloading-size") is None
    assert flag(args, "--kv-offloading-backend") is None
    assert engine_env(policy.spec, cpu) == [
        {"name": "LMCACHE_LOCAL_CPU", "value": "True"},
        {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "20"},  # 40 GiB over 2 TP ranks
        {"name": "LMCACHE_CHUNK_SIZE", "value": "256"},
    ]


def test_lmcache_disk_tier_sets_the_local_disk_variables() -> None:
    policy = make_policy(
        offload={
            "backend": "lmcache",
            "cpu": "8Gi",
            "secondaryTiers": [{"name": "disk", "size": "100Gi", "path": "/kv"}],
        },
        model={"env": [{"name": "LMCACHE_LOG_LEVEL", "value": "INFO"}]},
    )
    env = engine_env(policy.spec, level(policy, "disk"))
    assert {"name": "LMCACHE_LOCAL_DISK", "value": "file:///kv/"} in env
    assert {"name": "LMCACHE_MAX_LOCAL_DISK_SIZE", "value": "100"} in env
    assert env[-1] == {"name": "LMCACHE_LOG_LEVEL", "value": "INFO"}  # the spec's own env comes last
    assert "LMCACHE_LOCAL_DISK" not in {e["name"] for e in engine_env(policy.spec, level(policy, "cpu"))}


def test_managed_flags_come_first_and_extra_args_last() -> None:
    policy = make_policy(model={"extraArgs": ["--enable-prefix-caching", "--max-num-seqs=64"], "kvCacheDtype": "fp8"})
    args = engine_args(policy, level(policy, "cpu"))
    assert args[:14] == [
        "--model",
        "Qwen/Qwen3-8B",
        "--served-model-name",
        "chat",  # metadata.name when servedModelName is not set
        "--port",
        "8000",
        "--max-model-len",
        "16384",
        "--tensor-parallel-size",
        "1",
        "--kv-cache-dtype",
        "fp8",
        "--gpu-memory-utilization",
        "0.9",
    ]
    assert args[-2:] == ["--enable-prefix-caching", "--max-num-seqs=64"]


@pytest.mark.parametrize(("n_bytes", "text"), [(GIB, "1"), (GIB // 2, "0.5"), (3 * GIB // 4, "0.75"), (0, "0")])
def test_gib_is_an_exact_decimal(n_bytes: int, text: str) -> None:
    assert gib(n_bytes) == text


# --- the pod and its neighbours ---------------------------------------------------------


def test_a_deployment_is_named_and_selected_by_policy_and_level_and_its_role_changes_nothing_but_replicas() -> None:
    policy = make_policy()
    cpu = level(policy, "cpu")
    stable, canary = (
        deployment(render(policy, cpu, role, replicas)) for role, replicas in (("stable", 3), ("canary", 1))
    )
    for dep, replicas in ((stable, 3), (canary, 1)):
        assert dep["metadata"]["name"] == "chat-cpu"
        assert dep["metadata"]["namespace"] == "llm"
        assert dep["spec"]["replicas"] == replicas
        assert dep["spec"]["selector"]["matchLabels"] == {"kvoffload.io/policy": "chat", "kvoffload.io/level": "cpu"}
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert "kvoffload.io/variant" not in labels  # a role label would restart the pods when the role moves
        assert labels["kvoffload.io/level"] == "cpu"
        assert labels["kvoffload.io/config-hash"] == config_hash(policy, cpu)
    # the role moves without touching the pod template: promotion never restarts an engine
    assert stable["spec"]["template"] == canary["spec"]["template"]
    assert {**stable, "spec": {**stable["spec"], "replicas": 1}} == canary


def test_default_replicas_are_the_fleet_for_stable_and_the_canary_count_for_canary() -> None:
    policy = make_policy(replicas=5, rollout={"canaryReplicas": 2})
    cpu = level(policy, "cpu")
    assert deployment(render(policy, cpu, "stable"))["spec"]["replicas"] == 5
    assert deployment(render(policy, cpu, "canary"))["spec"]["replicas"] == 2
    assert deployment(render_level(policy, cpu))["spec"]["replicas"] == 5


def test_service_splits_traffic_across_variants_by_selecting_the_policy_only() -> None:
    policy = make_policy()
    service = next(d for d in render_level(policy, level(policy, "cpu")) if d["kind"] == "Service")
    assert service["spec"]["selector"] == {"kvoffload.io/policy": "chat"}
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("interval", "expected"), [("30s", "30s"), ("1500ms", "1s500ms"), ("2m", "2m"), ("1.5m", "1m30s")]
)
def test_pod_monitor_copies_policy_level_and_config_hash_labels_and_scrapes_every_interval(
    interval: str, expected: str
) -> None:
    policy = make_policy(analysis={"interval": interval})
    monitor = next(d for d in render_level(policy, level(policy, "cpu")) if d["kind"] == "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"] == {"matchLabels": {"kvoffload.io/policy": "chat"}}
    assert monitor["spec"]["podTargetLabels"] == [
        "kvoffload.io/policy",
        "kvoffload.io/level",
        "kvoffload.io/config-hash",
    ]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics", "interval": expected}]


def test_memory_is_guaranteed_and_sized_by_the_level() -> None:
    policy = make_policy(offload={"cpu": "32Gi"}, rollout={"pilotCpu": "4Gi"})
    for name in ("gpu-only", "cpu-pilot", "cpu"):
        lv = level(policy, name)
        resources = container(render_level(policy, lv))["resources"]
        assert resources["requests"] == resources["limits"]
        assert quantity_bytes(resources["limits"]["memory"]) == host_memory(policy.spec, lv).request
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        assert resources["limits"]["cpu"] == "8"


def test_dev_shm_is_a_memory_volume_sized_for_the_pool() -> None:
    policy = make_policy(offload={"cpu": "32Gi"})
    for name, expected in (("gpu-only", GIB), ("cpu", host_memory(policy.spec, level(policy, "cpu")).shm)):
        docs = render_level(policy, level(policy, name))
        pod = deployment(docs)["spec"]["template"]["spec"]
        dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert dshm["emptyDir"]["medium"] == "Memory"
        assert quantity_bytes(dshm["emptyDir"]["sizeLimit"]) == expected
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container(docs)["volumeMounts"]
    assert host_memory(policy.spec, level(policy, "cpu")).shm >= 33 * GIB


def test_engine_clears_stale_offload_files_from_dev_shm_before_every_start() -> None:
    policy = make_policy()
    engine = container(render_level(policy, level(policy, "cpu")))
    command = engine["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    script = command[2]
    assert script.index("rm -f /dev/shm/vllm_offload_*") < script.index('exec vllm serve "$@"')
    assert engine["args"][0] == "--model"


def test_tier_volumes_are_mounted_at_their_paths_and_bounded_by_their_size() -> None:
    tiers = [
        {"name": "nvme", "size": "500Gi", "path": "/mnt/kv"},
        {
            "name": "pvc",
            "size": "1Ti",
            "path": "/mnt/pvc",
            "volume": {"persistentVolumeClaim": {"claimName": "kv-cache"}},
        },
        {"name": "host", "size": "1Ti", "path": "/mnt/host", "volume": {"hostPath": {"path": "/nvme/kv"}}},
    ]
    policy = make_policy(offload={"cpu": "8Gi", "secondaryTiers": tiers})
    docs = render_level(policy, level(policy, "host"))
    volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert volumes["kv-nvme"] == {"name": "kv-nvme", "emptyDir": {"sizeLimit": "500Gi"}}
    assert volumes["kv-pvc"] == {"name": "kv-pvc", "persistentVolumeClaim": {"claimName": "kv-cache"}}
    assert volumes["kv-host"] == {"name": "kv-host", "hostPath": {"path": "/nvme/kv", "type": "DirectoryOrCreate"}}
    assert mounts == {"dshm": "/dev/shm", "kv-nvme": "/mnt/kv", "kv-pvc": "/mnt/pvc", "kv-host": "/mnt/host"}
    assert container(docs)["resources"]["requests"]["ephemeral-storage"] == "500Gi"
    lower = render_level(policy, level(policy, "nvme"))
    assert {m["name"] for m in container(lower)["volumeMounts"]} == {"dshm", "kv-nvme"}


def test_startup_probe_allows_the_startup_budget_and_grows_with_the_pool() -> None:
    policy = make_policy(offload={"cpu": "256Gi"}, resources={"baseMemory": "64Gi"})
    budgets = []
    for name in ("gpu-only", "cpu"):
        lv = level(policy, name)
        probe = container(render_level(policy, lv))["startupProbe"]
        allowed = probe["periodSeconds"] * probe["failureThreshold"]
        assert startup_seconds(policy.spec, lv) <= allowed < startup_seconds(policy.spec, lv) + probe["periodSeconds"]
        assert probe["httpGet"] == {"path": "/health", "port": "http"}
        budgets.append(allowed)
    assert budgets[1] > budgets[0]


def test_probes_and_strategy_suit_a_gpu_engine() -> None:
    policy = make_policy()
    docs = render_level(policy, level(policy, "cpu"))
    engine = container(docs)
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
    assert engine["livenessProbe"]["failureThreshold"] * engine["livenessProbe"]["periodSeconds"] >= 60
    assert deployment(docs)["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    surge = make_policy(rollout={"maxSurge": 1})
    assert deployment(render_level(surge, level(surge, "cpu")))["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


def test_gpu_class_scheduling_merges_with_the_spec() -> None:
    policy = make_policy(
        gpu={
            "class": "nvidia-h100-80gb",
            "nodeSelector": {"pool": "llm", "nvidia.com/gpu.product": "NVIDIA-H100-NVL"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        }
    )
    pod = deployment(render_level(policy, level(policy, "cpu")))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-NVL", "pool": "llm"}  # the spec wins
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
    ]


# --- the config hash ------------------------------------------------------------------


def test_config_hash_is_stable_per_level_and_ignores_replicas_and_variant() -> None:
    policy = make_policy(offload={"cpu": "32Gi"}, rollout={"pilotCpu": "4Gi"})
    ladder = build_ladder(policy.spec)
    hashes = [config_hash(policy, lv) for lv in ladder]
    assert len(set(hashes)) == len(ladder)
    assert hashes == [
        config_hash(make_policy(offload={"cpu": "32Gi"}, rollout={"pilotCpu": "4Gi"}), lv) for lv in ladder
    ]
    more = make_policy(replicas=9, offload={"cpu": "32Gi"}, rollout={"pilotCpu": "4Gi", "canaryReplicas": 3})
    assert [config_hash(more, lv) for lv in build_ladder(more.spec)] == hashes
    canary = deployment(render(policy, ladder[-1], "canary", 1))
    assert canary["metadata"]["labels"]["kvoffload.io/config-hash"] == hashes[-1]


def test_config_hash_changes_with_the_engine_config() -> None:
    base = make_policy()
    cpu = level(base, "cpu")
    changed = [
        make_policy(model={"extraArgs": ["--enable-prefix-caching"]}),
        make_policy(model={"env": [{"name": "A", "value": "1"}]}),
        make_policy(model={"image": "vllm/vllm-openai:v0.32.1"}),
        make_policy(resources={"baseMemory": "32Gi"}),
    ]
    assert all(config_hash(p, level(p, "cpu")) != config_hash(base, cpu) for p in changed)


# --- what only rendering can refuse -------------------------------------------------------


def tiers(*entries: dict[str, Any], **offload: Any) -> dict[str, Any]:
    """An ``offload`` patch: an 8Gi CPU tier and these secondary tiers (100Gi each)."""
    return {"offload": {"cpu": "8Gi", "secondaryTiers": [{"size": "100Gi", **e} for e in entries], **offload}}


def tier_at(path: str) -> dict[str, Any]:
    return tiers({"name": "a", "path": path})


READ_ONLY_CLAIM = {"persistentVolumeClaim": {"claimName": "c", "readOnly": True}}


@pytest.mark.parametrize(
    ("patch", "paths"),
    [
        (tier_at("/dev/shm"), ["secondaryTiers[0].path"]),
        (tier_at("/dev/shm/kv"), ["secondaryTiers[0].path"]),
        (tier_at("/dev"), ["secondaryTiers[0].path"]),
        (tier_at("/usr"), ["secondaryTiers[0].path"]),
        (tier_at("/mnt//kv"), ["secondaryTiers[0].path"]),
        (tier_at("/mnt/kv/"), ["secondaryTiers[0].path"]),
        (tiers({"name": "a", "path": "/mnt/kv"}, {"name": "b", "path": "/mnt/kv/b"}), ["secondaryTiers[1].path"]),
        (
            tiers({"name": "a", "path": "/kv", "volume": READ_ONLY_CLAIM}),
            ["secondaryTiers[0].volume.persistentVolumeClaim.readOnly"],
        ),
        (tiers({"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}, backend="lmcache"), ["secondaryTiers"]),
        (tiers(backend="lmcache", evictionPolicy="arc"), ["evictionPolicy"]),
        (tiers(backend="lmcache", storeThreshold=2), ["storeThreshold"]),
        (tiers(blockSize=24), ["blockSize"]),
    ],
    ids=[
        "tier-on-dev-shm",
        "tier-inside-dev-shm",
        "tier-above-dev-shm",
        "tier-hides-usr",
        "double-slash",
        "trailing-slash",
        "nested-tiers",
        "read-only-claim",
        "lmcache-two-disks",
        "lmcache-arc",
        "lmcache-store-threshold",
        "block-size-not-a-gpu-block-multiple",
    ],
)
def test_render_refuses_offload_settings_that_cannot_work(patch: dict[str, Any], paths: list[str]) -> None:
    policy = make_policy(**patch)
    with pytest.raises(PolicyError) as caught:
        render_level(policy, build_ladder(policy.spec)[-1])
    assert [e.path for e in caught.value.errors] == [f"spec.offload.{p}" for p in paths]


@pytest.mark.parametrize(
    ("gpu", "paths"),
    [
        ({"nodeSelector": {"pool": "has space"}}, ["spec.gpu.nodeSelector['pool']"]),
        ({"nodeSelector": {"a/b/c": "x"}}, ["spec.gpu.nodeSelector['a/b/c']"]),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, ["spec.gpu.tolerations[0].value"]),
        ({"tolerations": [{"operator": "Equal", "value": "v"}]}, ["spec.gpu.tolerations[0].operator"]),
    ],
    ids=["selector-value", "selector-key", "exists-with-value", "equal-without-key"],
)
def test_render_refuses_scheduling_the_api_server_would_reject(gpu: dict[str, Any], paths: list[str]) -> None:
    # The models alone: a key-less toleration is the admin's to allow (tenancy), judged before rendering.
    policy = KVOffloadPolicy.model_validate(policy_object(gpu=gpu))
    with pytest.raises(PolicyError) as caught:
        render_level(policy, level(policy, "cpu"))
    assert [e.path for e in caught.value.errors] == paths


@pytest.mark.parametrize("name", ["9lives", "chat.v2", "a" * 64])
def test_render_refuses_a_name_a_service_cannot_have(name: str) -> None:
    policy = make_policy(metadata={"name": name})
    with pytest.raises(PolicyError) as caught:
        render_level(policy, level(policy, "cpu"))
    assert [e.path for e in caught.value.errors] == ["metadata.name"]


def test_render_refuses_env_it_manages_or_that_repeats() -> None:
    policy = make_policy(
        offload={"backend": "lmcache", "cpu": "8Gi"},
        model={"env": [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "99"}, {"name": "A"}, {"name": "A"}]},
    )
    with pytest.raises(PolicyError) as caught:
        render_level(policy, level(policy, "cpu"))
    assert [e.path for e in caught.value.errors] == ["spec.model.env[0].name", "spec.model.env[2].name"]


def test_render_refuses_an_unknown_gpu_class_even_without_validation() -> None:
    policy = KVOffloadPolicy.model_validate(merge(BASE, {"spec": {"gpu": {"class": "tpu-v5"}}}))
    with pytest.raises(PolicyError) as caught:
        render_level(policy, level(policy, "cpu"))
    assert [e.path for e in caught.value.errors] == ["spec.gpu.class"]


# --- kvoffload render -----------------------------------------------------------------------


def write_policy(tmp_path: Path, obj: dict[str, Any]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def test_cli_render_prints_the_chosen_level_as_multi_document_yaml(tmp_path: Path) -> None:
    obj = merge(BASE, {"spec": {"rollout": {"pilotCpu": "4Gi"}}})
    path = write_policy(tmp_path, obj)
    policy = make_policy(rollout={"pilotCpu": "4Gi"})
    runner = CliRunner()
    by_index = runner.invoke(main, ["render", str(path), "--level", "1"])
    by_name = runner.invoke(main, ["render", str(path), "--level", "cpu-pilot"])
    by_old_name = runner.invoke(main, ["render", str(path), "--stage", "cpu-pilot"])
    top = runner.invoke(main, ["render", str(path)])
    assert by_index.exit_code == 0, by_index.output
    assert "--stage is deprecated" in by_old_name.stderr
    assert (
        by_index.stdout
        == by_name.stdout
        == by_old_name.stdout
        == dump_yaml(render_level(policy, level(policy, "cpu-pilot")))
    )
    assert [d["kind"] for d in yaml.safe_load_all(by_index.stdout)] == ["Deployment", "Service", "PodMonitor"]
    assert by_index.stdout.startswith("---\n")
    assert top.stdout == dump_yaml(render_level(policy, level(policy, "cpu")))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--level", "7"], "no ladder level 7; the levels are 0=gpu-only, 1=cpu"),
        (["--level", "nvme"], "no ladder level 'nvme'; the levels are 0=gpu-only, 1=cpu"),
        (["--level", "1", "--stage", "cpu"], "not both"),
    ],
)
def test_cli_render_names_the_choices_for_a_bad_level_and_prints_nothing(
    tmp_path: Path, options: list[str], message: str
) -> None:
    result = CliRunner().invoke(main, ["render", str(write_policy(tmp_path, BASE)), *options])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert message in result.stderr


def test_cli_render_reports_bad_fields_by_path_and_prints_nothing(tmp_path: Path) -> None:
    bad = merge(BASE, {"spec": tier_at("/dev/shm")})
    result = CliRunner().invoke(main, ["render", str(write_policy(tmp_path, bad))])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "spec.offload.secondaryTiers[0].path" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_pod_monitor_holds_an_engines_scrape_to_twenty_times_what_real_vllm_exposes() -> None:
    monitor = render_pod_monitor(make_policy())
    real = [
        line
        for name in ("vllm-0.32.0-cpu-metrics.txt", "vllm-0.26.0-gpu-offload-metrics.txt")
        for line in (DATA / name).read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert monitor["spec"]["sampleLimit"] == SAMPLE_LIMIT
    assert 10 * len(real) <= SAMPLE_LIMIT  # both captures together, ten times over

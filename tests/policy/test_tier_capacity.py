"""Tier capacity for KV-aware routers: the pods carry ``kvoffload.io/tier-capacity-tokens``, and its
figures are exactly the ones ``kvoffload plan`` prints for the same policy and level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.api.conventions import ANNOTATION_TIER_CAPACITY
from kvoffload.api.quantity import GIB, MIB
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.main import main
from kvoffload.policy.kvshape import stored_bytes_per_token
from kvoffload.policy.ladder import build_ladder, find_level
from kvoffload.policy.render import render
from tests.policy.render_policies import BASE, EXAMPLES, LAB, case_id, merge, policy_files
from tests.support import paths

POLICY_FILES = policy_files()


def run(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, *LAB])
    assert result.exit_code == 0, result.output
    return result.stdout


def pod_annotations(manifests: str) -> dict[str, str]:
    deployment = next(d for d in yaml.safe_load_all(manifests) if d["kind"] == "Deployment")
    annotations: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
    return annotations


def plan_figures(level: dict[str, Any]) -> dict[str, int]:
    """What `kvoffload plan -o json` says each tier of a level holds: the CPU tier, then the secondary ones."""
    if level["cpuTokens"] is None:
        return {}
    return {"cpu": level["cpuTokens"], **{tier["name"]: tier["tokens"] for tier in level["secondaryTiers"]}}


@pytest.mark.parametrize("path", POLICY_FILES, ids=[case_id(p) for p in POLICY_FILES])
def test_every_level_s_pods_carry_the_tokens_kvoffload_plan_gives_each_tier(path: Path) -> None:
    plan = json.loads(run("plan", str(path), "-o", "json"))
    for level in plan["levels"]:
        rendered = run("render", str(path), "--level", str(level["index"]))
        capacity = json.loads(pod_annotations(rendered)[ANNOTATION_TIER_CAPACITY])
        assert capacity == plan_figures(level), f"level {level['name']}"
        assert list(capacity) == level["tiers"], "tiers in ladder order"


def test_the_demo_s_nvme_pods_hold_what_the_arithmetic_says() -> None:
    # Qwen3-0.6B in bf16: 2 x 28 layers x 8 KV heads x 128 x 2 B = 114,688 B per token.
    # cpu 2304Mi -> 2,415,919,104 // 114,688 = 21,065; nvme 8Gi -> 8,589,934,592 // 114,688 = 74,898.
    rendered = run("render", str(EXAMPLES / "demo-two-tier.yaml"), "--level", "nvme")
    assert json.loads(pod_annotations(rendered)[ANNOTATION_TIER_CAPACITY]) == {"cpu": 21_065, "nvme": 74_898}
    assert 2304 * MIB // 114_688 == 21_065
    assert 8 * GIB // 114_688 == 74_898


def test_gpu_only_pods_say_no_offload_tier_holds_anything() -> None:
    rendered = run("render", str(EXAMPLES / "demo-two-tier.yaml"), "--level", "gpu-only")
    assert pod_annotations(rendered)[ANNOTATION_TIER_CAPACITY] == "{}"


def test_a_canary_carries_its_own_level_s_capacity_not_the_stable_one_s() -> None:
    policy = KVOffloadPolicy.model_validate(
        merge(BASE, {"spec": {"rollout": {"pilotCpu": "4Gi"}}})  # Qwen3-8B: 147,456 B per token
    )
    ladder = build_ladder(policy.spec)
    pilot, cpu = find_level(ladder, name="cpu-pilot"), find_level(ladder, name="cpu")
    per_token = stored_bytes_per_token(policy.spec)
    assert per_token == 147_456
    for level, size in ((pilot, 4 * GIB), (cpu, 32 * GIB)):
        deployment = render(policy, level, "canary")[0]
        annotation = deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION_TIER_CAPACITY]
        assert json.loads(annotation) == {"cpu": size // per_token}


def test_tensor_parallel_replicas_of_kv_heads_shrink_what_each_pod_holds(tmp_path: Path) -> None:
    # Qwen2.5-7B has 4 KV heads: at TP 8 (a whole node) every head is kept twice, so a token takes twice the bytes.
    doc = merge(
        BASE,
        {"spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct", "tensorParallelSize": 8}, "gpu": {"count": 8}}},
    )
    path = tmp_path / "tp8.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = json.loads(run("plan", str(path), "-o", "json"))
    assert plan["storedBytesPerToken"] == 2 * plan["kvBytesPerToken"]
    capacity = json.loads(pod_annotations(run("render", str(path)))[ANNOTATION_TIER_CAPACITY])
    assert capacity == {"cpu": 32 * GIB // plan["storedBytesPerToken"]} == plan_figures(plan["levels"][-1])


def test_render_reads_the_model_shape_from_a_config_map_in_the_same_file(tmp_path: Path) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "qwen3-8b-config", "namespace": "llm"},
        "data": {"config.json": (paths.DATA / "configs" / "Qwen3-8B.json").read_text()},
    }
    doc = merge(BASE, {"spec": {"model": {"name": "/models/qwen3-8b", "configMap": {"name": "qwen3-8b-config"}}}})
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc) + "---\n" + yaml.safe_dump(config_map))
    plan = json.loads(run("plan", str(path), "-o", "json"))
    capacity = json.loads(pod_annotations(run("render", str(path)))[ANNOTATION_TIER_CAPACITY])
    assert capacity == plan_figures(plan["levels"][-1]) == {"cpu": 32 * GIB // 147_456}


def test_render_without_the_config_map_it_needs_is_bad_input_at_its_path(tmp_path: Path) -> None:
    doc = merge(BASE, {"spec": {"model": {"name": "/models/x", "configMap": {"name": "x-config"}}}})
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["render", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "spec.model.configMap: ConfigMap 'x-config' is not in this file" in result.stderr
    assert "Traceback" not in result.output

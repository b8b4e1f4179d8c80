"""The policies the rendering tests run over: tests/data/render-*.yaml and every examples/*.yaml."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.ladder import Level, build_ladder
from kvoffload.policy.loading import load_policy, parse_policy
from kvoffload.policy.tenancy import Tenancy
from kvoffload_lab.demo import SGLANG_IMAGE
from tests.support import paths

ROOT = paths.ROOT
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "examples"
GOLDEN = paths.GOLDEN
# The cluster these policies render for: its admin allows hostPath tiers under /mnt (the NVMe examples), and
# a Prometheus on the node (the demo's lab, all on 127.0.0.1).
RENDER_TENANCY = Tenancy(host_path_roots=("/mnt", "/nvme"), private_prometheus=True)
# The same cluster's leave, as the CLI takes it.
LAB = ("--allowed-host-path", "/mnt", "--allowed-host-path", "/nvme", "--prometheus-allow-private")


def _is_policy_file(path: Path) -> bool:
    docs = list(yaml.safe_load_all(path.read_text()))
    return any(isinstance(d, dict) and d.get("kind") == "KVOffloadPolicy" for d in docs)


def policy_files() -> list[Path]:
    """Our own render test policies, then the examples (whenever another change adds them)."""
    examples = [p for p in sorted(EXAMPLES.glob("*.yaml")) if _is_policy_file(p)] if EXAMPLES.is_dir() else []
    return sorted(DATA.glob("render-*.yaml")) + examples


def case_id(path: Path) -> str:
    """``data-render-qwen3-small`` or ``examples-qwen3-0.6b-cpu``: unique across both folders."""
    return f"{path.parent.name}-{path.stem}"


@dataclass(frozen=True)
class LevelCase:
    file: Path
    policy: KVOffloadPolicy
    level: Level

    @property
    def id(self) -> str:
        return f"{case_id(self.file)}/{self.level.index}-{self.level.name}"


def level_cases() -> list[LevelCase]:
    """Every level of every policy."""
    cases = []
    for path in policy_files():
        policy = load_policy(path, RENDER_TENANCY)
        cases += [LevelCase(path, policy, level) for level in build_ladder(policy.spec)]
    return cases


BASE: dict[str, Any] = {
    "apiVersion": "kvoffload.io/v1alpha1",
    "kind": "KVOffloadPolicy",
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {
        "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 16384},
        "gpu": {"class": "nvidia-h100-80gb"},
        "replicas": 4,
        "resources": {"baseMemory": "24Gi"},
        "offload": {"cpu": "32Gi"},
    },
}


def merge(base: Any, patch: Any) -> Any:
    """``patch`` laid over ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return patch


def policy_object(metadata: dict[str, Any] | None = None, **spec_patch: Any) -> dict[str, Any]:
    """A Qwen3-8B policy object (valid unless the patch breaks it), ``spec_patch`` merged into its spec: a copy of
    its own, which the caller may change (``merge`` shares what the patch leaves alone with :data:`BASE`)."""
    obj: dict[str, Any] = merge(BASE, {"spec": spec_patch})
    if metadata is not None:
        obj = merge(obj, {"metadata": metadata})
    return copy.deepcopy(obj)


def make_policy(metadata: dict[str, Any] | None = None, **spec_patch: Any) -> KVOffloadPolicy:
    """The policy of ``policy_object``, validated as the operator of :data:`RENDER_TENANCY` validates it."""
    return parse_policy(policy_object(metadata, **spec_patch), tenancy=RENDER_TENANCY)


def sglang_policy(**spec_patch: Any) -> KVOffloadPolicy:
    """A Qwen3-8B policy on SGLang with a 32 GB HiCache pool, ``spec_patch`` merged into its spec."""
    base = {"engine": "sglang", "model": {"image": SGLANG_IMAGE}, "offload": {"cpu": "32G"}}
    return make_policy(**merge(base, spec_patch))


def sglang_policies() -> dict[str, KVOffloadPolicy]:
    """SGLang policies the rendering and SGLang's own parser check, each at every level."""
    nvme = {"name": "nvme", "size": "1Ti", "path": "/mnt/kv-nvme"}
    return {
        "cpu": sglang_policy(),
        "pilot-and-file-tier": sglang_policy(
            offload={"cpu": "64G", "secondaryTiers": [nvme]}, rollout={"pilotCpu": "8G"}
        ),
        "fp8-tp2": sglang_policy(
            model={"tensorParallelSize": 2, "kvCacheDtype": "fp8_e4m3", "servedModelName": "chat-fp8"},
            gpu={"count": 2, "memoryUtilization": 0.85},
            offload={"cpu": "64G"},
        ),
        "extra-args": sglang_policy(model={"extraArgs": ["--hicache-write-policy", "write_back", "--page-size", "64"]}),
    }

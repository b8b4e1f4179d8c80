"""The Deployments teams already run (tests/data/workloads) and the policies that take them over (issue 35)."""

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
from kvoffload.policy.workload import adopt
from tests.support import paths

WORKLOADS = paths.DATA / "workloads"
GOLDEN = WORKLOADS / "golden"
NAMES = ("production-stack", "llm-d", "sglang")
# The cluster they run in: its admin allows hostPath volumes under /mnt (the SGLang team's model cache).
TENANCY = Tenancy(host_path_roots=("/mnt",))
LAB = ("--allowed-host-path", "/mnt")


def workload_file(name: str) -> Path:
    return WORKLOADS / f"{name}.yaml"


def policy_file(name: str) -> Path:
    return WORKLOADS / f"{name}-policy.yaml"


def deployment(name: str) -> dict[str, Any]:
    """A fresh copy of the Deployment, which the caller may change."""
    loaded: dict[str, Any] = yaml.safe_load(workload_file(name).read_text())
    return loaded


def policy(name: str) -> KVOffloadPolicy:
    """The policy as parsed, before it reads its Deployment."""
    return load_policy(policy_file(name), TENANCY)


def policy_object(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(policy_file(name).read_text())
    return loaded


def parsed(obj: dict[str, Any]) -> KVOffloadPolicy:
    return parse_policy(copy.deepcopy(obj), tenancy=TENANCY)


def adopted(name: str, changed: dict[str, Any] | None = None) -> KVOffloadPolicy:
    """The policy with its Deployment (or ``changed``, another one) read in."""
    return adopt(policy(name), changed if changed is not None else deployment(name))


def engine_container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """The named container of a Deployment or pod template."""
    pod = obj["spec"]["template"]["spec"] if "template" in obj.get("spec", {}) else obj["spec"]
    found: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == name)
    return found


@dataclass(frozen=True)
class WorkloadCase:
    name: str
    policy: KVOffloadPolicy
    level: Level

    @property
    def id(self) -> str:
        return f"{self.name}/{self.level.index}-{self.level.name}"


def workload_cases() -> list[WorkloadCase]:
    """Every level of every adopted workload."""
    cases = []
    for name in NAMES:
        taken = adopted(name)
        cases += [WorkloadCase(name, taken, level) for level in build_ladder(taken.spec)]
    return cases

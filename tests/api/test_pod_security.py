"""The real API server's Pod Security Admission judges the engine pods kvoffload renders.

Every level of every policy the rendering tests use (tests/data/render-*.yaml and the examples, as
the cluster of :data:`RENDER_TENANCY` allows them) is rendered with :func:`render_level`; its
Deployment's pod template, made a Pod, is created with a server-side dry run in two namespaces of the
session's kube-apiserver, one enforcing the ``baseline`` Pod Security Standard and one ``restricted``
(``enforce-version: latest``). What the hardening buys, and what it does not:

* baseline admits every level without a hostPath tier, and refuses a hostPath tier by name;
* under restricted the only violation is runAsNonRoot (vLLM images run as root, so the operator does
  not set it); allowPrivilegeEscalation, capabilities and seccompProfile are all satisfied;
* the same pod with ``runAsNonRoot: true, runAsUser: 1000`` added is admitted under restricted.

The PodSecurity admission plugin runs on dry-run requests (it has no side effects):
:func:`test_a_dry_run_is_judged_as_a_real_create` checks that a real create gets the same verdict, and
:func:`test_the_namespaces_enforce_what_the_hardening_prevents` that a pod without the hardening is refused
for each of the three, so the "none of" assertions below can fail.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
from typing import Any

import pytest

from kvoffload.policy.render import render_level
from tests.policy.render_policies import LevelCase, level_cases
from tests.support.controlplane import Kube, wait_for

pytestmark = pytest.mark.kube

CASES = level_cases()
HARDENED_AWAY = ("allowPrivilegeEscalation", "capabilities", "seccompProfile")
NON_ROOT = {"runAsNonRoot": True, "runAsUser": 1000}


def engine_pod(case: LevelCase) -> dict[str, Any]:
    """The level's (only) Deployment's pod template as a Pod, named after the case."""
    (deployment,) = [d for d in render_level(case.policy, case.level) if d["kind"] == "Deployment"]
    template = copy.deepcopy(deployment["spec"]["template"])
    name = re.sub(r"[^a-z0-9-]+", "-", case.id.lower()).strip("-")[:63].rstrip("-")
    metadata = {"name": name, "labels": template["metadata"].get("labels", {})}
    if "annotations" in template["metadata"]:
        metadata["annotations"] = template["metadata"]["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def host_path_volumes(pod: dict[str, Any]) -> list[str]:
    return [v["name"] for v in pod["spec"].get("volumes", []) if "hostPath" in v]


def as_non_root(pod: dict[str, Any]) -> dict[str, Any]:
    hardened = copy.deepcopy(pod)
    hardened["spec"].setdefault("securityContext", {}).update(NON_ROOT)
    return hardened


def create(kube: Kube, ns: str, pod: dict[str, Any], *, dry_run: bool = True) -> subprocess.CompletedProcess[str]:
    flags = ["--dry-run=server"] if dry_run else []
    return kube.run("create", *flags, "-n", ns, "-f", "-", stdin=json.dumps(pod))


def violations(result: subprocess.CompletedProcess[str], level: str) -> str:
    """The PodSecurity refusal's list of violations, failing the test unless the create was refused for them."""
    assert result.returncode != 0, f"admitted under {level}: {result.stdout}"
    marker = f'violates PodSecurity "{level}:latest": '
    assert marker in result.stderr, result.stderr
    return result.stderr.split(marker, 1)[1].strip()


@pytest.fixture(scope="module")
def psa(control_plane: Kube) -> dict[str, str]:
    """A namespace per enforced Pod Security level, with its default ServiceAccount (pods need it)."""
    kube = control_plane
    made = {}
    for level in ("baseline", "restricted"):
        ns = kube.namespace(f"psa-{level}")
        kube.kubectl(
            "label", "namespace", ns,
            f"pod-security.kubernetes.io/enforce={level}", "pod-security.kubernetes.io/enforce-version=latest",
        )  # fmt: skip
        wait_for(functools.partial(has_default_account, kube, ns), f"the default ServiceAccount in {ns}")
        made[level] = ns
    return made


def has_default_account(kube: Kube, ns: str) -> bool:
    return kube.run("get", "serviceaccount", "default", "-n", ns).returncode == 0


def test_the_cases_include_host_path_levels_and_others() -> None:
    """Both verdicts are exercised: the render policies have hostPath tiers (the NVMe examples) and others."""
    with_host_path = [c.id for c in CASES if host_path_volumes(engine_pod(c))]
    assert with_host_path, "no rendered level has a hostPath tier"
    assert len(with_host_path) < len(CASES)
    for case in CASES:
        declared = any(t.volume.host_path is not None for t in case.level.secondary_tiers)
        assert declared == bool(host_path_volumes(engine_pod(case))), case.id


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_pod_security_admission_judges_the_rendered_pod(
    control_plane: Kube, psa: dict[str, str], case: LevelCase
) -> None:
    kube = control_plane
    pod = engine_pod(case)
    host_paths = host_path_volumes(pod)

    baseline = create(kube, psa["baseline"], pod)
    restricted = violations(create(kube, psa["restricted"], pod), "restricted")
    non_root = create(kube, psa["restricted"], as_non_root(pod))
    print(f"\n{case.id}: baseline rc={baseline.returncode}; restricted: {restricted}")

    assert "runAsNonRoot != true" in restricted
    for field in HARDENED_AWAY:
        assert field not in restricted, f"{field} under restricted: {restricted}"
    if not host_paths:
        assert baseline.returncode == 0, baseline.stderr
        assert "(server dry run)" in baseline.stdout
        # runAsNonRoot is the one thing restricted asks beyond the rendering.
        (container,) = [c["name"] for c in pod["spec"]["containers"]]
        assert restricted == (
            f'runAsNonRoot != true (pod or container "{container}" must set securityContext.runAsNonRoot=true)'
        )
        assert non_root.returncode == 0, non_root.stderr
        return
    # A hostPath tier: baseline refuses it by name; restricted too, and it stays refused as non-root.
    named = ", ".join(f'"{v}"' for v in host_paths)
    assert violations(baseline, "baseline") == f"hostPath volumes (volume{'s' if len(host_paths) > 1 else ''} {named})"
    assert "hostPath" in restricted
    still = violations(non_root, "restricted")
    assert "hostPath" in still
    assert "runAsNonRoot" not in still
    for field in HARDENED_AWAY:
        assert field not in still, still


def test_a_dry_run_is_judged_as_a_real_create(control_plane: Kube, psa: dict[str, str]) -> None:
    """PodSecurity runs on dry-run requests: a real create is refused with the same violations, and the
    non-root pod is created (and stays Pending: no kubelet here)."""
    kube = control_plane
    case = next(c for c in CASES if c.level.offloads and not host_path_volumes(engine_pod(c)))
    pod = engine_pod(case)
    dry = violations(create(kube, psa["restricted"], pod), "restricted")
    real = violations(create(kube, psa["restricted"], pod, dry_run=False), "restricted")
    assert real == dry
    assert kube.run("get", "pod", pod["metadata"]["name"], "-n", psa["restricted"]).returncode != 0
    created = create(kube, psa["restricted"], as_non_root(pod), dry_run=False)
    assert created.returncode == 0, created.stderr
    assert "(server dry run)" not in created.stdout
    kube.kubectl("delete", "pod", pod["metadata"]["name"], "-n", psa["restricted"], "--wait=false")

    host_case = next(c for c in CASES if host_path_volumes(engine_pod(c)))
    host_pod = engine_pod(host_case)
    dry_baseline = violations(create(kube, psa["baseline"], host_pod), "baseline")
    assert violations(create(kube, psa["baseline"], host_pod, dry_run=False), "baseline") == dry_baseline


def test_the_namespaces_enforce_what_the_hardening_prevents(control_plane: Kube, psa: dict[str, str]) -> None:
    """The rendered pod without its securityContexts is refused under restricted for each of the three that the
    rendering sets: the "none of" assertions above are not vacuous."""
    kube = control_plane
    case = next(c for c in CASES if not host_path_volumes(engine_pod(c)))
    bare = engine_pod(case)
    bare["spec"].pop("securityContext", None)
    for container in bare["spec"]["containers"]:
        container.pop("securityContext", None)
    found = violations(create(kube, psa["restricted"], bare), "restricted")
    print(f"\nwithout the hardening, restricted: {found}")
    for field in (*HARDENED_AWAY, "runAsNonRoot"):
        assert field in found, field
    # And baseline is enforced too (privileged itself is refused before admission: no --allow-privileged).
    host_network = {**bare, "spec": {**bare["spec"], "hostNetwork": True}}
    assert violations(create(kube, psa["baseline"], host_network), "baseline").startswith(
        "host namespaces (hostNetwork=true)"
    )

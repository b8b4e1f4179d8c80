"""End to end: custom metrics and a shared KVOffloadAnalysisTemplate, on both APIs (``tests/lab/test_e2e.py``'s
set-up: the operator as its own process, real Prometheus, emulated engines under load).

- One policy with a gated custom metric that fails on the canary (canary/stable request rate, held under a
  bound no canary can meet) and a dry-run metric that fails from the baseline on: the dry run is shown in
  status and never decides (the baseline passes), the gated one rolls the canary back by its own name.
- Two policies naming one template before it exists: both wait on it (Inconclusive, saying so), take it
  when it arrives, and a change to it reaches both at their next analysis, status naming the generation.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvoffload.api.analysistemplate import TEMPLATE_KIND
from tests.lab.test_e2e import (
    POLICY_API_VERSION,
    decisions,
    events_of,
    in_phase,
    local_cluster,  # noqa: F401  (the fixture, on both APIs)
    policy_doc,
)
from tests.support.cluster import Cluster, OperatorProcess, eventually, load_on, status_of

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.timeout(240)]

REQUEST_RATE = "sum(rate(vllm:time_to_first_token_seconds_count{ {{ selector }} }[{{ window }}]))"


def with_metrics(doc: dict[str, Any], metrics: list[dict[str, Any]], templates: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    doc = copy.deepcopy(doc)
    doc["spec"]["analysis"]["metrics"] = metrics
    doc["spec"]["analysis"]["templates"] = [{"name": name} for name in templates]
    return doc


def results(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    last = status_of(cluster, name).get("lastAnalysis") or {}
    return {m["name"]: m for m in last.get("metrics") or []}


def template_doc(generation_marker: float) -> dict[str, Any]:
    return {
        "apiVersion": POLICY_API_VERSION,
        "kind": TEMPLATE_KIND,
        "metadata": {"name": "platform-gates"},
        "spec": {"metrics": [{"name": "requestRate", "query": REQUEST_RATE, "min": 0, "max": generation_marker}]},
    }


async def test_a_gated_custom_metric_rolls_the_canary_back_while_a_dry_run_one_only_shows(
    local_cluster: Cluster,  # noqa: F811
    operator: OperatorProcess,
) -> None:
    doc = with_metrics(
        policy_doc("chat", local_cluster),
        [
            # canary/stable request rate is about 1/2 here: far over 0.01, so the canary fails once it is compared.
            {"name": "canaryShare", "query": REQUEST_RATE, "comparison": "ratio", "max": 0.01, "sustainedFor": "3s"},
            # Fails from the first analysis on, baseline included; a dry run must not stop anything.
            {"name": "tinyRate", "query": REQUEST_RATE, "max": 0.001, "dryRun": True},
        ],
    )
    await local_cluster.apply(doc)

    async with load_on(local_cluster, "chat"):
        dry = await eventually(
            lambda: (r := results(local_cluster, "chat").get("tinyRate")) and r.get("passed") is False and r, "dry run"
        )
        status = await eventually(lambda: in_phase(local_cluster, "chat", "RolledBack", "Stable"), "RolledBack", 150)

    assert dry["dryRun"] is True
    assert dry["message"].startswith("dry run: ")
    assert status["phase"] == "RolledBack", status.get("message")
    assert decisions(local_cluster, "chat")[:2] == ["NewLadder", "BaselineTaken"]  # the failing dry run passed it
    last = status["history"][-1]
    assert last["decision"] == "Rollback"
    assert "canaryShare" in last["message"]
    assert "tinyRate" not in last["message"]
    share = next(m for m in status["lastAnalysis"]["metrics"] if m["name"] == "canaryShare")
    assert (share["dryRun"], share["passed"], share["sustained"]) == (False, False, True)
    warnings = [e["message"] for e in await events_of(local_cluster, "chat") if e["type"] == "Warning"]
    assert any("canaryShare" in message for message in warnings), warnings


async def test_one_template_judges_two_policies_and_a_change_to_it_reaches_both(
    local_cluster: Cluster,  # noqa: F811
    operator: OperatorProcess,
) -> None:
    for name in ("alpha", "beta"):
        await local_cluster.apply(with_metrics(policy_doc(name, local_cluster), [], ["platform-gates"]))

    async with load_on(local_cluster, "alpha", "beta"):
        for name in ("alpha", "beta"):  # GitOps applied the policies first: they wait, saying on what
            waiting = await eventually(lambda n=name: results(local_cluster, n).get("template/platform-gates"), name)
            assert "not found" in waiting["message"]
            assert status_of(local_cluster, name)["lastAnalysis"]["verdict"] == "Inconclusive"

        await local_cluster.apply(template_doc(1e6))
        first = {}
        for name in ("alpha", "beta"):
            first[name] = await eventually(
                lambda n=name: (r := results(local_cluster, n).get("requestRate")) and r.get("passed") is True and r,
                f"{name} judged by the template",
            )
        generation = local_cluster.get(POLICY_API_VERSION, TEMPLATE_KIND, None, "platform-gates")["metadata"][
            "generation"
        ]
        assert {r["template"] for r in first.values()} == {f"platform-gates@{generation}"}

        await local_cluster.apply(template_doc(2e6))  # a new spec: a new generation
        changed = local_cluster.get(POLICY_API_VERSION, TEMPLATE_KIND, None, "platform-gates")["metadata"]["generation"]
        assert changed == generation + 1
        for name in ("alpha", "beta"):
            now = await eventually(
                lambda n=name: (
                    (r := results(local_cluster, n).get("requestRate"))
                    and r.get("template") == f"platform-gates@{changed}"
                    and r
                ),
                f"{name} judged by generation {changed}",
            )
            assert now["threshold"] == 2e6
            assert "template/platform-gates" not in results(local_cluster, name)

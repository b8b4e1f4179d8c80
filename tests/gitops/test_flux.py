"""Flux's view of a policy: the example Kustomization's healthCheckExprs, in cel-python, over the captures.

Flux's evaluator (fluxcd/pkg ``runtime/cel``, RFC 0009) first calls an object InProgress when its
``status.observedGeneration`` differs from ``metadata.generation``; then it evaluates
``inProgress``, ``failed`` and ``current`` in that order, with the object's top-level fields as the
variables, and the first true one wins; none true is InProgress; an evaluation error is an error.
:func:`flux_status` does the same.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
import yaml

from kvoffload.api.conventions import KIND, POLICY_API_VERSION
from tests.support.paths import EXAMPLES
from tests.support.status_fixtures import NAMES, load

FLUX_KUSTOMIZATION = EXAMPLES / "gitops" / "flux" / "kustomization-policies.yaml"
ORDER = (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current"))


def health_exprs() -> dict[str, str]:
    doc = yaml.safe_load(FLUX_KUSTOMIZATION.read_text())
    (entry,) = [
        e for e in doc["spec"]["healthCheckExprs"] if (e["apiVersion"], e["kind"]) == (POLICY_API_VERSION, KIND)
    ]
    return {key: entry[key] for key, _ in ORDER}


def evaluate(expr: str, obj: dict[str, Any]) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(expr)).evaluate({k: celpy.json_to_cel(v) for k, v in obj.items()})
    if isinstance(result, celpy.CELEvalError):
        raise result
    assert isinstance(result, celpy.celtypes.BoolType), f"{expr!r} gave {result!r}, not a bool"
    return bool(result)


def flux_status(obj: dict[str, Any]) -> str:
    generation = obj["metadata"].get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    if observed is not None and generation is not None and observed != generation:
        return "InProgress"
    exprs = health_exprs()
    for key, status in ORDER:
        if evaluate(exprs[key], obj):
            return status
    return "InProgress"


EXPECTED = {
    "pending": "InProgress",
    "baseline": "InProgress",
    "canary": "InProgress",
    "promoting": "InProgress",
    "stable": "Current",
    "generation-lag": "InProgress",
    "paused-by-person": "InProgress",
    "paused-inconclusive": "Failed",
    "rolled-back": "Failed",
    "invalid": "Failed",
}


def test_every_fixture_has_an_expected_flux_status() -> None:
    assert sorted(EXPECTED) == sorted(NAMES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_flux_health_of_each_captured_phase(name: str) -> None:
    assert flux_status(load(name)) == EXPECTED[name]


@pytest.mark.parametrize("name", NAMES)
def test_exactly_one_expression_is_true_for_every_capture(name: str) -> None:
    # The order Flux tries them in then never decides: the three expressions partition the phases.
    obj = load(name)
    true = [key for key, _ in ORDER if evaluate(health_exprs()[key], obj)]
    assert len(true) == 1, true


def test_a_stable_policy_whose_spec_changed_is_in_progress_before_any_expression_runs() -> None:
    lagging = load("stable")
    lagging["metadata"]["generation"] += 1
    assert evaluate(health_exprs()["current"], lagging)  # the expression alone would say Current
    assert flux_status(lagging) == "InProgress"


def test_a_policy_paused_by_a_person_at_the_top_is_current_and_below_it_in_progress() -> None:
    at_top = copy.deepcopy(load("stable"))
    at_top["status"]["phase"] = "Paused"
    assert flux_status(at_top) == "Current"
    assert flux_status(load("paused-by-person")) == "InProgress"


def test_a_pause_on_inconclusive_evidence_fails_and_the_same_pause_by_hand_does_not() -> None:
    by_hand = load("paused-inconclusive")
    for c in by_hand["status"]["conditions"]:
        if c["type"] == "AnalysisInconclusive":
            c["status"] = "False"
    assert flux_status(load("paused-inconclusive")) == "Failed"
    assert flux_status(by_hand) == "InProgress"


def test_the_example_waits_with_the_expressions_on_the_overlay_the_argo_cd_application_uses() -> None:
    doc = yaml.safe_load(FLUX_KUSTOMIZATION.read_text())
    application = yaml.safe_load((EXAMPLES / "gitops" / "argocd" / "application.yaml").read_text())
    assert doc["apiVersion"] == "kustomize.toolkit.fluxcd.io/v1"
    assert doc["spec"]["wait"] is True
    assert doc["spec"]["path"] == "./" + application["spec"]["source"]["path"]
    assert set(health_exprs()) == {"inProgress", "failed", "current"}

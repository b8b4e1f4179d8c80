"""The captured policy objects are what they claim to be, and still fit today's status model and CRD."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from kvoffload.api.status import KVOffloadPolicyStatus, Mode, Phase
from tests.support.crd_admission import drop_nulls, openapi_schema, strict
from tests.support.status_fixtures import CAPTURES, NAMES, STATUS_DIR, load

# Each fixture's phase, and the conditions that make it that phase.
CLAIMS: dict[str, tuple[Phase, Mode | None, dict[str, str]]] = {
    "baseline": (Phase.BASELINE, Mode.BASELINE, {"Reconciling": "True", "Stalled": "False", "Ready": "False"}),
    "canary": (Phase.CANARY, Mode.STEP, {"Reconciling": "True", "Stalled": "False", "Ready": "False"}),
    "promoting": (Phase.PROMOTING, Mode.STEP, {"Reconciling": "True", "Stalled": "False", "Ready": "False"}),
    "stable": (Phase.STABLE, Mode.STABLE, {"Reconciling": "False", "Stalled": "False", "Ready": "True"}),
    "generation-lag": (Phase.STABLE, Mode.STABLE, {"Ready": "True"}),
    "paused-by-person": (Phase.PAUSED, Mode.STEP, {"Paused": "True", "AnalysisInconclusive": "False"}),
    "paused-inconclusive": (Phase.PAUSED, Mode.STEP, {"Paused": "False", "AnalysisInconclusive": "True"}),
    "rolled-back": (Phase.ROLLED_BACK, Mode.ROLLED_BACK, {"Reconciling": "False", "Stalled": "True", "Ready": "False"}),
    "invalid": (Phase.INVALID, None, {"Invalid": "True", "Stalled": "True", "Reconciling": "False"}),
}


def conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj["status"].get("conditions", [])}


def test_every_capture_has_its_file_and_the_readme_says_how_it_was_made() -> None:
    readme = (STATUS_DIR / "README.md").read_text()
    assert sorted(p.stem for p in STATUS_DIR.glob("*.json")) == sorted(NAMES)
    for capture in CAPTURES:
        assert f"`{capture.name}.json`" in readme, capture.name


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_a_fixture_is_in_the_phase_its_name_says(name: str) -> None:
    phase, mode, expected = CLAIMS[name]
    obj = load(name)
    status = KVOffloadPolicyStatus.model_validate(obj["status"])
    assert (status.phase, status.mode) == (phase, mode)
    assert {t: conditions(obj)[t] for t in expected} == expected


@pytest.mark.parametrize("name", NAMES)
def test_a_fixture_fits_the_crd_status_schema_with_integer_generations(name: str) -> None:
    obj = load(name)
    # A real API server prunes the nulls of non-nullable fields; the emulator kept them.
    jsonschema.validate(drop_nulls(obj["status"]), strict(openapi_schema()["properties"]["status"]))
    generations = [obj["status"]["observedGeneration"]]
    generations += [c["observedGeneration"] for c in obj["status"].get("conditions", [])]
    assert all(type(g) is int for g in generations), generations


def test_the_generation_lag_and_pending_fixtures_lag_and_the_others_do_not() -> None:
    lagging = {n for n in NAMES if load(n)["metadata"]["generation"] != load(n)["status"]["observedGeneration"]}
    assert lagging == {"generation-lag", "pending"}
    assert load("pending")["status"] == {"observedGeneration": 0}


def test_the_claims_check_would_catch_a_mislabelled_fixture() -> None:
    stable = load("stable")
    _, _, expected = CLAIMS["rolled-back"]
    assert {t: conditions(stable)[t] for t in expected} != expected

"""Argo CD's view of a policy: the Lua health check and resource actions, run in Lua 5.1 over real captures.

The scripts live where Argo CD's own repository keeps them
(``deploy/argocd/resource_customizations/kvoffload.io/KVOffloadPolicy/``). Every health rule is
checked against the fixture that shows it and against a one-field change that must turn it off.
Each action is enabled exactly where ``rollout.decide`` would act on its annotation, and sets the
annotation ``kvoffload <verb> NAME`` sets, with a value the operator has not seen.
"""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kvoffload.api.conventions import Reason
from kvoffload.api.status import KVOffloadPolicyStatus
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.control import VERBS, new_annotation_value
from kvoffload.policy.sized import size_policy
from kvoffload.rollout.decide import decide
from kvoffload.rollout.observations import Observations, VariantObservation
from tests.support import lua
from tests.support.paths import ROOT
from tests.support.status_fixtures import NAMES, load

CUSTOMIZATIONS = ROOT / "deploy" / "argocd" / "resource_customizations" / "kvoffload.io" / "KVOffloadPolicy"
HEALTH = (CUSTOMIZATIONS / "health.lua").read_text()
DISCOVERY = (CUSTOMIZATIONS / "actions" / "discovery.lua").read_text()


def action_script(verb: str) -> str:
    return (CUSTOMIZATIONS / "actions" / verb / "action.lua").read_text()


def health(obj: dict[str, Any]) -> str:
    result = lua.run(HEALTH, obj)
    assert set(result) == {"status", "message"}, result
    status: str = result["status"]
    return status


def set_condition(obj: dict[str, Any], type_: str, status: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for c in out["status"]["conditions"]:
        if c["type"] == type_:
            c["status"] = status
    return out


# --- health --------------------------------------------------------------------------------

EXPECTED_HEALTH = {
    "pending": "Progressing",
    "baseline": "Progressing",
    "canary": "Progressing",
    "promoting": "Progressing",
    "stable": "Healthy",
    "generation-lag": "Progressing",
    "paused-by-person": "Suspended",
    "paused-inconclusive": "Degraded",
    "rolled-back": "Degraded",
    "invalid": "Degraded",
}


def test_every_fixture_has_an_expected_health() -> None:
    assert sorted(EXPECTED_HEALTH) == sorted(NAMES)


@pytest.mark.parametrize("name", sorted(EXPECTED_HEALTH))
def test_argo_cd_health_of_each_captured_phase(name: str) -> None:
    assert health(load(name)) == EXPECTED_HEALTH[name]


def test_a_stable_policy_is_healthy_and_says_where_it_rests() -> None:
    result = lua.run(HEALTH, load("stable"))
    assert result["status"] == "Healthy"
    assert result["message"].startswith("Stable: ")
    assert "nvme" in result["message"]


def test_a_stable_policy_whose_spec_changed_is_progressing_until_the_operator_acts_on_it() -> None:
    lagging = load("stable")
    lagging["metadata"]["generation"] += 1
    result = lua.run(HEALTH, lagging)
    assert result == {
        "status": "Progressing",
        "message": "Waiting for the kvoffload operator to act on generation 2 (last acted on 1)",
    }


def test_a_policy_without_any_status_is_progressing_not_healthy() -> None:
    # A cluster whose CRD predates the status default serves a new policy with no status at all.
    bare = load("pending")
    del bare["status"]
    assert health(bare) == "Progressing"


def test_a_rolled_back_policy_is_degraded_with_the_reason_and_figures() -> None:
    result = lua.run(HEALTH, load("rolled-back"))
    assert result["status"] == "Degraded"
    assert result["message"].startswith("RolledBack: canary failed")
    assert "canary nvme removed" in result["message"]


def test_an_invalid_policy_is_degraded_and_names_the_field() -> None:
    result = lua.run(HEALTH, load("invalid"))
    assert result["status"] == "Degraded"
    assert "spec.gpu.class" in result["message"]


def test_a_pause_on_inconclusive_evidence_is_degraded_and_a_manual_pause_is_not() -> None:
    inconclusive = lua.run(HEALTH, load("paused-inconclusive"))
    assert inconclusive["status"] == "Degraded"
    assert inconclusive["message"].startswith("Paused on inconclusive evidence: ")
    # The same object once evidence is back (the condition False) is a climb again, not Degraded.
    assert health(set_condition(load("paused-inconclusive"), "AnalysisInconclusive", "False")) == "Progressing"


def test_a_manual_pause_is_suspended_and_resuming_makes_it_progress_again() -> None:
    assert health(load("paused-by-person")) == "Suspended"
    assert health(set_condition(load("paused-by-person"), "Paused", "False")) == "Progressing"


def test_a_manual_pause_at_the_top_of_the_ladder_is_suspended_not_healthy() -> None:
    assert health(set_condition(load("stable"), "Paused", "True")) == "Suspended"


def test_degraded_beats_suspended_when_a_paused_policy_also_runs_out_of_evidence() -> None:
    both = set_condition(load("paused-by-person"), "AnalysisInconclusive", "True")
    assert health(both) == "Degraded"


def test_a_stalled_condition_alone_is_degraded_and_its_absence_is_not() -> None:
    assert health(set_condition(load("canary"), "Stalled", "True")) == "Degraded"
    assert health(set_condition(load("rolled-back"), "Stalled", "False")) == "Degraded"  # phase RolledBack still
    assert health(load("canary")) == "Progressing"


# --- actions: discovery ------------------------------------------------------------------------


def discovered(obj: dict[str, Any]) -> set[str]:
    actions = lua.run(DISCOVERY, obj)
    assert set(actions) == set(VERBS), actions
    return {verb for verb, flags in actions.items() if not flags["disabled"]}


EXPECTED_ENABLED = {
    "pending": set(),
    "baseline": {"promote", "abort", "pause"},
    "canary": {"promote", "abort", "pause"},
    "promoting": {"promote", "abort", "pause"},
    "stable": {"pause"},
    "generation-lag": set(),
    "paused-by-person": {"promote", "abort", "retry", "resume"},
    "paused-inconclusive": {"promote", "abort", "retry", "pause", "resume"},
    "rolled-back": {"retry"},
    "invalid": set(),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ENABLED))
def test_the_actions_offered_in_each_captured_phase(name: str) -> None:
    assert discovered(load(name)) == EXPECTED_ENABLED[name]


def operator_acts_on(obj: dict[str, Any], verb: str) -> bool:
    """Whether ``rollout.decide`` acts on a new value of the verb's annotation, given this object."""
    policy = KVOffloadPolicy.model_validate({k: v for k, v in obj.items() if k != "status"})
    status = KVOffloadPolicyStatus.model_validate(obj["status"])

    def seen(variant: Any) -> VariantObservation:
        if variant is None:
            return VariantObservation()
        return VariantObservation(True, variant.config_hash, variant.level, variant.replicas, variant.replicas)

    stamps = [status.stage.started_at] if status.stage is not None and status.stage.started_at else []
    stamps += [status.last_analysis.time] if status.last_analysis is not None else []
    now = max(stamps, default=datetime.fromisoformat("2026-01-01T00:00:00+00:00")) + timedelta(seconds=0.5)
    key = VERBS[verb]
    annotations = {**status.annotations_seen, key: new_annotation_value(status.annotations_seen.get(key), now)}
    observations = Observations(
        generation=obj["metadata"]["generation"],
        sized=size_policy(policy),
        annotations=annotations,
        stable=seen(status.stable),
        canary=seen(status.canary),
    )
    plan = decide(policy.spec, status, observations, now)
    acted = {Reason.ABORTED, Reason.PAUSED, Reason.RESUMED, Reason.RETRY, Reason.MANUAL_PROMOTE}
    return any(event.reason in acted for event in plan.events)


# The invalid spec never reaches decide(): the handler answers it with invalid(), which reads no annotation.
@pytest.mark.parametrize("name", sorted(set(NAMES) - {"invalid"}))
def test_an_action_is_offered_exactly_where_the_operator_would_act_on_it(name: str) -> None:
    obj = load(name)
    acts = {verb for verb in VERBS if operator_acts_on(obj, verb)}
    assert discovered(obj) == acts


def test_the_cross_check_sees_the_operator_ignore_an_action() -> None:
    # A pause on a rolled-back policy is recorded and ignored: the cross-check must not count it.
    assert not operator_acts_on(load("rolled-back"), "pause")
    assert operator_acts_on(load("rolled-back"), "retry")


# --- actions: what they write ---------------------------------------------------------------------


def test_there_is_one_action_per_cli_verb_and_nothing_else() -> None:
    folders = {p.name for p in (CUSTOMIZATIONS / "actions").iterdir() if p.is_dir()}
    assert folders == set(VERBS)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_action_sets_the_annotation_the_cli_sets_and_changes_nothing_else(verb: str) -> None:
    before = load("canary")
    after = lua.run(action_script(verb), before)

    value = after["metadata"]["annotations"].pop(VERBS[verb])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ(#\d+)?", value), value
    written = datetime.fromisoformat(value.split("#")[0])
    assert abs(written - datetime.now(UTC)) < timedelta(seconds=5), "a UTC timestamp of now"
    assert as_lua_sees_it(after) == as_lua_sees_it(before), "only the annotation may change"


def as_lua_sees_it(value: Any) -> Any:
    """Nulls dropped (nil is no key) and empty lists as empty tables, as a Lua table holds them.

    Argo CD itself puts the empty lists of the live object back when it turns an action's result into a patch.
    """
    if isinstance(value, dict):
        return {k: as_lua_sees_it(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_lua_sees_it(v) for v in value] if value else {}
    return value


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_action_on_a_policy_without_annotations_creates_them(verb: str) -> None:
    bare = load("stable")
    bare["metadata"].pop("annotations", None)
    after = lua.run(action_script(verb), bare)
    assert set(after["metadata"]["annotations"]) == {VERBS[verb]}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_action_run_twice_in_a_row_writes_a_new_value_each_time(verb: str) -> None:
    first = lua.run(action_script(verb), load("canary"))
    second = lua.run(action_script(verb), first)
    third = lua.run(action_script(verb), second)
    values = [obj["metadata"]["annotations"][VERBS[verb]] for obj in (first, second, third)]
    assert len(set(values)) == 3, values


def test_an_action_replaces_a_value_the_cli_wrote() -> None:
    obj = load("canary")
    cli_value = new_annotation_value(None, datetime.now(UTC))
    obj["metadata"].setdefault("annotations", {})["kvoffload.io/pause"] = cli_value
    after = lua.run(action_script("pause"), obj)
    assert after["metadata"]["annotations"]["kvoffload.io/pause"] not in ("", cli_value)


def test_the_lua_files_are_plain_lua_5_1_with_no_tabs_or_trailing_spaces() -> None:
    scripts = [CUSTOMIZATIONS / "health.lua", *sorted((CUSTOMIZATIONS / "actions").rglob("*.lua"))]
    for path in scripts:
        text = path.read_text()
        assert "\t" not in text, path
        assert not [n for n, line in enumerate(text.splitlines(), 1) if line != line.rstrip()], path
        assert text.endswith("\n"), path
    assert len(scripts) == 7

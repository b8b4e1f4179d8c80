"""A policy names only sinks the operator has: the operator, its admission webhook and ``kvoffload run``'s tenancy
judge ``spec.notifications`` alike, naming the field path; a repeated name or event is refused by the model (and
by the real API server: tests/notify/test_notifications_e2e.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.api.errors import PolicyError
from kvoffload.controller.admission import problems
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.tenancy import SinkGrant, Tenancy
from tests.support.kube import policy_manifest

TEAM = Tenancy(notification_sinks=(SinkGrant("team"), SinkGrant("llm-oncall"), SinkGrant("billing", ("billing",))))
SPEC: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
    "gpu": {"class": "nvidia-l4"},
    "replicas": 2,
    "resources": {"baseMemory": "4Gi"},
    "offload": {"cpu": "1Gi"},
}


def told(**notifications: Any) -> dict[str, Any]:
    return policy_manifest("chat", "llm", {**SPEC, "notifications": notifications})


def test_a_policy_may_name_the_operator_s_sinks() -> None:
    policy = parse_policy(told(sinks=["llm-oncall"]), tenancy=TEAM)
    assert policy.spec.notifications is not None
    assert [e.value for e in policy.spec.notifications.events] == [
        "Promoted",
        "RolledBack",
        "Paused",
        "AwaitingPromotion",
        "Invalid",
    ]


def test_an_unknown_sink_is_refused_naming_its_place_by_the_operator_and_the_webhook() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(told(sinks=["team", "https://attacker.example/hook"]), tenancy=TEAM)
    (error,) = caught.value.errors
    assert error.path == "spec.notifications.sinks[1]"  # the model refuses it as no name first
    (refused,) = problems(told(sinks=["team", "pager"]), TEAM)
    assert refused.path == "spec.notifications.sinks[1]"
    assert "pager is not a notification sink this operator has (namespace llm may name: team, llm-oncall)" in (
        refused.message
    )


def test_a_sink_granted_to_other_namespaces_is_refused_naming_its_place() -> None:
    # Issue 33: a policy may name only the sinks the admin grants its namespace (here billing's alone).
    (refused,) = problems(told(sinks=["billing"]), TEAM)
    assert refused.path == "spec.notifications.sinks[0]"
    assert "the notification sink billing is not granted to namespace llm (it may name: team, llm-oncall)" in (
        refused.message
    )
    billing = policy_manifest("chat", "billing", {**SPEC, "notifications": {"sinks": ["billing"]}})
    assert problems(billing, TEAM) == []


def test_an_operator_without_sinks_refuses_every_notification_and_plan_does_not_judge_them() -> None:
    (refused,) = problems(told(sinks=["team"]), Tenancy(notification_sinks=()))
    assert "(namespace llm may name: none)" in refused.message
    assert problems(told(sinks=["team"]), Tenancy()) == []  # kvoffload plan: the sinks are not known there


@pytest.mark.parametrize(
    ("notifications", "path"),
    [
        ({"sinks": ["team", "team"]}, "spec.notifications.sinks"),
        ({"sinks": ["team"], "events": ["Paused", "Paused"]}, "spec.notifications.events"),
        ({"sinks": []}, "spec.notifications.sinks"),
        ({"sinks": ["team"], "events": ["Deployed"]}, "spec.notifications.events[0]"),
        ({"sinks": ["team"], "url": "http://anywhere/"}, "spec.notifications.url"),
    ],
)
def test_what_cannot_be_a_choice_of_sinks_is_refused_naming_the_field(notifications: dict[str, Any], path: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(told(**notifications), tenancy=TEAM)
    assert [e.path for e in caught.value.errors] == [path]

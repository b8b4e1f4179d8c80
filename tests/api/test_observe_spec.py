"""``spec.rollout.observeOnly`` and ``spec.rollout.observe``: what the models take and refuse, by field path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvoffload.api.errors import PolicyError
from kvoffload.api.rollout import ObserveSelector
from kvoffload.policy.loading import parse_policy

POLICY: dict[str, Any] = {
    "apiVersion": "kvoffload.io/v1alpha1",
    "kind": "KVOffloadPolicy",
    "metadata": {"name": "team", "namespace": "llm"},
    "spec": {
        "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 32768},
        "gpu": {"class": "nvidia-h100-80gb"},
        "replicas": 4,
        "resources": {"baseMemory": "24Gi"},
        "offload": {"cpu": "32Gi"},
        "rollout": {"observeOnly": True, "observe": {"selector": {"matchLabels": {"app": "vllm"}}}},
    },
}


def policy_with(**rollout: Any) -> dict[str, Any]:
    out = copy.deepcopy(POLICY)
    out["spec"]["rollout"] = rollout
    return out


def errors_of(obj: dict[str, Any]) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(obj)
    return [str(e) for e in caught.value.errors]


def test_an_observe_only_policy_parses_with_its_selector() -> None:
    policy = parse_policy(POLICY)
    assert policy.spec.rollout.observe_only
    assert policy.spec.rollout.observe is not None
    assert policy.spec.rollout.observe.selector.label_selector() == "app=vllm"


def test_observe_only_without_a_selector_names_the_field() -> None:
    (error,) = errors_of(policy_with(observeOnly=True))
    assert error.startswith("spec.rollout")
    assert "rollout.observe.selector is required when rollout.observeOnly is true" in error


@pytest.mark.parametrize(
    ("labels", "where"),
    [
        ({}, "spec.rollout.observe.selector.matchLabels"),
        ({"app": "a,b=c"}, "spec.rollout.observe.selector.matchLabels.app"),  # would widen the selector
        ({"app,tier": "x"}, "spec.rollout.observe.selector.matchLabels"),
        ({"a/b/c": "x"}, "spec.rollout.observe.selector.matchLabels"),
        ({"app": "x" * 64}, "spec.rollout.observe.selector.matchLabels.app"),
    ],
)
def test_a_selector_that_is_no_label_selector_is_refused_by_field_path(labels: dict[str, str], where: str) -> None:
    errors = errors_of(policy_with(observeOnly=True, observe={"selector": {"matchLabels": labels}}))
    assert any(e.startswith(f"{where}:") for e in errors), errors


def test_label_selector_joins_every_label_in_order() -> None:
    selector = ObserveSelector.model_validate({"matchLabels": {"tier": "gpu", "app.kubernetes.io/name": "vllm"}})
    assert selector.label_selector() == "app.kubernetes.io/name=vllm,tier=gpu"

"""Choosing sinks changes no engine: ``spec.notifications`` enters neither the spec digest (a new ladder) nor the
render input (a Deployment write), and a spec without it digests as before the field existed, so an upgraded
operator restarts no ladder and rewrites no Deployment."""

from __future__ import annotations

import hashlib
import json

from kvoffload.api.notifications import NotificationsSpec
from kvoffload.api.status import Phase
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.templating import render_input, renderer_version
from kvoffload.rollout.context import spec_digest
from tests.rollout.test_rollout import World, at_stage, in_phase, make_spec
from tests.support.kube import policy_manifest


def test_a_new_choice_of_sinks_mid_climb_starts_no_new_ladder() -> None:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu-pilot"))
    before = world.decisions()
    told = make_spec().model_copy(update={"notifications": NotificationsSpec(sinks=["team"])})
    world.change_spec(told)
    world.run_for("5m")
    assert world.decisions() == before
    assert world.stage == ("cpu-pilot", 0)
    world.run_until(in_phase(Phase.STABLE))  # and it climbs on


def test_neither_digest_reads_the_field_and_both_read_as_before_it_existed() -> None:
    spec = make_spec()
    told = spec.model_copy(update={"notifications": NotificationsSpec(sinks=["team"])})
    assert spec_digest(told) == spec_digest(spec)
    # The spec without replicas, with no notifications key at all, and no field at its default.
    old = {
        k: v
        for k, v in spec.model_dump(mode="json", by_alias=True, exclude={"replicas"}, exclude_defaults=True).items()
        if k != "notifications"
    }
    assert spec_digest(spec) == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]

    policy = KVOffloadPolicy.model_validate(policy_manifest("chat", "llm", spec.model_dump(mode="json", by_alias=True)))
    told_policy = policy.model_copy(update={"spec": told})
    assert render_input(told_policy) == render_input(policy)
    dumped = json.loads(policy.spec.model_dump_json(by_alias=True))
    assert "notifications" in dumped  # the field is there, as null; the render input leaves it out
    without = json.dumps({k: v for k, v in dumped.items() if k != "notifications"}, separators=(",", ":"))
    text = f"{renderer_version()}\0llm/chat\0{without}"
    assert render_input(policy) == hashlib.sha256(text.encode()).hexdigest()[:16]

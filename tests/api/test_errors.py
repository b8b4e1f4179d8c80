"""What a refusal costs: a big bad policy gets a bounded, printable message at apply and in its Invalid condition
(issue 33: a 66 KB policy once made a 1.6 MB message, which the API server refused as a status write)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from kvoffload.api.errors import MAX_ERROR_CHARS, MAX_ERRORS_SHOWN, FieldError, summary
from kvoffload.controller import admission
from kvoffload.rollout.decide import invalid
from tests.controller.test_admission_webhook import policy


def test_a_summary_shows_the_first_errors_each_cut_then_how_many_more() -> None:
    errors = [FieldError(f"spec.model.env[{i}].name", "x" * 1000) for i in range(25)]
    text = summary(errors)
    assert text.startswith("spec.model.env[0].name: xxx")
    assert text.endswith("; and 15 more")
    assert text.count("spec.model.env[") == MAX_ERRORS_SHOWN
    assert len(text) < MAX_ERRORS_SHOWN * (MAX_ERROR_CHARS + 2) + 20
    assert summary([FieldError("spec.x", "bad")]) == "spec.x: bad"


def test_a_summary_is_printable() -> None:
    text = summary([FieldError("spec.model.env[0].value", "a\nb\x00c\x1b[31md")])
    assert text.isprintable()
    assert text == "spec.model.env[0].value: a b c [31md"


def test_a_huge_bad_policy_is_refused_and_marked_invalid_with_a_bounded_message() -> None:
    names = [f"LD_{'P' * 200}{i}" for i in range(128)]  # each refused, naming its own path and echoing its name
    flags = [f"--x{'y' * 200}{i}" for i in range(60)]
    obj = policy("team-a", "huge", model__env=[{"name": n, "value": "v"} for n in names], model__extraArgs=flags)
    assert len(json.dumps(obj)) > 40_000
    found = admission.problems(obj)
    assert len(found) >= 128
    assert len("; ".join(map(str, found))) > 30_000  # what the message was, unbounded
    refusal = admission.message(found)
    assert len(refusal) < 4_000, len(refusal)
    assert refusal.endswith(f"; and {len(found) - MAX_ERRORS_SHOWN} more")
    plan = invalid(None, [str(e) for e in found], 1, datetime(2026, 12, 6, tzinfo=UTC))
    assert plan.status is not None
    (condition,) = [c for c in plan.status.conditions if c.type == "Invalid"]
    assert condition.message == refusal


def test_a_takeover_is_admitted_on_its_fields_and_its_levels_are_left_to_the_operator() -> None:
    """The webhook cannot read the referenced Deployment: what depends on it (the levels, their sizing) is judged
    by the operator once it has (status Invalid); the policy's own fields are still judged at apply."""
    obj = policy("team-a", "chat", workloadRef={"name": "chat"})
    del obj["spec"]["model"]["image"]
    assert admission.problems(obj) == []
    obj["spec"]["model"]["extraArgs"] = ["--enforce-eager"]
    assert [e.path for e in admission.problems(obj)] == ["spec"]
    assert "with workloadRef, the referenced Deployment carries" in admission.message(admission.problems(obj))

"""What a team's channel reads: a tenant's own text in a Slack message shows as text (never a mention or a
disguised link), and a notification of an observe-only policy says that nothing was applied.

Both from the real code paths: the Invalid notice is the one the operator derives from a spec that fails
validation with a hostile selector key, and the observe-only notices are those of a real observe-only climb."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kvoffload.api.errors import errors_from
from kvoffload.api.notifications import NotificationEvent
from kvoffload.api.status import Phase
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.notify.derive import Notice, notices
from kvoffload.notify.payload import OBSERVE_ONLY, generic, slack
from kvoffload.rollout.decide import invalid
from tests.rollout.test_observe import Fleet, observe_spec
from tests.rollout.test_rollout import BASE_SPEC, T0, World, in_phase, make_spec

HOSTILE = "<!channel> urgent: click <https://evil.example|here>"
LINK = "https://grafana.example.com/d/kvoffload?var-namespace=llm&var-policy=chat"


def slack_texts(message: dict[str, Any]) -> list[str]:
    """Every string Slack renders as mrkdwn in a message: ``text`` and each block's."""
    texts = [message["text"]]
    for block in message["blocks"]:
        if "text" in block:
            texts.append(block["text"]["text"])
        texts += [e["text"] for e in block.get("elements", [])]
    return texts


def hostile_invalid_notice() -> Notice:
    raw = {
        **BASE_SPEC,
        "rollout": {
            **BASE_SPEC["rollout"],
            "observeOnly": True,
            "observe": {"selector": {"matchLabels": {HOSTILE: "x"}}},
        },
    }
    with pytest.raises(ValidationError) as caught:
        KVOffloadPolicySpec.model_validate(raw)
    errors = [str(e) for e in errors_from(caught.value)]  # as the controller hands them to invalid()
    plan = invalid(None, errors, 1, T0)
    (told,) = notices("llm", "chat", None, plan.status, T0)
    assert told.event is NotificationEvent.INVALID
    assert HOSTILE in told.message  # the tenant's text really is in what is told
    return told


def test_a_tenants_text_reaches_slack_as_text_never_as_a_mention_or_a_link() -> None:
    message = slack(hostile_invalid_notice(), LINK)
    for text in slack_texts(message):
        assert "<!" not in text, text
        assert "<https://evil" not in text, text
    body = message["blocks"][1]["text"]["text"]
    assert "&lt;!channel&gt; urgent: click &lt;https://evil.example|here&gt;" in body
    # The operator's own link stays a link: the admin's, with its & as it was.
    assert message["blocks"][0]["text"]["text"].endswith(f" (<{LINK}|dashboard>)")


def test_every_field_slack_shows_is_escaped_and_the_generic_payload_carries_it_as_it_is() -> None:
    told = hostile_invalid_notice()
    odd = Notice(
        **{
            **told.__dict__,
            "reason": "A&B<c>",
            "level": "<!here>",
            "phase": "<@U123>",
            "stable": "<#C1>",
            "canary": "a>b",
        }
    )
    message = slack(odd)
    joined = "\n".join(slack_texts(message))
    for raw in ("<!here>", "<@U123>", "<#C1>", "a>b", "A&B<c>", "<!channel>"):
        assert raw not in joined, raw
    for escaped in ("&lt;!here&gt;", "&lt;@U123&gt;", "&lt;#C1&gt;", "a&gt;b", "A&amp;B&lt;c&gt;"):
        assert escaped in joined, escaped
    assert "<" not in joined
    assert ">" not in joined
    # Escaping is Slack's business: the generic payload is JSON, and carries the tenant's text unchanged.
    assert generic(odd)["message"] == told.message
    assert generic(odd)["reason"] == "A&B<c>"


def test_a_long_escaped_message_is_cut_without_splitting_an_entity() -> None:
    told = hostile_invalid_notice()
    long = Notice(**{**told.__dict__, "message": "x" * 2897 + "&" * 10})
    body = slack(long)["blocks"][1]["text"]["text"]
    assert len(body) <= 2900
    assert body.endswith("&amp;…") or body.endswith("x…")
    assert not body[:-1].endswith(("&", "&a", "&am", "&amp"))


def test_an_observe_only_climb_is_told_as_observe_only_everywhere() -> None:
    fleet = Fleet(observe_spec())
    fleet.run(240)
    assert fleet.status is not None
    assert fleet.status.phase is Phase.STABLE
    told: list[Notice] = []
    for i, plan in enumerate(fleet.plans):
        told += notices("llm", "chat", fleet.plans[i - 1].status if i else None, plan.status, T0)
    promoted = [n for n in told if n.event is NotificationEvent.PROMOTED]
    assert promoted
    assert promoted[-1].level == "nvme"
    for notice in told:
        assert notice.observe_only
        assert generic(notice)["observeOnly"] is True
        message = slack(notice, LINK)
        assert OBSERVE_ONLY in message["text"]
        assert OBSERVE_ONLY in message["blocks"][0]["text"]["text"]
    assert json.loads(json.dumps(generic(promoted[-1])))["observeOnly"] is True


def test_an_applied_climb_is_not_marked_observe_only() -> None:
    world = World.given(make_spec())
    world.run_until(in_phase(Phase.STABLE))
    told: list[Notice] = []
    for i, plan in enumerate(world.plans):
        told += notices("llm", "chat", world.plans[i - 1].status if i else None, plan.status, T0)
    assert told
    for notice in told:
        assert not notice.observe_only
        assert generic(notice)["observeOnly"] is False
        assert OBSERVE_ONLY not in slack(notice)["text"]

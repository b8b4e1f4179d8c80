"""docs/notifications.md shows the payloads the code sends: each example, read back into a notice, is what
``payload.generic``, ``payload.slack`` and ``payload.alertmanager`` make of it, id included."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from kvoffload.api.notifications import NotificationEvent
from kvoffload.notify.derive import Notice
from kvoffload.notify.payload import PAYLOAD_VERSION, alertmanager, generic, slack
from tests.support.paths import ROOT

GUIDE = (ROOT / "docs" / "notifications.md").read_text()


def examples() -> list[Any]:
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", GUIDE, re.DOTALL)]


def notice_of(example: dict[str, Any]) -> Notice:
    return Notice(
        namespace=example["policy"]["namespace"],
        name=example["policy"]["name"],
        event=NotificationEvent(example["event"]),
        time=datetime.fromisoformat(example["time"]),
        decision=example["decision"],
        reason=example["reason"],
        message=example["message"],
        phase=example["phase"],
        level=example["level"],
        step=example["step"],
        stable=example["stable"],
        canary=example["canary"],
        observe_only=example["observeOnly"],
    )


def test_the_generic_example_is_what_the_operator_sends() -> None:
    generic_example, _, _ = examples()
    assert generic_example["version"] == PAYLOAD_VERSION
    assert generic(notice_of(generic_example), generic_example["link"]) == generic_example


def test_the_slack_example_is_the_same_notification_as_slack_gets_it() -> None:
    generic_example, slack_example, _ = examples()
    assert slack(notice_of(generic_example), generic_example["link"]) == slack_example


def test_the_guide_lists_every_event_and_every_payload_field() -> None:
    for event in NotificationEvent:
        assert f"| `{event.value}` |" in GUIDE, event
    generic_example, _, _ = examples()
    for key in generic_example:
        assert f"| `{key}`" in GUIDE or f"`{key}` |" in GUIDE or f", `{key}` |" in GUIDE, key


def test_the_alertmanager_example_is_the_same_notification_as_alertmanager_gets_it() -> None:
    generic_example, _, alert_example = examples()
    assert alertmanager(notice_of(generic_example), generic_example["link"]) == alert_example

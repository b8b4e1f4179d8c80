"""``format: apprise``: a notification reaches real local receivers through Apprise 2.3.0, each in its own
service's format (Mattermost, ntfy, Gotify, Apprise's JSON, and its JSON as HTML), with a tenant's text defanged;
a receiver answering 500 is retried then given up; a URL Apprise cannot load is refused naming its field; and
no piece of the URL (a credential) reaches a log record, Apprise's own included."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.api.notifications import NotificationEvent, NotificationsSpec
from kvoffload.notify.config import ConfigError, NotificationsConfig, load_config
from kvoffload.notify.derive import Notice
from kvoffload.notify.notifier import Notifier
from kvoffload.notify.payload import APPRISE_SEVERITY, apprise_text
from kvoffload.notify.sink import Result
from kvoffload.notify.via_apprise import REDACTED, redact
from tests.notify.test_sink import FAST, Tally
from tests.support.receiver import Receiver, free_port

T0 = datetime(2026, 12, 5, 19, 0, tzinfo=UTC)
HOSTILE = "<!channel> @channel urgent: click [here](https://evil.example) or <https://evil.example|here>"
LINK = "https://grafana.example.com/d/kvoffload?var-namespace=llm&var-policy=chat"
TOKEN = "s3cr3tTokenXyZ"


def notice(event: NotificationEvent = NotificationEvent.INVALID, **changes: Any) -> Notice:
    fields: dict[str, Any] = {
        "namespace": "llm",
        "name": "chat",
        "event": event,
        "time": T0,
        "decision": "Invalid",
        "reason": "InvalidSpec",
        "message": f"spec.rollout.observe.selector.matchLabels.{HOSTILE}: not a label key",
        "phase": "Invalid",
        "level": "gpu-only",
        "step": None,
        "stable": "gpu-only",
        "canary": None,
    }
    return Notice(**{**fields, **changes})


def deliver(url: str, tally: Tally, told: list[Notice], **sink: Any) -> Notifier:
    config = NotificationsConfig.model_validate(
        {"sinks": [{"name": "team", "format": "apprise", "url": url, **FAST, **sink}], "link": LINK}
    )
    notifier = Notifier(config, tally.result, tally.retry)
    notifier.start()
    assert notifier.send(NotificationsSpec(sinks=["team"]), told) == len(told)
    return notifier


def assert_defanged(text: str) -> None:
    """No mention, no Slack-style markup, no Markdown link: what the tenant wrote shows as text."""
    for live in ("<!channel>", "@channel", "<https://evil", "](https://evil"):
        assert live not in text, (live, text)
    assert "\u200b" in text
    assert "click [here]" in text  # the words are all there, only defanged


@pytest.fixture
def tally() -> Tally:
    return Tally()


def test_mattermost_gets_its_own_text_message_with_the_tenants_text_defanged(tally: Tally) -> None:
    with Receiver() as receiver:
        notifier = deliver(f"mmost://127.0.0.1:{receiver.port}/{TOKEN}", tally, [notice()])
        (body,) = receiver.wait_for(1)
        notifier.close()
    assert receiver.requests == [f"POST /hooks/{TOKEN}"]
    assert set(body) == {"text", "username", "icon_url"}  # Mattermost's incoming-webhook message
    title, text = body["text"].split("\r\n", 1)
    assert title == "KVOffloadPolicy llm/chat has an invalid spec at gpu-only"
    assert_defanged(body["text"])
    assert text.endswith(LINK)  # the admin's link is left whole
    assert tally.results == Counter({("team", Result.DELIVERED): 1})


def test_ntfy_gets_its_topic_title_and_message(tally: Tally) -> None:
    with Receiver() as receiver:
        notifier = deliver(f"ntfy://127.0.0.1:{receiver.port}/kvoffload-{TOKEN}", tally, [notice()])
        (body,) = receiver.wait_for(1)
        notifier.close()
    assert receiver.requests == ["POST /"]
    assert body["topic"] == f"kvoffload-{TOKEN}"
    assert body["title"] == "KVOffloadPolicy llm/chat has an invalid spec at gpu-only"
    assert_defanged(body["message"])
    assert receiver.headers[0]["X-Icon"].endswith("apprise-failure-256x256.png")  # FAILURE for an Invalid


def test_gotify_gets_its_key_header_and_priority(tally: Tally) -> None:
    with Receiver() as receiver:
        notifier = deliver(f"gotify://127.0.0.1:{receiver.port}/{TOKEN}", tally, [notice()])
        (body,) = receiver.wait_for(1)
        notifier.close()
    assert receiver.requests == ["POST /message"]
    assert receiver.headers[0]["X-Gotify-Key"] == TOKEN
    assert set(body) == {"priority", "title", "message"}
    assert_defanged(body["message"])


def test_apprise_json_carries_each_events_severity(tally: Tally) -> None:
    told = [notice(event) for event in NotificationEvent]
    with Receiver() as receiver:
        notifier = deliver(f"json://127.0.0.1:{receiver.port}/hook", tally, told)
        bodies = receiver.wait_for(len(told))
        notifier.close()
    assert [b["type"] for b in bodies] == [APPRISE_SEVERITY[e].value for e in NotificationEvent]
    assert {e: APPRISE_SEVERITY[e].value for e in NotificationEvent} == {
        NotificationEvent.PROMOTED: "success",
        NotificationEvent.ROLLED_BACK: "failure",
        NotificationEvent.PAUSED: "info",
        NotificationEvent.AWAITING_PROMOTION: "info",
        NotificationEvent.INVALID: "failure",
    }
    assert {b["version"] for b in bodies} == {"1.0"}
    assert bodies[0]["title"] == "KVOffloadPolicy llm/chat promoted at gpu-only"


def test_a_service_that_takes_html_gets_the_text_html_escaped_by_apprise(tally: Tally) -> None:
    # As an HTML email would: Apprise turns the plain text into HTML, escaping what HTML reads.
    with Receiver() as receiver:
        notifier = deliver(f"json://127.0.0.1:{receiver.port}/hook?format=html", tally, [notice()])
        (body,) = receiver.wait_for(1)
        notifier.close()
    assert "&lt;" in body["message"]
    assert "<!channel>" not in body["message"]
    assert "<https://evil" not in body["message"]


def test_a_receiver_answering_500_is_retried_then_given_up_and_counted(tally: Tally) -> None:
    with Receiver(status=500) as receiver:
        notifier = deliver(f"json://127.0.0.1:{receiver.port}/hook", tally, [notice()], maxAttempts=3)
        tally.wait("team", Result.FAILED)
        notifier.close()
    assert receiver.arrived == 3  # apprise's own retry is 0: one request per attempt
    assert tally.retries["team"] == 2
    assert tally.results == Counter({("team", Result.FAILED): 1})


def test_a_receiver_that_is_down_is_retried_until_it_comes_up(tally: Tally) -> None:
    port = free_port()
    notifier = deliver(f"json://127.0.0.1:{port}/hook", tally, [notice()], maxAttempts=20)
    assert tally.retried.wait(10), "no retry after a refused connection"
    with Receiver(port=port) as receiver:
        tally.wait("team", Result.DELIVERED)
        assert receiver.bodies[0]["type"] == "failure"
    notifier.close()


@pytest.mark.parametrize(
    ("sink", "path"),
    [
        ({"format": "apprise", "url": f"nosuchservice://{TOKEN}/x"}, "sinks[0].url"),
        ({"format": "apprise", "url": f"rocket://127.0.0.1/webhook/{TOKEN}"}, "sinks[0].url"),  # no user nor mode
        ({"format": "apprise", "url": "mmost://127.0.0.1/"}, "sinks[0].url"),  # no token
        ({"format": "json", "url": f"mmost://127.0.0.1/{TOKEN}"}, "sinks[0].url"),  # not http for a webhook
        ({"format": "alertmanager", "url": f"gotify://127.0.0.1/{TOKEN}"}, "sinks[0].url"),
    ],
)
def test_a_url_the_sink_cannot_use_is_refused_at_load_naming_its_field_and_never_repeating_it(
    tmp_path: Path, sink: dict[str, Any], path: str
) -> None:
    config = tmp_path / "notifications.yaml"
    config.write_text(yaml.safe_dump({"sinks": [{"name": "team", **sink}]}))
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    ((error),) = refused.value.errors
    assert error.path == path
    assert TOKEN not in str(refused.value)


def test_an_apprise_url_file_holding_no_apprise_url_is_refused_naming_the_url_file(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(f"nosuchservice://{TOKEN}\n")
    config = tmp_path / "notifications.yaml"
    config.write_text(yaml.safe_dump({"sinks": [{"name": "team", "format": "apprise", "urlFile": str(url_file)}]}))
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert [e.path for e in refused.value.errors] == ["sinks[0].urlFile"]
    assert TOKEN not in str(refused.value)
    url_file.write_text(f"mmost://127.0.0.1/{TOKEN}\n")
    assert load_config(config).sinks[0].url_file == url_file


def test_no_piece_of_the_url_reaches_any_log_record_even_at_debug(
    tally: Tally, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, apprise's and urllib3's included
    bad = tmp_path / "notifications.yaml"
    bad.write_text(yaml.safe_dump({"sinks": [{"name": "t", "format": "apprise", "url": f"rocket://h/w/{TOKEN}"}]}))
    with pytest.raises(ConfigError):
        load_config(bad)  # Apprise logs an ERROR naming the URL it cannot load
    with Receiver(status=500) as failing, Receiver() as working:
        notifier = deliver(f"mmost://127.0.0.1:{failing.port}/{TOKEN}", tally, [notice()], maxAttempts=2)
        tally.wait("team", Result.FAILED)
        notifier.close()
        notifier = deliver(f"mmost://127.0.0.1:{working.port}/{TOKEN}", tally, [notice()])
        tally.wait("team", Result.DELIVERED)
        notifier.close()
    apprise_records = [r for r in caplog.records if r.name == "apprise"]
    assert {r.levelname for r in apprise_records} >= {"ERROR", "WARNING"}, "Apprise logged nothing to check"
    assert all(r.levelno >= logging.WARNING for r in apprise_records)  # its DEBUG dumps URLs and payloads
    assert any(REDACTED in r.getMessage() for r in apprise_records)
    assert any(r.name == "kvoffload.notify.sink" for r in caplog.records)  # our own retry and give-up lines
    for record in caplog.records:
        assert TOKEN not in record.getMessage(), (record.name, record.getMessage())
    assert TOKEN not in caplog.text


def test_redaction_takes_every_piece_of_a_remembered_url_and_anything_url_shaped() -> None:
    from kvoffload.notify.via_apprise import remember

    remember("msteams://TokenAaaa/TokenBbbb/TokenCccc?image=no")
    assert redact("posting to TokenBbbb failed") == f"posting to {REDACTED} failed"
    assert redact("Could not load pover://user@key1234") == f"Could not load {REDACTED}"
    assert redact("HTTP 500 from the service") == "HTTP 500 from the service"


def test_the_text_is_built_from_the_notice_with_the_admins_link_whole() -> None:
    text = apprise_text(notice(NotificationEvent.ROLLED_BACK, observe_only=True), LINK)
    assert text.title.endswith("(observe-only: nothing was applied)")
    assert text.body.splitlines()[-1] == LINK
    assert text.severity.value == "failure"

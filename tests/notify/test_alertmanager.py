"""``format: alertmanager``: notifications POSTed as alerts to a real Alertmanager (Debian's), read back from its
API v2 with the labels SREs route on; an alert it refuses (400) is final, not retried."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kvoffload.api.notifications import NotificationEvent, NotificationsSpec
from kvoffload.notify.config import NotificationsConfig
from kvoffload.notify.derive import Notice
from kvoffload.notify.notifier import Notifier
from kvoffload.notify.sink import Result, _alerts_url
from tests.notify.test_sink import FAST, Tally
from tests.support.alertmanager import Alertmanager, alertmanager  # noqa: F401  (the fixture)

LINK = "https://grafana.example.com/d/kvoffload?var-namespace=llm&var-policy=chat"


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def notice(event: NotificationEvent, when: datetime, **changes: Any) -> Notice:
    fields: dict[str, Any] = {
        "namespace": "llm",
        "name": "chat",
        "event": event,
        "time": when,
        "decision": "Rollback",
        "reason": "AnalysisFailed",
        "message": "canary p99 2500.0ms over the 1500ms budget; canary cpu removed, all 4 replicas on gpu-only",
        "phase": "RolledBack",
        "level": "gpu-only",
        "step": None,
        "stable": "gpu-only",
        "canary": None,
    }
    return Notice(**{**fields, **changes})


def notifier_for(url: str, tally: Tally) -> Notifier:
    config = NotificationsConfig.model_validate(
        {"sinks": [{"name": "sre", "format": "alertmanager", "url": url, **FAST, "maxAttempts": 3}], "link": LINK}
    )
    made = Notifier(config, tally.result, tally.retry)
    made.start()
    return made


def test_a_rollback_and_a_promotion_arrive_as_alerts_labelled_for_routing(alertmanager: Alertmanager) -> None:  # noqa: F811
    tally = Tally()
    when = now()
    told = [
        notice(NotificationEvent.ROLLED_BACK, when),
        notice(NotificationEvent.PROMOTED, when, name="summarise", decision="Promoted", reason="AnalysisPassed"),
    ]
    notifier = notifier_for(alertmanager.url + "/", tally)
    assert notifier.send(NotificationsSpec(sinks=["sre"]), told) == 2
    tally.wait("sre", Result.DELIVERED, count=2)
    notifier.close()
    alerts = {a["labels"]["alertname"]: a for a in alertmanager.wait_for_alerts(2)}
    rolled_back = alerts["KVOffloadRolledBack"]
    assert rolled_back["labels"] == {
        "alertname": "KVOffloadRolledBack",
        "namespace": "llm",
        "policy": "chat",
        "severity": "warning",
    }
    assert rolled_back["annotations"]["summary"] == "KVOffloadPolicy llm/chat rolled back at gpu-only"
    assert rolled_back["annotations"]["description"] == told[0].message
    assert rolled_back["annotations"]["id"] == told[0].id
    assert rolled_back["annotations"]["reason"] == "AnalysisFailed"
    assert rolled_back["generatorURL"] == LINK
    assert datetime.fromisoformat(rolled_back["startsAt"]) == when
    assert datetime.fromisoformat(rolled_back["endsAt"]) > when  # Alertmanager's resolve_timeout, none of ours
    assert rolled_back["status"]["state"] == "active"
    assert alerts["KVOffloadPromoted"]["labels"] == {
        "alertname": "KVOffloadPromoted",
        "namespace": "llm",
        "policy": "summarise",
        "severity": "info",
    }
    assert tally.results == Counter({("sre", Result.DELIVERED): 2})


def test_an_alert_alertmanager_refuses_is_final_not_retried(alertmanager: Alertmanager) -> None:  # noqa: F811
    # Starting after the end Alertmanager gives it (now + resolve_timeout): a 400, which no retry changes.
    tally = Tally()
    notifier = notifier_for(alertmanager.url, tally)
    notifier.send(NotificationsSpec(sinks=["sre"]), [notice(NotificationEvent.PAUSED, now() + timedelta(days=1))])
    tally.wait("sre", Result.FAILED)
    notifier.close()
    assert tally.retries["sre"] == 0
    assert alertmanager.alerts() == []


@pytest.mark.parametrize(
    ("url", "posted_to"),
    [
        ("http://am.monitoring:9093", "http://am.monitoring:9093/api/v2/alerts"),
        ("http://am.monitoring:9093/", "http://am.monitoring:9093/api/v2/alerts"),
        ("https://gw.example/alertmanager/", "https://gw.example/alertmanager/api/v2/alerts"),
        ("http://am:9093/api/v2/alerts", "http://am:9093/api/v2/alerts"),
    ],
)
def test_the_alerts_go_to_the_api_v2_under_the_alertmanagers_url(url: str, posted_to: str) -> None:
    assert _alerts_url(url) == posted_to

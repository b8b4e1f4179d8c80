"""What a sink receives: the generic JSON payload, a Slack message (``text`` and ``blocks``), an Alertmanager
alert, or an Apprise title and text.

Each is documented, with examples, in docs/notifications.md; a test holds the examples to this code.
"""

from __future__ import annotations

from typing import Any

from kvoffload.api.notifications import NotificationEvent
from kvoffload.notify.config import SinkFormat
from kvoffload.notify.derive import Notice
from kvoffload.notify.via_apprise import AppriseText, Severity

PAYLOAD_VERSION = "kvoffload.io/notification/v1"
"""The generic payload's ``version``: a receiver can tell a later, changed layout."""

_EMOJI = {
    NotificationEvent.PROMOTED: ":arrow_up:",
    NotificationEvent.ROLLED_BACK: ":rotating_light:",
    NotificationEvent.PAUSED: ":double_vertical_bar:",
    NotificationEvent.AWAITING_PROMOTION: ":raising_hand:",
    NotificationEvent.INVALID: ":x:",
}
_HEADLINE = {
    NotificationEvent.PROMOTED: "promoted",
    NotificationEvent.ROLLED_BACK: "rolled back",
    NotificationEvent.PAUSED: "paused",
    NotificationEvent.AWAITING_PROMOTION: "awaits promotion",
    NotificationEvent.INVALID: "has an invalid spec",
}


OBSERVE_ONLY = "(observe-only: nothing was applied)"
"""What a Slack message of an observe-only policy says, so that no one reads its ladder as applied."""


def generic(notice: Notice, link: str | None = None) -> dict[str, Any]:
    """The generic JSON payload."""
    body: dict[str, Any] = {
        "version": PAYLOAD_VERSION,
        "id": notice.id,
        "event": notice.event.value,
        "time": notice.time.isoformat().replace("+00:00", "Z"),
        "policy": {"namespace": notice.namespace, "name": notice.name},
        "phase": notice.phase,
        "level": notice.level,
        "step": notice.step,
        "stable": notice.stable,
        "canary": notice.canary,
        "decision": notice.decision,
        "reason": notice.reason,
        "message": notice.message,
        "observeOnly": notice.observe_only,
    }
    if link is not None:
        body["link"] = link
    return body


def slack(notice: Notice, link: str | None = None) -> dict[str, Any]:
    """A Slack incoming-webhook message: ``text`` (the notification's fallback) and Block Kit ``blocks``.

    Every field put in is escaped (``&``, ``<``, ``>``, as Slack asks): a message or reason can carry a tenant's
    text (an Invalid spec's field path names a selector key), which must not become a mention (``<!channel>``)
    or a disguised link. Only the operator's own link markup (the admin's ``link``) stays markup."""
    who = _esc(f"{notice.namespace}/{notice.name}")
    where = _esc(notice.level + (f" step {notice.step}" if notice.step else ""))
    reason = _esc(notice.reason)
    observing = f" {OBSERVE_ONLY}" if notice.observe_only else ""
    text = f"{_EMOJI[notice.event]} KVOffloadPolicy {who} {_HEADLINE[notice.event]} at {where} ({reason}){observing}"
    headline = f"*{_EMOJI[notice.event]} KVOffloadPolicy `{who}` {_HEADLINE[notice.event]}* at `{where}`{observing}"
    if link is not None:
        headline += f" (<{link}|dashboard>)"
    context = f"phase {_esc(notice.phase)} · stable {_esc(notice.stable or '-')} · canary {_esc(notice.canary or '-')}"
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": headline}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _clip(_esc(notice.message)) or reason}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"{reason} · {context}"}]},
        ],
    }


ALERT_SEVERITY = {
    NotificationEvent.PROMOTED: "info",
    NotificationEvent.ROLLED_BACK: "warning",
    NotificationEvent.PAUSED: "warning",
    NotificationEvent.AWAITING_PROMOTION: "warning",
    NotificationEvent.INVALID: "warning",
}
"""The ``severity`` label of each event's alert: as the chart's own alerts of the same states have it
(``KVOffloadPolicyRolledBack``, ``KVOffloadPolicyAwaitingPromotion``: warning)."""


def alertname(event: NotificationEvent) -> str:
    """``KVOffload<Event>``: apart from the chart's Prometheus alerts (``KVOffloadPolicy...``), which are states
    while these are transitions, so Alertmanager never merges the two."""
    return f"KVOffload{event.value}"


def alertmanager(notice: Notice, link: str | None = None) -> list[dict[str, Any]]:
    """The body of a POST to Alertmanager's ``/api/v2/alerts``: one alert, labelled for routing.

    No ``endsAt``: Alertmanager resolves it after its ``resolve_timeout`` (5m unless set), as a one-off
    transition should be; a later same transition of the same policy within that time is the same alert to it.
    Escaping is the receiver template's business: Alertmanager's templates escape for their own formats."""
    summary = f"KVOffloadPolicy {notice.namespace}/{notice.name} {_HEADLINE[notice.event]} at {_where(notice)}"
    annotations = {
        "summary": summary + (f" {OBSERVE_ONLY}" if notice.observe_only else ""),
        "description": notice.message or notice.reason,
        "id": notice.id,
        "decision": notice.decision,
        "reason": notice.reason,
        "phase": notice.phase,
        "level": notice.level,
        "step": "" if notice.step is None else str(notice.step),
        "stable": notice.stable or "",
        "canary": notice.canary or "",
        "observeOnly": "true" if notice.observe_only else "false",
    }
    alert: dict[str, Any] = {
        "labels": {
            "alertname": alertname(notice.event),
            "namespace": notice.namespace,
            "policy": notice.name,
            "severity": ALERT_SEVERITY[notice.event],
        },
        "annotations": annotations,
        "startsAt": notice.time.isoformat().replace("+00:00", "Z"),
    }
    if link is not None:
        alert["generatorURL"] = link
    return [alert]


APPRISE_SEVERITY = {
    NotificationEvent.PROMOTED: Severity.SUCCESS,
    NotificationEvent.ROLLED_BACK: Severity.FAILURE,
    NotificationEvent.INVALID: Severity.FAILURE,
    NotificationEvent.PAUSED: Severity.INFO,
    NotificationEvent.AWAITING_PROMOTION: Severity.INFO,
}
"""Apprise's notify type per event: what each service shows as colour or icon."""


def apprise_text(notice: Notice, link: str | None = None) -> AppriseText:
    """A title and a plain-text body for Apprise, every field of the policy's defanged (:func:`defang`): Apprise
    passes text as it is to the chat services, which read mentions and link markup in it. Only the admin's link
    is left whole."""
    title = f"KVOffloadPolicy {notice.namespace}/{notice.name} {_HEADLINE[notice.event]} at {_where(notice)}"
    if notice.observe_only:
        title += f" {OBSERVE_ONLY}"
    context = f"{notice.reason} · phase {notice.phase} · stable {notice.stable or '-'} · canary {notice.canary or '-'}"
    lines = [defang(notice.message or notice.reason), defang(context)]
    if link is not None:
        lines.append(link)
    return AppriseText(defang(title), "\n".join(lines), APPRISE_SEVERITY[notice.event])


_ZWSP = "\u200b"


def defang(text: str) -> str:
    """Text no chat service reads as a mention or a link in disguise: a zero-width space after each ``@``
    (``@channel``, ``@here``, ``@everyone``) and ``<`` (Slack's ``<!channel>`` and ``<url|text>``, which
    Mattermost and Rocket.Chat take too; HTML), and between ``]`` and ``(`` (a Markdown link). It reads the same."""
    return text.replace("@", "@" + _ZWSP).replace("<", "<" + _ZWSP).replace("](", "]" + _ZWSP + "(")


def payload(notice: Notice, form: SinkFormat, link: str | None = None) -> Any:
    """The JSON body of a sink that is POSTed to (every format but apprise)."""
    if form is SinkFormat.SLACK:
        return slack(notice, link)
    if form is SinkFormat.ALERTMANAGER:
        return alertmanager(notice, link)
    return generic(notice, link)


def _where(notice: Notice) -> str:
    return notice.level + (f" step {notice.step}" if notice.step else "")


def _esc(text: str) -> str:
    """Text as Slack's mrkdwn shows it literally: its control characters as the entities Slack asks for."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int = 2900) -> str:
    """Slack refuses a section text over 3,000 characters; an Invalid message lists every field path. Cut after
    escaping, and never inside an entity (``&amp;`` half cut would show as text)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


__all__ = [
    "ALERT_SEVERITY",
    "APPRISE_SEVERITY",
    "OBSERVE_ONLY",
    "PAYLOAD_VERSION",
    "alertmanager",
    "alertname",
    "apprise_text",
    "defang",
    "generic",
    "payload",
    "slack",
]

"""What a sink receives: the generic JSON payload, or a Slack message (``text`` and ``blocks``).

Both are documented, with examples, in docs/notifications.md; a test holds the examples to this code.
"""

from __future__ import annotations

from typing import Any

from kvoffload.api.notifications import NotificationEvent
from kvoffload.notify.config import SinkFormat
from kvoffload.notify.derive import Notice

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


def payload(notice: Notice, form: SinkFormat, link: str | None = None) -> dict[str, Any]:
    return slack(notice, link) if form is SinkFormat.SLACK else generic(notice, link)


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


__all__ = ["OBSERVE_ONLY", "PAYLOAD_VERSION", "generic", "payload", "slack"]

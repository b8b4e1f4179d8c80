"""Delivery through Apprise (Teams, PagerDuty, Opsgenie, Discord, email, ...: one sink type, ``format: apprise``).

An Apprise URL is a credential: its host, path or user often *is* the token (``msteams://TokenA/TokenB/TokenC``,
``pagerduty://integrationKey@apiKey``). Apprise logs it: at DEBUG the whole POST URL (``.../hooks/TOKEN``), and
at ERROR a URL it cannot load, token included. So every record of the ``apprise`` logger below WARNING is dropped
(its DEBUG dumps URLs and payloads, its INFO adds nothing to our own line), and every record left, and every one of
``urllib3.connectionpool`` (which logs a request's path at DEBUG), has each piece of every Apprise URL this
process has seen, and anything shaped like a URL, replaced by ``<redacted>`` before any handler sees it.

Apprise reports a delivery as a bool, with no status code: a False is taken as a fault that may pass and tried
again up to ``maxAttempts``, since a refused token and a receiver that is down cannot be told apart from here.
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
from dataclasses import dataclass
from enum import StrEnum

REDACTED = "<redacted>"
_SHORTEST_SECRET = 3
"""Pieces shorter than this are not redacted: "a" or "me" would blank every word that holds them."""
_URL_SHAPED = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


class Severity(StrEnum):
    """Apprise's notify types, as the notification's event maps onto them (``payload.apprise_text``)."""

    INFO = "info"
    SUCCESS = "success"
    WARNING = "warning"
    FAILURE = "failure"


@dataclass(frozen=True)
class AppriseText:
    """What an Apprise service is given: a title, a plain-text body, and the severity it shows (colour, icon)."""

    title: str
    body: str
    severity: Severity


class AppriseFailed(Exception):
    """Apprise did not deliver; the message names no URL."""


_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def _pieces(url: str) -> set[str]:
    """The URL and each part of it that may be a token: host, user, password, path segments, query values."""
    found = {url, url.strip()}
    try:
        parts = urllib.parse.urlsplit(url.strip())
        found |= {parts.netloc, parts.hostname or "", parts.username or "", parts.password or "", parts.fragment}
        found |= set(parts.path.split("/"))
        for _key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
            found.add(value)
    except ValueError:  # an unparseable netloc (a stray bracket): the whole URL is still redacted
        pass
    found |= {urllib.parse.unquote(p) for p in found}
    return {p for p in found if len(p) >= _SHORTEST_SECRET}


def remember(url: str) -> None:
    """Have every later log record lose the pieces of ``url``: called before Apprise is given it."""
    pieces = _pieces(url)
    with _secrets_lock:
        _secrets.update(pieces)


def redact(text: str) -> str:
    """``text`` without any piece of a remembered URL, nor anything shaped like a URL."""
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # the whole URL before its parts
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _URL_SHAPED.sub(REDACTED, text)


class _Redacting(logging.Filter):
    def __init__(self, floor: int) -> None:
        super().__init__()
        self.floor = floor

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.floor:
            return False
        message = record.getMessage()
        if record.exc_info:  # a traceback can carry the URL too: kept as redacted text
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, None
        record.msg, record.args = redact(message), None
        return True


def _quiet() -> None:
    apprise_log = logging.getLogger("apprise")
    if not any(isinstance(f, _Redacting) for f in apprise_log.filters):
        apprise_log.addFilter(_Redacting(logging.WARNING))
    pool_log = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _Redacting) for f in pool_log.filters):
        pool_log.addFilter(_Redacting(logging.NOTSET))


_quiet()


def url_problem(url: str) -> str | None:
    """Why ``url`` is no Apprise URL this install can send to, or None; the reason names no part of it."""
    import apprise  # lazily: loading its plugins takes about a second, paid only by an operator with such a sink

    remember(url)
    if apprise.Apprise.instantiate(url) is None:
        return "not an Apprise URL that this operator's Apprise can load (unknown scheme, or a part missing)"
    return None


def send(url: str, text: AppriseText, timeout: float) -> None:
    """One attempt at delivering ``text`` to ``url``; AppriseFailed when Apprise says it did not."""
    import apprise

    remember(url)
    sender = apprise.Apprise()
    if not sender.add(url):
        raise AppriseFailed("not an Apprise URL that this operator's Apprise can load")
    result = sender.notify(
        title=text.title,
        body=text.body,
        notify_type=apprise.NotifyType(text.severity.value),
        body_format=apprise.NotifyFormat.TEXT,  # Apprise escapes it for the services that take HTML (email)
        timeout=timeout,
    )
    if not result:
        raise AppriseFailed(f"Apprise reported {result.status.name}")


__all__ = ["REDACTED", "AppriseFailed", "AppriseText", "Severity", "redact", "remember", "send", "url_problem"]

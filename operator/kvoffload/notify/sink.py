"""Delivery to one sink: a bounded queue drained by a thread of its own, retried with capped backoff.

Never in a reconcile's way: ``put`` only appends under a lock, and the POSTs, their timeouts and the waits
between attempts happen in the sink's thread. One thread per sink, so a receiver that is down or slow delays
only its own notifications.

The queue is shared fairly between policies: each policy has a line of its own, served in turn, and a full
queue lets the oldest notification of the policy with the most waiting go (counted). So a policy that floods a
sink (one that flaps, or a tenant's on purpose) delays and drops only its own notices, never another's
RolledBack.
The URL is a credential (a Slack webhook's is): it is never logged, only the sink's name.

Only the "send one" step differs between formats: a POST of the JSON body to the URL (json, slack), to the
URL's ``/api/v2/alerts`` (alertmanager), or one Apprise notify (apprise; ``via_apprise`` says how its retries
and logs are kept honest).
"""

from __future__ import annotations

import collections
import email.utils
import http.client
import logging
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvoffload import __version__
from kvoffload.notify import via_apprise
from kvoffload.notify.config import SinkConfig, SinkFormat
from kvoffload.notify.via_apprise import AppriseText

log = logging.getLogger(__name__)

JOIN_SECONDS = 1.0
"""How long a stopping sink waits for its worker to notice, past the grace."""
ALERTS_PATH = "/api/v2/alerts"
"""Where an Alertmanager takes alerts, under its URL (which may carry a route prefix)."""
ANSWER_BYTES = 65536
"""The most of an answer's body that is read: a 2xx is a delivery, its body is not needed."""
_TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
"""Answers worth another attempt; any other 4xx (a wrong URL, a revoked webhook) will not change by itself."""


class Result(StrEnum):
    """The ``result`` label of ``kvoffload_notifications_total``: what became of each notification."""

    DELIVERED = "delivered"
    FAILED = "failed"
    """Refused for good (a 4xx), or not delivered within ``maxAttempts``."""
    DROPPED = "dropped"
    """Pushed out of a full queue by a newer one, or still queued when the operator stopped."""


PolicyKey = tuple[str, str]
"""(namespace, policy name): whose line a notification waits in."""


@dataclass(frozen=True)
class Delivery:
    """One notification for one sink: the JSON body (or, for Apprise, ``text``), what to call it in logs, and the
    policy it tells of."""

    body: bytes
    what: str
    policy: PolicyKey = ("", "")
    text: AppriseText | None = None


class _Transient(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Permanent(Exception):
    pass


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook that redirects is answered as refused: the POST goes only where the admin said."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class WebhookSink:
    """One sink's queue and worker. ``on_result(sink, result)`` counts each notification's fate and
    ``on_retry(sink)`` each failed attempt that will be tried again; both are called from the worker."""

    def __init__(
        self,
        config: SinkConfig,
        on_result: Callable[[str, Result], None],
        on_retry: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.config = config
        self._on_result = on_result
        self._on_retry = on_retry
        self._lines: dict[PolicyKey, collections.deque[Delivery]] = {}
        """Each policy's waiting notifications; the dict's order is the turn (a served line goes to the back)."""
        self._waiting = 0
        self._lock = threading.Condition()
        self._busy = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"notify-{self.name}", daemon=True)
            self._thread.start()

    def put(self, delivery: Delivery) -> None:
        """Queue a notification; never blocks. A full queue lets the oldest of the longest line go (the new
        notification's own line when it is among the longest)."""
        dropped = None
        with self._lock:
            if self._waiting >= self.config.queue_size:
                own = delivery.policy
                longest = max(self._lines, key=lambda k: (len(self._lines[k]), k == own))
                dropped = self._take(longest)
            self._lines.setdefault(delivery.policy, collections.deque()).append(delivery)
            self._waiting += 1
            self._lock.notify()
        if dropped is not None:
            log.warning("notification sink %s: queue full, dropped %s", self.name, dropped.what)
            self._on_result(self.name, Result.DROPPED)

    def pending(self) -> int:
        """Notifications queued or being delivered."""
        with self._lock:
            return self._waiting + (1 if self._busy else 0)

    def close(self, grace: float) -> None:
        """Stop, giving what is queued ``grace`` seconds to go out; what is left is counted dropped."""
        deadline = time.monotonic() + grace
        with self._lock:
            while (self._waiting or self._busy) and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)  # the worker notifies after each notification
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:  # a POST under way is not cut short; its result is counted when it ends
            self._thread.join(timeout=JOIN_SECONDS)
        with self._lock:
            left_over, self._waiting = self._waiting, 0
            self._lines.clear()
        for _ in range(left_over):
            self._on_result(self.name, Result.DROPPED)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stop.is_set():
                    self._lock.wait()
                if self._stop.is_set():
                    return
                turn = next(iter(self._lines))
                delivery = self._take(turn)
                if turn in self._lines:  # to the back of the turn: the other policies' lines go first
                    self._lines[turn] = self._lines.pop(turn)
                self._busy = True
            try:
                result = self._deliver(delivery)
            except Exception:  # a bug of ours must not end the worker: the sink would go silent for good
                log.exception("notification sink %s: delivering %s failed", self.name, delivery.what)
                result = Result.FAILED
            with self._lock:
                self._busy = False
                self._lock.notify_all()
            self._on_result(self.name, result)

    def _take(self, policy: PolicyKey) -> Delivery:
        """The oldest of ``policy``'s line, off the queue (the lock held)."""
        line = self._lines[policy]
        delivery = line.popleft()
        if not line:
            del self._lines[policy]
        self._waiting -= 1
        return delivery

    def _deliver(self, delivery: Delivery) -> Result:
        """Attempts until delivered, refused for good, out of attempts, or stopped (then dropped)."""
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                self._send(delivery)
                return Result.DELIVERED
            except _Permanent as exc:
                log.warning("notification sink %s: %s refused: %s", self.name, delivery.what, exc)
                return Result.FAILED
            except _Transient as exc:
                if attempt == self.config.max_attempts:
                    log.warning(
                        "notification sink %s: gave %s up after %d attempts: %s", self.name, delivery.what, attempt, exc
                    )
                    return Result.FAILED
                delay = self._backoff(attempt, exc.retry_after)
                log.info(
                    "notification sink %s: attempt %d for %s failed (%s); again in %.1fs",
                    self.name,
                    attempt,
                    delivery.what,
                    exc,
                    delay,
                )
                self._on_retry(self.name)
                if self._stop.wait(delay):
                    return Result.DROPPED
        return Result.FAILED  # pragma: no cover - the loop returns on its last attempt

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Doubling from ``backoffSeconds``, up to ``maxBackoffSeconds``, with jitter so that sinks recovering
        together are not hit at once; a receiver's Retry-After is honoured within the same cap."""
        cap = self.config.max_backoff_seconds
        if retry_after is not None:
            return min(cap, max(0.0, retry_after))
        delay: float = min(cap, self.config.backoff_seconds * 2.0 ** (attempt - 1))
        return delay * random.uniform(0.8, 1.0)

    def _url(self) -> str:
        if self.config.url is not None:
            return self.config.url
        assert self.config.url_file is not None
        try:  # read each time: a rotated Secret reaches the mounted file without a restart
            url = self.config.url_file.read_text().strip()
        except OSError as exc:
            raise _Transient(f"cannot read its urlFile: {exc.strerror or exc}") from None
        if self.config.format.over_http and not url.startswith(("http://", "https://")):
            raise _Permanent("its urlFile holds no http(s) URL")
        return url

    def _send(self, delivery: Delivery) -> None:
        """One attempt; _Transient or _Permanent when it did not deliver."""
        if self.config.format is SinkFormat.APPRISE:
            assert delivery.text is not None
            try:
                via_apprise.send(self._url(), delivery.text, self.config.timeout_seconds)
            except via_apprise.AppriseFailed as exc:  # no status code to tell a refusal from an outage
                raise _Transient(str(exc)) from None
        elif self.config.format is SinkFormat.ALERTMANAGER:
            self._post(_alerts_url(self._url()), delivery.body)
        else:
            self._post(self._url(), delivery.body)

    def _post(self, url: str, body: bytes) -> None:
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": f"kvoffload/{__version__}"},
        )
        deadline = time.monotonic() + self.config.timeout_seconds
        try:
            with _OPENER.open(request, timeout=self.config.timeout_seconds) as response:
                _drain(response, deadline)
        except urllib.error.HTTPError as exc:
            with exc:
                if exc.code in _TRANSIENT_STATUSES:
                    raise _Transient(f"HTTP {exc.code}", _retry_after(exc.headers.get("Retry-After"))) from None
                raise _Permanent(f"HTTP {exc.code}") from None
        except http.client.InvalidURL as exc:  # a urlFile's URL with a space or a control character in it
            raise _Permanent(f"not a usable URL: {type(exc).__name__}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, reset, timed out
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise _Transient(str(reason) or type(reason).__name__) from None
        except http.client.HTTPException as exc:  # a receiver answering garbage: a bad status line, a cut body
            raise _Transient(f"a broken answer ({type(exc).__name__})") from None


def _alerts_url(url: str) -> str:
    """An Alertmanager's URL, with or without a route prefix, as the URL of its API v2 alerts."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith(ALERTS_PATH):
        path += ALERTS_PATH
    return urllib.parse.urlunsplit(parts._replace(path=path))


def _drain(response: http.client.HTTPResponse, deadline: float) -> None:
    """Read a little of an answer's body, for no longer than the attempt's deadline: the socket's timeout bounds
    each read alone, so a receiver trickling a byte at a time would otherwise hold the sink for ever. The
    status already said 2xx, which is the delivery; the body is not needed, so what is left is let go."""
    left = ANSWER_BYTES
    while left > 0 and time.monotonic() < deadline:
        chunk = response.read1(min(left, 8192))  # what has come, at most one receive: never waits for a full chunk
        if not chunk:
            return
        left -= len(chunk)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds, from either of its forms (seconds, or an HTTP date)."""
    if not value:
        return None
    seconds = value.strip()
    if seconds.isascii() and seconds.isdigit():  # "²".isdigit() is True too, and float() refuses it
        return float(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


__all__ = ["ALERTS_PATH", "ANSWER_BYTES", "Delivery", "PolicyKey", "Result", "WebhookSink"]

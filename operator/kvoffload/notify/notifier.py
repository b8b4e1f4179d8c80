"""The admin's sinks by name, and the one call a reconcile makes: :meth:`Notifier.send`.

A policy chooses sinks by name only (``spec.notifications.sinks``); a name the admin did not configure, or did
not grant the policy's namespace, is refused when the policy is judged (``policy/tenancy.py``), and skipped here
besides, so no policy can have the operator POST anywhere but where the admin said.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence

from kvoffload.api.notifications import NotificationsSpec
from kvoffload.notify.config import NotificationsConfig, SinkFormat
from kvoffload.notify.derive import Notice
from kvoffload.notify.payload import apprise_text, payload
from kvoffload.notify.sink import Delivery, Result, WebhookSink

log = logging.getLogger(__name__)

CLOSE_GRACE_SECONDS = 5.0
"""How long a stopping operator lets queued notifications go out."""


class Notifier:
    """Every configured sink, each with its queue and worker."""

    def __init__(
        self,
        config: NotificationsConfig,
        on_result: Callable[[str, Result], None] = lambda *_: None,
        on_retry: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.config = config
        self.sinks = {s.name: WebhookSink(s, on_result, on_retry) for s in config.sinks}

    @property
    def names(self) -> tuple[str, ...]:
        return self.config.names

    def start(self) -> None:
        for sink in self.sinks.values():
            sink.start()

    def close(self, grace: float = CLOSE_GRACE_SECONDS) -> None:
        """Stop every sink within about ``grace`` seconds in all: they deliver side by side meanwhile, so each
        is waited for only as long as is left of it."""
        deadline = time.monotonic() + grace
        for sink in self.sinks.values():
            sink.close(max(0.0, deadline - time.monotonic()))

    def send(self, chosen: NotificationsSpec | None, found: Sequence[Notice]) -> int:
        """Queue each notice for each sink the policy chose, if it chose its event; returns how many were queued.
        Never blocks and never raises for a sink."""
        if chosen is None or not found:
            return 0
        queued = 0
        for notice in found:
            if notice.event not in chosen.events:
                continue
            link = self.config.link_for(notice.namespace, notice.name)
            for name in chosen.sinks:
                sink = self.sinks.get(name)
                if sink is None or not sink.config.grants(notice.namespace):
                    log.warning(
                        "%s/%s: no notification sink %r is configured for its namespace",
                        notice.namespace,
                        notice.name,
                        name,
                    )
                    continue
                what = f"{notice.event.value} of {notice.namespace}/{notice.name} ({notice.id})"
                policy = (notice.namespace, notice.name)
                if sink.config.format is SinkFormat.APPRISE:
                    sink.put(Delivery(b"", what, policy, apprise_text(notice, link)))
                else:
                    sink.put(Delivery(json.dumps(payload(notice, sink.config.format, link)).encode(), what, policy))
                queued += 1
        return queued


__all__ = ["CLOSE_GRACE_SECONDS", "Notifier"]

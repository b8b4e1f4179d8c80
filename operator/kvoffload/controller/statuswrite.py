"""Writing the policy's status: only when it changed (at rest, readings alone at most every
``resting_refresh_seconds``), remembered until kopf's body catches up, then the plan's Events and notifications."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kvoffload.api.status import KVOffloadPolicyStatus, Mode
from kvoffload.controller.cycle import ControllerBase, Reconcile
from kvoffload.controller.kubestate import resource_version
from kvoffload.notify.derive import notices
from kvoffload.notify.notifier import Notifier
from kvoffload.rollout.plan import Plan

log = logging.getLogger(__name__)


class StatusWriter(ControllerBase):
    """The ``Controller``'s writing of the policy's status, Events and notifications."""

    notifier: Notifier | None
    _written: dict[str, tuple[str, str]]

    def _freshest_status(self, uid: str, body: Mapping[str, Any]) -> KVOffloadPolicyStatus | None:
        """The body's status, unless this operator has since written a newer one.

        kopf hands a cycle the body of the last watch event it has seen; on a real API server the event
        of the status this operator has just written can come after the next cycle has started, and that
        cycle would then judge from a status already replaced: a policy seen with no status at all starts
        its ladder again (seen on kube-apiserver v1.37.2: "NewLadder" twice, the second one "adopted the
        running gpu-only Deployment"). kopf's bodies only move forward, and a resourceVersion may be compared
        only for equality: a body with the version the writing cycle read is that stale copy; any other is
        the write or what came after it."""
        stored = _stored_status(body)
        written = self._written.get(uid)
        if written is not None:
            if resource_version(body) == written[1]:
                return KVOffloadPolicyStatus.model_validate_json(written[0])
            del self._written[uid]  # kopf has caught up with that write
        return stored

    async def _finish(self, ctx: Reconcile, plan: Plan) -> None:
        """Write the status if it changed, then the Events; count the new decisions."""
        new = _dump(plan.status)
        old = _dump(ctx.status) if ctx.status is not None else None
        if new != old and (old is None or self._worth_writing(ctx.status, plan.status, old, new, ctx.now)):
            body = plan.status.model_dump(mode="json", by_alias=True)  # None removes a key (merge patch)
            await self._api("patch_status", self.gateway.patch_status(ctx.ref, body), ctx.ref)
            read = resource_version(ctx.body)
            if read is not None:
                self._written[ctx.ref.uid] = (plan.status.model_dump_json(by_alias=True), read)
            self._notify(ctx, plan.status)
        before = ctx.status.history if ctx.status is not None else []
        self.metrics.count_decisions(e.decision for e in plan.status.history if e not in before)
        for event in plan.events:
            await self.gateway.emit_event(ctx.ref, event.type, event.reason, event.message)

    def _notify(self, ctx: Reconcile, written: KVOffloadPolicyStatus) -> None:
        """Queue what the status just written decided for the policy's sinks: only once the write is stored, so a
        failed write tells nothing (the next cycle decides again), and never in the cycle's way."""
        if self.notifier is None or ctx.notifications is None:
            return
        try:
            found = notices(ctx.ref.namespace, ctx.ref.name, ctx.status, written, ctx.now)
            self.notifier.send(ctx.notifications, found)
        except Exception:  # a bug in telling must never cost a decision
            log.exception("%s: notifications could not be queued", ctx.ref)

    def _worth_writing(
        self,
        old: KVOffloadPolicyStatus | None,
        new: KVOffloadPolicyStatus,
        old_doc: Mapping[str, Any],
        new_doc: Mapping[str, Any],
        now: datetime,
    ) -> bool:
        """Whether a changed status (``new``, dumped as ``new_doc``) is written now: always, unless both are at rest
        in the same mode, only the readings changed, and the stored analysis is younger than
        ``resting_refresh_seconds``."""
        if old is None or new.mode is not old.mode or new.mode not in RESTING_MODES:
            return True
        if old.last_analysis is None or _without_readings(new_doc) != _without_readings(old_doc):
            return True
        return (now - old.last_analysis.time).total_seconds() >= self.settings.resting_refresh_seconds


def _stored_status(body: Mapping[str, Any]) -> KVOffloadPolicyStatus | None:
    raw = body.get("status")
    if not isinstance(raw, Mapping) or not raw:
        return None
    try:
        return KVOffloadPolicyStatus.model_validate(raw)
    except ValidationError as exc:  # someone wrote garbage: start over rather than crash every cycle
        log.warning("Ignoring an unreadable status: %s", exc)
        return None


def _dump(status: KVOffloadPolicyStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


RESTING_MODES = frozenset({Mode.STABLE, Mode.ROLLED_BACK, Mode.HELD})
"""Modes that nothing moves out of on its own schedule: their status is refreshed, not rewritten every cycle."""


def _without_readings(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A dumped status without what every analysis reads afresh: its time and figures, the printer columns and
    messages that quote them. What is left (verdicts, counters, conditions' states, replicas, history) is what a
    write must never wait for."""
    out = {k: v for k, v in doc.items() if k not in ("message", "ttftP99", "externalShare")}
    out["conditions"] = [{k: v for k, v in c.items() if k != "message"} for c in doc.get("conditions", ())]
    analysis = doc.get("lastAnalysis")
    if analysis is not None:
        metrics = [  # threshold too: some are relative to the stable's reading
            {k: v for k, v in m.items() if k not in ("stable", "canary", "threshold", "message")}
            for m in analysis.get("metrics", ())
        ]
        kept = {k: v for k, v in analysis.items() if k not in ("time", "message")}
        out["lastAnalysis"] = {**kept, "metrics": metrics}
    return out

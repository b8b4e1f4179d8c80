"""What every part of the reconcile cycle shares: one cycle's inputs (``Reconcile``), the state that
``Controller.__init__`` sets (``ControllerBase``), and the wrapper of every gateway call (``_api``), which counts
a failure, tells it in an Event where a person can act, and raises ``ReconcileError``."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from kvoffload.api.notifications import NotificationsSpec
from kvoffload.api.status import KVOffloadPolicyStatus
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.controller.apierrors import ApiRejectedError, GatewayError, MissingObjectError, NotOwnedError
from kvoffload.controller.gateway import KubernetesGateway, PolicyRef
from kvoffload.controller.metrics import OperatorMetrics
from kvoffload.controller.settings import ControllerSettings
from kvoffload.controller.workloads import Workloads
from kvoffload.policy.sized import Sized
from kvoffload.rollout.observations import WorkloadObservation

_T = TypeVar("_T")

log = logging.getLogger(__name__)


class ReconcileError(Exception):
    """A Kubernetes API operation failed; the cycle should be retried after ``delay`` seconds."""

    def __init__(self, message: str, *, operation: str, delay: float) -> None:
        super().__init__(message)
        self.operation = operation
        self.delay = delay


@dataclass
class Reconcile:
    """One cycle's inputs."""

    ref: PolicyRef
    body: dict[str, Any]
    """The policy as read; once parsed, its metadata only."""
    status: KVOffloadPolicyStatus | None
    now: datetime
    started: float = field(default_factory=time.perf_counter)
    spec: KVOffloadPolicySpec | None = None
    """The parsed spec (model shape resolved), once it parsed."""
    sized: Sized | None = None
    """The spec's sized plan (its ladder, host memory, deadlines and config hashes), once it parsed."""
    notifications: NotificationsSpec | None = None
    """The sinks the policy chose (read on its own from an invalid spec, so that Invalid is told too)."""
    workload: WorkloadObservation | None = None
    """spec.workloadRef's Deployment, as read this cycle."""


class ControllerBase:
    """The state every part of the ``Controller`` reads (set by its ``__init__``), and the gateway call wrapper."""

    gateway: KubernetesGateway
    settings: ControllerSettings
    metrics: OperatorMetrics
    workloads: Workloads
    _monotonic: Callable[[], float]

    async def _api(self, operation: str, call: Awaitable[_T], ref: PolicyRef) -> _T:
        """Await a gateway call; a failure is counted, told in an Event when a person can act, and re-raised typed."""
        try:
            return await call
        except MissingObjectError as exc:
            self.metrics.count_api_error(operation, exc)
            raise
        except GatewayError as exc:
            self.metrics.count_api_error(operation, exc)
            if isinstance(exc, NotOwnedError | ApiRejectedError) and not _is_404(exc):
                await self.gateway.emit_event(ref, "Warning", exc.reason, str(exc))
            log.warning("%s: %s failed: %s", ref, operation, exc)
            raise ReconcileError(str(exc), operation=operation, delay=self.settings.retry_delay_seconds) from exc


def _is_404(exc: GatewayError) -> bool:
    return isinstance(exc, ApiRejectedError) and exc.status == 404

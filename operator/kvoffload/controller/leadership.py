"""Leader election: one operator replica reconciles; the others wait, ready to take over.

The election is the Kubernetes client's own (``kubernetes.leaderelection``) over a
``coordination.k8s.io/v1`` Lease, the same record kube-controller-manager and controller-runtime
keep: the leader renews it every ``retry_period``; a candidate takes it once it has seen no renewal
for ``lease_duration``. Its rules, and why the defaults are shorter than client-go's 15/10/2 s:

- A SIGKILLed leader is replaced within ``lease_duration + 2 × retry_period`` (8 + 2 s by default):
  the issue asks for a takeover within 15 s, and the price is small: a read and a write of the Lease
  a second by the leader, and a read a second by each standby.
- A leader that cannot renew for ``renew_deadline`` (5 s) gives up before any candidate may take
  the Lease (8 s): ``on_lost`` runs, and the operator exits at once rather than go on writing, as
  client-go's users do. Kubernetes restarts it, as a candidate.
- A leader that stops cleanly (SIGTERM) hands the Lease back at once (:meth:`Leadership.release`),
  so a rolling update of the operator waits for no expiry.
- Every write is a replace at the Lease's ``resourceVersion``, so two candidates can never both win.

The library is synchronous: it runs in daemon threads, and reports to the event loop through
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from kvoffload.controller.apierrors import api_message

log = logging.getLogger(__name__)

LEASE_NAME = "kvoffload-leader"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is, who this candidate is, and the election's timing (whole seconds, as the Lease
    stores them)."""

    namespace: str
    name: str = LEASE_NAME
    identity: str = ""
    lease_duration: int = 8
    renew_deadline: int = 5
    retry_period: int = 1

    def __post_init__(self) -> None:
        if not self.identity:
            object.__setattr__(self, "identity", default_identity())
        # The library's own checks call sys.exit; say what is wrong instead.
        if not self.lease_duration > self.renew_deadline > 1.2 * self.retry_period >= 1.2:
            raise ValueError(
                f"lease timing must satisfy duration > renew deadline > 1.2 × retry period ≥ 1.2 s, not "
                f"{self.lease_duration} > {self.renew_deadline} > 1.2 × {self.retry_period}"
            )

    @classmethod
    def for_duration(cls, namespace: str, lease_duration: int, name: str = LEASE_NAME) -> LeaseSettings:
        """The renew deadline and retry period that go with ``lease_duration`` (≥ 3 s): 60% of it, and 1 s."""
        return cls(namespace, name, lease_duration=lease_duration, renew_deadline=max(2, round(lease_duration * 0.6)))

    @property
    def takeover_bound(self) -> int:
        """The longest a SIGKILLed leader's Lease can keep a candidate waiting, in seconds."""
        return self.lease_duration + 2 * self.retry_period


def default_identity() -> str:
    """The pod's name ($POD_NAME, else the hostname) and a per-process suffix, as client-go's candidates name
    themselves: a restarted container in the same pod must not be taken for the leader it replaces."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def own_namespace(default: str = "default") -> str:
    """The namespace the operator runs in: $POD_NAMESPACE (the chart's downward API), else the service
    account's, else ``default`` (a developer's ``kvoffload run``)."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or default
    except OSError:
        return default


class _Released(Exception):
    """Raised through the library's loops to end its thread once the Lease is handed back."""


class _Lock(LeaseLock):
    """The library's Lease lock on the operator's API client, which stops renewing once released."""

    def __init__(self, settings: LeaseSettings, api_client: kubernetes.client.ApiClient) -> None:
        super().__init__(settings.name, settings.namespace, settings.identity)  # type: ignore[no-untyped-call]
        self.api_instance = kubernetes.client.CoordinationV1Api(api_client)
        self.released = False
        self._guard = threading.Lock()
        self._last_refusal = ""
        self._last_renewal_refusal = ""  # apart: a read that works between two refused renewals must not reset it

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        if self.released:
            raise _Released  # the library's loops have no other way out
        try:
            found, record = super().get(name, namespace)  # type: ignore[no-untyped-call]
        except Exception as exc:  # a connection error: the library catches only ApiException, and its thread
            found, record = False, exc  # would die, leaving a leader that no longer renews
        if not found and getattr(record, "status", None) != 404:
            # The library only retries; a candidate that may not read its Lease would wait in silence.
            refusal = api_message(record)
            if refusal != self._last_refusal:
                log.warning("cannot read the Lease %s/%s (retrying): %s", namespace, name, refusal)
                self._last_refusal = refusal
        elif found:
            self._last_refusal = ""
        return found, record

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        try:
            return bool(super().create(name, namespace, election_record))  # type: ignore[no-untyped-call]
        except Exception as exc:
            log.warning("cannot create the Lease %s/%s (retrying): %s", namespace, name, exc)
            return False

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        # The library's update logs a refused write at INFO, which quiet_library_logs hides: a leader refused its
        # renewal would say nothing until it gave up. So the write is made here, and a refusal said once.
        with self._guard:
            if self.released or self.lease_reference is None:
                return False
            try:
                self.lease_reference.spec = self.get_lease_spec(updated_record, self.lease_reference.spec)  # type: ignore[no-untyped-call]
                self.api_instance.replace_namespaced_lease(name=name, namespace=namespace, body=self.lease_reference)
            except Exception as exc:
                refusal = api_message(exc)
                if refusal != self._last_renewal_refusal:
                    log.warning("cannot renew the Lease %s/%s (retrying): %s", namespace, name, refusal)
                    self._last_renewal_refusal = refusal
                return False
            self._last_renewal_refusal = ""
            return True

    def release(self) -> bool:
        """Hand the Lease back (holder cleared, so a candidate takes it on its next try); False when it was
        not ours any more or the write failed."""
        with self._guard:
            self.released = True
            try:
                lease = self.api_instance.read_namespaced_lease(self.name, self.namespace)
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return False
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
                return True
            except Exception as exc:
                log.warning("could not hand the Lease %s/%s back: %s", self.namespace, self.name, api_message(exc))
                return False


class Leadership:
    """One candidate in the election. :meth:`start` it, then ``await`` :meth:`wait_leading`; ``on_lost``
    runs (in a library thread) when a leader fails to renew in time."""

    def __init__(
        self,
        settings: LeaseSettings,
        api_client: kubernetes.client.ApiClient,
        on_lost: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._lock = _Lock(settings, api_client)
        self._on_lost = on_lost
        self._leading: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def identity(self) -> str:
        return self.settings.identity

    @property
    def leading(self) -> bool:
        return self._leading is not None and self._leading.is_set()

    def start(self) -> None:
        """Join the election in a daemon thread (the library's loops never return while the Lease is held)."""
        self._loop = asyncio.get_running_loop()
        self._leading = asyncio.Event()
        config = electionconfig.Config(  # type: ignore[no-untyped-call]
            self._lock,
            lease_duration=self.settings.lease_duration,
            renew_deadline=self.settings.renew_deadline,
            retry_period=self.settings.retry_period,
            onstarted_leading=self._started,
            onstopped_leading=self._stopped,
        )
        election = leaderelection.LeaderElection(config)  # type: ignore[no-untyped-call]

        def run() -> None:
            with contextlib.suppress(_Released):
                election.run()  # type: ignore[no-untyped-call]

        self._thread = threading.Thread(target=run, name="leader-election", daemon=True)
        self._thread.start()
        log.info(
            "candidate %s for the Lease %s/%s (a leader is replaced within %d s)",
            self.identity,
            self.settings.namespace,
            self.settings.name,
            self.settings.takeover_bound,
        )

    async def wait_leading(self) -> None:
        assert self._leading is not None, "start() first"
        await self._leading.wait()

    def release(self) -> bool:
        """Stop renewing and hand the Lease back, when this candidate holds it."""
        was_leading = self.leading
        released = self._lock.release()
        if was_leading and released:
            log.info("handed the Lease %s/%s back", self.settings.namespace, self.settings.name)
        return released

    def _started(self) -> None:
        log.info("%s holds the Lease %s/%s: leading", self.identity, self.settings.namespace, self.settings.name)
        assert self._loop is not None
        assert self._leading is not None
        self._loop.call_soon_threadsafe(self._leading.set)

    def _stopped(self) -> None:
        if self._lock.released:
            return  # our own release, not a loss
        log.critical(
            "%s could not renew the Lease %s/%s within %d s: another replica may lead now",
            self.identity,
            self.settings.namespace,
            self.settings.name,
            self.settings.renew_deadline,
        )
        self._on_lost()


def quiet_library_logs() -> None:
    """The library logs every retry at INFO ("yet to finish lease_duration ..."); keep its warnings only."""
    logging.getLogger("leaderelection").setLevel(logging.WARNING)


__all__ = ("LEASE_NAME", "Leadership", "LeaseSettings", "default_identity", "own_namespace", "quiet_library_logs")

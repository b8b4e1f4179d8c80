"""The operator-wide settings of the reconcile cycle (``ControllerSettings``), as ``kvoffload run`` sets them
from its flags, and where a Prometheus token Secret lies (``SecretLocation``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from kvoffload.analysis.promhttp import Connection
from kvoffload.policy.tenancy import DEFAULT_TENANCY, Tenancy


@dataclass(frozen=True)
class ControllerSettings:
    """Operator-wide choices for the reconcile cycle."""

    prometheus_url: str | None = None
    """Query this Prometheus for every policy instead of spec.prometheus.url (local clusters, tests)."""
    children_resync_seconds: float = 300.0
    """Service and PodMonitor are rewritten at most this often when unchanged (heals drift, e.g. a deletion)."""
    retry_delay_seconds: float = 10.0
    """How soon a cycle that hit a Kubernetes API error is tried again."""
    analysis_due_fraction: float = 0.5
    """A cycle measures only when this share of analysis.interval has passed since the last verdict."""
    prometheus_token: SecretLocation | None = None
    """The operator's own Prometheus bearer token (a Secret in its namespace), for every policy that names
    no ``spec.prometheus.bearerTokenSecret``."""
    forbidden_retry_seconds: float = 300.0
    """A token Secret the API server refused to let the operator read is asked for again only this often."""
    prometheus_connection: Connection = field(default_factory=Connection)
    """The admin's extra headers (``X-Scope-OrgID``), basic auth and TLS settings (``--prometheus-header``, ...).
    Like the operator's token, they go only to ``prometheus_url`` or an allowed URL (see ``_token_may_go``)."""
    monitor_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels every rendered PodMonitor carries (``--monitor-label``): what the cluster's Prometheus selects
    PodMonitors on, e.g. kube-prometheus-stack's ``release``."""
    tenancy: Tenancy = DEFAULT_TENANCY
    """What the cluster admin lets a policy ask for (``policy/tenancy.py``); its ``prometheus_url`` and
    ``operator_token`` are taken from the two fields above (see :attr:`judged_tenancy`)."""
    resting_refresh_seconds: float = 300.0
    """At rest (Stable, RolledBack, Held), a status whose only change is the latest analysis's readings (its
    time, figures and the messages that quote them) is written at most this often, as the kubelet writes an
    unchanged Node status (KEP-589): a resting fleet then costs the API server almost no writes. A change of
    verdict, counter, condition, replicas or decision is written at once, and so is everything during a climb."""

    @functools.cached_property
    def judged_tenancy(self) -> Tenancy:
        """:attr:`tenancy` with the operator's own Prometheus and token, as policies are judged against it."""
        # Headers and basic auth are credentials too (a tenant ID picks whose data is read): the token's rule holds.
        credentials = self.prometheus_token is not None or self.prometheus_connection.configured
        return replace(self.tenancy, prometheus_url=self.prometheus_url, operator_token=credentials)


@dataclass(frozen=True)
class SecretLocation:
    """One key of one Secret."""

    namespace: str
    name: str
    key: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

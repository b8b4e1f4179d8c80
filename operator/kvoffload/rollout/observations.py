"""What ``decide`` sees: the Deployments, pods and annotations the handler gathered this cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvoffload.analysis.assess import Assessment
from kvoffload.analysis.measurements import Measurements
from kvoffload.api.conventions import Reason
from kvoffload.policy.sized import Sized
from kvoffload.rollout.preflight import RestorePrice


@dataclass(frozen=True)
class PodObservation:
    """One engine pod of a variant."""

    name: str
    ready: bool = False
    restarts: int = 0
    """Container restarts, summed over the pod's containers."""
    oom_killed: bool = False
    """A container's last or current state was terminated with reason OOMKilled."""
    crash_looping: bool = False
    """A container waits with reason CrashLoopBackOff."""
    config_hash: str | None = None
    """The config hash label of the pod; None when unknown (then it is judged as current)."""
    unschedulable: str | None = None
    """The scheduler's message while it cannot place the pod (condition PodScheduled False, Unschedulable)."""


@dataclass(frozen=True)
class VariantObservation:
    """The Deployment of one variant (stable or canary) as the cluster shows it."""

    exists: bool = False
    config_hash: str | None = None
    """The config hash in the Deployment's pod template."""
    level: int | None = None
    """The ladder level label in the Deployment's pod template."""
    desired_replicas: int = 0
    ready_replicas: int = 0
    """Ready replicas running ``config_hash`` (pods of an older template are not counted)."""
    pods: tuple[PodObservation, ...] = ()


@dataclass(frozen=True)
class TokenCheck:
    """Whether the Secret with the Prometheus bearer token could be read this cycle."""

    problem: Reason | None
    """None: read; else why not (``Reason.SECRET_FORBIDDEN``, ``Reason.SECRET_NOT_FOUND``)."""
    message: str = ""
    """What is missing, naming the Secret (and, when forbidden, the permission)."""


@dataclass(frozen=True)
class PodMonitorRef:
    """The policy's PodMonitor: what a Prometheus must select to scrape its engines."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    """Every label it carries (the operator's ``--monitor-label`` ones included)."""


@dataclass(frozen=True)
class FleetObservation:
    """An observe-only policy's fleet: the pods of ``spec.rollout.observe.selector``, which the operator did not
    render and never writes."""

    selector: str
    """The label selector, as sent to the API server."""
    pods: tuple[PodObservation, ...] = ()
    """Its live pods (terminating ones left out)."""

    @property
    def ready(self) -> int:
        return sum(1 for p in self.pods if p.ready)


@dataclass(frozen=True)
class WorkloadObservation:
    """The Deployment spec.workloadRef names, as read this cycle."""

    name: str
    digest: str
    """Its pod template's digest."""
    original_replicas: int
    """What it ran before the takeover (recorded on it, else its replicas when first read)."""
    replicas: int
    """Its spec.replicas now."""


@dataclass(frozen=True)
class Observations:
    """Everything ``decide`` needs to know about the world, gathered by the adapter."""

    generation: int | None
    """metadata.generation of the policy."""
    sized: Sized
    """The current spec's sized plan (``policy.sized``): every ladder level with its host memory, deadlines and
    config hash, worked out once per render input."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The policy's annotations; only the ``kvoffload.io/`` control keys are read."""
    stable: VariantObservation = field(default_factory=VariantObservation)
    canary: VariantObservation = field(default_factory=VariantObservation)
    retiring: tuple[VariantObservation, ...] = ()
    """The Deployments of ``status.retiring``, in its order."""
    assessment: Assessment | None = None
    """This cycle's verdict from ``assess()``; None when no analysis ran this cycle."""
    measurements: Measurements | None = None
    """This cycle's raw figures; the baseline is taken from ``measurements.stable``."""
    price: RestorePrice | None = None
    """The preflight's restore-vs-recompute price on the policy's GPU class (the adapter prices it with
    ``economics.breakeven`` while a preflight may be due); None when not priced this cycle."""
    token: TokenCheck | None = None
    """The bearer token's Secret, when this cycle read one; None keeps the PrometheusTokenUnreadable condition."""
    pod_monitor: PodMonitorRef | None = None
    """The policy's PodMonitor as rendered, named in the PodsNotScraped message; None: named from the policy."""
    workload: WorkloadObservation | None = None
    """spec.workloadRef's Deployment; None without one."""
    fleet: FleetObservation | None = None
    """Observe-only (``spec.rollout.observeOnly``): the observed fleet, from which ``decide`` builds the roles it
    would have applied (``rollout.observe.observed_roles``); ignored otherwise."""

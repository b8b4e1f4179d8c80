"""Every name the operator writes into the cluster, in one place.

The API group and kind, the labels and annotations on policies and on what the
operator renders, the condition types, the reasons, and the decisions written to
``status.history``. Renaming one of these changes what users, dashboards and
GitOps tools see, so each has exactly one home: here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

# --- the resource -----------------------------------------------------------------

API_GROUP = "kvoffload.io"
API_VERSION = "v1alpha1"
KIND = "KVOffloadPolicy"
PLURAL = "kvoffloadpolicies"
POLICY_API_VERSION = f"{API_GROUP}/{API_VERSION}"
COMPONENT = "kvoffload"
"""The operator's name: field manager, Event source, ``app.kubernetes.io/managed-by``."""
FINALIZER = f"{API_GROUP}/finalizer"
PEERING_NAME = "kvoffload"

# --- variants: the two Deployments of a policy ----------------------------------------

Variant = Literal["stable", "canary"]
VARIANTS: tuple[Variant, ...] = ("stable", "canary")

# --- labels and annotations on rendered objects ------------------------------------------

LABEL_POLICY = f"{API_GROUP}/policy"
LABEL_LEVEL = f"{API_GROUP}/level"
"""On engine pods: the ladder level's name. With the config hash, it tells the variants apart in Prometheus."""
LABEL_CONFIG_HASH = f"{API_GROUP}/config-hash"
LABEL_VARIANT = f"{API_GROUP}/variant"
"""Legacy: the role label that pods of ``<policy>-stable`` and ``<policy>-canary`` carried before roles moved
into status (issue 9). Read only to adopt such Deployments without restarting their pods; never written."""
LEGACY_DEPLOYMENT_ROLES: tuple[Variant, ...] = ("stable", "canary")
"""Legacy Deployments were ``<policy>-<role>``."""
SERIES_POD_LABELS = (LABEL_POLICY, LABEL_LEVEL, LABEL_CONFIG_HASH)
"""The pod labels the PodMonitor copies onto every series (as kvoffload_io_policy, kvoffload_io_level,
kvoffload_io_config_hash): none of them changes while a pod runs."""
ANNOTATION_LEVEL_INDEX = f"{API_GROUP}/level-index"
ANNOTATION_TIERS = f"{API_GROUP}/tiers"
ANNOTATION_APPLIED = f"{API_GROUP}/applied-digest"
"""Digest of the rendered child the operator last wrote; equal digests mean nothing to write."""
ANNOTATION_RENDER_INPUT = f"{API_GROUP}/render-input"
"""On the operator's Deployments: a digest of what they were rendered from (the policy's name, namespace and
resolved spec, and the renderer's version). Equal inputs render equal manifests, so a cycle compares this, and
renders nothing, when neither the spec nor the replicas changed (a restarted operator too)."""
ANNOTATION_TIER_CAPACITY = f"{API_GROUP}/tier-capacity-tokens"
"""On engine pods: JSON ``{"cpu": tokens, "<tier>": tokens, ...}``, the tokens each offload tier of the pod's
level holds (all TP ranks together), for KV-aware routers; ``{}`` on the GPU-only level. The GPU's own
cache is not in it: vLLM reports that (``kv_cache_size_tokens`` of ``vllm:cache_config_info``)."""
# On a Deployment a policy's spec.workloadRef took over: the replicas it ran before, given back on release.
ANNOTATION_ORIGINAL_REPLICAS = f"{API_GROUP}/original-replicas"
# The policy that took it over (one Deployment, one taker).
ANNOTATION_TAKEN_BY = f"{API_GROUP}/taken-over-by"
# On a policy with workloadRef: holds its deletion until the referenced Deployment serves again.
HAND_BACK_FINALIZER = f"{API_GROUP}/hand-back"

# --- manual control: annotations a person sets on a policy ---------------------------------

ANNOTATION_PREFIX = f"{API_GROUP}/"
PROMOTE = f"{ANNOTATION_PREFIX}promote"
ABORT = f"{ANNOTATION_PREFIX}abort"
RETRY = f"{ANNOTATION_PREFIX}retry"
PAUSE = f"{ANNOTATION_PREFIX}pause"
RESUME = f"{ANNOTATION_PREFIX}resume"
RELEASE = f"{ANNOTATION_PREFIX}release"
"""On a policy with spec.workloadRef (``kvoffload abort NAME --release``): while set, the team's Deployment is
handed back at its recorded count and the operator runs none of its own engines; removing it takes over again."""
MANUAL_ANNOTATIONS = (ABORT, PAUSE, RESUME, RETRY, PROMOTE)
"""In the order a cycle acts on them, one per cycle."""

# --- condition types ------------------------------------------------------------------

READY = "Ready"
"""True when the ladder has come to rest at its top level."""
PROGRESSING = "Progressing"
"""True while a baseline, a canary or a promotion step runs."""
DEGRADED = "Degraded"
"""True after a rollback or an abort; the reason says why."""
PAUSED = "Paused"
"""True while a person has paused the policy (``kvoffload.io/pause``)."""
ANALYSIS_INCONCLUSIVE = "AnalysisInconclusive"
"""True after ``maxInconclusive`` Inconclusive verdicts in a row."""
INVALID = "Invalid"
"""True while the spec fails validation; the message lists the field errors."""
# kstatus (Flux, Helm v4 --wait=watcher, kpt) reads these two first, then Ready.
RECONCILING = "Reconciling"
"""True while the ladder climbs (a baseline or a step runs): the policy is not done yet."""
STALLED = "Stalled"
"""True when the climb cannot go on by itself: rolled back, held by the preflight, or an invalid spec."""
OFFLOAD_WILL_NOT_PAY = "OffloadWillNotPay"
"""True when the preflight found that offload cannot pay: the policy holds on GPU-only, no canary runs."""
PROMETHEUS_TOKEN_UNREADABLE = "PrometheusTokenUnreadable"
"""True while the Secret holding the Prometheus bearer token cannot be read (missing, or the operator may
not get it); the message names the Secret and what is missing. Set only once a token was asked for."""
PODS_NOT_SCRAPED = "PodsNotScraped"
"""True while Prometheus holds no series of any of the policy's pods after ``maxInconclusive`` cycles: no
Prometheus scrapes its PodMonitor (most often its podMonitorSelector wants a label the PodMonitor lacks). Set
only once it was True; the message names the PodMonitor, its labels and the fix."""
OBSERVING = "Observing"
"""True while ``spec.rollout.observeOnly``: the ladder is analysed and decided in status, and nothing is
applied. Written only for a policy that observes, or once more (False) when it stops observing."""

CONDITION_TYPES = (
    READY,
    PROGRESSING,
    DEGRADED,
    PAUSED,
    ANALYSIS_INCONCLUSIVE,
    INVALID,
    RECONCILING,
    STALLED,
    OFFLOAD_WILL_NOT_PAY,
    PROMETHEUS_TOKEN_UNREADABLE,
    PODS_NOT_SCRAPED,
    OBSERVING,
)


class Reason(StrEnum):
    """Every reason the operator writes into a condition, an Event or a history entry."""

    # Progressing
    BASELINE_RUNNING = "BaselineRunning"
    CANARY_RUNNING = "CanaryRunning"
    PROMOTION_RUNNING = "PromotionRunning"
    AWAITING_PROMOTION = "AwaitingPromotion"
    LADDER_COMPLETE = "LadderComplete"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    # Transitions
    BASELINE_TAKEN = "BaselineTaken"
    CANARY_STARTED = "CanaryStarted"
    PILOT_PASSED = "PilotPassed"
    PROMOTED = "Promoted"
    LEVEL_PROMOTED = "LevelPromoted"
    NEW_LADDER = "NewLadder"
    SPEC_CHANGED = "SpecChanged"
    WORKLOAD_CHANGED = "WorkloadChanged"
    """spec.workloadRef's pod template changed (an image, a flag): a new ladder from GPU-only."""
    RELEASED = "Released"
    """kvoffload.io/release: spec.workloadRef's Deployment handed back (Paused: nothing runs until it goes)."""
    # Degraded
    AS_EXPECTED = "AsExpected"
    ANALYSIS_FAILED = "AnalysisFailed"
    GUARD_BREACH = "GuardBreach"
    CANARY_OOM_KILLED = "CanaryOOMKilled"
    CANARY_ALLOCATION_MISMATCH = "CanaryAllocationMismatch"
    CANARY_CRASH_LOOPING = "CanaryCrashLoopBackOff"
    CANARY_RESTARTED = "CanaryRestarted"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    ABORTED = "Aborted"
    # Warm-up
    WARMED_UP = "WarmedUp"
    """The step's canary is warm: its latency is judged from one analysis window on (``warmup.judgedFrom``)."""
    # Capacity
    CAPACITY_DIP = "CapacityDip"
    """maxSurge 0: a move of replicas onto a level takes Ready engines away before their replacements are Ready."""
    # Paused / AnalysisInconclusive
    PAUSED = "Paused"
    NOT_PAUSED = "NotPaused"
    RESUMED = "Resumed"
    TOO_MANY_INCONCLUSIVE = "TooManyInconclusive"
    ENOUGH_EVIDENCE = "EnoughEvidence"
    # Manual control
    MANUAL_PROMOTE = "ManualPromote"
    RETRY = "Retry"
    MANUAL_ACTION_IGNORED = "ManualActionIgnored"
    # Invalid
    SPEC_INVALID = "SpecInvalid"
    SPEC_VALID = "SpecValid"
    # PrometheusTokenUnreadable
    SECRET_FORBIDDEN = "SecretForbidden"
    """The API server refused the operator ``get`` on the token's Secret (RBAC)."""
    SECRET_NOT_FOUND = "SecretNotFound"
    """The token's Secret, or its key, does not exist."""
    TOKEN_READ = "TokenRead"
    # PodsNotScraped
    NOT_SCRAPED = "NotScraped"
    """Prometheus holds no series of the policy's pods: its PodMonitor is not selected by any Prometheus."""
    SCRAPED = "Scraped"
    # Reconciling / Stalled
    CLIMBING = "Climbing"
    AT_REST = "AtRest"
    # The preflight: OffloadWillNotPay (also Ready, Progressing and Stalled while it holds), its rules
    OFFLOAD_WILL_NOT_PAY = "OffloadWillNotPay"
    RESTORE_NOT_FASTER = "RestoreNotFaster"
    """Restoring the typical prompt from the CPU tier is not faster than recomputing it."""
    GPU_MEMORY_NOT_CONSTRAINED = "GPUMemoryNotConstrained"
    """The GPU KV cache never came near full and nothing was preempted."""
    NO_PREFIX_REUSE = "NoPrefixReuse"
    """With no memory pressure, the prefix-cache hit rate (all the reuse there is) is below minPrefixReuse."""
    OFFLOAD_MAY_PAY = "OffloadMayPay"
    """False: the preflight judged, and no rule found that offload cannot pay."""
    PREFLIGHT_NOT_JUDGED = "PreflightNotJudged"
    """False: no preflight verdict on this ladder (none asked, the baseline still runs, or not a GPU-only baseline)."""
    # Observing (spec.rollout.observeOnly)
    OBSERVE_ONLY = "ObserveOnly"
    """True: the policy analyses a fleet it did not render and applies nothing."""
    APPLYING = "Applying"
    """False: observeOnly was turned off; the operator applies its ladder for real."""
    WOULD_APPLY = "WouldApply"
    """An Event of an observe-only policy: the Deployment change a real climb would have made, not made."""
    OBSERVE_SWITCHED = "ObserveSwitched"
    """spec.rollout.observeOnly changed: a new ladder starts from GPU-only."""


class Decision(StrEnum):
    """What ``status.history`` records; each transition of the ladder writes one."""

    NEW_LADDER = "NewLadder"
    SPEC_CHANGED = "SpecChanged"
    WORKLOAD_CHANGED = "WorkloadChanged"
    RELEASE = "Release"
    RETRY = "Retry"
    BASELINE_TAKEN = "BaselineTaken"
    CANARY_STARTED = "CanaryStarted"
    PILOT_PASSED = "PilotPassed"
    PROMOTED = "Promoted"
    MANUAL_PROMOTE = "ManualPromote"
    LEVEL_PROMOTED = "LevelPromoted"
    ROLLBACK = "Rollback"
    ABORT = "Abort"
    PAUSE = "Pause"
    RESUME = "Resume"
    INVALID = "Invalid"
    OFFLOAD_WILL_NOT_PAY = "OffloadWillNotPay"
    OBSERVE_SWITCHED = "ObserveSwitched"


ROLLBACK_DECISIONS = frozenset({Decision.ROLLBACK, Decision.ABORT})
"""Decisions that took a level away."""

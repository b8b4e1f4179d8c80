"""``kvoffload get NAME``: a policy and what runs for it, as a tree, the way ``kubectl argo rollouts get rollout``
shows a Rollout: the policy (phase, level, Ready and its reason, the last verdict), its Deployments (role,
level, replicas ready of desired), their ReplicaSets and their pods (readiness, restarts, age).

:func:`render` and :func:`document` are pure, over the objects as the API server serves them (:class:`Tree`);
:func:`read` gathers them: the policy, the Deployments with its ``kvoffload.io/policy`` label (and the one its
``spec.workloadRef`` took over), and for each Deployment the ReplicaSets and pods its selector matches that it
owns. A Deployment's role comes from the policy's status: the one whose config hash (else level) is
``status.stable``'s is stable, ``status.canary``'s canary, a level of ``status.retiring`` retiring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kvoffload.api.conventions import KIND, LABEL_CONFIG_HASH, LABEL_LEVEL, LABEL_POLICY, READY
from kvoffload.api.status import KVOffloadPolicyStatus
from kvoffload.cli.statusview import ladder_line, parse_time, promotion_steps, short_age, step_text, table
from kvoffload.controller.kubestate import parse_deployment, parse_pod
from kvoffload.rollout import conditions as cond

Obj = Mapping[str, Any]

ORIGINAL = "taken-over"
"""The role of the Deployment a policy's spec.workloadRef took over (the team's own)."""
ROLE_ORDER = ("stable", "canary", "retiring", ORIGINAL, "")
COLUMNS = ("NAME", "KIND", "STATUS", "AGE", "INFO")
WIDE_COLUMNS = ("NODE", "IP", "CONFIG")
"""What ``-o wide`` adds: the pod's node and IP, and the config hash of each Deployment, ReplicaSet and pod."""
# The branches, as kubectl argo rollouts draws them.
TEE, ELBOW, PIPE, SPACE = "├──", "└──", "│  ", "   "
ICONS = {KIND: "⟳", "Deployment": "#", "ReplicaSet": "⧉", "Pod": "□"}
HEALTHY, PROGRESSING, DEGRADED, SCALED_DOWN = "✔", "◌", "✖", "•"


@dataclass(frozen=True)
class Tree:
    """A policy and the objects that run for it, as read (flat: :func:`render` joins them by ownerReference)."""

    policy: Obj
    deployments: Sequence[Obj] = ()
    replicasets: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    original: str | None = None
    """The name of the Deployment spec.workloadRef names, when there is one."""


@dataclass
class _Row:
    depth_prefix: str
    icon: str
    name: str
    kind: str
    status: str
    age: str
    info: str
    node: str = "-"
    ip: str = "-"
    config: str = "-"
    children: list[_Row] = field(default_factory=list)


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _owned(obj: Obj, owner: Obj) -> bool:
    uid = _meta(owner).get("uid")
    return uid is not None and any(ref.get("uid") == uid for ref in _meta(obj).get("ownerReferences") or [])


def _status(policy: Obj) -> KVOffloadPolicyStatus | None:
    raw = policy.get("status") or {}
    if "phase" not in raw:
        return None
    try:
        return KVOffloadPolicyStatus.model_validate(raw)
    except ValidationError:
        return None  # written by another version: the tree still shows what runs


def role(deployment: Obj, status: KVOffloadPolicyStatus | None, original: str | None = None) -> str:
    """The Deployment's role for the policy: stable, canary, retiring, taken-over, or "" (none: left over)."""
    name = _meta(deployment).get("name")
    if original is not None and name == original:
        return ORIGINAL
    if status is None:
        return ""
    labels = _meta(deployment).get("labels") or {}
    level, config = labels.get(LABEL_LEVEL), labels.get(LABEL_CONFIG_HASH)
    variants = (("stable", status.stable), ("canary", status.canary))
    for who, variant in variants:  # the config hash first: it tells two renderings of one level apart
        if variant is not None and config is not None and variant.config_hash == config:
            return who
    for who, variant in variants:
        if variant is not None and 0 <= variant.level < len(status.ladder) and status.ladder[variant.level] == level:
            return who
    if any(r.level_name == level for r in status.retiring):
        return "retiring"
    return ""


def _deployment_row(deployment: Obj, who: str, now: datetime) -> _Row:
    state = parse_deployment(deployment)
    labels = _meta(deployment).get("labels") or {}
    if state.replicas == 0:
        health = f"{SCALED_DOWN} ScaledDown"
    elif state.ready_replicas >= state.replicas and state.updated_replicas >= state.replicas:
        health = f"{HEALTHY} Healthy"
    elif _condition(deployment, "Progressing", "False"):
        health = f"{DEGRADED} Degraded"  # past its progressDeadlineSeconds
    else:
        health = f"{PROGRESSING} Progressing"
    info = [who or "not in status", f"level {labels.get(LABEL_LEVEL) or '-'}"]
    info.append(f"ready {state.ready_replicas}/{state.replicas}")
    return _Row(
        "", ICONS["Deployment"], state.name, "Deployment", health, _age(deployment, now), ", ".join(info),
        config=labels.get(LABEL_CONFIG_HASH) or "-",
    )  # fmt: skip


def _condition(obj: Obj, kind: str, value: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == value for c in conditions)


def _revision(obj: Obj) -> int:
    value = (_meta(obj).get("annotations") or {}).get("deployment.kubernetes.io/revision", "0")
    return int(value) if str(value).isdigit() else 0


def _replicaset_row(replicaset: Obj, now: datetime) -> _Row:
    spec, status = replicaset.get("spec") or {}, replicaset.get("status") or {}
    desired, ready = int(spec.get("replicas") or 0), int(status.get("readyReplicas") or 0)
    if desired == 0:
        health = f"{SCALED_DOWN} ScaledDown"
    elif ready >= desired:
        health = f"{HEALTHY} Healthy"
    else:
        health = f"{PROGRESSING} Progressing"
    info = f"revision {_revision(replicaset)}, ready {ready}/{desired}"
    config = (_meta(replicaset).get("labels") or {}).get(LABEL_CONFIG_HASH) or "-"
    name = _meta(replicaset).get("name", "?")
    return _Row("", ICONS["ReplicaSet"], name, "ReplicaSet", health, _age(replicaset, now), info, config=config)


def pod_status(pod: Obj) -> str:
    """A pod's STATUS as kubectl shows it, with argo rollouts' mark: Running, Pending, ContainerCreating,
    CrashLoopBackOff, OOMKilled, Unschedulable, Terminating..."""
    state = parse_pod(pod)
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    waiting = next(
        (w["reason"] for c in statuses if (w := (c.get("state") or {}).get("waiting") or {}).get("reason")), None
    )
    if state.terminating:
        return f"{PROGRESSING} Terminating"
    if state.crash_looping:
        return f"{DEGRADED} CrashLoopBackOff"
    if state.oom_killed and not state.ready:
        return f"{DEGRADED} OOMKilled"
    if state.unschedulable is not None:
        return f"{PROGRESSING} Unschedulable"
    if waiting is not None:
        return f"{PROGRESSING} {waiting}"
    if state.phase == "Running":
        return f"{HEALTHY if state.ready else PROGRESSING} Running"
    if state.phase == "Failed":
        return f"{DEGRADED} Failed"
    return f"{PROGRESSING} {state.phase}"


def _ready_containers(pod: Obj) -> tuple[int, int]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or []) or len(statuses)
    return sum(1 for c in statuses if c.get("ready")), total


def _pod_row(pod: Obj, now: datetime) -> _Row:
    state = parse_pod(pod)
    ready, total = _ready_containers(pod)
    status = pod.get("status") or {}
    return _Row(
        "", ICONS["Pod"], state.name, "Pod", pod_status(pod), _age(pod, now),
        f"ready {ready}/{total}, restarts {state.restarts}",
        node=(pod.get("spec") or {}).get("nodeName") or "-",
        ip=status.get("podIP") or "-",
        config=state.config_hash or "-",
    )  # fmt: skip


def _age(obj: Obj, now: datetime) -> str:
    return short_age(parse_time(_meta(obj).get("creationTimestamp")), now)


def _sorted_deployments(tree: Tree, status: KVOffloadPolicyStatus | None) -> list[tuple[Obj, str]]:
    roles = [(d, role(d, status, tree.original)) for d in tree.deployments]
    return sorted(roles, key=lambda pair: (ROLE_ORDER.index(pair[1]), _meta(pair[0]).get("name", "")))


def _children(tree: Tree, deployment: Obj) -> list[tuple[Obj, list[Obj]]]:
    """The Deployment's ReplicaSets, newest revision first, each with its pods by name."""
    sets = sorted((r for r in tree.replicasets if _owned(r, deployment)), key=lambda r: -_revision(r))
    return [
        (rs, sorted((p for p in tree.pods if _owned(p, rs)), key=lambda p: _meta(p).get("name", ""))) for rs in sets
    ]


def _policy_summary(tree: Tree, now: datetime) -> dict[str, Any]:
    meta, spec = _meta(tree.policy), tree.policy.get("spec") or {}
    raw = tree.policy.get("status") or {}
    status = _status(tree.policy)
    summary: dict[str, Any] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "phase": str(raw.get("phase") or "Pending"),
        "level": None,
        "levelName": None,
        "step": "-",
        "ladder": "-",
        "ready": None,
        "reason": None,
        "message": str(raw.get("message") or ""),
        "lastVerdict": None,
        "age": _age(tree.policy, now),
    }
    if status is None:
        return summary
    if status.stage is not None:
        summary.update(level=status.stage.index, levelName=status.stage.name)
    summary.update(step=step_text(status, promotion_steps(spec)), ladder=ladder_line(status, promotion_steps(spec)))
    if (ready := cond.find(status.conditions, READY)) is not None:
        summary.update(ready=ready.status, reason=ready.reason)
    if (last := status.last_analysis) is not None:
        summary["lastVerdict"] = {
            "verdict": last.verdict.value,
            "time": last.time.isoformat().replace("+00:00", "Z") if last.time is not None else None,
            "age": short_age(last.time, now),
            "message": last.message,
        }
    return summary


def _rows(tree: Tree, now: datetime) -> _Row:
    status = _status(tree.policy)
    summary = _policy_summary(tree, now)
    level = "-" if summary["level"] is None else f"level {summary['level']} {summary['levelName']}"
    top = _Row("", ICONS[KIND], summary["name"] or "?", KIND, summary["phase"], summary["age"], f"{level}")
    for deployment, who in _sorted_deployments(tree, status):
        branch = _deployment_row(deployment, who, now)
        for rs, pods in _children(tree, deployment):
            leaf = _replicaset_row(rs, now)
            leaf.children = [_pod_row(p, now) for p in pods]
            branch.children.append(leaf)
        top.children.append(branch)
    return top


def _flatten(row: _Row, prefix: str = "", last: bool = True, root: bool = True) -> list[_Row]:
    row.depth_prefix = "" if root else prefix + (ELBOW if last else TEE)
    out = [row]
    below = "" if root else prefix + (SPACE if last else PIPE)
    for i, child in enumerate(row.children):
        out += _flatten(child, below, i == len(row.children) - 1, root=False)
    return out


def render(tree: Tree, now: datetime, *, wide: bool = False) -> list[str]:
    """The tree as lines for a terminal: the policy's summary, then one row per object, drawn as a tree."""
    s = _policy_summary(tree, now)
    lines = [f"Name:          {s['name']}", f"Namespace:     {s['namespace']}", f"Phase:         {s['phase']}"]
    if s["level"] is not None:
        lines.append(f"Level:         {s['level']} {s['levelName']} (step {s['step']})")
    lines.append(f"Ladder:        {s['ladder']}")
    ready = "-" if s["ready"] is None else f"{s['ready']} ({s['reason']})"
    lines.append(f"Ready:         {ready}")
    if s["message"]:
        lines.append(f"Message:       {s['message']}")
    verdict = s["lastVerdict"]
    if verdict is None:
        lines.append("Last verdict:  none")
    else:
        said = f": {verdict['message']}" if verdict["message"] else ""
        lines.append(f"Last verdict:  {verdict['verdict']} {verdict['age']} ago{said}")
    rows = [list(COLUMNS) + (list(WIDE_COLUMNS) if wide else [])]
    for row in _flatten(_rows(tree, now)):
        cells = [f"{row.depth_prefix}{row.icon} {row.name}", row.kind, row.status, row.age, row.info]
        rows.append(cells + ([row.node, row.ip, row.config] if wide else []))
    return [*lines, "", *table(rows, indent="")]


def document(tree: Tree, now: datetime) -> dict[str, Any]:
    """What ``kvoffload get NAME -o json|yaml`` prints: the policy's summary and the tree as nested objects."""
    status = _status(tree.policy)
    deployments = []
    for deployment, who in _sorted_deployments(tree, status):
        state = parse_deployment(deployment)
        replicasets = []
        for rs, pods in _children(tree, deployment):
            rs_spec, rs_status = rs.get("spec") or {}, rs.get("status") or {}
            replicasets.append(
                {
                    "name": _meta(rs).get("name"),
                    "revision": _revision(rs),
                    "replicas": int(rs_spec.get("replicas") or 0),
                    "ready": int(rs_status.get("readyReplicas") or 0),
                    "age": _age(rs, now),
                    "pods": [_pod_document(p, now) for p in pods],
                }
            )
        deployments.append(
            {
                "name": state.name,
                "role": who or None,
                "level": state.level,
                "configHash": (state.labels or {}).get(LABEL_CONFIG_HASH),
                "replicas": state.replicas,
                "ready": state.ready_replicas,
                "updated": state.updated_replicas,
                "available": state.available_replicas,
                "age": _age(deployment, now),
                "replicaSets": replicasets,
            }
        )
    return {"policy": _policy_summary(tree, now), "deployments": deployments}


def _pod_document(pod: Obj, now: datetime) -> dict[str, Any]:
    state = parse_pod(pod)
    ready, total = _ready_containers(pod)
    return {
        "name": state.name,
        "phase": state.phase,
        "status": pod_status(pod).split(" ", 1)[1],
        "ready": state.ready,
        "readyContainers": f"{ready}/{total}",
        "restarts": state.restarts,
        "age": _age(pod, now),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "ip": (pod.get("status") or {}).get("podIP"),
    }


def read(api: Any, namespace: str, name: str) -> Tree:
    """Read the policy and what runs for it through ``api`` (a kubernetes ApiClient); ControlError (from
    :mod:`kvoffload.cli.control`) when something cannot be read, PolicyNotFoundError when there is no policy."""
    from kvoffload.cli import control

    policy = control.read_policy(api, namespace, name)
    ref = (policy.get("spec") or {}).get("workloadRef") or {}
    original = ref.get("name") if isinstance(ref.get("name"), str) else None
    deployments = control.list_objects(api, "Deployment", namespace, f"{LABEL_POLICY}={name}")
    if original is not None and all(_meta(d).get("name") != original for d in deployments):
        deployments += control.list_objects(api, "Deployment", namespace, field_selector=f"metadata.name={original}")
    replicasets: list[Obj] = []
    pods: list[Obj] = []
    for deployment in deployments:
        selector = _selector(deployment)
        if selector is None:
            continue
        owned = [r for r in control.list_objects(api, "ReplicaSet", namespace, selector) if _owned(r, deployment)]
        replicasets += owned
        pods += [p for p in control.list_objects(api, "Pod", namespace, selector) if any(_owned(p, r) for r in owned)]
    return Tree(policy, tuple(deployments), tuple(replicasets), tuple(pods), original)


def _selector(deployment: Obj) -> str | None:
    """The Deployment's spec.selector.matchLabels as a label selector (matchExpressions are filtered by owner)."""
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None

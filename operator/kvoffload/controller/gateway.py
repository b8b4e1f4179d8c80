"""The Kubernetes gateway: the operator's thin adapter to the API server.

Besides the kopf handlers, this is the only module that talks to Kubernetes. It uses
the official client (``kubernetes.client.ApiClient``) for transport, configuration and
errors, with plain dicts in and out so that one code path serves every kind. Each
method is a coroutine that runs the blocking call in a worker thread, retries
conflicts and transient failures with bounded, jittered exponential backoff, and never
changes or deletes an object that the policy does not own.

Children (Deployments and their engines' ConfigMaps, the Service, the PodMonitor) are written by server-side apply,
as field manager ``kvoffload`` (:data:`FIELD_MANAGER`): the operator states the fields it
renders, the API server merges them into the object and removes the ones it rendered
before and renders no more, and every field another manager set (an annotation, a
finalizer, a sidecar, the Deployment controller's revision) stays that manager's. An
object is applied only after it was read and found owned by the policy, and the apply
carries the resourceVersion that was read as a precondition, so a change in between,
a change of owner included, fails with 409 and the next attempt reads and checks
again. See :meth:`KubernetesGateway.apply` for ``force`` and for the one race that a
precondition cannot close (a create).

Every write names the field manager ``kvoffload``, so ``metadata.managedFields`` says
which fields are the operator's. The policy's status is written by a merge patch of
the status subresource (see :meth:`KubernetesGateway.patch_status` for why not apply).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import datetime
import hashlib
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from kvoffload.api.analysistemplate import TEMPLATE_PLURAL
from kvoffload.api.conventions import COMPONENT, KIND, LABEL_POLICY, PLURAL, POLICY_API_VERSION
from kvoffload.controller.apierrors import (
    ApiRejectedError,
    ApiUnavailableError,
    FieldConflictError,
    GatewayError,
    MissingObjectError,
    NotOwnedError,
    api_message,
)
from kvoffload.controller.kubestate import OwnedWorkloads, PodState, parse_deployment, parse_pod

log = logging.getLogger(__name__)

T = TypeVar("T")
Obj = dict[str, Any]


# The kinds the operator reads or writes: (apiVersion, kind) -> plural.
PLURALS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    (POLICY_API_VERSION, KIND): PLURAL,
}
# Children that apply()/delete_owned() manage, by kind.
CHILD_KINDS: dict[str, str] = {
    "Deployment": "apps/v1",
    "ConfigMap": "v1",  # a level's engine config files (policy/render.py, render_config_map)
    "Service": "v1",
    "PodMonitor": "monitoring.coreos.com/v1",
}

RETRIABLE_STATUSES = frozenset({0, 409, 429, 500, 502, 503, 504})

FIELD_MANAGER = COMPONENT
"""The field manager of every write, as ``metadata.managedFields`` records it."""
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class _Again(Exception):
    """Raised inside an attempt to start over from a fresh read."""


@dataclasses.dataclass(frozen=True)
class PolicyRef:
    """The KVOffloadPolicy that owns the children, as an owner and as an Event's object."""

    namespace: str
    name: str
    uid: str
    api_version: str = POLICY_API_VERSION
    kind: str = KIND

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PolicyRef:
        """From a policy object (e.g. kopf's ``body``)."""
        meta = body["metadata"]
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            api_version=body.get("apiVersion", POLICY_API_VERSION),
            kind=body.get("kind", KIND),
        )

    def owner_reference(self) -> Obj:
        """The controller reference its children carry, so the garbage collector removes them with it."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter: attempt n waits U(0, min(max, base * 2**n))."""

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 5.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * 2**attempt))


def api_client_from_environment(
    kubeconfig: str | None = None, context: str | None = None
) -> kubernetes.client.ApiClient:
    """An ApiClient from a kubeconfig file, else the in-cluster service account, else ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return kubernetes.client.ApiClient(configuration)
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context, client_configuration=configuration
    )
    return kubernetes.client.ApiClient(configuration)


def resource_path(
    api_version: str, plural: str, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    """The REST path of a collection, an object or an object's subresource."""
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    parts = [base]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


# Metadata the API server keeps: never part of an applied configuration.
_SERVER_METADATA = frozenset(
    {"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "managedFields", "selfLink"}
)


def _controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller")), None)


def _owned_by(obj: Mapping[str, Any], owner: PolicyRef) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner.uid for ref in refs)


# Characters a YAML string keeps as written (go-yaml's is_printable, less its line breaks NEL, LS and PS, which
# fold): the API server reads an apply body as YAML.
_NOT_YAML_LITERAL = re.compile(
    "[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def apply_body(config: Mapping[str, Any]) -> str:
    """A server-side apply body the API server's YAML reader takes: UTF-8 JSON, since JSON's ASCII form writes a
    character past U+FFFF as a \\ud8xx\\udcxx pair, which YAML refuses, and ``\\uXXXX`` for a character YAML refuses
    raw or folds (a C1 control, NEL, a BOM), which is always on the basic plane. Only strings hold such characters."""
    text = json.dumps(config, ensure_ascii=False)
    return _NOT_YAML_LITERAL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class KubernetesGateway:
    """The operator's API operations. Create one per ApiClient; it is safe to share between handlers."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        retry: RetryPolicy = RetryPolicy(),
        request_timeout: tuple[float, float] = (5.0, 30.0),
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api_client
        self._retry = retry
        self._timeout = request_timeout
        self._rng = rng or random.Random()
        self._sleep = sleep

    # --- children --------------------------------------------------------------------

    async def apply(self, obj: Mapping[str, Any], owner: PolicyRef, *, force: bool = True) -> Obj:
        """Create or update a child (Deployment, Service, PodMonitor) owned by the policy, by server-side apply.

        The child gets the policy as its controller ownerReference. An existing object of
        that name is applied to only if the policy already owns it (NotOwnedError for an
        object owned by someone else, or by no one), with the resourceVersion that was read
        as a precondition. Fields other managers set on it stay theirs and stay put; the
        fields this operator applied before and no longer renders are removed. Returns the
        object as stored.

        ``force`` (default True) takes over a field that another manager changed since the
        operator last applied it, e.g. ``spec.replicas`` after a ``kubectl scale``, and sets
        it back. That is right for these objects: the policy is their controller (checked
        just before), the rendered fields are the ladder's plan, and nobody could resolve a
        conflict if the operator stopped at it; Kubernetes asks controllers to force for
        this reason. With ``force=False`` such a conflict raises FieldConflictError naming
        the fields and managers, and is not retried.

        A create cannot carry a "must not exist" precondition: server-side apply creates
        what is missing, ignores a resourceVersion when it creates, and refuses any uid
        for a missing object. So an object that someone else creates in the moment between
        the read that found nothing and the apply gets the applied fields merged into it;
        if it already has a controller, the API server refuses the second one (422).
        """
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural = self._child_plural(api_version, kind)
        name = obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace", owner.namespace)
        if namespace != owner.namespace:
            raise GatewayError(f"{kind} {namespace}/{name}: children must live in the policy's namespace")
        desired = copy.deepcopy(dict(obj))
        desired.pop("status", None)
        meta = {k: v for k, v in desired["metadata"].items() if k not in _SERVER_METADATA}
        desired["metadata"] = {**meta, "namespace": namespace, "ownerReferences": [owner.owner_reference()]}
        path = resource_path(api_version, plural, namespace, name)
        query = {"fieldManager": FIELD_MANAGER, **({"force": "true"} if force else {})}

        async def attempt() -> Obj:
            current = await self._get(path)
            config = desired
            if current is not None:
                self._require_owned(current, owner, kind)
                version = current["metadata"]["resourceVersion"]
                config = {**desired, "metadata": {**desired["metadata"], "resourceVersion": version}}
            text = apply_body(config)
            try:
                return await self._call("PATCH", path, body=text, query=query, content_type=APPLY_PATCH)
            except ApiException as exc:
                conflicts = _field_conflicts(exc)
                if conflicts:
                    raise FieldConflictError(
                        f"apply {kind} {namespace}/{name}: fields another manager owns: {'; '.join(conflicts)}", 409
                    ) from exc
                raise

        return await self._retrying(attempt, f"apply {kind} {namespace}/{name}")

    async def delete_owned(self, kind: str, name: str, owner: PolicyRef) -> bool:
        """Delete a child if the policy owns it. False if it was already gone; NotOwnedError if it is not ours."""
        api_version = CHILD_KINDS.get(kind)
        if api_version is None:
            raise GatewayError(f"kvoffload does not manage objects of kind {kind}")
        path = resource_path(api_version, PLURALS[(api_version, kind)], owner.namespace, name)

        async def attempt() -> bool:
            current = await self._get(path)
            if current is None:
                return False
            self._require_owned(current, owner, kind)
            meta = current["metadata"]
            options = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "propagationPolicy": "Background",
                # Delete exactly what was checked: a changed or re-created object fails with 409.
                "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            }
            try:
                await self._call("DELETE", path, body=options)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        return await self._retrying(attempt, f"delete {kind} {owner.namespace}/{name}")

    async def scale_owned(self, name: str, replicas: int, owner: PolicyRef) -> Obj:
        """Set an owned Deployment's ``spec.replicas`` and nothing else, by merge patch (its pod template is
        left exactly as it is, so no pod restarts). For Deployments adopted from an older naming, which the
        operator no longer renders."""
        path = resource_path("apps/v1", "deployments", owner.namespace, name)

        async def attempt() -> Obj:
            current = await self._get(path)
            if current is None:
                raise MissingObjectError(f"Deployment {owner.namespace}/{name} is gone")
            self._require_owned(current, owner, "Deployment")
            body = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": {"replicas": replicas},
            }
            query = {"fieldManager": FIELD_MANAGER}
            return await self._call("PATCH", path, body=body, query=query, content_type=MERGE_PATCH)

        return await self._retrying(attempt, f"scale Deployment {owner.namespace}/{name}")

    async def list_owned(self, policy: PolicyRef) -> OwnedWorkloads:
        """The policy's Deployments (by label and ownerReference) and the pods with its label."""
        query = {"labelSelector": f"{LABEL_POLICY}={policy.name}"}
        deployments = await self._retrying(
            lambda: self._call("GET", resource_path("apps/v1", "deployments", policy.namespace), query=query),
            f"list Deployments of {policy}",
        )
        pods = await self._retrying(
            lambda: self._call("GET", resource_path("v1", "pods", policy.namespace), query=query),
            f"list pods of {policy}",
        )
        return OwnedWorkloads(
            deployments=tuple(
                parse_deployment(item) for item in deployments.get("items", []) if _owned_by(item, policy)
            ),
            pods=tuple(parse_pod(item) for item in pods.get("items", [])),
        )

    async def list_pods(self, namespace: str, selector: str) -> tuple[PodState, ...]:
        """The pods of ``namespace`` that match a label selector: an observe-only policy's fleet, read, never
        written (the operator owns none of it)."""
        query = {"labelSelector": selector}
        pods = await self._retrying(
            lambda: self._call("GET", resource_path("v1", "pods", namespace), query=query),
            f"list pods {selector} in {namespace}",
        )
        return tuple(parse_pod(item) for item in pods.get("items", []))

    # --- a Deployment spec.workloadRef took over: read, scaled, never owned or deleted ------------

    async def read_deployment(self, namespace: str, name: str) -> Obj:
        """A Deployment the operator does not own; MissingObjectError when there is none."""
        deployment = await self._retrying(
            lambda: self._get(resource_path("apps/v1", "deployments", namespace, name)),
            f"read Deployment {namespace}/{name}",
        )
        if deployment is None:
            raise MissingObjectError(f"Deployment {namespace}/{name} not found")
        return deployment

    async def scale_workload(
        self, namespace: str, name: str, replicas: int, annotations: Mapping[str, str | None]
    ) -> Obj:
        """Set a taken-over Deployment's ``spec.replicas`` and the operator's annotations on it (None removes
        one), by merge patch on the version read, so its pod template and everything else stay as they are."""
        path = resource_path("apps/v1", "deployments", namespace, name)

        async def attempt() -> Obj:
            current = await self._get(path)
            if current is None:
                raise MissingObjectError(f"Deployment {namespace}/{name} is gone")
            body = {
                "metadata": {
                    "resourceVersion": current["metadata"]["resourceVersion"],
                    "annotations": dict(annotations),
                },
                "spec": {"replicas": replicas},
            }
            query = {"fieldManager": FIELD_MANAGER}
            return await self._call("PATCH", path, body=body, query=query, content_type=MERGE_PATCH)

        return await self._retrying(attempt, f"scale Deployment {namespace}/{name}")

    async def set_finalizer(
        self, policy: PolicyRef, metadata: Mapping[str, Any], finalizer: str, present: bool
    ) -> None:
        """Add or remove one finalizer of the policy whose ``metadata`` was read, leaving the others (kopf's, a
        user's) as they are: a JSON patch that tests the list read is still there, so a concurrent writer makes
        it fail (retried by the next cycle, with the newer body) rather than lose their finalizer."""
        held = list(metadata.get("finalizers") or [])
        if (finalizer in held) == present:
            return
        wanted = [*held, finalizer] if present else [f for f in held if f != finalizer]
        check: dict[str, Any]
        if held:
            check = {"op": "test", "path": "/metadata/finalizers", "value": held}
        else:
            check = {"op": "test", "path": "/metadata/resourceVersion", "value": metadata.get("resourceVersion")}
        body = [check, {"op": "add", "path": "/metadata/finalizers", "value": wanted}]
        path = resource_path(policy.api_version, PLURAL, policy.namespace, policy.name)
        what = f"{'add' if present else 'remove'} finalizer {finalizer} of {policy}"
        try:
            await self._call("PATCH", path, body=body, content_type=JSON_PATCH)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise ApiRejectedError(f"{what}: {exc.status} {api_message(exc)}", exc.status) from exc

    # --- the policy itself -----------------------------------------------------------

    async def patch_status(self, policy: PolicyRef, status: Mapping[str, Any]) -> Obj:
        """Merge-patch the policy's status subresource (``None`` values remove keys), as field manager kvoffload.

        A merge patch, not an apply: the operator is the status's only writer and writes it
        whole, and the nulls remove what the new status no longer has whoever wrote it
        last. An apply would remove only the fields that the ``kvoffload`` manager owns, so
        a key written under another manager (an earlier operator version's writes, which
        the API server recorded under the client's default manager name, or a
        ``kubectl edit --subresource=status``) would stay in the status for good.
        """
        path = resource_path(policy.api_version, PLURAL, policy.namespace, policy.name, "status")
        body = {"status": dict(status)}
        query = {"fieldManager": FIELD_MANAGER}
        return await self._retrying(
            lambda: self._call("PATCH", path, body=body, query=query, content_type=MERGE_PATCH),
            f"patch the status of {policy}",
        )

    async def emit_event(self, policy: PolicyRef, type_: str, reason: str, message: str) -> bool:
        """Record a core/v1 Event on the policy; repeats of the same event raise its count.

        Returns False (and logs) if the Event could not be written: Events are auxiliary and
        must never fail a reconciliation.
        """
        if type_ not in ("Normal", "Warning"):
            raise ValueError(f"event type must be Normal or Warning, not {type_!r}")
        digest = hashlib.sha256(f"{policy.uid}\0{type_}\0{reason}\0{message}".encode()).hexdigest()[:16]
        name = f"{policy.name[:200]}.{digest}"  # names are at most 253 characters
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        collection = resource_path("v1", "events", policy.namespace)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": policy.namespace},
            "involvedObject": {
                "apiVersion": policy.api_version,
                "kind": policy.kind,
                "name": policy.name,
                "namespace": policy.namespace,
                "uid": policy.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
        }

        query = {"fieldManager": FIELD_MANAGER}

        async def attempt() -> None:
            try:
                await self._call("POST", collection, body=event, query=query)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            existing = await self._get(f"{collection}/{name}")
            if existing is None:
                raise _Again
            bump = {
                "metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]},
                "count": int(existing.get("count") or 1) + 1,
                "lastTimestamp": now,
            }
            await self._call("PATCH", f"{collection}/{name}", body=bump, query=query, content_type=MERGE_PATCH)

        try:
            await self._retrying(attempt, f"record event {reason} on {policy}")
        except GatewayError as exc:
            log.warning("Could not record an Event on %s: %s", policy, exc)
            return False
        return True

    async def read_configmap(self, namespace: str, name: str, key: str) -> str:
        """One value of a ConfigMap; MissingObjectError names what is missing."""
        configmap = await self._retrying(
            lambda: self._get(resource_path("v1", "configmaps", namespace, name)), f"read ConfigMap {namespace}/{name}"
        )
        if configmap is None:
            raise MissingObjectError(f"ConfigMap {namespace}/{name} not found")
        data = configmap.get("data") or {}
        if key not in data:
            raise MissingObjectError(f"ConfigMap {namespace}/{name} has no key {key!r}")
        return str(data[key])

    async def read_secret(self, namespace: str, name: str, key: str) -> str:
        """One value of a Secret, decoded; MissingObjectError names what is missing."""
        secret = await self._retrying(
            lambda: self._get(resource_path("v1", "secrets", namespace, name)), f"read Secret {namespace}/{name}"
        )
        if secret is None:
            raise MissingObjectError(f"Secret {namespace}/{name} not found")
        data = secret.get("data") or {}
        if key not in data:
            raise MissingObjectError(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(data[key]).decode().strip()

    async def read_analysis_template(self, name: str) -> Obj | None:
        """A KVOffloadAnalysisTemplate (cluster-scoped) by name; None when there is none."""
        path = resource_path(POLICY_API_VERSION, TEMPLATE_PLURAL, None, name)
        return await self._retrying(lambda: self._get(path), f"read KVOffloadAnalysisTemplate {name}")

    # --- plumbing --------------------------------------------------------------------

    @staticmethod
    def _child_plural(api_version: str, kind: str) -> str:
        if CHILD_KINDS.get(kind) != api_version:
            raise GatewayError(f"kvoffload does not manage objects of kind {api_version} {kind}")
        return PLURALS[(api_version, kind)]

    @staticmethod
    def _require_owned(current: Mapping[str, Any], owner: PolicyRef, kind: str) -> None:
        controller = _controller_of(current)
        if _owned_by(current, owner) and (controller is None or controller.get("uid") == owner.uid):
            return
        meta = current["metadata"]
        holder = f"owned by {controller.get('kind')} {controller.get('name')}" if controller else "not owned by it"
        raise NotOwnedError(
            f"{kind} {meta.get('namespace')}/{meta['name']} already exists and is {holder}; "
            f"{owner} will not adopt or change it"
        )

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], what: str) -> T:
        """Run an attempt; on a conflict or transient failure, back off and run it again."""
        last: BaseException | None = None
        for number in range(self._retry.attempts):
            if number:
                await self._sleep(self._retry.delay(number - 1, self._rng))
            try:
                return await attempt()
            except _Again as exc:
                last = exc.__cause__ or exc
            except ApiException as exc:
                if exc.status not in RETRIABLE_STATUSES:
                    raise ApiRejectedError(f"{what}: {exc.status} {api_message(exc)}", exc.status) from exc
                last = exc
            except urllib3.exceptions.HTTPError as exc:
                last = exc
            log.debug("%s: attempt %d failed (%s); retrying", what, number + 1, last)
        raise ApiUnavailableError(f"{what}: gave up after {self._retry.attempts} attempts: {last}") from last

    async def _get(self, path: str) -> Obj | None:
        try:
            return await self._call("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        return await asyncio.to_thread(self._call_blocking, method, path, body, query, content_type)

    def _call_blocking(
        self, method: str, path: str, body: Any, query: Mapping[str, str] | None, content_type: str
    ) -> Obj:
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*request, _request_timeout=self._timeout)
        response.read()  # type: ignore[no-untyped-call]
        data = self._api.response_deserialize(response, {"2XX": "object"}).data
        return data if isinstance(data, dict) else {}


def _field_conflicts(exc: ApiException) -> list[str]:
    """The fields of a server-side apply conflict (409 with FieldManagerConflict causes), as
    ``.spec.replicas (someone)``; empty for any other error, a stale resourceVersion included."""
    if exc.status != 409:
        return []
    try:
        causes = json.loads(exc.body or "")["details"]["causes"]
    except (ValueError, KeyError, TypeError):
        return []
    return [
        f"{cause.get('field', '?')} ({cause.get('message', '')})"
        for cause in causes
        if isinstance(cause, dict) and cause.get("reason") == "FieldManagerConflict"
    ]

"""The policies' Deployments and pods, as each cycle reads them.

Listing them costs two API calls per policy per cycle: 2,000 a cycle for 1,000 policies, each a TLS round
trip and a JSON decode in the operator. ``kvoffload run`` keeps them instead from a list and then a watch of
each kind (client-go's informer), with the server-side label selector ``kvoffload.io/policy`` that every
engine carries, and keeps of each object only the fields the cycle reads (``DeploymentState``, ``PodState``).
Each watch runs in a thread of its own, so a climb's stream of pod changes costs the event loop nothing.

kopf's own indexes were tried first: over 1,000 policies (2,000 Deployments, 2,000 pods) a restarted
operator's first reconcile came 65.8 s after its start instead of about 5 s, because kopf puts every watched
object through its per-object machinery before it calls any handler (``bench/operator/README.md``).

- **Behind its own write.** A watch can trail the operator's own write by a moment, and a cycle that read the
  Deployment as it was before would write again. After the operator writes a policy's Deployment, that policy
  is read by a list until the watch has delivered the write (an event with the resourceVersion the write
  returned, or the object gone after a delete), or for at most ``EXPECTATION_TTL`` seconds: the "expectations"
  of Kubernetes' ReplicaSet controller. A resourceVersion is opaque (equality only), so the Deployments' watch
  remembers the last ``VERSIONS_KEPT`` versions it delivered of each object rather than comparing numbers.
- **Before the first list** a read waits for it, for at most ``FIRST_LIST_WAIT`` seconds (client-go's
  ``WaitForCacheSync``): at a restart over 1,000 policies the reconciles that came first otherwise listed their
  engines by two calls each while the watch's own list was under way. **After a failed list**, and where the
  first one takes longer than that, a read is a list. A watch the API server refuses (403) fails every read of
  its namespace with that refusal, as a refused list would.
- Without ``watch()`` (the controller's own tests), and where the namespaces are patterns (``-n 'llm-*'``),
  every read is a list.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from kvoffload.api.conventions import LABEL_POLICY
from kvoffload.controller.apierrors import ApiRejectedError, api_message
from kvoffload.controller.gateway import KubernetesGateway, PolicyRef, resource_path
from kvoffload.controller.kubestate import DeploymentState, OwnedWorkloads, PodState, parse_deployment, parse_pod
from kvoffload.controller.metrics import OperatorMetrics

log = logging.getLogger(__name__)

EXPECTATION_TTL = 60.0
"""Seconds after which a write the watch has not shown no longer makes its policy list."""
WATCH_SECONDS = 270
"""The API server ends each watch after this long; it is resumed from the last version seen."""
PAGE = 500
"""Objects per page of a list."""
FIRST_LIST_WAIT = 30.0
"""Seconds a read waits for the watch's first list before it lists for itself."""
VERSIONS_KEPT = 16
"""The resourceVersions of each Deployment the watch remembers delivering: its own write, then the Deployment
controller's status updates that follow within a cycle."""

V = TypeVar("V")
Ident = tuple[str, str]
"""(namespace, name) of a watched object."""


def index_deployment(body: Mapping[str, Any]) -> dict[Hashable, DeploymentState]:
    """A Deployment under the uid of each policy it names as an owner (``list_owned`` checks the same)."""
    if LABEL_POLICY not in (body.get("metadata", {}).get("labels") or {}):
        return {}
    state = parse_deployment(body)
    refs = body.get("metadata", {}).get("ownerReferences") or []
    return {str(ref["uid"]): state for ref in refs if ref.get("uid")}


def index_pod(body: Mapping[str, Any]) -> dict[Hashable, PodState]:
    """A pod under (namespace, policy label), as ``list_owned`` selects them."""
    meta = body.get("metadata", {})
    policy = (meta.get("labels") or {}).get(LABEL_POLICY)
    if not policy:
        return {}
    return {(str(meta.get("namespace")), str(policy)): parse_pod(body)}


class Informer(Generic[V]):
    """One kind in one scope (a namespace, or all of them): a list, then a watch from the list's version, again
    and again, in a thread of its own. It keeps what ``index`` gives of each object (key -> value); ``values``
    reads them under a lock."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        api_version: str,
        plural: str,
        namespace: str | None,
        index: Callable[[Mapping[str, Any]], Mapping[Hashable, V]],
        versions_kept: int = 0,
    ) -> None:
        self._api = api
        self._path = resource_path(api_version, plural, namespace)
        self._index = index
        self.name = f"{plural} in {namespace}" if namespace else f"{plural} in every namespace"
        self._lock = threading.Lock()
        self._store: dict[Hashable, dict[Ident, V]] = {}
        self._placed: dict[Ident, list[Hashable]] = {}
        self._versions_kept = versions_kept
        self._versions: dict[Ident, collections.deque[str]] = {}
        self.synced = False
        """True from the end of a list until a list fails."""
        self.refused: str | None = None
        """The API server's message while it refuses this list or watch (403), until a watch is answered."""
        self.first_listed = threading.Event()
        """Set once the first list has ended, whether it worked or not."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch {self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop at the next event or the end of the current watch (the thread is a daemon: nothing waits)."""
        self._stopped.set()

    def values(self, key: Hashable) -> list[V]:
        with self._lock:
            return list(self._store.get(key, {}).values())

    def delivered(self, ident: Ident, version: str) -> bool:
        """Whether a list or an event showed this version of the object, among the last ``versions_kept``."""
        with self._lock:
            return version in self._versions.get(ident, ())

    def _remember(self, versions: dict[Ident, collections.deque[str]], obj: Mapping[str, Any]) -> None:
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if self._versions_kept and version:
            versions.setdefault(_ident(obj), collections.deque(maxlen=self._versions_kept)).append(str(version))

    # --- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                failures = 0
            except Exception as exc:  # the thread must outlive every error: it is the operator's eyes
                self.first_listed.set()
                failures += 1
                version = None
                self.synced = False
                refused = isinstance(exc, ApiException) and exc.status == 403
                message = api_message(exc)
                if refused and self.refused != message:
                    log.error("watch of %s refused: %s", self.name, message)
                elif failures == 1 and not refused:
                    log.warning("watch of %s failed, listing again: %s", self.name, message)
                self.refused = message if refused else None
                self._stopped.wait(random.uniform(0.5, 1.0) * min(30.0, 2.0 ** min(failures, 5)))

    def _list(self) -> str:
        store: dict[Hashable, dict[Ident, V]] = {}
        placed: dict[Ident, list[Hashable]] = {}
        versions: dict[Ident, collections.deque[str]] = {}
        query = {"labelSelector": LABEL_POLICY, "limit": str(PAGE)}
        while True:
            page = json.loads(self._get(query).read())
            for item in page.get("items") or []:
                _place(store, placed, item, self._index(item))
                self._remember(versions, item)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            query = {**query, "continue": meta["continue"]}
        with self._lock:
            self._store, self._placed, self._versions = store, placed, versions
        self.synced = True
        self.first_listed.set()
        return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str | None:
        """Apply the watch's events until it ends; the last version seen, or None when it expired (410)."""
        query = {
            "labelSelector": LABEL_POLICY,
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        response = self._get(query)
        self.refused = None  # only a watch that the API server answers ends a refusal: the list alone is not enough
        try:
            # urllib3's response yields the body line by line (one event a line), however it was chunked.
            for line in response.response:
                if self._stopped.is_set():
                    return version
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise ApiException(status=obj.get("code") or 500, reason=obj.get("message"))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    _remove(self._store, self._placed, _ident(obj))
                    if kind == "DELETED":
                        self._versions.pop(_ident(obj), None)
                    else:
                        _place(self._store, self._placed, obj, self._index(obj))
                        self._remember(self._versions, obj)
        finally:
            response.response.close()  # a new connection per watch (every few minutes), never a half-read one
        return version

    def _get(self, query: Mapping[str, str]) -> Any:
        request = self._api.param_serialize(
            method="GET",
            resource_path=self._path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*request, _request_timeout=(10.0, WATCH_SECONDS + 30.0))
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason, body=response.read().decode())  # type: ignore[no-untyped-call]
        return response


def _ident(obj: Mapping[str, Any]) -> Ident:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _place(
    store: dict[Hashable, dict[Ident, V]],
    placed: dict[Ident, list[Hashable]],
    obj: Mapping[str, Any],
    entries: Mapping[Hashable, V],
) -> None:
    ident = _ident(obj)
    for key, value in entries.items():
        store.setdefault(key, {})[ident] = value
    if entries:
        placed[ident] = list(entries)


def _remove(store: dict[Hashable, dict[Ident, V]], placed: dict[Ident, list[Hashable]], ident: Ident) -> None:
    for key in placed.pop(ident, ()):
        bucket = store.get(key)
        if bucket is not None:
            bucket.pop(ident, None)
            if not bucket:
                del store[key]


class Workloads:
    """Reads a policy's Deployments and pods: from the watch where it can be trusted, else by a list."""

    def __init__(
        self,
        gateway: KubernetesGateway,
        metrics: OperatorMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway = gateway
        self._metrics = metrics or OperatorMetrics()
        self._monotonic = monotonic
        # namespace (None: every namespace) -> its Deployments' and pods' informers
        self._watched: dict[str | None, tuple[Informer[DeploymentState], Informer[PodState]]] = {}
        # policy uid -> Deployment name -> (resourceVersion its write returned, None for a delete; when written)
        self._expected: dict[str, dict[str, tuple[str | None, float]]] = {}
        # namespace -> the one wait for its informers' first lists that every read of it shares
        self._first_lists: dict[str | None, asyncio.Future[None]] = {}

    def watch(self, api: kubernetes.client.ApiClient, namespaces: Sequence[str] | None) -> None:
        """Start watching the engines of these namespaces (None: of every namespace). Namespace patterns
        cannot be watched one by one: with any, nothing is watched and every read is a list."""
        scopes: Iterable[str | None] = [None] if namespaces is None else namespaces
        if namespaces is not None and any(set(ns) & set("*?[") for ns in namespaces):
            log.info("namespaces given as patterns: the engines are listed every cycle, not watched")
            return
        for scope in scopes:
            deployments = Informer(api, "apps/v1", "deployments", scope, index_deployment, VERSIONS_KEPT)
            pods = Informer(api, "v1", "pods", scope, index_pod)
            self._watched[scope] = (deployments, pods)
            deployments.start()
            pods.start()

    def stop(self) -> None:
        for informers in self._watched.values():
            for informer in informers:
                informer.stop()

    async def owned(self, policy: PolicyRef) -> OwnedWorkloads:
        """The policy's Deployments and the pods with its label, sorted by name."""
        scope = None if None in self._watched else policy.namespace
        informers = self._watched.get(scope)
        if informers is None:
            return await self._listed(policy)
        deployments, pods = informers
        await self.synced(policy.namespace)
        refused = deployments.refused or pods.refused
        if refused is not None:
            raise ApiRejectedError(f"watch the engines of {policy}: {refused}", 403)
        if not (deployments.synced and pods.synced):
            return await self._listed(policy)
        found = deployments.values(policy.uid)
        if not self._caught_up(policy, found, deployments):
            return await self._listed(policy)
        self._metrics.workload_reads.labels(source="watch").inc()
        return OwnedWorkloads(
            deployments=tuple(sorted(found, key=lambda d: d.name)),
            pods=tuple(sorted(pods.values((policy.namespace, policy.name)), key=lambda p: p.name)),
        )

    async def synced(self, namespace: str) -> None:
        """Wait until the first lists of this namespace's engines have ended (or ``FIRST_LIST_WAIT``); at once where
        they have, or where nothing is watched. One waiting thread per scope, whatever the number of waiters."""
        scope = None if None in self._watched else namespace
        informers = self._watched.get(scope)
        if informers is None or all(informer.synced for informer in informers):
            return
        waiting = self._first_lists.get(scope)
        if waiting is None:
            deadline = self._monotonic() + FIRST_LIST_WAIT

            def wait() -> None:
                for informer in informers:
                    informer.first_listed.wait(max(0.0, deadline - self._monotonic()))

            waiting = self._first_lists[scope] = asyncio.ensure_future(asyncio.to_thread(wait))
        await asyncio.shield(waiting)

    def wrote(self, policy: PolicyRef, name: str, resource_version: str | None) -> None:
        """The operator wrote the policy's Deployment ``name`` and the API server answered with this version."""
        if resource_version is not None:
            self._expected.setdefault(policy.uid, {})[name] = (resource_version, self._monotonic())

    def deleted(self, policy: PolicyRef, name: str) -> None:
        self._expected.setdefault(policy.uid, {})[name] = (None, self._monotonic())

    def forget(self, uid: str) -> None:
        self._expected.pop(uid, None)

    async def _listed(self, policy: PolicyRef) -> OwnedWorkloads:
        self._metrics.workload_reads.labels(source="list").inc()
        return await self._gateway.list_owned(policy)

    def _caught_up(
        self, policy: PolicyRef, deployments: Iterable[DeploymentState], informer: Informer[DeploymentState]
    ) -> bool:
        """Whether the watch has delivered every write of this policy's Deployments that the operator made."""
        expected = self._expected.get(policy.uid)
        if not expected:
            return True
        present = {d.name for d in deployments}
        now = self._monotonic()
        for name, (version, when) in list(expected.items()):
            shown = name not in present if version is None else informer.delivered((policy.namespace, name), version)
            if shown or now - when > EXPECTATION_TTL:
                del expected[name]
        if not expected:
            del self._expected[policy.uid]
            return True
        return False

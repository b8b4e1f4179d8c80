"""Manual control of a policy through its annotations, and reading, listing and watching policies, for the CLI.

``kvoffload promote|abort|retry|pause|resume NAME`` sets ``kvoffload.io/<verb>`` to a
new value with a merge patch; the operator acts on each new value once, at its next
cycle (``rollout.decide`` remembers the values it acted on in
``status.annotationsSeen``). ``kvoffload status NAME --watch`` follows one policy through
the watch API (:class:`PolicyWatch`), ``kvoffload list`` lists them. Errors come out as
:class:`ControlError` with a message for people, never as a client traceback.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from kvoffload.api.conventions import ABORT, API_GROUP, API_VERSION, KIND, PAUSE, PLURAL, PROMOTE, RESUME, RETRY
from kvoffload.controller.gateway import api_client_from_environment

VERBS: dict[str, str] = {"promote": PROMOTE, "abort": ABORT, "retry": RETRY, "pause": PAUSE, "resume": RESUME}
"""Command verb -> the annotation it sets."""

WHAT_IT_DOES: dict[str, str] = {
    "promote": "end the current baseline or step now and move on, without waiting for evidence",
    "abort": "remove the canary and halt the ladder on the stable level (phase RolledBack)",
    "retry": "start the ladder again from the stable level after a rollback, a pause or a preflight hold",
    "pause": "stop forward motion (rollbacks still apply)",
    "resume": "go on after a pause; the step clock restarts",
}


class ControlError(Exception):
    """A control request that could not be made; the message is for people."""


class PolicyNotFoundError(ControlError):
    """No KVOffloadPolicy of that name in that namespace."""


def connect(kubeconfig: Path | None = None, context: str | None = None) -> kubernetes.client.ApiClient:
    """An ApiClient from ``kubeconfig`` (else $KUBECONFIG, in-cluster, ~/.kube/config); ControlError if none."""
    try:
        return api_client_from_environment(str(kubeconfig) if kubeconfig is not None else None, context)
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = f" from {kubeconfig}" if kubeconfig is not None else ""
        raise ControlError(f"cannot load a Kubernetes configuration{where}: {exc}") from None


def default_namespace(kubeconfig: Path | None = None, context: str | None = None) -> str:
    """The namespace of the kubeconfig's current context, else ``default``."""
    try:
        contexts, active = kubernetes.config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig is not None else None
        )
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    if context is not None:
        active = next((c for c in contexts if c.get("name") == context), active)
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def new_annotation_value(previous: str | None, now: datetime) -> str:
    """A value that differs from ``previous``: ``now`` in RFC 3339 (UTC, microseconds), plus a counter if needed."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if previous is None or not previous.startswith(stamp):
        return stamp
    # Same instant as the value already there: count up so the operator still sees a change.
    _, _, count = previous.partition("#")
    return f"{stamp}#{int(count) + 1 if count.isdigit() else 2}"


def _describe(exc: BaseException, what: str) -> ControlError:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "")["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        return ControlError(f"{what}: the API server answered {exc.status}: {message}")
    return ControlError(f"{what}: cannot reach the API server: {exc}")


def _as_object(data: object) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ControlError(f"the API server answered with {type(data).__name__}, not an object")
    return data


def read_policy(
    api: kubernetes.client.ApiClient, namespace: str, name: str, timeout: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The KVOffloadPolicy object as stored; PolicyNotFoundError if there is none.

    ``timeout``: (connect, read) seconds for the request; None: the client's default (none).
    """
    objects = kubernetes.client.CustomObjectsApi(api)
    options: dict[str, Any] = {"_request_timeout": timeout} if timeout is not None else {}
    try:
        found = objects.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name, **options)
    except ApiException as exc:
        if exc.status == 404:
            raise PolicyNotFoundError(f"no {KIND} {name!r} in namespace {namespace!r}") from None
        raise _describe(exc, f"read {KIND} {namespace}/{name}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise _describe(exc, f"read {KIND} {namespace}/{name}") from None
    return _as_object(found)


def request(
    api: kubernetes.client.ApiClient,
    namespace: str,
    name: str,
    verb: str,
    now: datetime | None = None,
    *,
    key: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Set the verb's annotation (or ``key``) to a new value; return the value and the policy as stored after the
    patch.

    The value always differs from the one already there, so the operator acts on it once.
    """
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}; known: {', '.join(VERBS)}")
    key = key or VERBS[verb]
    current = read_policy(api, namespace, name)
    previous = (current.get("metadata", {}).get("annotations") or {}).get(key)
    value = new_annotation_value(previous, now or datetime.now(UTC))
    objects = kubernetes.client.CustomObjectsApi(api)
    try:
        # The client defaults PATCH to a JSON patch; a merge patch touches only this key.
        patched = objects.patch_namespaced_custom_object(
            API_GROUP,
            API_VERSION,
            namespace,
            PLURAL,
            name,
            {"metadata": {"annotations": {key: value}}},
            _content_type="application/merge-patch+json",
        )
    except ApiException as exc:
        if exc.status == 404:
            raise PolicyNotFoundError(f"no {KIND} {name!r} in namespace {namespace!r}") from None
        raise _describe(exc, f"annotate {KIND} {namespace}/{name}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise _describe(exc, f"annotate {KIND} {namespace}/{name}") from None
    return value, _as_object(patched)


def list_policies(
    api: kubernetes.client.ApiClient, namespace: str | None, selector: str | None = None
) -> list[dict[str, Any]]:
    """Every KVOffloadPolicy of ``namespace`` (of every namespace when None), sorted by namespace and name."""
    objects = kubernetes.client.CustomObjectsApi(api)
    where = f"in namespace {namespace}" if namespace is not None else "in any namespace"
    options: dict[str, Any] = {"label_selector": selector} if selector else {}
    try:
        if namespace is None:
            found = objects.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, **options)
        else:
            found = objects.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, **options)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        raise _describe(exc, f"list {KIND}s {where}") from None
    items = [_as_object(item) for item in _as_object(found).get("items") or []]
    return sorted(items, key=lambda o: ((o.get("metadata") or {}).get("namespace", ""), o["metadata"].get("name", "")))


LISTS: dict[str, tuple[Callable[[kubernetes.client.ApiClient], Any], str]] = {
    "Deployment": (kubernetes.client.AppsV1Api, "list_namespaced_deployment"),
    "ReplicaSet": (kubernetes.client.AppsV1Api, "list_namespaced_replica_set"),
    "Pod": (kubernetes.client.CoreV1Api, "list_namespaced_pod"),
}
"""The kinds :func:`list_objects` lists: (the client's API class, its list method)."""


def list_objects(
    api: kubernetes.client.ApiClient,
    kind: str,
    namespace: str,
    label_selector: str | None = None,
    *,
    field_selector: str | None = None,
) -> list[dict[str, Any]]:
    """The objects of one kind in ``namespace`` that match the selectors, as the API server serves them (camelCase
    keys, as ``kubectl get -o json`` prints them, not the client's models)."""
    make, method = LISTS[kind]
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": READ_TIMEOUT}
    if label_selector:
        options["label_selector"] = label_selector
    if field_selector:
        options["field_selector"] = field_selector
    where = f"list {kind}s in namespace {namespace}"
    try:
        response = getattr(make(api), method)(namespace, **options)
        found = json.loads(response.data)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        raise _describe(exc, where) from None
    except ValueError as exc:
        raise ControlError(f"{where}: the API server answered with something not JSON: {exc}") from None
    return [_as_object(item) for item in _as_object(found).get("items") or []]


WATCH_WINDOW_S = 300
"""The longest one watch request lasts (the API server ends it then, and the next one resumes from the last
resourceVersion): a connection that died silently is found within this plus :data:`READ_GRACE_S`."""
READ_GRACE_S = 15
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT = (CONNECT_TIMEOUT_S, 30.0)
"""(connect, read) seconds for each plain read of the policy a watch makes."""
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Waits before reconnecting after the 1st, 2nd, ... failed request in a row (the last one repeats)."""
GONE = 410
FATAL = frozenset({401, 403, 404})
"""Answers no reconnect can change: unauthenticated, forbidden, or the resource not served."""


class PolicyWatch:
    """One policy followed through the Kubernetes watch API: the object as stored now, then each change.

    Iterating reads the policy (PolicyNotFoundError if there is none), yields it, then watches it from
    that resourceVersion with a field selector on its name, yielding every new version, until ``deadline``
    (a ``time.monotonic()`` instant; None: never). A stream the API server ends (at :data:`WATCH_WINDOW_S`
    or ``deadline``), a dropped connection or a 5xx answer is resumed from the last resourceVersion
    seen, after a backoff; a 410 Gone (that version was compacted away) reads the policy again and goes on
    from there. A deleted policy raises PolicyNotFoundError, and 401, 403 or 404 a ControlError.
    """

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        namespace: str,
        name: str,
        *,
        deadline: float | None = None,
        window_s: int = WATCH_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.deadline, self.window_s, self.clock, self.sleep = deadline, window_s, clock, sleep
        self.streams = 0
        """Watch requests opened so far (the first one, and every reconnect)."""
        self.relists = 0
        """Reads after a 410 Gone."""

    def _remaining(self) -> float:
        return math.inf if self.deadline is None else self.deadline - self.clock()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        current = read_policy(self.api, self.namespace, self.name, READ_TIMEOUT)
        yield current
        version = current["metadata"].get("resourceVersion")
        failures = 0
        objects = kubernetes.client.CustomObjectsApi(self.api)
        what = f"watch {KIND} {self.namespace}/{self.name}"
        while (remaining := self._remaining()) > 0:
            window = max(1, math.ceil(min(remaining, self.window_s)))
            self.streams += 1
            try:
                stream = kubernetes.watch.Watch().stream(  # type: ignore[no-untyped-call]
                    objects.list_namespaced_custom_object,
                    API_GROUP,
                    API_VERSION,
                    self.namespace,
                    PLURAL,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=window,
                    _request_timeout=(CONNECT_TIMEOUT_S, window + READ_GRACE_S),
                    deserialize=False,
                )
                for event in stream:
                    failures = 0
                    obj = _as_object(event.get("object"))
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    if event.get("type") == "BOOKMARK":
                        continue
                    if event.get("type") == "DELETED":
                        raise PolicyNotFoundError(f"{KIND} {self.namespace}/{self.name} was deleted")
                    yield obj
                    if self._remaining() <= 0:
                        return
                failures = 0  # the API server ended the stream: resume at once
            except ApiException as exc:
                if exc.status == GONE:
                    self.relists += 1
                    current = read_policy(self.api, self.namespace, self.name, READ_TIMEOUT)
                    version = current["metadata"].get("resourceVersion")
                    yield current
                    continue
                if exc.status in FATAL:
                    raise _describe(exc, what) from None
                failures += 1
            except (urllib3.exceptions.HTTPError, OSError):
                failures += 1
            if failures:
                self.sleep(max(0.0, min(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1], self._remaining())))

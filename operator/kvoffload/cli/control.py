"""Manual control of a policy through its annotations, and reading a policy, for the CLI.

``kvoffload promote|abort|retry|pause|resume NAME`` sets ``kvoffload.io/<verb>`` to a
new value with a merge patch; the operator acts on each new value once, at its next
cycle (``rollout.decide`` remembers the values it acted on in
``status.annotationsSeen``). Errors come out as :class:`ControlError` with a message
for people, never as a client traceback.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
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


def read_policy(api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The KVOffloadPolicy object as stored; PolicyNotFoundError if there is none."""
    objects = kubernetes.client.CustomObjectsApi(api)
    try:
        found = objects.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            raise PolicyNotFoundError(f"no {KIND} {name!r} in namespace {namespace!r}") from None
        raise _describe(exc, f"read {KIND} {namespace}/{name}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise _describe(exc, f"read {KIND} {namespace}/{name}") from None
    return _as_object(found)


def request(
    api: kubernetes.client.ApiClient, namespace: str, name: str, verb: str, now: datetime | None = None
) -> tuple[str, dict[str, Any]]:
    """Set the verb's annotation to a new value; return the value and the policy as stored after the patch.

    The value always differs from the one already there, so the operator acts on it once.
    """
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}; known: {', '.join(VERBS)}")
    key = VERBS[verb]
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

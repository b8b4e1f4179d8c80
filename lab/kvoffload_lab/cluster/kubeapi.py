"""A small async client for a real kube-apiserver: the lab's kubelet stand-in and its cluster speak through it.

aiohttp over TLS with the control plane's CA and a client certificate (the admin's). Paths are REST
paths (``/api/v1/pods``); answers are the server's JSON. Errors are :class:`KubeAPIError` with the
HTTP status and the server's message, so callers can tell a 404 or a 409 from a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

Obj = dict[str, Any]

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "kvoffload-lab"
"""The field manager of what the lab writes (its objects, the pods' status)."""

_PLURALS: dict[str, str] = {
    "Namespace": "namespaces",
    "Node": "nodes",
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Event": "events",
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
    "Lease": "leases",
    "PodMonitor": "podmonitors",
    "Prometheus": "prometheuses",
    "KVOffloadPolicy": "kvoffloadpolicies",
    "KVOffloadAnalysisTemplate": "kvoffloadanalysistemplates",
    "CustomResourceDefinition": "customresourcedefinitions",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}
_CLUSTER_SCOPED = frozenset(
    {"Namespace", "Node", "CustomResourceDefinition", "ValidatingWebhookConfiguration", "KVOffloadAnalysisTemplate"}
)


class KubeAPIError(RuntimeError):
    """A non-2xx answer: ``status`` is the HTTP status, the message the server's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def object_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    """The REST path of a kind's collection (``name`` None) or of one object."""
    plural = _PLURALS.get(kind)
    if plural is None:
        raise ValueError(f"the lab's client does not know the plural of {kind}")
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    if namespace is not None and kind not in _CLUSTER_SCOPED:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


def tls_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """Trust ``ca``; present ``cert``/``key`` (PEM files) as the client."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


class KubeAPI:
    """One aiohttp session on the API server at ``server`` (``https://127.0.0.1:PORT``)."""

    def __init__(self, server: str, tls: ssl.SSLContext) -> None:
        self.server = server.rstrip("/")
        self.tls = tls
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeAPI:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.tls), timeout=aiohttp.ClientTimeout(total=30)
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the API client is closed")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with self.session.request(
            method, f"{self.server}{path}", data=data, params=dict(params or {}), headers=headers
        ) as response:
            text = await response.text()
            if response.status >= 300:
                try:
                    message = json.loads(text).get("message", text)
                except (ValueError, AttributeError):
                    message = text
                raise KubeAPIError(response.status, f"{method} {path}: {message}")
            answer: Obj = json.loads(text) if text else {}
            return answer

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Obj | None:
        """The object or list at ``path``; None when it does not exist."""
        try:
            return await self.request("GET", path, params=params)
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise

    async def items(self, path: str, params: Mapping[str, str] | None = None) -> list[Obj]:
        """The items of a list (none when the kind is not served)."""
        listing = await self.get(path, params)
        return list((listing or {}).get("items") or [])

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        meta = obj.get("metadata") or {}
        return await self.request("POST", object_path(obj["apiVersion"], obj["kind"], meta.get("namespace")), body=obj)

    async def apply(self, obj: Mapping[str, Any], *, manager: str = FIELD_MANAGER) -> Obj:
        """Server-side apply (forced: the lab's objects are its own)."""
        meta = obj.get("metadata") or {}
        path = object_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return await self.request(
            "PATCH", path, body=obj, params={"fieldManager": manager, "force": "true"}, content_type=APPLY_PATCH
        )

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Obj:
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def delete(self, path: str, *, grace_seconds: int | None = None, uid: str | None = None) -> bool:
        """Delete; False when it was already gone (or ``uid`` no longer names it)."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path, body=options)
        except KubeAPIError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def watch(self, path: str, params: Mapping[str, str] | None = None) -> AsyncIterator[Obj]:
        """The watch events of a collection from now on (list first for the resourceVersion); ends when
        the server closes the stream."""
        listing = await self.request("GET", path, params=params)
        query = {
            **dict(params or {}),
            "watch": "true",
            "resourceVersion": listing["metadata"]["resourceVersion"],
            "timeoutSeconds": "300",
            "allowWatchBookmarks": "false",
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(f"{self.server}{path}", params=query, timeout=timeout) as response:
            if response.status >= 300:
                raise KubeAPIError(response.status, f"watch {path}: {await response.text()}")
            async for line in response.content:
                if line.strip():
                    with contextlib.suppress(ValueError):
                        event: Obj = json.loads(line)
                        yield event


async def wake_on_changes(
    api: KubeAPI, path: str, wake: asyncio.Event, params: Mapping[str, str] | None = None
) -> None:
    """Set ``wake`` on every change of a collection, forever (reconnecting when the stream ends or fails)."""
    while True:
        try:
            async for _event in api.watch(path, params):
                wake.set()
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, KubeAPIError, KeyError, TimeoutError, OSError):
            await asyncio.sleep(0.5)  # the server is restarting or stopping: retry shortly
        wake.set()  # events may have been missed between streams


__all__ = (
    "FIELD_MANAGER",
    "KubeAPI",
    "KubeAPIError",
    "Obj",
    "object_path",
    "tls_context",
    "wake_on_changes",
)

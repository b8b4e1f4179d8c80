"""An emulated Kubernetes API server, for the tests and for ``kvoffload demo``.

It is kmock's ``KubernetesEmulator`` with the API-server semantics that kopf and the
operator rely on and that kmock 0.8 lacks:

- server-managed metadata: uid, resourceVersion (one cluster-wide counter),
  creationTimestamp, generation (bumped only when something besides metadata and
  status changes), apiVersion/kind defaulting, generateName;
- list with a real resourceVersion, label and field selectors; watch from a
  resourceVersion with no lost events (a change log, replayed then followed live),
  selectors, ``timeoutSeconds``, ``sendInitialEvents``, 410 Gone for a pruned version,
  served as ``application/json`` (client-go refuses a watch of another type);
- PUT; merge, JSON and (approximate) strategic-merge patches; 422 when a JSON-patch
  ``test`` fails; 409 on a stale ``metadata.resourceVersion``;
- a minimal server-side apply (:func:`apply_configuration`): upsert, the applied fields
  merged in, and the fields a manager applied before but no longer applies removed; see
  that function for what it does not do (field ownership, conflicts, ``force``);
- the status subresource changes only ``.status``, the main resource never does;
- finalizers (deletionTimestamp while any remain), and the garbage collector:
  deleting an object deletes the dependents whose ownerReferences name its uid;
- posting a CRD registers its resource, and a default its schema gives ``status`` is what an
  object without a status reads as (the API server defaults it on every read);
- the core group's discovery names its version ``v1`` (kmock says ``/v1``, which client-go,
  hence Helm, cannot map).

A request that a user-defined kmock reaction answers does not change the state,
unlike in kmock itself: the emulator's own handling lives in its fallback reactions.
Tests inject API failures with :meth:`KubeEmulator.fail_next`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import dataclasses
import datetime
import json
import re
import secrets
import string
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import kmock
import yaml
from kmock import Response  # type: ignore[attr-defined]  # exported, though not in __all__

Obj = dict[str, Any]
Key = tuple[kmock.resource, str | None, str]

ALL_VERBS = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})

# Resources every emulated cluster serves: (kind, namespaced, subresources).
BUILTIN_RESOURCES: dict[str, tuple[str, bool, frozenset[str]]] = {
    "v1/namespaces": ("Namespace", False, frozenset({"status"})),
    "v1/pods": ("Pod", True, frozenset({"status"})),
    "v1/services": ("Service", True, frozenset({"status"})),
    "v1/configmaps": ("ConfigMap", True, frozenset()),
    "v1/secrets": ("Secret", True, frozenset()),
    "v1/events": ("Event", True, frozenset()),
    "events.k8s.io/v1/events": ("Event", True, frozenset()),
    "apps/v1/deployments": ("Deployment", True, frozenset({"status"})),
    "apps/v1/replicasets": ("ReplicaSet", True, frozenset({"status"})),
    "coordination.k8s.io/v1/leases": ("Lease", True, frozenset()),
    "monitoring.coreos.com/v1/podmonitors": ("PodMonitor", True, frozenset()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, frozenset({"status"})),
}
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
BUILTIN_GROUPS = frozenset({"", "apps", "events.k8s.io", "coordination.k8s.io", "apiextensions.k8s.io"})

# Server-managed metadata that a write request cannot change.
_SERVER_FIELDS = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
    "name",
    "namespace",
    "generateName",
)
_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
# List items merged by key in a strategic-merge patch (the common cases of the built-in types).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
}
_MERGE_SETS = frozenset({"finalizers"})


def api_error(status: int, message: str, *, reason: str | None = None, **details: Any) -> kmock.KubernetesError:
    """An error answered as a Kubernetes ``Status`` object."""
    return kmock.KubernetesError(
        status=status, reason=reason or _REASONS.get(status, "Unknown"), message=message, details=details
    )


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_version_of(res: kmock.resource) -> str:
    return f"{res.group}/{res.version}" if res.group else str(res.version)


# --- selectors ---------------------------------------------------------------------------

_LABEL_TERM = re.compile(
    r"^(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?$"
)


def _split_terms(selector: str) -> list[str]:
    """Split on the commas that are not inside ``in (a, b)`` parentheses."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    terms.append("".join(current).strip())
    return [term for term in terms if term]


def label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Compile a Kubernetes label selector (equality- and set-based) into a predicate."""
    requirements: list[tuple[str, str, frozenset[str]]] = []  # (operator, key, values)
    for term in _split_terms(selector):
        match = _LABEL_TERM.match(term)
        if not match or (match["neg"] and (match["op"] or match["setop"])):
            raise api_error(400, f"unable to parse requirement: {term!r}")
        if match["setop"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append((match["setop"], match["key"], values))
        elif match["op"]:
            requirements.append(("!=" if match["op"] == "!=" else "=", match["key"], frozenset({match["value"]})))
        else:
            requirements.append(("!exists" if match["neg"] else "exists", match["key"], frozenset()))

    def matches(labels: Mapping[str, str]) -> bool:
        for operator, key, values in requirements:
            value = labels.get(key)
            satisfied = {
                "=": value in values,
                "in": value in values,
                "!=": value not in values,
                "notin": value not in values,
                "exists": key in labels,
                "!exists": key not in labels,
            }[operator]
            if not satisfied:
                return False
        return True

    return matches


def field_selector(selector: str) -> Callable[[Obj], bool]:
    """Compile a field selector (``a.b=v``, ``a.b==v``, ``a.b!=v``) into a predicate on objects."""
    requirements: list[tuple[list[str], bool, str]] = []  # (path, equal, value)
    for term in _split_terms(selector):
        match = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", term)
        if not match:
            raise api_error(400, f"invalid field selector: {term!r}")
        path, op, value = match.groups()
        requirements.append((path.split("."), op != "!=", value))

    def lookup(obj: Obj, path: list[str]) -> str:
        node: Any = obj
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        return "" if node is None else str(node)

    def matches(obj: Obj) -> bool:
        return all((lookup(obj, path) == value) == equal for path, equal, value in requirements)

    return matches


@dataclasses.dataclass(frozen=True)
class _Filter:
    """What a list or watch request selects: resource, namespace (None: all), selectors."""

    resource: kmock.resource
    namespace: str | None
    labels: Callable[[Mapping[str, str]], bool]
    fields: Callable[[Obj], bool]

    @classmethod
    def of(cls, request: kmock.Request) -> _Filter:
        assert request.resource is not None
        params = request.params
        labels = label_selector(params.get("labelSelector", ""))
        fields = field_selector(params.get("fieldSelector", ""))
        return cls(request.resource, request.namespace, labels, fields)

    def selects(self, key: Key, obj: Obj | None) -> bool:
        res, namespace, _ = key
        if obj is None or res != self.resource:
            return False
        if self.namespace is not None and namespace != self.namespace:
            return False
        return self.labels(obj.get("metadata", {}).get("labels") or {}) and self.fields(obj)


# --- patches -----------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str | None = None) -> Any:
    """An approximation of the strategic merge patch of the built-in types.

    Like a merge patch, except that the usual keyed lists (containers, env, volumes,
    conditions, ownerReferences, ...) merge item by key and finalizers merge as a set.
    ``$patch`` directives are not emulated.
    """
    if isinstance(patch, Mapping):
        result = dict(target) if isinstance(target, Mapping) else {}
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, key)
        return result
    if isinstance(patch, list) and isinstance(target, list):
        if field in _MERGE_SETS:
            return list(target) + [item for item in patch if item not in target]
        merge_key = _MERGE_KEYS.get(field or "")
        if merge_key and all(isinstance(item, Mapping) and merge_key in item for item in [*target, *patch]):
            merged = {item[merge_key]: item for item in target}
            for item in patch:
                merged[item[merge_key]] = strategic_merge_patch(merged.get(item[merge_key]), item)
            return list(merged.values())
    return copy.deepcopy(patch)


def apply_patch(obj: Obj, patch: Any, content_type: str, *, builtin: bool) -> Obj:
    """Apply a PATCH body of the given content type, as the API server does, or raise its error."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/json-patch+json":
        if not isinstance(patch, list):
            raise api_error(400, "a JSON patch must be a list of operations")
        try:
            return jsonpatch.apply_patch(obj, patch, in_place=False)  # type: ignore[no-any-return]
        except jsonpatch.JsonPatchTestFailed as exc:
            raise api_error(422, f"the server rejected our request due to an error in our request: {exc}") from exc
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise api_error(422, f"the server rejected our request due to an error in our request: {exc}") from exc
    if not isinstance(patch, Mapping):
        raise api_error(400, f"a {kind} body must be an object")
    if kind == "application/merge-patch+json":
        return merge_patch(obj, patch)  # type: ignore[no-any-return]
    if kind == "application/strategic-merge-patch+json":
        if not builtin:
            raise api_error(415, "strategic merge patch is not supported for custom resources")
        return strategic_merge_patch(obj, patch)  # type: ignore[no-any-return]
    raise api_error(415, f"the emulator does not serve patches of type {kind!r}")


APPLY_PATCH = "application/apply-patch+yaml"


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _keyed(field: str | None, *lists: Any, builtin: bool) -> str | None:
    """The merge key of a list field, when every item of ``lists`` has it (built-in types only)."""
    key = _MERGE_KEYS.get(field or "") if builtin else None
    if key and all(isinstance(item, Mapping) and key in item for items in lists for item in items):
        return key
    return None


_ABSENT: Any = object()
"""A field a configuration does not set, or a value of which nothing is left."""


def _unapply(live: Any, previous: Any, config: Any, *, builtin: bool, field: str | None = None) -> Any:
    """What is left of ``live`` once what ``previous`` (a manager's last applied configuration) set and
    ``config`` (its new one; :data:`_ABSENT` when it does not set the field) no longer sets is removed:
    map keys, items of keyed lists and of finalizers. :data:`_ABSENT` when nothing is left."""
    if isinstance(previous, Mapping) and isinstance(live, Mapping):
        wanted = config if isinstance(config, Mapping) else {}
        out = dict(live)
        for key, before in previous.items():
            if key in out:
                rest = _unapply(out[key], before, wanted.get(key, _ABSENT), builtin=builtin, field=key)
                if rest is _ABSENT:
                    del out[key]
                else:
                    out[key] = rest
        return _ABSENT if config is _ABSENT and not out else out
    if isinstance(previous, list) and isinstance(live, list):
        wanted_items = config if isinstance(config, list) else []
        key = _keyed(field, live, previous, wanted_items, builtin=builtin)
        if builtin and field in _MERGE_SETS:
            items = [item for item in live if item not in previous or item in wanted_items]
        elif key is not None:
            before_by_key = {item[key]: item for item in previous}
            wanted_by_key = {item[key]: item for item in wanted_items}
            items = []
            for item in live:
                if item[key] in before_by_key:
                    if item[key] not in wanted_by_key:
                        continue  # the whole item goes, whatever others set in it
                    item = _unapply(item, before_by_key[item[key]], wanted_by_key[item[key]], builtin=builtin)
                items.append(item)
        else:
            return _ABSENT if config is _ABSENT else live  # an atomic list: whole, or replaced by the config
        return _ABSENT if config is _ABSENT and not items else items
    return _ABSENT if config is _ABSENT else live


def _apply_merge(live: Any, config: Any, *, builtin: bool, field: str | None = None) -> Any:
    """The configuration merged into ``live``: maps key by key, keyed lists item by item, the rest replaced."""
    if isinstance(config, Mapping):
        out = dict(live) if isinstance(live, Mapping) else {}
        for key, value in config.items():
            out[key] = _apply_merge(out.get(key), value, builtin=builtin, field=key)
        return out
    if isinstance(config, list) and isinstance(live, list):
        if builtin and field in _MERGE_SETS:
            return list(live) + [item for item in config if item not in live]
        key = _keyed(field, live, config, builtin=builtin)
        if key is not None:
            merged = {item[key]: item for item in live}
            for item in config:
                merged[item[key]] = _apply_merge(merged.get(item[key]), item, builtin=builtin)
            return list(merged.values())
    return copy.deepcopy(config)


def apply_configuration(live: Obj, previous: Obj | None, config: Obj, *, builtin: bool) -> Obj:
    """A minimal server-side apply: what ``live`` becomes when a field manager applies ``config``,
    having applied ``previous`` (None: never) before.

    What it does, as the API server does for one manager: the fields ``config`` sets are merged
    into the object (maps key by key; for the built-in types the keyed lists of
    :data:`_MERGE_KEYS` item by item and finalizers as a set; other lists replaced whole), and
    the fields that ``previous`` set and ``config`` no longer sets are removed.

    What it does not do: it keeps no per-field ownership (``metadata.managedFields`` is not
    written), so it never reports a conflict with another manager, ``force`` changes nothing,
    and a field that this manager stops applying is removed even when another manager set
    the same value too (the API server would keep such a shared field). Nulls in ``config``
    are ignored.
    """
    config = _drop_nulls(config)
    base = _unapply(live, previous, config, builtin=builtin) if previous is not None else live
    merged: Obj = _apply_merge({} if base is _ABSENT else base, config, builtin=builtin)
    return merged


# --- the emulator ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Change:
    """One committed change: what watchers replay from a resourceVersion on."""

    revision: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    obj: Obj
    old: Obj | None


@dataclasses.dataclass
class _Fault:
    status: int
    method: str | None
    plural: str | None
    name: str | None
    subresource: str | None
    times: int
    message: str

    def matches(self, request: kmock.Request) -> bool:
        assert request.resource is not None
        return (
            (self.method is None or request.method.value == self.method.upper())
            and (self.plural is None or request.resource.plural == self.plural)
            and (self.name is None or request.name == self.name)
            and (self.subresource is None or request.subresource == self.subresource)
        )


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with the API-server semantics kopf and kvoffload need.

    Serve it with ``kmock.Server(emulator)`` (see :func:`serve`). The in-process helpers
    (:meth:`create_object`, :meth:`patch_object`, :meth:`delete_object`, :meth:`read_object`)
    go through the same code as HTTP requests, for the tests and the demo that play the
    kubelet or a controller. kmock's own ``get``/``patch``/``delete`` stay HTTP clients.
    """

    history_limit: int = 10_000  # changes kept for watch resumption; older versions get 410 Gone
    object_history_limit: int = 100  # versions kept per object in ``objects[...].history``

    _revision: int = attrs.field(default=0, init=False)
    _changes: list[_Change] = attrs.field(factory=list, init=False)
    _pruned_up_to: int = attrs.field(default=0, init=False)
    _cond: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _faults: list[_Fault] = attrs.field(factory=list, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _status_defaults: dict[kmock.resource, Obj] = attrs.field(factory=dict, init=False)
    # uid -> field manager -> the configuration it last applied (server-side apply).
    _applied: dict[str, dict[str, Obj]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_replace
        for path, (kind, namespaced, subresources) in BUILTIN_RESOURCES.items():
            self.register(path, kind=kind, namespaced=namespaced, subresources=subresources)

    # --- configuration -------------------------------------------------------------------

    def register(
        self,
        path: str,
        *,
        kind: str,
        namespaced: bool = True,
        subresources: frozenset[str] | set[str] = frozenset(),
        singular: str | None = None,
        shortnames: frozenset[str] | set[str] = frozenset(),
    ) -> kmock.resource:
        """Serve a resource, e.g. ``register('kvoffload.io/v1alpha1/kvoffloadpolicies', kind=...)``."""
        res = kmock.resource(path)
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            subresources=set(subresources),
            singular=singular or kind.lower(),
            shortnames=set(shortnames),
            verbs=set(ALL_VERBS),
        )
        return res

    def register_crd(self, crd: Mapping[str, Any]) -> list[kmock.resource]:
        """Serve every served version of a CustomResourceDefinition."""
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        registered = []
        for version in spec.get("versions", []):
            if version.get("served", True):
                res = self.register(
                    f"{spec['group']}/{version['name']}/{names['plural']}",
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    subresources=set(version.get("subresources", {})),
                    singular=names.get("singular"),
                    shortnames=set(names.get("shortNames", [])),
                )
                schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
                status_default = ((schema.get("properties") or {}).get("status") or {}).get("default")
                if isinstance(status_default, Mapping):
                    self._status_defaults[res] = dict(status_default)
                registered.append(res)
        return registered

    def fail_next(
        self,
        status: int,
        *,
        method: str | None = None,
        plural: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        times: int = 1,
        message: str = "injected by the test",
    ) -> None:
        """Answer the next ``times`` matching resource requests with an error, changing nothing."""
        self._faults.append(_Fault(status, method, plural, name, subresource, times, message))

    def resource_for(self, api_version: str, kind: str) -> kmock.resource:
        """The served resource of an apiVersion and kind, e.g. ('apps/v1', 'Deployment')."""
        group, _, version = api_version.rpartition("/")
        for res in self.resources:
            if res.group == group and res.version == version and self.resources[res].kind == kind:
                return res
        raise LookupError(f"{api_version} {kind} is not served by the emulator")

    @property
    def revision(self) -> int:
        """The latest resourceVersion of the cluster."""
        return self._revision

    async def close_watches(self) -> None:
        """End every open watch stream (before stopping the server, which would wait for them)."""
        async with self._cond:
            self._closing = True
            self._cond.notify_all()

    # --- in-process access (same semantics as over HTTP) ---------------------------------

    def read_object(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        """The current state of an object, or None."""
        res = self.resource_for(api_version, kind)
        current = self._current((res, namespace, name))
        return copy.deepcopy(current) if current is not None else None

    async def create_object(self, obj: Mapping[str, Any]) -> Obj:
        """Create an object from a full manifest (apiVersion, kind, metadata)."""
        res = self.resource_for(obj["apiVersion"], obj["kind"])
        async with self._cond:
            return copy.deepcopy(self._create(res, obj.get("metadata", {}).get("namespace"), dict(obj)))

    async def patch_object(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> Obj:
        """Merge-patch an object (or its status with ``subresource='status'``)."""
        res = self.resource_for(api_version, kind)
        key = (res, namespace, name)
        async with self._cond:
            old = self._existing(key)
            new = merge_patch(old, patch)
            return copy.deepcopy(self._update(key, old, new, subresource, expected_rv=None))

    async def delete_object(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete an object as ``DELETE`` does (finalizers honoured, dependents collected)."""
        res = self.resource_for(api_version, kind)
        async with self._cond:
            return copy.deepcopy(self._delete((res, namespace, name), {}))

    # --- HTTP dispatch -------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.resource.plural is not None:
            for fault in self._faults:
                if fault.matches(request):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    raise api_error(fault.status, fault.message)
        # kmock's emulator writes before dispatching, with plain dict merging; here the
        # writes happen in the fallback reactions below, so skip to the plain dispatcher.
        return await kmock.RawHandler._handle(self, request)

    async def _serve_version(self, request: kmock.Request) -> Any:
        # kmock names the core group's version "/v1"; client-go's REST mapper keys resources by
        # that string and then finds no ConfigMap in "v1" (Helm: "no matches for kind").
        body = await super()._serve_version(request)
        if request.resource is not None and request.resource.group == "" and isinstance(body, dict):
            body["groupVersion"] = request.resource.version
        return body

    def _info(self, request: kmock.Request) -> kmock.ResourceInfo:
        res = request.resource
        if res is None or res.plural is None or res not in self.resources:
            raise api_error(404, f"the server could not find the requested resource ({request.url.path})")
        if request.subresource not in (None, *self.resources[res].subresources):
            raise api_error(404, f"{res.plural} has no subresource {request.subresource!r}")
        return self.resources[res]

    async def _serve_list(self, request: kmock.Request) -> Obj:
        info = self._info(request)
        selection = _Filter.of(request)
        async with self._cond:
            items = [obj for key, obj in self._live() if selection.selects(key, obj)]
            revision = self._revision
        assert request.resource is not None
        return {
            "apiVersion": api_version_of(request.resource),
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(revision)},
            "items": copy.deepcopy(items),
        }

    async def _serve_fetch(self, request: kmock.Request) -> Obj:
        self._info(request)
        assert request.resource is not None
        assert request.name is not None
        async with self._cond:
            return copy.deepcopy(self._existing((request.resource, request.namespace, request.name)))

    async def _serve_create(self, request: kmock.Request) -> Response:
        self._info(request)
        if request.subresource is not None or not isinstance(request.data, Mapping):
            raise api_error(400, "a create request needs an object body and no subresource")
        assert request.resource is not None
        async with self._cond:
            created = self._create(request.resource, request.namespace, dict(request.data))
        return Response(status=201, payload=copy.deepcopy(created))

    async def _serve_update(self, request: kmock.Request) -> Response:
        # Always a Response with its status: kmock 0.8 keeps the status of a Response a reaction
        # once returned (the 201 of an apply that created) for every later answer of that reaction.
        self._info(request)
        assert request.resource is not None
        assert request.name is not None
        content_type = {k.lower(): v for k, v in request.headers.items()}.get("content-type", "")
        if content_type.split(";")[0].strip().lower() == APPLY_PATCH:
            return await self._serve_apply(request)
        key = (request.resource, request.namespace, request.name)
        async with self._cond:
            old = self._existing(key)
            new = apply_patch(old, request.data, content_type, builtin=request.resource.group in BUILTIN_GROUPS)
            expected = None
            if isinstance(request.data, Mapping):
                expected = (request.data.get("metadata") or {}).get("resourceVersion")
            updated = self._update(key, old, new, request.subresource, expected_rv=expected)
        return Response(status=200, payload=copy.deepcopy(updated))

    async def _serve_apply(self, request: kmock.Request) -> Response:
        """Server-side apply (``PATCH`` with ``application/apply-patch+yaml``): see :func:`apply_configuration`."""
        assert request.resource is not None
        assert request.name is not None
        info = self.resources[request.resource]
        manager = request.params.get("fieldManager", "")
        if not manager:
            raise api_error(
                422, 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
            )
        config = request.data
        if config is None:  # YAML rather than JSON
            try:
                config = yaml.safe_load(request.text or "")
            except yaml.YAMLError as exc:
                raise api_error(400, f"error decoding YAML: {exc}") from exc
        if not isinstance(config, Mapping):
            raise api_error(400, "error decoding patch: an apply configuration must be an object")
        config = dict(config)
        if config.get("apiVersion") != api_version_of(request.resource) or config.get("kind") != info.kind:
            raise api_error(400, f"invalid object type: {config.get('apiVersion', '/')}, Kind={config.get('kind', '')}")
        meta = config.get("metadata") or {}
        if meta.get("name") != request.name:
            raise api_error(
                400, f"the name of the object ({meta.get('name')}) does not match the name on the URL ({request.name})"
            )
        key = (request.resource, request.namespace, request.name)
        builtin = request.resource.group in BUILTIN_GROUPS
        async with self._cond:
            old = self._current(key)
            if old is None:
                if request.subresource is not None:
                    raise api_error(404, f'{request.resource.plural} "{request.name}" not found', name=request.name)
                if meta.get("uid"):
                    raise api_error(
                        409,
                        f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": uid mismatch: '
                        f"the provided object specified uid {meta['uid']}, and no existing object was found",
                    )
                config = _without_preconditions(config)
                created = self._create(
                    request.resource, request.namespace, apply_configuration({}, None, config, builtin=builtin)
                )
                self._applied[created["metadata"]["uid"]] = {f"{manager}/": config}
                return Response(status=201, payload=copy.deepcopy(created))
            old_meta = old.get("metadata", {})
            if meta.get("uid") not in (None, old_meta.get("uid")):
                raise api_error(
                    422,
                    f'{info.kind} "{request.name}" is invalid: metadata.uid: Invalid value: "{meta["uid"]}": '
                    "field is immutable",
                )
            applied = self._applied.setdefault(old_meta.get("uid", ""), {})
            previous_key = f"{manager}/{request.subresource or ''}"
            config = _without_preconditions(config)
            new = apply_configuration(old, applied.get(previous_key), config, builtin=builtin)
            updated = self._update(key, old, new, request.subresource, expected_rv=meta.get("resourceVersion"))
            applied[previous_key] = config
        return Response(status=200, payload=copy.deepcopy(updated))

    async def _serve_replace(self, request: kmock.Request) -> Obj:
        self._info(request)
        if request.name is None or not isinstance(request.data, Mapping):
            raise api_error(405, "PUT needs an object URL and an object body")
        assert request.resource is not None
        body = dict(request.data)
        body_name = (body.get("metadata") or {}).get("name")
        if body_name not in (None, request.name):
            raise api_error(400, f"the name of the object ({body_name}) does not match the name on the URL")
        key = (request.resource, request.namespace, request.name)
        async with self._cond:
            old = self._existing(key)
            expected = (body.get("metadata") or {}).get("resourceVersion") or None
            return copy.deepcopy(self._update(key, old, body, request.subresource, expected_rv=expected))

    async def _serve_delete(self, request: kmock.Request) -> Obj:
        self._info(request)
        assert request.resource is not None
        assert request.name is not None
        options = dict(request.data) if isinstance(request.data, Mapping) else {}
        if "propagationPolicy" in request.params:
            options["propagationPolicy"] = request.params["propagationPolicy"]
        async with self._cond:
            return copy.deepcopy(self._delete((request.resource, request.namespace, request.name), options))

    async def _serve_watch(self, request: kmock.Request) -> Response:  # type: ignore[override]  # kmock renders both
        # A stream that says it is JSON: client-go (so Helm's status watcher) picks its decoder by
        # the Content-Type and refuses aiohttp's default application/octet-stream.
        self._info(request)
        return Response(headers={"Content-Type": "application/json"}, payload=self._watch_events(request))

    async def _watch_events(self, request: kmock.Request) -> AsyncIterator[Any]:
        assert request.resource is not None
        selection = _Filter.of(request)
        params = request.params
        since = params.get("resourceVersion", "")
        loop = asyncio.get_running_loop()
        timeout = params.get("timeoutSeconds")
        deadline = loop.time() + float(timeout) if timeout else None
        if since not in ("", "0") and not since.isdigit():
            raise api_error(400, f"invalid resourceVersion {since!r}")

        initial: list[Obj] = []
        async with self._cond:
            if since in ("", "0"):
                initial = copy.deepcopy([obj for key, obj in self._live() if selection.selects(key, obj)])
                cursor = self._revision
            else:
                cursor = int(since) if int(since) >= self._pruned_up_to else -1
        yield b""  # send the headers now, even if nothing happens for a while
        if cursor < 0:
            yield {"type": "ERROR", "object": self._status(410, f"too old resource version: {since}")}
            return
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        if params.get("sendInitialEvents") == "true":
            yield {"type": "BOOKMARK", "object": self._bookmark(request.resource, cursor, initial_end=True)}

        while not self._closing and (deadline is None or loop.time() < deadline):
            async with self._cond:
                start = bisect.bisect_right(self._changes, cursor, key=lambda change: change.revision)
                batch = self._changes[start:]
                if not batch and not self._closing:
                    # asyncio.timeout, never wait_for: on 3.11, wait_for cancelled after its own timeout leaves
                    # Condition.wait retaking the lock in an orphaned task, and this block then releases a lock
                    # it does not hold; the orphan keeps it for ever, and every write waits (issue 39).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            await self._cond.wait()
            for change in batch:
                cursor = change.revision
                event = self._event_for(selection, change)
                if event is not None:
                    yield event
            if self._disconnected(request):
                return

    # --- state ---------------------------------------------------------------------------

    def _live(self) -> Iterator[tuple[Key, Obj]]:
        for key, obj in self._objects.items():
            if not obj.deleted:
                yield key, obj.raw

    def _current(self, key: Key) -> Obj | None:
        if key not in self._objects or self._objects[key].deleted:
            return None
        return self._objects[key].raw

    def _existing(self, key: Key) -> Obj:
        current = self._current(key)
        if current is None:
            res, _, name = key
            raise api_error(404, f'{res.plural} "{name}" not found', name=name, kind=res.plural)
        return current

    def _commit(self, type_: str, key: Key, obj: Obj | None, old: Obj | None) -> Obj:
        """Store a new state (None: removed) under the next resourceVersion and wake the watchers."""
        self._revision += 1
        final = copy.deepcopy(obj if obj is not None else old)
        assert final is not None
        final.setdefault("metadata", {})["resourceVersion"] = str(self._revision)
        if obj is None:
            self._objects[key].delete()
        elif key in self._objects:
            history = self._objects[key].history
            history.append(final)
            if len(history) > self.object_history_limit:
                del history[: len(history) - self.object_history_limit]
        else:
            self._objects[key] = final
        self._changes.append(_Change(self._revision, type_, key, final, old))
        if len(self._changes) > self.history_limit:
            dropped = self._changes[: len(self._changes) - self.history_limit]
            del self._changes[: len(dropped)]
            self._pruned_up_to = dropped[-1].revision
        self._cond.notify_all()
        return final

    def _create(self, res: kmock.resource, namespace: str | None, body: Obj) -> Obj:
        info = self.resources[res]
        meta = dict(body.get("metadata") or {})
        if info.namespaced:
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise api_error(400, "a namespaced object needs a namespace")
            if meta.get("namespace") not in (None, namespace):
                raise api_error(400, "the namespace of the object does not match the namespace on the request")
            meta["namespace"] = namespace
        else:
            namespace = None
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise api_error(422, "metadata.name or metadata.generateName is required")
            suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
            meta["name"] = meta["generateName"] + suffix
        key = (res, namespace, meta["name"])
        if self._current(key) is not None:
            raise api_error(409, f'{res.plural} "{meta["name"]}" already exists', reason="AlreadyExists")
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(server_field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        _drop_empty(meta)
        obj = {**body, "apiVersion": api_version_of(res), "kind": info.kind, "metadata": meta}
        if "status" in info.subresources:
            obj.pop("status", None)  # set through the status subresource only
        if "status" not in obj and res in self._status_defaults:
            obj["status"] = copy.deepcopy(self._status_defaults[res])  # what every read would show
        created = self._commit("ADDED", key, obj, None)
        if res == CRDS:
            self.register_crd(created)
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if owners and not owners & {o.get("metadata", {}).get("uid") for _, o in self._live()}:
            # Kubernetes' garbage collector deletes a dependent whose owners are all gone, e.g. a
            # pod a controller made from a stale read of a Deployment that was deleted meanwhile.
            self._delete(key, {"propagationPolicy": "Background"})
        return created

    def _update(self, key: Key, old: Obj, proposed: Obj, subresource: str | None, expected_rv: str | None) -> Obj:
        old_meta = old.get("metadata", {})
        if expected_rv is not None and str(expected_rv) != old_meta.get("resourceVersion"):
            res, _, name = key
            raise api_error(
                409,
                f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        proposed_uid = (proposed.get("metadata") or {}).get("uid")
        if proposed_uid not in (None, old_meta.get("uid")):
            raise api_error(
                409,
                f"Precondition failed: UID in precondition: {proposed_uid}, UID in object meta: {old_meta.get('uid')}",
            )
        info = self.resources[key[0]]
        if subresource == "status":
            new = {k: v for k, v in old.items() if k != "status"}
            if proposed.get("status") is not None:
                new["status"] = proposed["status"]
            elif key[0] in self._status_defaults:
                new["status"] = copy.deepcopy(self._status_defaults[key[0]])
        else:
            new = {k: v for k, v in proposed.items() if k != "status" or "status" not in info.subresources}
            if "status" in info.subresources and "status" in old:
                new["status"] = old["status"]
        meta = dict(new.get("metadata") or {})
        for server_field in _SERVER_FIELDS:
            meta.pop(server_field, None)
            if server_field in old_meta:
                meta[server_field] = old_meta[server_field]
        _drop_empty(meta)
        new["metadata"] = meta
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if _spec_of(new) != _spec_of(old):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        if new == old:
            return old  # a no-op write changes nothing, as on a real API server
        updated = self._commit("MODIFIED", key, new, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(key, updated, propagation="Background")
        return updated

    def _delete(self, key: Key, options: Mapping[str, Any]) -> Obj:
        current = self._existing(key)
        meta = current.get("metadata", {})
        preconditions = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if preconditions.get(field_name) not in (None, meta.get(field_name)):
                raise api_error(409, f"precondition failed: {field_name} does not match")
        if meta.get("deletionTimestamp"):
            return current  # already terminating: waiting for its finalizers
        propagation = options.get("propagationPolicy") or "Background"
        if meta.get("finalizers"):
            marked = {**current, "metadata": {**meta, "deletionTimestamp": now_rfc3339()}}
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._commit("MODIFIED", key, marked, current)
        return self._remove(key, current, propagation=propagation)

    def _remove(self, key: Key, current: Obj, *, propagation: str) -> Obj:
        """Remove an object, then collect its dependents as Kubernetes' garbage collector does."""
        uid = current.get("metadata", {}).get("uid")
        removed = self._commit("DELETED", key, None, current)
        self._applied.pop(uid or "", None)
        live_uids = {obj.get("metadata", {}).get("uid") for _, obj in self._live()}
        for dep_key in [k for k, _ in self._live()]:
            dep = self._current(dep_key)  # re-read: collecting one dependent may have changed another
            refs = (dep or {}).get("metadata", {}).get("ownerReferences") or []
            if dep is None or uid is None or not any(ref.get("uid") == uid for ref in refs):
                continue
            rest = [ref for ref in refs if ref.get("uid") != uid]
            if propagation == "Orphan" or any(ref.get("uid") in live_uids for ref in rest):
                orphaned = {**dep, "metadata": {**dep["metadata"], "ownerReferences": rest}}
                if not rest:
                    del orphaned["metadata"]["ownerReferences"]
                self._commit("MODIFIED", dep_key, orphaned, dep)
            else:
                self._delete(dep_key, {"propagationPolicy": "Background"})
        return removed

    # --- watch events --------------------------------------------------------------------

    def _event_for(self, selection: _Filter, change: _Change) -> Obj | None:
        """The event a watcher with this selection sees, as objects enter and leave it."""
        now_in = selection.selects(change.key, change.obj)
        was_in = selection.selects(change.key, change.old)
        if change.type == "ADDED":
            type_ = "ADDED" if now_in else None
        elif change.type == "DELETED":
            type_ = "DELETED" if was_in or now_in else None
        elif now_in and was_in:
            type_ = "MODIFIED"
        else:
            type_ = "ADDED" if now_in else "DELETED" if was_in else None
        return {"type": type_, "object": change.obj} if type_ else None

    def _bookmark(self, res: kmock.resource, revision: int, *, initial_end: bool) -> Obj:
        meta: Obj = {"resourceVersion": str(revision)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"apiVersion": api_version_of(res), "kind": self.resources[res].kind, "metadata": meta}

    @staticmethod
    def _status(code: int, message: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": code,
            "reason": _REASONS.get(code, "Unknown"),
            "message": message,
        }

    @staticmethod
    def _disconnected(request: kmock.Request) -> bool:
        raw = request._raw_request
        return raw is not None and (raw.transport is None or raw.transport.is_closing())


def _drop_empty(meta: Obj) -> None:
    """Empty metadata maps and lists are absent on a real server (Go's omitempty)."""
    for key in ("labels", "annotations", "finalizers", "ownerReferences"):
        if key in meta and not meta[key]:
            del meta[key]


def _without_preconditions(config: Obj) -> Obj:
    """An apply configuration without the metadata that is a precondition (uid, resourceVersion) or the
    server's, not a field to apply."""
    meta = {k: v for k, v in (config.get("metadata") or {}).items() if k not in (*_SERVER_FIELDS, "managedFields")}
    meta.update({k: config["metadata"][k] for k in ("name", "namespace") if k in (config.get("metadata") or {})})
    return {**config, "metadata": meta}


def _spec_of(obj: Obj) -> Obj:
    """Everything whose change bumps metadata.generation."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


# --- serving -----------------------------------------------------------------------------


def kubeconfig(url: str, *, namespace: str = "default") -> Obj:
    """A kubeconfig for the emulator at ``url`` (plain HTTP, no credentials)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kvoffload-emulator", "cluster": {"server": url}}],
        "users": [{"name": "kvoffload-emulator", "user": {}}],
        "contexts": [
            {
                "name": "kvoffload-emulator",
                "context": {"cluster": "kvoffload-emulator", "user": "kvoffload-emulator", "namespace": namespace},
            }
        ],
        "current-context": "kvoffload-emulator",
    }


def write_kubeconfig(url: str, path: Path) -> Path:
    """Write :func:`kubeconfig` to ``path`` (JSON is valid YAML) and return the path."""
    path.write_text(json.dumps(kubeconfig(url), indent=2) + "\n")
    return path


@contextlib.asynccontextmanager
async def serve(
    emulator: KubeEmulator | None = None, *, host: str = "127.0.0.1", port: int | None = None
) -> AsyncIterator[tuple[KubeEmulator, str]]:
    """Serve an emulator over HTTP (a free port unless given); yield it with its URL."""
    emulator = emulator if emulator is not None else KubeEmulator()
    async with emulator, kmock.Server(emulator, host=host, port=port) as server:
        try:
            yield emulator, str(server.url).rstrip("/")
        finally:
            await emulator.close_watches()

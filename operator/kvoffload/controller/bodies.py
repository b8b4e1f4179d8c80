"""A kopf body as plain data: the snapshot a cycle or an admission review works on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _view_as_dict(value: object) -> dict[str, Any]:
    """``json``'s fallback for what it cannot encode: kopf's views of a body are Mappings, not dicts."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a body holds a {type(value).__name__}, which is not JSON")


def packed_body(body: Mapping[str, Any]) -> bytes:
    """The object without ``metadata.managedFields`` (which nothing here reads, and which is a quarter of a policy as
    served), as compact JSON: how the operator keeps a policy between its cycles. A policy as served is some 9 kB of
    JSON and decodes to some 45 kB of Python objects; packed, it is some 6.5 kB. The C encoder walks the nested dicts
    and lists itself: a copy in Python was most of the CPU of a watch event at 1,000 policies."""
    meta = body.get("metadata")
    top = dict(body)
    if isinstance(meta, Mapping):
        top["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return json.dumps(top, separators=(",", ":"), default=_view_as_dict).encode()


def unpacked_body(packed: bytes) -> dict[str, Any]:
    """A ``packed_body`` as a fresh object of its own."""
    out: dict[str, Any] = json.loads(packed)
    return out


def plain_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the object as plain dicts and lists, without ``metadata.managedFields``: kopf replaces its body on
    every watch event, so a cycle works on a copy of its own."""
    return unpacked_body(packed_body(body))


__all__ = ["packed_body", "plain_body", "unpacked_body"]

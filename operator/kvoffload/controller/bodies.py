"""A kopf body as plain data: the snapshot a cycle or an admission review works on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _plain(value: Any) -> Any:
    """Nested Mappings (a kopf Body and its views) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def plain_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the object without ``metadata.managedFields``, which nothing here reads and which is a quarter of a
    policy as served: kopf replaces its body on every watch event, so a cycle works on a copy of its own."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key == "metadata" and isinstance(value, Mapping):
            out[key] = {str(k): _plain(v) for k, v in value.items() if k != "managedFields"}
        else:
            out[str(key)] = _plain(value)
    return out


def packed_body(body: Mapping[str, Any]) -> bytes:
    """``plain_body`` as compact JSON: how the operator keeps a policy between its cycles. A policy as served is
    some 9 kB of JSON and decodes to some 45 kB of Python objects; packed, it is some 6.5 kB."""
    return json.dumps(plain_body(body), separators=(",", ":")).encode()


def unpacked_body(packed: bytes) -> dict[str, Any]:
    """A ``packed_body`` as a fresh object of its own."""
    out: dict[str, Any] = json.loads(packed)
    return out


__all__ = ["packed_body", "plain_body", "unpacked_body"]

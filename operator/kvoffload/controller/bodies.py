"""A kopf body as plain data: the snapshot a cycle or an admission review works on."""

from __future__ import annotations

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


__all__ = ["plain_body"]

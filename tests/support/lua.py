"""A real Lua interpreter (lupa's Lua 5.1, the dialect of Argo CD's gopher-lua) running Argo CD scripts.

Argo CD runs a health or action script as one chunk with the resource in the global ``obj`` and
takes what the chunk returns. :func:`run` does the same: the object goes in through
``LuaRuntime.table_from(obj, recursive=True)`` and the returned table comes back as Python
(tables keyed 1..n as lists, other tables as dicts).
"""

from __future__ import annotations

from typing import Any

from lupa import lua51


def to_python(value: Any) -> Any:
    """A Lua value as Python: tables keyed 1..n become lists, other tables dicts; scalars stay."""
    if lua51.lua_type(value) != "table":
        return value
    items = list(value.items())
    keys = [k for k, _ in items]
    if keys and all(isinstance(k, int) for k in keys) and sorted(keys) == list(range(1, len(keys) + 1)):
        return [to_python(v) for _, v in sorted(items, key=lambda kv: kv[0])]
    return {k: to_python(v) for k, v in items}


def run(script: str, obj: dict[str, Any]) -> Any:
    """Run an Argo CD Lua script on ``obj`` in a fresh interpreter; return what it returns, as Python."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = runtime.table_from(obj, recursive=True)
    return to_python(runtime.execute(script))

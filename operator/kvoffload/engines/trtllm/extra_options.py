"""Judge a ``trtllm-serve --extra_llm_api_options`` (``--config``) YAML mapping as TensorRT-LLM would.

The file's top-level keys are ``TorchLlmArgs``' fields and ``kv_cache_config`` is a ``KvCacheConfig``; both
forbid unknown keys (``BaseLlmArgs`` declares ``extra="forbid"``, ``KvCacheConfig`` inherits it from
``StrictBaseModel``). The field tables come from TensorRT-LLM's own sources (``data/trtllm-options.json``,
written by ``scripts/trtllm_options.py``), since its classes cannot be imported here.

Types are judged as declared, and more strictly than pydantic's lax mode: an ``int`` field takes a YAML
integer, not ``"5"`` or ``true``; a ``float`` field takes a YAML number. Nested models other than
``kv_cache_config`` (``moe_config``, ``scheduler_config``, ...) and the type aliases the saved sources do not
define are not judged beyond their own key: :func:`unjudged_types` names them.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

TABLE = "trtllm-options.json"

# Plain types by their declared spelling, with the bound pydantic's constrained aliases add.
_INTS = {"int": None, "StrictInt": None, "PositiveInt": ("gt", 0), "NonNegativeInt": ("ge", 0)}
_FLOATS = {"float": None, "NonNegativeFloat": ("ge", 0)}
_STRINGS = {"str", "Path"}
_ANY = {"Any", "object"}
_OPTIONAL = {"Optional"}
_UNIONS = {"Union"}
_SEQUENCES = {"List", "list", "Set", "set", "Tuple", "tuple"}
_MAPPINGS = {"Dict", "dict"}


@dataclass(frozen=True)
class Field:
    name: str
    key: str  # what the YAML spells: the alias when there is one
    type: ast.expr
    constraints: Mapping[str, float]


@dataclass(frozen=True)
class Model:
    name: str
    fields: Mapping[str, Field]  # by YAML key


@dataclass(frozen=True)
class Tables:
    llm_args: Model
    kv_cache: Model
    enums: Mapping[str, frozenset[str]]


def _model(raw: Mapping[str, Any]) -> Model:
    fields = {}
    for name, entry in raw["fields"].items():
        key = entry.get("alias", name)
        bounds = {k: float(v) for k, v in entry.get("constraints", {}).items() if isinstance(v, int | float)}
        fields[key] = Field(name, key, ast.parse(entry["type"], mode="eval").body, bounds)
    return Model(raw["class"], fields)


@functools.cache
def tables() -> Tables:
    """The field tables shipped with the operator."""
    raw = json.loads((resources.files("kvoffload.engines.trtllm") / "data" / TABLE).read_text(encoding="utf-8"))
    enums = {name: frozenset(members) for name, members in raw["llmArgs"]["enums"].items()}
    return Tables(_model(raw["llmArgs"]), _model(raw["kvCacheConfig"]), enums)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _bounded(value: float, bound: tuple[str, float] | None) -> bool:
    if bound is None:
        return True
    op, limit = bound
    return {"gt": value > limit, "ge": value >= limit, "lt": value < limit, "le": value <= limit}[op]


class _Judge:
    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def model(self, model: Model, value: object, path: str) -> list[str]:
        if not isinstance(value, Mapping):
            return [f"{path or '(root)'}: expected a mapping ({model.name}), got {_kind(value)}"]
        found: list[str] = []
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            field = model.fields.get(key) if isinstance(key, str) else None
            if field is None:
                found.append(f"{where}: unknown key; {model.name} forbids extra fields")
                continue
            found += self.field(field, item, where)
        return found

    def field(self, field: Field, value: object, path: str) -> list[str]:
        if not self.matches(field.type, value):
            return [f"{path}: expected {ast.unparse(field.type)}, got {_kind(value)} {value!r}"]
        if isinstance(field.type, ast.Name) and field.type.id == "KvCacheConfig":
            return self.model(self.tables.kv_cache, value, path)
        return [f"{path}: {problem}" for problem in _outside(field.constraints, value)]

    def matches(self, node: ast.expr, value: object) -> bool:
        if isinstance(node, ast.Constant) and node.value is None:
            return value is None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.matches(node.left, value) or self.matches(node.right, value)
        if isinstance(node, ast.Name):
            return self.named(node.id, value)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
            return self.generic(node.value.id, args, value)
        return True  # a form the tables do not use: not judged

    def named(self, name: str, value: object) -> bool:
        if name in _INTS:
            return isinstance(value, int) and not isinstance(value, bool) and _bounded(value, _INTS[name])
        if name in _FLOATS:
            return isinstance(value, int | float) and not isinstance(value, bool) and _bounded(value, _FLOATS[name])
        if name == "bool":
            return isinstance(value, bool)
        if name in _STRINGS:
            return isinstance(value, str)
        if name == self.tables.kv_cache.name:
            return isinstance(value, Mapping)
        if name in self.tables.enums:
            return isinstance(value, str) and value.upper() in self.tables.enums[name]
        return True  # _ANY, and the models and aliases the saved sources do not define (unjudged_types)

    def generic(self, name: str, args: Sequence[ast.expr], value: object) -> bool:
        if name == "Literal":
            return any(isinstance(a, ast.Constant) and a.value == value and type(a.value) is type(value) for a in args)
        if name in _OPTIONAL:
            return value is None or self.matches(args[0], value)
        if name in _UNIONS:
            return any(self.matches(a, value) for a in args)
        if name in _SEQUENCES:
            return isinstance(value, list) and all(self.matches(args[0], v) for v in value)
        if name in _MAPPINGS:
            return isinstance(value, Mapping) and all(
                self.matches(args[0], k) and self.matches(args[1], v) for k, v in value.items()
            )
        return True


def _outside(constraints: Mapping[str, float], value: object) -> list[str]:
    found = []
    for op, limit in constraints.items():
        if op in ("min_length", "max_length"):
            if isinstance(value, list) and not _bounded(len(value), ("ge" if op == "min_length" else "le", limit)):
                found.append(f"{op} is {limit:g}, got {len(value)} items")
        elif isinstance(value, int | float) and not isinstance(value, bool) and not _bounded(value, (op, limit)):
            found.append(f"must be {op} {limit:g}, got {value!r}")
    return found


def problems(document: object) -> list[str]:
    """What TensorRT-LLM would refuse in an extra-options document, each naming its key path; [] when none.

    ``None`` (an empty YAML file) is an empty mapping, as ``trtllm-serve`` reads it.
    """
    if document is None:
        return []
    return _Judge(tables()).model(tables().llm_args, document, "")


def unjudged_types() -> set[str]:
    """The type names in the tables that :func:`problems` does not judge (anything is taken for them)."""
    judge = _Judge(tables())
    known = set(_INTS) | set(_FLOATS) | _STRINGS | _ANY | {"bool", judge.tables.kv_cache.name, *judge.tables.enums}
    generic = {"Literal"} | _OPTIONAL | _UNIONS | _SEQUENCES | _MAPPINGS
    found: set[str] = set()
    for model in (judge.tables.llm_args, judge.tables.kv_cache):
        for field in model.fields.values():
            for node in ast.walk(field.type):
                if isinstance(node, ast.Name) and node.id not in known | generic:
                    found.add(node.id)
    return found

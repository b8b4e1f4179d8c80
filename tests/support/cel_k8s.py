"""CEL as the Kubernetes API server runs it for a CRD, on cel-python.

cel-python implements the CEL language but not Kubernetes' own libraries. The
rules in our CRD use two of them, so this module adds them, backed by the same
parser the operator uses:

- quantity (``quantity()``, ``isQuantity()`` and the methods ``isLessThan``,
  ``isGreaterThan``, ``compareTo``, ``sign``, ``asInteger``,
  ``asApproximateFloat``, ``isInteger``);
- lists (``isSorted()``).

:func:`rule_failures` walks a schema and an object together and evaluates each
``x-kubernetes-validations`` rule with ``self`` bound to its node, the way the
API server does: a rule on an absent field does not run, a rule on an array's
items runs once per item, and a failure is reported at the node's path plus the
rule's ``fieldPath``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes

from kvoffload.api.quantity import parse_quantity


class Quantity:
    """The value of Kubernetes' CEL ``quantity()``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.value: Decimal = parse_quantity(text)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def _as_quantity(value: Any) -> Quantity:
    if not isinstance(value, Quantity):
        raise TypeError(f"no such overload: expected a quantity, got {type(value).__name__}")
    return value


def _quantity(text: Any) -> Quantity:
    if not isinstance(text, celtypes.StringType):
        raise TypeError("no such overload: quantity() takes a string")
    return Quantity(str(text))  # a malformed quantity raises ValueError: a CEL error, as in Kubernetes


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(a: Any, b: Any) -> int:
    x, y = _as_quantity(a).value, _as_quantity(b).value
    return (x > y) - (x < y)


def _as_integer(q: Any) -> celtypes.IntType:
    value = _as_quantity(q).value
    if value != value.to_integral_value() or not -(2**63) <= value < 2**63:
        raise ValueError(f"{q!r} cannot be represented as an int64")
    return celtypes.IntType(int(value))


def _is_sorted(items: Any) -> celtypes.BoolType:
    values = list(items)
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(values)))


KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "sign": lambda q: celtypes.IntType((_as_quantity(q).value > 0) - (_as_quantity(q).value < 0)),
    "asInteger": _as_integer,
    "isInteger": lambda q: celtypes.BoolType(_as_quantity(q).value == _as_quantity(q).value.to_integral_value()),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(_as_quantity(q).value)),
    "isSorted": _is_sorted,
}
"""The Kubernetes CEL library functions our rules use; method calls pass the receiver first."""

_ENV = celpy.Environment()


@functools.cache
def compile_rule(rule: str) -> celpy.Runner:
    """A runnable rule; raises celpy.CELParseError when it does not parse."""
    return _ENV.program(_ENV.compile(rule), functions=KUBERNETES_FUNCTIONS)


def evaluate(rule: str, self_value: Any) -> Any:
    """The value of ``rule`` with ``self`` bound to a JSON-like value; raises CELEvalError on error."""
    return compile_rule(rule).evaluate({"self": celpy.json_to_cel(self_value)})


@dataclass(frozen=True)
class RuleFailure:
    """One rule that refused (or could not evaluate) a node."""

    path: str
    message: str
    rule: str


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def rule_failures(schema: dict[str, Any], value: Any, path: str = "") -> list[RuleFailure]:
    """Every x-kubernetes-validations rule in ``schema`` that ``value`` breaks, with its field path."""
    found: list[RuleFailure] = []
    for entry in schema.get("x-kubernetes-validations", []):
        where = path + entry.get("fieldPath", "")
        try:
            ok = evaluate(entry["rule"], value)
        except celpy.CELEvalError as exc:
            found.append(RuleFailure(where, f"rule could not be evaluated: {exc.args[0]}", entry["rule"]))
            continue
        if ok is not True and ok != celtypes.BoolType(True):
            found.append(RuleFailure(where, entry["message"], entry["rule"]))
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value and value[name] is not None:
                found += rule_failures(sub, value[name], _join(path, name))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, item in value.items():
                found += rule_failures(extra, item, _join(path, name))
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += rule_failures(schema["items"], item, f"{path}[{i}]")
    return found


def every_rule(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each (schema path, schema node, rule entry) in the schema, for coverage checks."""
    found = [(path, schema, entry) for entry in schema.get("x-kubernetes-validations", [])]
    for name, sub in schema.get("properties", {}).items():
        found += every_rule(sub, _join(path, name))
    if isinstance(schema.get("items"), dict):
        found += every_rule(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += every_rule(schema["additionalProperties"], f"{path}.*")
    return found

"""What the API server does with a KVOffloadPolicy against our generated CRD, offline.

The steps, in the API server's order: drop nulls, apply the schema defaults,
check the OpenAPI schema (``jsonschema``; unknown fields refused as kubectl's
default strict field validation does), then run the CEL rules
(:mod:`tests.support.cel_k8s`). Every problem comes back as a field path such
as ``spec.offload.cpu``, like the API server's ``field.Error`` list.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import jsonschema

from kvoffload.api.crd import crd_manifest
from kvoffload.api.errors import format_loc
from tests.support.cel_k8s import rule_failures


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    source: str
    """'schema' or 'cel'."""


@functools.cache
def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the generated CRD's only version (shared: do not mutate)."""
    (version,) = crd_manifest()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever properties are listed (strict field validation)."""
    out = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        if "properties" in node:
            node["additionalProperties"] = False
            for sub in node["properties"].values():
                walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    walk(out)
    return out


def drop_nulls(value: Any) -> Any:
    """Nulls removed, as the API server prunes them for fields that are not nullable."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """A copy of ``value`` with the schema defaults filled in, top-down, as structural defaulting does."""
    value = copy.deepcopy(value)
    _default(schema, value)
    return value


def _default(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for item in value.values():
                _default(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)


def _schema_paths(error: jsonschema.ValidationError) -> list[str]:
    loc = list(error.absolute_path)
    if error.validator == "required":
        missing = [p for p in error.validator_value if p not in error.instance]
        return [format_loc([*loc, p]) for p in missing]
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = error.schema.get("properties", {})
        return [format_loc([*loc, p]) for p in error.instance if p not in known]
    return [format_loc(loc)]


@functools.cache
def _strict_validator() -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(strict(openapi_schema()))


def schema_problems(obj: dict[str, Any]) -> list[Problem]:
    """OpenAPI schema problems of an already defaulted object, unknown fields included."""
    validator = _strict_validator()
    found = []
    for error in validator.iter_errors(obj):
        found += [Problem(path, error.message, "schema") for path in _schema_paths(error)]
    return found


def admit(obj: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """The object as the API server would store it, and every problem that would refuse it."""
    schema = openapi_schema()
    stored = apply_defaults(schema, drop_nulls(obj))
    problems = schema_problems(stored)
    problems += [Problem(f.path, f.message, "cel") for f in rule_failures(schema, stored)]
    return stored, problems

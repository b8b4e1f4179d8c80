"""What the API server does with a KVOffloadPolicy against our generated CRD, offline.

The steps, in the API server's order, each stopping where the server stops (checked
against kube-apiserver v1.37 in tests/api/test_server_admission.py):

1. decoding: with strict field validation (kubectl's default) an unknown field refuses
   the object, and nothing else is reported; with ``strict=False`` (``kubectl apply
   --validate=warn``) unknown fields are pruned (the server warns);
2. drop nulls, apply the schema defaults;
3. the OpenAPI schema (``jsonschema``); an object that fails it is refused without its
   CEL rules being run;
4. the CEL rules (:mod:`tests.support.cel_k8s`).

Every problem comes back as a field path such as ``spec.offload.cpu``, like the API
server's ``field.Error`` list.
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


def unknown_fields(obj: Any, schema: dict[str, Any] | None = None, loc: tuple[str | int, ...] = ()) -> list[str]:
    """The paths of the fields the schema does not declare (where it lists properties)."""
    schema = openapi_schema() if schema is None else schema
    found: list[str] = []
    if isinstance(obj, dict) and "properties" in schema:
        for key, value in obj.items():
            if key in schema["properties"]:
                found += unknown_fields(value, schema["properties"][key], (*loc, key))
            elif not (loc == () and key in ("apiVersion", "kind", "metadata", "status")):
                found.append(format_loc((*loc, key)))
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            found += unknown_fields(value, schema["additionalProperties"], (*loc, key))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], (*loc, i))
    return found


def prune(obj: Any, schema: dict[str, Any] | None = None) -> Any:
    """``obj`` without the fields the schema does not declare, as the API server prunes them."""
    schema = openapi_schema() if schema is None else schema
    if isinstance(obj, dict) and "properties" in schema:
        return {
            k: prune(v, schema["properties"][k]) if k in schema["properties"] else v
            for k, v in obj.items()
            if k in schema["properties"] or k in ("apiVersion", "kind", "metadata", "status")
        }
    if isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: prune(v, schema["additionalProperties"]) for k, v in obj.items()}
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in obj]
    return obj


def admit(obj: dict[str, Any], *, strict: bool = True) -> tuple[dict[str, Any], list[Problem]]:
    """The object as the API server would store it, and the problems it would refuse it with.

    ``strict``: kubectl's default strict field validation (an unknown field refuses the
    object at decoding, alone); False prunes unknown fields, as ``--validate=warn`` does.
    """
    schema = openapi_schema()
    unknown = unknown_fields(obj)
    if unknown and strict:
        return obj, [Problem(path, "unknown field", "decode") for path in unknown]
    stored = apply_defaults(schema, drop_nulls(prune(obj)))
    problems = schema_problems(stored)
    if problems:
        return stored, problems  # the server does not run the CEL rules on an object that fails its schema
    return stored, [Problem(f.path, f.message, "cel") for f in rule_failures(schema, stored)]

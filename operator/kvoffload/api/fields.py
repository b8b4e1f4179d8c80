"""The building blocks of the custom resource's models: the base model, CEL rules, and the field types
(quantities, durations, names) that spec models share. ``kvoffload crd`` turns them into the CRD's schema."""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict, JsonValue

from kvoffload.api.quantity import DURATION_PATTERN, QUANTITY_PATTERN, parse_duration, parse_quantity

# Environment variables that change what code the engine loads: the dynamic loader's (LD_*), Python's
# import and start-up hooks, glibc's iconv modules, CUDA's and NVTX's injection libraries (loaded into every CUDA
# process), NCCL's plugins. A policy may not set them.
LOADER_ENV_PREFIXES = ("LD_",)
LOADER_ENV = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONINSPECT",
        "PYTHONWARNINGS",
        "PYTHONBREAKPOINT",
        "PYTHONPLATLIBDIR",
        "GCONV_PATH",
        "CUDA_INJECTION64_PATH",
        "CUDA_INJECTION32_PATH",
        "NVTX_INJECTION64_PATH",
        "NVTX_INJECTION32_PATH",
        "BASH_ENV",
        "ENV",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "VLLM_PLUGINS",
        # Switches vLLM to SimpleCPUOffloadConnector: another pool and other metrics than the ladder's.
        "VLLM_USE_SIMPLE_KV_OFFLOAD",
    }
)


# --- CEL rules ---------------------------------------------------------------
# Each pydantic validator below has a twin CEL rule in the generated CRD, so the
# API server refuses what `kvoffload plan` refuses. Rules run on the object
# after the API server applied the schema defaults.


def cel_list(names: frozenset[str]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in sorted(names)) + "]"


def cel_rules(*rules: tuple[str, str] | tuple[str, str, str]) -> JsonDict:
    """``json_schema_extra`` holding CEL rules as (rule, message[, fieldPath]) tuples."""
    entries: list[JsonValue] = []
    for rule in rules:
        entry: JsonDict = {"rule": rule[0], "message": rule[1]}
        if len(rule) == 3:
            entry["fieldPath"] = rule[2]
        entries.append(entry)
    return {"x-kubernetes-validations": entries}


# --- field types -------------------------------------------------------------


# Bounds the cost the API server estimates for the CEL quantity() rules.
QUANTITY_MAX_LENGTH = 64
# No node holds a pebibyte of memory and no tier needs more; the API server caps no decimal exponent itself.
QUANTITY_MAX = "1Pi"
# A step, window or deadline past thirty days is a typo; it also keeps every rendered second within int32.
DURATION_MAX = "720h"


def _quantity(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a Kubernetes quantity such as 32Gi, 500Mi or 8")
    if len(str(value)) > QUANTITY_MAX_LENGTH:
        raise ValueError(f"must be at most {QUANTITY_MAX_LENGTH} characters")
    if abs(parse_quantity(value)) > parse_quantity(QUANTITY_MAX):
        raise ValueError(f"must be at most {QUANTITY_MAX}")
    return str(value)


def _positive_quantity(value: str) -> str:
    if parse_quantity(value) <= 0:
        raise ValueError("must be greater than zero")
    return value


def _non_negative_quantity(value: str) -> str:
    if parse_quantity(value) < 0:
        raise ValueError("must not be negative")
    return value


def _duration(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError("must be a duration string such as 30s, 2m or 1500ms")
    if parse_duration(value) > parse_duration(DURATION_MAX):
        raise ValueError(f"must be at most {DURATION_MAX}")
    return value


def _positive_duration(value: str) -> str:
    if parse_duration(value) <= 0:
        raise ValueError("must be longer than zero")
    return value


_QUANTITY_SCHEMA: JsonDict = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": QUANTITY_PATTERN,
    "maxLength": QUANTITY_MAX_LENGTH,
    "x-kubernetes-int-or-string": True,
}
# An exponent of three digits or more is the pattern's to refuse: kube-apiserver (v1.37.2) times out comparing
# 1e999999999 with anything, so the comparison is not made for it.
_QUANTITY_BOUND = (
    "string(self).matches('[eE][-+]?[0-9][0-9][0-9]')"
    f" || quantity(string(self)).compareTo(quantity('{QUANTITY_MAX}')) <= 0",
    f"must be at most {QUANTITY_MAX}",
)
_POSITIVE_QUANTITY_SCHEMA: JsonDict = _QUANTITY_SCHEMA | cel_rules(
    ("sign(quantity(string(self))) == 1", "must be greater than zero"), _QUANTITY_BOUND
)
_NON_NEGATIVE_QUANTITY_SCHEMA: JsonDict = _QUANTITY_SCHEMA | cel_rules(
    ("sign(quantity(string(self))) >= 0", "must not be negative"), _QUANTITY_BOUND
)
_DURATION_SCHEMA: JsonDict = {
    "type": "string",
    "pattern": DURATION_PATTERN,
    "maxLength": 32,
    **cel_rules(
        ("duration(self) > duration('0s')", "must be longer than zero"),
        (f"duration(self) <= duration('{DURATION_MAX}')", f"must be at most {DURATION_MAX}"),
    ),
}

Quantity = Annotated[
    str, BeforeValidator(_quantity), AfterValidator(_positive_quantity), WithJsonSchema(_POSITIVE_QUANTITY_SCHEMA)
]
"""A Kubernetes quantity that must be greater than zero."""

NonNegativeQuantity = Annotated[
    str,
    BeforeValidator(_quantity),
    AfterValidator(_non_negative_quantity),
    WithJsonSchema(_NON_NEGATIVE_QUANTITY_SCHEMA),
]
Duration = Annotated[
    str, BeforeValidator(_duration), AfterValidator(_positive_duration), WithJsonSchema(_DURATION_SCHEMA)
]
"""A Go duration such as ``30s``, ``2m`` or ``1500ms``, longer than zero."""

Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class Model(BaseModel):
    """Base for every spec model: camelCase on the wire, unknown fields refused, JSON's scalar types kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _scalar_type(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1, "2" as 2 and "yes" as true, where kube-apiserver refuses each
        # against the schema's integer, number or boolean: the CLI, the webhook and the server must agree.
        kind = _scalar_kind(cls, info.field_name) if info.field_name else None
        if kind == "number" and isinstance(value, bool | str):
            raise ValueError(f"must be a number, not {type(value).__name__} {value!r}")
        if kind == "boolean" and isinstance(value, int | float | str) and not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {type(value).__name__} {value!r}")
        return value


@functools.cache
def _scalar_kind(model: type[BaseModel], field: str) -> str | None:
    """``number`` or ``boolean`` for a field of only that JSON type (``None`` allowed), else ``None``."""
    info = model.model_fields.get(field)
    if info is None:
        return None
    annotation = info.annotation
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    members = tuple(m for m in members if m is not type(None))
    if members and all(m in (int, float) for m in members):
        return "number"
    if members == (bool,):
        return "boolean"
    return None

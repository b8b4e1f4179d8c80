"""Turning raw objects into policies, with every bad field named by its path."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvoffload.api.types import KVOffloadPolicy


@dataclass(frozen=True)
class FieldError:
    """One offending field: its path (``spec.offload.cpu``) and why."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PolicyError(ValueError):
    """A policy that cannot work, with every offending field."""

    def __init__(self, errors: Iterable[FieldError], source: str = "") -> None:
        self.errors = list(errors)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: " if self.source else ""
        count = len(self.errors)
        lines = [f"{head}invalid KVOffloadPolicy ({count} error{'s' if count != 1 else ''}):"]
        lines += [f"  - {e}" for e in self.errors]
        return "\n".join(lines)


def format_loc(loc: Iterable[str | int]) -> str:
    """``('spec', 'offload', 'secondaryTiers', 0, 'size')`` -> ``spec.offload.secondaryTiers[0].size``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(object)"


def _message(err: Any) -> str:
    msg = str(err["msg"])
    # pydantic prefixes validator errors; the path already says where.
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "required field is missing"
    return msg


def errors_from(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[FieldError]:
    """Every pydantic error as a FieldError, tagged-union noise removed."""
    found: list[FieldError] = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        found.append(FieldError(format_loc(prefix + loc), _message(err)))
    return found


def parse_policy(obj: Any, source: str = "") -> KVOffloadPolicy:
    """Validate one object as a KVOffloadPolicy; raise PolicyError naming every bad field."""
    if not isinstance(obj, dict):
        raise PolicyError([FieldError("(object)", "expected a mapping (a YAML object)")], source)
    try:
        policy = KVOffloadPolicy.model_validate(obj)
    except ValidationError as exc:
        raise PolicyError(errors_from(exc), source) from None
    from kvoffload.policy.sizing import check_policy

    problems = check_policy(policy)
    if problems:
        raise PolicyError(problems, source)
    return policy


def iter_documents(path: Path) -> Iterator[Any]:
    """The YAML documents in a file, skipping empty ones."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError([FieldError("(file)", exc.strerror or str(exc))], str(path)) from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise PolicyError([FieldError("(file)", f"not valid YAML: {exc}")], str(path)) from None
    yield from (d for d in docs if d is not None)


def load_policy(path: Path) -> KVOffloadPolicy:
    """The single KVOffloadPolicy in a YAML file."""
    docs = [d for d in iter_documents(path) if isinstance(d, dict) and d.get("kind") == "KVOffloadPolicy"]
    if len(docs) != 1:
        raise PolicyError(
            [FieldError("(file)", f"expected exactly one KVOffloadPolicy document, found {len(docs)}")], str(path)
        )
    return parse_policy(docs[0], str(path))

"""Turning raw objects and YAML files into policies, with every bad field named by its path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvoffload.api.errors import FieldError, PolicyError, errors_from
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.sizing import check_policy


def parse_policy(obj: Any, source: str = "") -> KVOffloadPolicy:
    """Validate one object as a KVOffloadPolicy; raise PolicyError naming every bad field."""
    if not isinstance(obj, dict):
        raise PolicyError([FieldError("(object)", "expected a mapping (a YAML object)")], source)
    try:
        policy = KVOffloadPolicy.model_validate(obj)
    except ValidationError as exc:
        raise PolicyError(errors_from(exc), source) from None
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

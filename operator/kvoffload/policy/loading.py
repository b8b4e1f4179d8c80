"""Turning raw objects and YAML files into policies, with every bad field named by its path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvoffload.api.errors import FieldError, PolicyError, errors_from
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.nodefit import check_policy
from kvoffload.policy.tenancy import DEFAULT_TENANCY, Tenancy, check_tenancy

# The API server takes no request over 3 MiB; a policy file past that is not a policy.
MAX_FILE_BYTES = 3 * 1024 * 1024


def parse_policy(obj: Any, source: str = "", tenancy: Tenancy = DEFAULT_TENANCY) -> KVOffloadPolicy:
    """Validate one object as a KVOffloadPolicy that asks for no more than ``tenancy`` allows; raise PolicyError
    naming every bad field."""
    if not isinstance(obj, dict):
        raise PolicyError([FieldError("(object)", "expected a mapping (a YAML object)")], source)
    try:
        policy = KVOffloadPolicy.model_validate(as_the_server_reads(obj))
    except ValidationError as exc:
        raise PolicyError(errors_from(exc), source) from None
    problems = check_policy(policy) + check_tenancy(policy, tenancy)
    if problems:
        raise PolicyError(problems, source)
    return policy


def as_the_server_reads(obj: Any) -> Any:
    """``obj`` as kube-apiserver reads a custom resource, so that ``plan`` judges what the server would store:
    every null field taken away (no field of the CRD is nullable), and every string's UTF-16 surrogate pairs
    joined. YAML reads a JSON escape such as ``\\ud8ae\\udf90`` as two lone surrogates where the server's JSON
    decoder reads one character; a lone one becomes U+FFFD, as there."""
    if isinstance(obj, dict):
        return {as_the_server_reads(k): as_the_server_reads(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [as_the_server_reads(v) for v in obj]
    if isinstance(obj, str) and any("\ud800" <= c <= "\udfff" for c in obj):
        return obj.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return obj


def read_bounded(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file of at most ``limit`` bytes (``/dev/zero`` included); PolicyError otherwise."""
    try:
        with path.open("rb") as stream:
            data = stream.read(limit + 1)
    except OSError as exc:
        raise PolicyError([FieldError("(file)", exc.strerror or str(exc))], str(path)) from None
    if len(data) > limit:
        raise PolicyError([FieldError("(file)", f"larger than {limit // (1024 * 1024)} MiB")], str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            [FieldError("(file)", f"not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})")], str(path)
        ) from None


def iter_documents(path: Path) -> Iterator[Any]:
    """The YAML documents in a file, skipping empty ones."""
    text = read_bounded(path)
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise PolicyError([FieldError("(file)", f"not valid YAML: {exc}")], str(path)) from None
    except RecursionError:  # a document nested thousands deep
        raise PolicyError([FieldError("(file)", "nested too deeply")], str(path)) from None
    yield from (d for d in docs if d is not None)


def load_policy(path: Path, tenancy: Tenancy = DEFAULT_TENANCY) -> KVOffloadPolicy:
    """The single KVOffloadPolicy in a YAML file, judged against ``tenancy``."""
    docs = [d for d in iter_documents(path) if isinstance(d, dict) and d.get("kind") == "KVOffloadPolicy"]
    if len(docs) != 1:
        raise PolicyError(
            [FieldError("(file)", f"expected exactly one KVOffloadPolicy document, found {len(docs)}")], str(path)
        )
    return parse_policy(docs[0], str(path), tenancy)

"""The errors a policy can have, each naming the offending field by its path."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


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


MAX_ERRORS_SHOWN = 10
MAX_ERROR_CHARS = 300
"""A refusal and the Invalid condition show the first errors, each this long at most, then how many more: a policy
of 66 KB once made a 1.6 MB message, which the API server refused as a status write, so the cycle retried for ever."""


def summary(errors: Iterable[object]) -> str:
    """The errors as one bounded, printable line: the first :data:`MAX_ERRORS_SHOWN`, each cut to
    :data:`MAX_ERROR_CHARS`, then ``and N more``."""
    texts = [printable(str(error)) for error in errors]
    shown = "; ".join(texts[:MAX_ERRORS_SHOWN])
    more = len(texts) - MAX_ERRORS_SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def printable(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line, every control character a space, cut to ``limit`` characters: what status may carry."""
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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

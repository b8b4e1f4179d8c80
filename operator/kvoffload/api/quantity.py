"""Kubernetes quantities (``32Gi``, ``500M``, ``8``) and Go-style durations (``90s``, ``1m30s``).

Parsed the way the API server parses them, so a value that Kubernetes accepts
means the same number here.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal

GIB = 1024**3
MIB = 1024**2

_BINARY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}

# Kubernetes' own grammar, but an exponent of at most two digits: no quantity here needs more than 1e18, and
# kube-apiserver (v1.37.2) times out comparing 1e999999999 in a CEL rule (api/types.py guards the rule too).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_SPLIT_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the numeric value of a Kubernetes quantity; raise ValueError if malformed."""
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string such as 32Gi")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if isinstance(value, int | float):
        return Decimal(str(value))
    return _quantity_text(value.strip())


# A cycle reads the same few texts of its spec again and again: 40 parses per policy in a start over 1,000.
@functools.lru_cache(maxsize=4096)
def _quantity_text(text: str) -> Decimal:
    if not _QUANTITY_RE.match(text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 32Gi, 500Mi, 8)")
    number, suffix = _SPLIT_RE.match(text).groups()  # type: ignore[union-attr]
    if suffix in _BINARY:
        return Decimal(number) * _BINARY[suffix]
    if suffix in _DECIMAL:
        return Decimal(number) * _DECIMAL[suffix]
    try:  # exponent form, 1e3; Kubernetes caps no exponent, so 1e999999999 is well-formed
        return Decimal(number) * Decimal(10) ** Decimal(suffix[1:])
    except ArithmeticError:
        raise ValueError(f"{text!r} is out of range") from None


def quantity_bytes(value: str | int | float) -> int:
    """A memory quantity in whole bytes (rounded up, as Kubernetes does)."""
    amount = parse_quantity(value)
    whole = int(amount)
    return whole if whole == amount else whole + 1


def format_bytes(n: float) -> str:
    """A human size with binary units, e.g. ``32.0 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def to_quantity(n: int) -> str:
    """Whole bytes as the shortest exact binary quantity (``34359738368`` -> ``32Gi``)."""
    for suffix, factor in reversed(list(_BINARY.items())):
        if n and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)


def parse_duration(value: str | int | float) -> float:
    """Seconds in a Go duration such as ``90s``, ``2m`` or ``1h30m``; bare numbers are seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a string such as 30s, 2m or 1h30m")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number of seconds")
    if isinstance(value, int | float):
        return float(value)
    return _duration_text(value.strip())


@functools.lru_cache(maxsize=4096)
def _duration_text(text: str) -> float:
    if not _DURATION_RE.match(text):
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 2m, 1500ms, 1h30m)")
    seconds = sum(float(num) * _DURATION_UNIT[unit] for num, unit in _DURATION_PART.findall(text))
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is out of range")
    return seconds


def format_duration(seconds: float) -> str:
    """A short Go-style duration: ``90`` -> ``1m30s``, ``0.0189`` -> ``18.9ms``."""
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"

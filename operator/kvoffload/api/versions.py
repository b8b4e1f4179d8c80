"""vLLM versions: parsed from a version string or an image tag. Sizing and the metric dialects both key on them."""

from __future__ import annotations

import re

VersionTuple = tuple[int, ...]

# v?MAJOR.MINOR[.PATCH[.POST]] then an optional suffix that starts with a letter
# after an optional separator (rc1, .post1, -cu128, +cpu).
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+._]?[A-Za-z][\w.+-]*)?$", re.I)


def parse_version(version: str) -> VersionTuple:
    """``"0.32.0"``, ``"v0.10.1.1"``, ``"0.11.0rc2"`` -> a tuple of ints.

    Pre-release and build suffixes are dropped: a 0.32.0 release candidate
    speaks the 0.32 dialect. Raises ValueError on anything else.
    """
    match = _VERSION_RE.match(version.strip())
    if match is None:
        raise ValueError(f"not a vLLM version: {version!r} (want e.g. 0.32.0)")
    return tuple(int(p) for p in match.groups() if p is not None)


def version_from_image(image: str | None) -> str | None:
    """The vLLM version an image reference's tag names (numeric part only), or None.

    ``vllm/vllm-openai:v0.32.0`` -> ``"0.32.0"``; ``registry:5000/vllm:0.11.0-cu128@sha256:..``
    -> ``"0.11.0"``; a bare tag ``"0.11.2"`` -> ``"0.11.2"``; ``:latest``, ``:nightly``,
    a bare digest, no tag or no image -> None.
    """
    if image is None:
        return None
    ref = image.strip().split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else last
    try:
        return ".".join(str(p) for p in parse_version(tag))
    except ValueError:
        return None

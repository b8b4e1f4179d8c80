"""The dialect table against vLLM's own sources: 0.32.0 (the vLLM-for-CPU venv), 0.33.0 and 0.34.0 (``.vllm-03x``).

Every family the analysis reads for a release is registered, by that name, somewhere in that release's
``vllm/`` package; and the families 0.34 added over 0.33 are exactly the ones the 0.34 row of
``engines/vllm/dialect.py`` names as not read. vLLM registers its families with literal names (counters
without ``_total``), so a scan of the string literals finds each one.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

import pytest

from kvoffload.engines import dialect as dialects
from kvoffload.engines.vllm import dialect as vllm_dialects

pytestmark = pytest.mark.realvllm

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "0.32.0": next(iter(sorted((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"))), None),
    "0.33.0": ROOT / ".vllm-033" / "vllm",
    "0.34.0": ROOT / ".vllm-034" / "vllm",
}
ADDED_IN_034 = {
    "vllm:kv_offload_tiering_deferred_release_chunks",
    "vllm:kv_offload_tiering_deferred_release_hold_seconds",
    "vllm:request_render_duration_seconds",
}
NAME = re.compile(r"""["'](vllm:[a-z][a-z0-9_:]*)["']""")


@cache
def registered(version: str) -> frozenset[str]:
    """Every ``vllm:`` name written as a string literal in that release's package."""
    root = SOURCES[version]
    if root is None or not (root / "__init__.py").exists():
        what = f"vLLM {version}'s sources ({root or '.venv-vllm'})"
        if os.environ.get("CI"):
            pytest.fail(f"{what} are missing; CI must set them up (make setup)")
        pytest.skip(f"{what} are missing (make setup)")
    names: set[str] = set()
    for path in root.rglob("*.py"):
        names.update(NAME.findall(path.read_text(errors="replace")))
    return frozenset(names)


def read_by(dialect: dialects.Dialect) -> set[str]:
    return {*dialect.required_families(), *dialect.offload_families(), *dialect.tiering_families()}


@pytest.mark.parametrize("version", list(SOURCES))
def test_every_family_the_analysis_reads_is_registered_by_that_release(version: str) -> None:
    names = registered(version)
    missing = [n for n in sorted(read_by(vllm_dialects.dialect_for(version))) if n.removesuffix("_total") not in names]
    assert not missing


def test_034_adds_only_families_the_analysis_does_not_read() -> None:
    added = registered("0.34.0") - registered("0.33.0")
    assert added == ADDED_IN_034
    newest = vllm_dialects.dialect_for("0.34.0")
    assert newest.name == "0.34"
    assert newest is vllm_dialects.NEWEST
    assert not {n.removesuffix("_total") for n in read_by(newest)} & added
    assert read_by(newest) == read_by(vllm_dialects.dialect_for("0.33.0"))

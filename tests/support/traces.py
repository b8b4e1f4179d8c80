"""The Mooncake traces: they live in shared/ beside the clone (CI keeps a copy there), not in the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SHARED_TRACES = ROOT.parent / "shared" / "traces"
TRACES = ("mooncake-conversation.jsonl", "mooncake-synthetic.jsonl")


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``shared/traces/`` with both Mooncake traces: skipped on a workstation without them, failed in CI."""
    missing = [name for name in TRACES if not (SHARED_TRACES / name).is_file()]
    if missing:
        reason = f"{', '.join(missing)} missing under {SHARED_TRACES} (shared/ must sit beside the clone)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return SHARED_TRACES

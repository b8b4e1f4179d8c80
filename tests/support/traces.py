"""The two Mooncake traces, as the repository holds them (gzipped): the conversation trace ships with the
lab, the synthetic one with the tests (tests/data/traces/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import ROOT

MOONCAKE = {
    "mooncake-conversation.jsonl": ROOT / "lab" / "kvoffload_lab" / "data" / "mooncake-conversation.jsonl.gz",
    "mooncake-synthetic.jsonl": ROOT / "tests" / "data" / "traces" / "mooncake-synthetic.jsonl.gz",
}
"""Each trace's name in the traces' README, and its file."""


@pytest.fixture(scope="session")
def mooncake_traces() -> dict[str, Path]:
    """Both Mooncake traces by name."""
    return MOONCAKE

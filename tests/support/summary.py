"""Lines a test adds to pytest's closing summary (what CI's log should keep: a fuzz's case count)."""

from __future__ import annotations

import pytest

SUMMARY_LINES = pytest.StashKey[list[str]]()


def report(config: pytest.Config, line: str) -> None:
    """Print ``line`` in the session's closing summary."""
    config.stash.setdefault(SUMMARY_LINES, []).append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for line in config.stash.get(SUMMARY_LINES, []):
        terminalreporter.write_line(line)

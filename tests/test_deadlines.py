"""Every test run ends (tests/support/deadlines.py): throwaway runs that time out and hang on purpose, each in a
pytest of its own, end within a minute of their timeout with every thread's and task's stack printed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import paths
from tests.support.deadlines import DEADLINE_ENV, HANG_EXIT_STATUS

TIMEOUT_S = 3
GRACE_S = 4

STUBBORN = '''
    import asyncio
    import time

    import pytest


    async def stubborn_lab_task() -> None:
        """A lab task that ignores cancellation, on purpose: the loop's teardown waits for it for ever."""
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass


    @pytest.mark.timeout({timeout})
    async def test_times_out_beside_a_task_that_ignores_cancellation() -> None:
        asyncio.get_running_loop().create_task(stubborn_lab_task(), name="stubborn-lab-task")
        await asyncio.sleep(3600)


    @pytest.fixture
    def teardown_that_swallows_everything():
        yield
        while True:
            try:
                time.sleep(3600)
            except BaseException:
                pass


    @pytest.mark.timeout({timeout})
    def test_whose_teardown_never_ends(teardown_that_swallows_everything: None) -> None:
        pass


    def test_without_a_timeout_that_sleeps() -> None:
        time.sleep(3600)


    def test_after_them() -> None:
        pass
'''


def run_pytest(tmp_path: Path, *selection: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """The throwaway tests in a pytest of their own, with the project's deadlines plugin; (status, output, s)."""
    (tmp_path / "test_throwaway.py").write_text(textwrap.dedent(STUBBORN.format(timeout=TIMEOUT_S)))
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\nhang_grace = {GRACE_S}\n"
    )
    command = [sys.executable, "-m", "pytest", "-p", "tests.support.deadlines", "-p", "no:cacheprovider", "-rA"]
    command += [f"test_throwaway.py::{name}" for name in selection]
    began = time.monotonic()
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(paths.ROOT), DEADLINE_ENV: "off", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - began


@pytest.mark.timeout(150)
def test_a_timed_out_test_whose_loop_cannot_close_fails_with_every_stack_and_the_run_goes_on(tmp_path: Path) -> None:
    status, output, took = run_pytest(
        tmp_path, "test_times_out_beside_a_task_that_ignores_cancellation", "test_after_them"
    )
    assert status == 1, output
    assert f"Timeout (>{TIMEOUT_S:.1f}s) from pytest-timeout" in output, output
    # The tasks as the alarm found them, the stubborn one among them, in the failed test's report.
    assert "asyncio tasks at the timeout" in output, output
    assert "stubborn-lab-task" in output, output
    # Then the loop's teardown waited on it, until the watchdog printed every stack and interrupted the wait.
    assert f"still running {GRACE_S} s after its {TIMEOUT_S} s timeout" in output, output
    assert "Current thread" in output, output  # faulthandler's dump of every thread
    assert "Hung: " in output, output
    assert "1 failed, 1 passed, 1 error" in output, output  # the next test still ran
    assert took < TIMEOUT_S + GRACE_S + 30, (took, output)


@pytest.mark.timeout(150)
def test_a_test_that_cannot_be_interrupted_ends_the_run_with_every_stack(tmp_path: Path) -> None:
    status, output, took = run_pytest(tmp_path, "test_whose_teardown_never_ends", "test_after_them")
    assert status == HANG_EXIT_STATUS, output
    assert f"still running {2 * GRACE_S} s after its {TIMEOUT_S} s timeout; ending the run" in output, output
    assert "teardown_that_swallows_everything" in output, output  # where it hung, in the threads' stacks
    assert "test_after_them PASSED" not in output, output
    assert took < TIMEOUT_S + 2 * GRACE_S + 30, (took, output)


@pytest.mark.timeout(150)
def test_the_session_deadline_ends_a_test_without_a_timeout(tmp_path: Path) -> None:
    deadline = time.time() + 8
    status, output, took = run_pytest(
        tmp_path, "test_without_a_timeout_that_sleeps", env={DEADLINE_ENV: f"{deadline:.0f}"}
    )
    assert status == 1, output
    assert "Timeout (0:00:0" in output, output  # faulthandler's banner, then every thread
    assert "test_without_a_timeout_that_sleeps" in output, output
    assert took < 40, (took, output)


@pytest.mark.timeout(150)
def test_no_test_starts_within_the_margin_of_the_session_deadline(tmp_path: Path) -> None:
    deadline = time.time() + 120  # inside the margin already: the first test runs, no other starts
    status, output, _ = run_pytest(tmp_path, "test_after_them", "test_after_them", env={DEADLINE_ENV: str(deadline)})
    assert status == 1, output
    assert "no further test starts" in output, output
    assert output.count("PASSED") == 1, output

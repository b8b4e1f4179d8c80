"""Every test run ends (issue 39): what happens once a test has outlived its timeout.

pytest-timeout (``timeout`` in pyproject.toml, ``@pytest.mark.timeout``) fails a test that outlives its timeout, by
SIGALRM in the main thread, and prints every other thread's stack. This plugin bounds what it does not:

- **The tasks.** A test that fails on its timeout also reports every asyncio task of its loop with its stack (the
  report section "asyncio tasks at the timeout"), so a wait on a future or a lock shows where it waits.
- **A hang after the timeout.** A teardown can still wait for ever: the event loop's teardown waits for every task
  it cancels, and a task that ignores cancellation never ends. A watchdog thread gives each test its timeout and
  ``hang_grace`` seconds more (ini; 30). Past that, it prints every thread's and task's stack to the terminal and
  interrupts the main thread (SIGUSR1) with :class:`Hung`, which fails the test where it waits; the run goes on.
  Still running another ``hang_grace`` later, the process prints every thread's stack again and exits with status 3.
- **The session.** ``$KVOFFLOAD_TEST_DEADLINE`` (epoch seconds; ``make test`` sets it 85 minutes after it starts,
  inside CI's 90; ``off`` turns it off): no test starts within ``SESSION_STOP_MARGIN_S`` of it, and at the deadline
  faulthandler prints every thread's stack and ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import os
import signal
import threading
import time
from collections.abc import Generator
from types import FrameType
from typing import Any, TextIO

import pytest

DEADLINE_ENV = "KVOFFLOAD_TEST_DEADLINE"
SESSION_STOP_MARGIN_S = 600.0
"""No test starts this close to the session's deadline: the longest test, its timeout and grace, fits in it."""
HANG_EXIT_STATUS = 3
"""The status of a run that a test kept from ending (pytest's own: internal error)."""

_TERMINAL = pytest.StashKey[TextIO]()
_TASKS_AT_TIMEOUT = pytest.StashKey[str]()
_RUNNING: list[_Watchdog] = []
"""The watchdog of the test running now (at most one): the SIGUSR1 handler reads it."""


class Hung(Exception):
    """A test still running ``hang_grace`` seconds after its timeout, interrupted where it waited."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "hang_grace",
        "seconds a test may run past its timeout before its stacks are printed and it is interrupted (then as many "
        "again before the run ends)",
        default="30",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A copy of the terminal's stderr, which pytest's capture (of fd 2) does not redirect during a test: what is
    # written here is seen even when the process then ends.
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    config.stash[_TERMINAL] = terminal
    signal.signal(signal.SIGUSR1, _interrupt)
    deadline = session_deadline()
    if deadline is not None:
        left = deadline - time.time()
        if left <= 0:
            raise pytest.UsageError(f"${DEADLINE_ENV} ({deadline:.0f}) has passed: no time is left to run tests")
        faulthandler.dump_traceback_later(left, exit=True, file=terminal)


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.cancel_dump_traceback_later()
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    with contextlib.suppress(KeyError, OSError):
        config.stash[_TERMINAL].close()


def session_deadline() -> float | None:
    """The session's deadline (epoch seconds) from ``$KVOFFLOAD_TEST_DEADLINE``, or None."""
    value = os.environ.get(DEADLINE_ENV, "").strip()
    if value in ("", "off"):
        return None
    try:
        return float(value)
    except ValueError:
        raise pytest.UsageError(f"${DEADLINE_ENV} is {value!r}: epoch seconds, or 'off'") from None


def timeout_of(item: pytest.Item) -> float:
    """The item's pytest-timeout timeout (its marker, else --timeout, else the ini); 0 for none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(value or 0)


# --- the tasks, when a test times out -------------------------------------------------------------


def format_tasks(loop: asyncio.AbstractEventLoop | None) -> str:
    """Every unfinished task of ``loop`` with its stack, or why there is none."""
    if loop is None:
        return "no event loop is running\n"
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    out = io.StringIO()
    out.write(f"{len(tasks)} unfinished asyncio task(s)\n")
    for task in tasks:
        out.write(f"--- {task!r}\n")
        task.print_stack(file=out)
    return out.getvalue()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Generator[None, None, None]:
    """Record the tasks of the loop the alarm interrupts, then let pytest-timeout's handler fail the test."""
    yield
    if settings.method != "signal":
        return
    handler = signal.getsignal(signal.SIGALRM)
    if not callable(handler):
        return

    def alarm(signum: int, frame: FrameType | None) -> Any:
        item.stash[_TASKS_AT_TIMEOUT] = format_tasks(running_loop())
        return handler(signum, frame)

    signal.signal(signal.SIGALRM, alarm)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    tasks = item.stash.get(_TASKS_AT_TIMEOUT, None)
    if tasks is not None:
        del item.stash[_TASKS_AT_TIMEOUT]
        outcome.get_result().sections.append(("asyncio tasks at the timeout", tasks))


# --- a hang after the timeout, and the session's deadline -------------------------------------


class _Watchdog(threading.Thread):
    """Interrupts the test ``grace`` seconds past its timeout, and ends the run another ``grace`` later."""

    def __init__(self, item: pytest.Item, timeout: float, grace: float, terminal: TextIO) -> None:
        super().__init__(name=f"hang watchdog: {item.nodeid}", daemon=True)
        self.item, self.timeout, self.grace, self.terminal = item, timeout, grace, terminal
        self.finished = threading.Event()
        self.main = threading.main_thread().ident

    def run(self) -> None:
        if self.finished.wait(self.timeout + self.grace):
            return
        assert self.main is not None
        signal.pthread_kill(self.main, signal.SIGUSR1)  # _interrupt, in the main thread
        if self.finished.wait(self.grace):
            return
        self.banner(f"still running {2 * self.grace:.0f} s after its {self.timeout:.0f} s timeout; ending the run")
        faulthandler.dump_traceback(file=self.terminal, all_threads=True)
        self.terminal.flush()
        os._exit(HANG_EXIT_STATUS)

    def banner(self, what: str) -> None:
        self.terminal.write(f"\n{'+' * 30} {self.item.nodeid}: {what} {'+' * 30}\n")
        self.terminal.flush()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if not _RUNNING:
        return  # the test ended as the signal came
    watchdog = _RUNNING[0]
    watchdog.banner(f"still running {watchdog.grace:.0f} s after its {watchdog.timeout:.0f} s timeout")
    faulthandler.dump_traceback(file=watchdog.terminal, all_threads=True)
    watchdog.terminal.write(format_tasks(running_loop()))
    watchdog.terminal.flush()
    raise Hung(
        f"{watchdog.item.nodeid} was still running {watchdog.grace:.0f} s after its {watchdog.timeout:.0f} s "
        "timeout; every thread's and task's stack is printed above it"
    )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    timeout = timeout_of(item)
    watchdog = None
    if timeout > 0:
        grace = float(item.config.getini("hang_grace"))
        watchdog = _Watchdog(item, timeout, grace, item.config.stash[_TERMINAL])
        _RUNNING.append(watchdog)
        watchdog.start()
    try:
        yield
    finally:
        if watchdog is not None:
            _RUNNING.remove(watchdog)
            watchdog.finished.set()
    deadline = session_deadline()
    if deadline is not None and time.time() > deadline - SESSION_STOP_MARGIN_S:
        item.session.shouldfail = (
            f"${DEADLINE_ENV} is {max(0.0, deadline - time.time()) / 60:.0f} min away: no further test starts"
        )

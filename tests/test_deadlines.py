"""Every test run ends (tests/support/deadlines.py): throwaway runs that time out and hang on purpose, each in a
pytest of its own, end within a minute of their timeout with every thread's and task's stack printed."""

from __future__ import annotations

import ast
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


# --- no wait without a deadline, in the lab and the test support ----------------------------------------------

WAITS = frozenset({"wait", "join", "communicate", "get", "acquire", "read", "readline", "readexactly"})
"""Methods that block until another party acts: each needs a timeout argument or an enclosing deadline."""
BLOCKING_CALLS = frozenset({"run", "check_output", "check_call", "call"})
"""subprocess's functions that wait for the child: each needs timeout=."""
DEADLINE = "# deadline:"
"""The comment that says where a wait's deadline is kept (a session's timeout), or that none is and why: a
server's wait for work, which ends on cancellation."""


def _name(node: ast.AST) -> str:
    return ast.unparse(node)


def _under_deadline(parents: list[ast.AST]) -> bool:
    """Inside ``async with asyncio.timeout(...)`` (or ``timeout_at``)."""
    for parent in parents:
        if isinstance(parent, ast.AsyncWith):
            for item in parent.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and _name(call.func) in ("asyncio.timeout", "asyncio.timeout_at"):
                    return True
    return False


def _problem(call: ast.Call, parents: list[ast.AST]) -> str | None:
    """What makes a call wait without a deadline, or None."""
    func = _name(call.func)
    keywords = {k.arg for k in call.keywords}
    if func == "asyncio.wait_for":
        return f"{func}: asyncio.timeout instead (wait_for orphans its inner task on 3.11)"
    needs_timeout = (
        (func.startswith("subprocess.") and func.split(".")[-1] in BLOCKING_CALLS)
        or func == "aiohttp.ClientSession"
        or func.startswith("requests.")
    )
    if needs_timeout:
        return None if "timeout" in keywords else f"{func}: no timeout="
    if func == "asyncio.to_thread" and len(call.args) == 1 and not keywords:
        target = _name(call.args[0])
        return f"{func}({target}): a thread that waits for ever" if target.split(".")[-1] in WAITS else None
    if not isinstance(call.func, ast.Attribute) or call.func.attr not in WAITS or call.args or "timeout" in keywords:
        return None
    awaited = bool(parents) and isinstance(parents[-1], ast.Await)
    if awaited and _under_deadline(parents):
        return None
    if awaited or call.func.attr in ("wait", "join", "communicate"):
        return f"{func}(): no timeout and no enclosing asyncio.timeout"
    return None


def unbounded_waits(path: Path) -> list[str]:
    """The waits of one module that have no deadline: ``path:line: what``."""
    source = path.read_text()
    lines = source.splitlines()
    found: list[str] = []

    def marked(node: ast.AST) -> bool:
        line = node.lineno - 1
        return any(DEADLINE in lines[i] for i in (line - 1, line) if 0 <= i < len(lines))

    def visit(node: ast.AST, parents: list[ast.AST]) -> None:
        if isinstance(node, ast.Call) and not marked(node):
            problem = _problem(node, parents)
            if problem is not None:
                found.append(f"{path.name}:{node.lineno}: {problem}")
                if _name(node.func) == "asyncio.wait_for":
                    return  # what it waits for is reported with it
        for child in ast.iter_child_nodes(node):
            visit(child, [*parents, node])

    visit(ast.parse(source), [])
    return found


def test_no_wait_without_a_deadline_in_the_lab_or_the_test_support() -> None:
    modules = [
        *(paths.ROOT / "lab" / "kvoffload_lab").rglob("*.py"),
        *(paths.ROOT / "tests" / "support").glob("*.py"),
    ]
    assert len(modules) > 40
    found = [f"{module.parent.name}/{line}" for module in sorted(modules) for line in unbounded_waits(module)]
    assert not found, "waits without a deadline:\n" + "\n".join(found)


def test_the_wait_check_finds_each_kind_of_unbounded_wait(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    text = textwrap.dedent(
        """
        async def f(process, event, queue, lock):
            await asyncio.wait_for(event.wait(), 1)
            subprocess.run(["true"])
            await asyncio.to_thread(process.wait)
            await event.wait()
            await queue.get()
            process.wait()
            aiohttp.ClientSession()
            requests.get("http://x")
            async with asyncio.timeout(1):
                await event.wait()
            process.wait(timeout=1)
            subprocess.run(["true"], timeout=1)
            await event.wait()  # deadline: none; a server's wait for work, ended by cancellation
        """
    )
    module.write_text(text)
    found = unbounded_waits(module)
    assert [line.split(": ")[1] for line in found] == [
        "asyncio.wait_for",
        "subprocess.run",
        "asyncio.to_thread(process.wait)",
        "event.wait()",
        "queue.get()",
        "process.wait()",
        "aiohttp.ClientSession",
        "requests.get",
    ], found

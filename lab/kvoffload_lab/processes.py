"""Ending the lab's child processes within a deadline: SIGTERM, a grace period, SIGKILL, then a bounded wait.

No wait here is unbounded (issue 39): a process that outlives SIGKILL by :data:`KILL_WAIT_S` (stuck in the kernel)
raises :class:`ProcessStuck`, naming it, rather than holding up a test or the demo for ever. The async form polls
from the event loop, so no thread is left waiting that the loop's teardown would then wait for.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

KILL_WAIT_S = 10.0
"""How long a SIGKILLed process may take to be reaped."""
POLL_S = 0.05


class ProcessStuck(RuntimeError):
    """A child process that SIGKILL did not end within :data:`KILL_WAIT_S`."""


def end_process(process: subprocess.Popen[Any], *, name: str, grace: float) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
    try:
        return process.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        raise ProcessStuck(f"{name} (pid {process.pid}) outlived SIGKILL by {KILL_WAIT_S:.0f} s") from None


async def exited(process: subprocess.Popen[Any], within: float) -> int | None:
    """The exit status once the process ends, or None if it still runs after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while process.poll() is None and loop.time() < deadline:
        await asyncio.sleep(POLL_S)  # a poll interval; the loop serves meanwhile
    return process.poll()


async def end_process_async(process: subprocess.Popen[Any], *, name: str, grace: float) -> int:
    """:func:`end_process` from the event loop."""
    if process.poll() is None:
        process.terminate()
        if await exited(process, grace) is not None:
            return int(process.returncode)
        process.kill()
    return await reaped(process, name=name)


async def reaped(process: subprocess.Popen[Any], *, name: str) -> int:
    """The exit status of a process just SIGKILLed."""
    code = await exited(process, KILL_WAIT_S)
    if code is None:
        raise ProcessStuck(f"{name} (pid {process.pid}) outlived SIGKILL by {KILL_WAIT_S:.0f} s")
    return code


__all__ = ("KILL_WAIT_S", "ProcessStuck", "end_process", "end_process_async", "exited", "reaped")

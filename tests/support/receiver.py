"""A real webhook receiver: ``http.server`` on 127.0.0.1 in a thread of its own, recording each POSTed JSON body.

It can answer with another status, hold its first requests until released (a slow receiver), answer its first
requests with what a script writes to the socket (garbage, a trickle), and start on a port chosen before (a
receiver that was down and comes up). ``free_port()`` gives a port where nothing listens:
a connection there is refused.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed: a connection there is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receiver:
    """``with Receiver() as r:`` serves at ``r.url``; ``r.wait_for(n)`` returns the first ``n`` bodies."""

    def __init__(
        self,
        port: int = 0,
        status: int = 200,
        hold_first: int = 0,
        script: list[Callable[[Any], None]] | None = None,
    ) -> None:
        self.port = port
        self.script = list(script or [])
        """Each of the first requests is answered by the next of these, called with the socket's writer: raw
        bytes of the test's choosing. The request is counted in ``arrived``, and its body is not recorded."""
        self.status = status
        self.hold_first = hold_first
        """So many requests are held (no answer) until :meth:`release`: a receiver slower than the timeout."""
        self.released = threading.Event()
        self.bodies: list[dict[str, Any]] = []
        self.arrived = 0
        """Requests that came in, answered or not."""
        self.headers: list[dict[str, str]] = []
        self.requests: list[str] = []
        """``METHOD path`` of every request, of any method, as it came."""
        self._changed = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with receiver._changed:
                    receiver.requests.append(f"GET {self.path}")
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._changed:
                    receiver.requests.append(f"POST {self.path}")
                    receiver.arrived += 1
                    held = receiver.arrived <= receiver.hold_first
                    receiver._changed.notify_all()
                    answer = receiver.script.pop(0) if receiver.script and not held else None
                if held:
                    receiver.released.wait(30)
                    return  # the client gave up long ago; nothing is recorded
                if answer is not None:
                    self.close_connection = True
                    with contextlib.suppress(OSError):  # the client hung up on a trickle: as it should
                        answer(self.wfile)
                    return
                with receiver._changed:
                    receiver.headers.append(dict(self.headers))
                    if receiver.status < 300:
                        receiver.bodies.append(json.loads(body))
                    receiver._changed.notify_all()
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="receiver", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def release(self) -> None:
        self.released.set()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The first ``count`` bodies, once they came (AssertionError after ``timeout`` seconds)."""
        return self._wait(lambda: len(self.bodies) >= count, f"{count} notification(s)", timeout)[:count]

    def wait_arrived(self, count: int, timeout: float = 10.0) -> None:
        self._wait(lambda: self.arrived >= count, f"{count} request(s)", timeout)

    def _wait(self, done: Any, what: str, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                assert left > 0, f"the receiver did not get {what} in {timeout}s: got {self.bodies}"
                self._changed.wait(left)
            return list(self.bodies)

    def events(self) -> Iterator[str]:
        return (b.get("event", "") for b in self.bodies)


__all__ = ["Receiver", "free_port"]

"""Hostile stand-ins for a tenant's Prometheus (issue 33): huge bodies, gzip bombs, tarpits that drip a byte at a time.

Raw sockets, not ``http.server``: what is written, when, and how much of it the client took are the point. Each
server answers every connection the same way, counts the bytes it managed to send, and stops when closed.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from dataclasses import dataclass, field

EMPTY_ANSWER = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@dataclass
class HostileServer:
    """One listening socket and a thread per connection; ``mode`` says how it answers.

    - ``answer``: a well-formed empty answer (an honest Prometheus, for URL churn);
    - ``huge``: ``size`` bytes of JSON, chunked (no Content-Length), status ``status``;
    - ``declared``: a Content-Length of ``size``, then the same bytes;
    - ``gzip``: a small gzip body that decodes to ``size`` bytes;
    - ``tarpit``: headers at once, then the body one byte every ``drip`` seconds, for ever;
    - ``header-tarpit``: the status line, then a header one byte every ``drip`` seconds;
    - ``retry-after``: 503 with ``Retry-After: 3600``;
    - ``series``: a well-formed answer of ``size`` tiny series (what decodes to the most objects per byte).
    """

    mode: str
    size: int = 100 << 20
    status: int = 200
    drip: float = 1.0
    sent: int = 0
    """Bytes the clients took (what the kernel accepted: up to its socket buffers more than what was read)."""
    connections: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sock: socket.socket | None = None
    _body: bytes = b""
    """The body made once at start (``gzip``, ``series``)."""

    def start(self) -> HostileServer:
        if self.mode == "gzip":  # once, not per connection: compressing 100 MiB takes a second
            self._body = gzip.compress(b" " * self.size, compresslevel=9)
        elif self.mode == "series":
            one = b'{"metric":{},"value":[1,"1"]}'
            result = b",".join([one] * self.size)
            self._body = b'{"status":"success","data":{"resultType":"vector","result":[' + result + b"]}}"
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._sock.settimeout(0.2)
        threading.Thread(target=self._accept, name=f"hostile {self.mode}", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._sock is not None
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), name="hostile connection", daemon=True).start()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.sent += len(data)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                conn.recv(65536)  # the request (one packet on loopback)
                self._answer(conn)
            except OSError:
                pass  # the client cut it: what the test wants

    def _answer(self, conn: socket.socket) -> None:
        reason = b"OK" if self.status == 200 else b"Error"
        # One answer a connection, and each says so: a client would send its next query down a closed one.
        head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n" % (self.status, reason)
        if self.mode == "answer":
            self._send(conn, head + b"Content-Length: %d\r\n\r\n" % len(EMPTY_ANSWER) + EMPTY_ANSWER)
        elif self.mode in ("huge", "declared"):
            chunked = self.mode == "huge"
            framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % self.size
            self._send(conn, head + framing + b"\r\n")
            piece = b'{"status":"success","data":{"resultType":"vector","result":["' + b"x" * (1 << 20)
            left = self.size
            while left > 0 and not self._stop.is_set():
                data = piece[: min(left, len(piece))]
                self._send(conn, b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                left -= len(data)
            if chunked:
                self._send(conn, b"0\r\n\r\n")
        elif self.mode == "gzip":
            body = self._body
            self._send(conn, head + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        elif self.mode == "tarpit":
            self._send(conn, head + b"Content-Length: 1000000\r\n\r\n")
            self._drip(conn)
        elif self.mode == "header-tarpit":
            self._send(conn, b"HTTP/1.1 200 OK\r\nX-Slow: ")
            self._drip(conn)
        elif self.mode == "retry-after":
            body = b"overloaded"
            self._send(
                conn,
                b"HTTP/1.1 503 Busy\r\nRetry-After: 3600\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body),
            )
        elif self.mode == "series":
            self._send(conn, head + b"Content-Length: %d\r\n\r\n" % len(self._body))
            self._send(conn, self._body)
        else:
            raise ValueError(self.mode)

    def _drip(self, conn: socket.socket) -> None:
        while not self._stop.wait(self.drip):
            self._send(conn, b"x")


def vm_rss_kib() -> int:
    """This process's resident set now (``VmRSS``), in KiB; 0 where /proc is not."""
    return _status_kib("VmRSS")


def vm_hwm_kib() -> int:
    """This process's peak resident set (``VmHWM``), in KiB; 0 where /proc is not."""
    return _status_kib("VmHWM")


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def wait_until(predicate: object, timeout: float = 5.0) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if callable(predicate) and predicate():
            return True
        time.sleep(0.02)
    return False

"""The bounded HTTP under the Prometheus provider (issue 33): how the operator reaches Prometheus (headers, basic
auth, TLS), a total deadline per query that cuts a socket which drips, caps on what of an answer is read, the
process's query threads, and a one-line reason for each way a query fails."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import re
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from kvoffload.api.errors import printable
from kvoffload.api.promql import TemplateError

HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP header name (RFC 9110's token)."""

RESERVED_HEADERS = frozenset({"authorization", "host", "content-length", "transfer-encoding", "connection"})
"""Headers an operator-wide setting may not set: Authorization comes from a token or basic auth read from a
Secret (never a value on the command line, where ``ps`` and the Deployment show it); the rest are the
transport's."""


def header_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` cannot be an extra header of every query; None when it can."""
    if not HEADER_NAME.match(name):
        return f"{name!r} is not an HTTP header name"
    if name.lower() in RESERVED_HEADERS:
        return f"{name} may not be set as an extra header (a token or basic auth from a Secret gives Authorization)"
    if any(c in value for c in "\r\n\0"):
        return f"the value of {name} holds a line break or NUL"
    return None


@dataclass(frozen=True)
class Connection:
    """How the operator reaches the admin's Prometheus beyond its URL: extra headers (Mimir's, Cortex's or a Thanos
    receive's tenant header ``X-Scope-OrgID``), basic auth and TLS. Operator-wide: a policy sets none of it, and the
    controller applies it only where the operator's own token may go (its ``--prometheus-url`` or an allowed URL)."""

    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every query, in order."""
    username: str | None = None
    """Basic auth's user; sent only with a password file, and never beside a bearer token."""
    password_file: Path | None = field(default=None)
    """Basic auth's password, read again for every batch so a rotated Secret is picked up."""
    ca_file: Path | None = None
    """A PEM bundle of the CAs to trust instead of the system's."""
    insecure_skip_verify: bool = False
    """Do not verify Prometheus's certificate at all: an explicit opt-in, warned about."""

    @property
    def verify(self) -> bool | str:
        """requests' ``verify``: False when skipping, the CA bundle's path, or True (the system's CAs)."""
        if self.insecure_skip_verify:
            return False
        return str(self.ca_file) if self.ca_file is not None else True

    @property
    def configured(self) -> bool:
        """Whether any of it is set: then it is the admin's Prometheus's, and goes nowhere else."""
        return self != Connection()

    def problems(self) -> list[str]:
        """What is wrong with these settings as given; empty when they can be used."""
        found = [problem for name, value in self.headers if (problem := header_problem(name, value))]
        if (self.username is None) != (self.password_file is None):
            found.append("basic auth needs both a username and a password file")
        if self.username is not None and ":" in self.username:
            found.append("a basic auth username may not contain ':'")
        if self.insecure_skip_verify and self.ca_file is not None:
            found.append("give a CA file or skip verification, not both")
        for what, path in (("password file", self.password_file), ("CA file", self.ca_file)):
            if path is not None and not path.is_file():
                found.append(f"the {what} {path} is not a readable file")
        return found


QUERY_CONCURRENCY = 4
"""Queries of one batch in flight at once. Prometheus evaluates them side by side (its own limit is 20): a batch
that asks fleet-wide took 50-140 ms a query after a restart over 1,000 policies, one after the other."""

QUERY_THREADS = 8
"""Threads that send every provider's queries, however many Prometheus sources the policies name (issue 33: 50 URL
edits of one policy once left 50 providers of 4 threads each). Each provider keeps at most ``QUERY_CONCURRENCY`` of
them busy, so one slow source leaves the others half the pool."""

MAX_ANSWER_BYTES = 16 << 20
"""The largest answer body read for one query (issue 33: a 120 MiB body took one cycle to 1.1 GiB RSS). Honest
answers stay far below: a batch of 100 policies reads some 10-600 kB a query, and a fleet-wide one over 1,000 policies
of 16 pods about 6 MB. A hostile one of tiny series costs about 12 bytes of Python objects per byte once decoded,
hence also ``MAX_ANSWER_SERIES``."""

MAX_ANSWER_SERIES = 100_000
"""The most series an answer may hold, counted in its bytes before it is decoded (a fleet-wide answer over 1,000
policies of 16 pods holds some 32,000, and one of TTFT bucket counts 46,000: 23 a variant; 100,000 tiny ones decode to
about 40 MiB)."""

BODIES_IN_FLIGHT_BYTES = 40 << 20
"""What all queries of the process may hold of bodies being read at once, beyond ``FREE_BODY_BYTES`` each: without
it, ``QUERY_THREADS`` answers at the cap would be 128 MiB (the chart gives the operator 256Mi). A query that finds no
room fails at once rather than wait (waiting readers that each held part of it stalled one another until their
deadlines)."""

FREE_BODY_BYTES = 1 << 20
"""What of each body is read without the shared budget: every honest answer of a batch of 100 policies."""

MAX_ERROR_BYTES = 64 << 10
"""The most of an error answer's body read: its first 300 characters are all a reason shows."""

READ_CHUNK = 64 << 10

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers retried (``retries`` times) within the query's deadline; a Retry-After header is not obeyed (a tarpit
could ask for hours)."""


class QueryDeadlineExceeded(requests.Timeout):
    """No whole answer within a query's total deadline (connection, headers and body, retries included)."""


class AnswerTooLarge(requests.RequestException):
    """An answer over ``MAX_ANSWER_BYTES`` or ``MAX_ANSWER_SERIES``: read no further, and its connection closed."""


class PrometheusHTTPError(requests.RequestException):
    """An answer other than 200, with at most ``MAX_ERROR_BYTES`` of its body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class _Call:
    """One query's deadline and the sockets it has used: the deadline thread shuts them down when it passes, which
    ends a read blocked on a server that drips a byte at a time (a read timeout alone restarts with each byte)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self.done = False
        self.held = 0
        """Bytes of ``_BODIES`` this call holds."""
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            if self.done:
                return
            self._sockets.append(sock)
            if self.expired:  # a retry's new connection after the deadline: no use starting it
                _cut(sock)

    def expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.expired = True
            for sock in self._sockets:
                _cut(sock)

    def finish(self) -> None:
        with self._lock:
            self.done = True
            self._sockets.clear()


def _cut(sock: socket.socket) -> None:
    # The socket-level shutdown, not SSLSocket's (which would tear down its TLS state under the reading thread):
    # the blocked recv returns at once, in whichever thread it runs.
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Deadlines:
    """One daemon thread for the whole process that expires the calls whose deadline has passed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Call]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, call: _Call) -> None:
        with self._cond:
            heapq.heappush(self._heap, (call.deadline, next(self._order), call))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="prometheus deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].done:  # finished in time: nothing to cut
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                call = heapq.heappop(self._heap)[2]
            call.expire()


class _Budget:
    """Bytes shared by every query being read (``BODIES_IN_FLIGHT_BYTES``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False when there is no room."""
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


_BODIES = _Budget(BODIES_IN_FLIGHT_BYTES)
_DEADLINES = _Deadlines()
_current = threading.local()
"""The call the current thread is making (``_current.call``), for the connection classes below."""


def _attach(sock: socket.socket | None) -> None:
    call: _Call | None = getattr(_current, "call", None)
    if call is not None and sock is not None:
        call.attach(sock)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _attach(sock)  # before TLS: a handshake that drips is cut too
        return sock


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    """HTTPS, its socket watched as above (the method resolves to HTTPSConnection's below it)."""


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        _attach(getattr(conn, "sock", None))  # a kept-alive connection: its socket is the one this call reads
        return conn


class _WatchedHTTPSPool(_WatchedPool, HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def _watch_pools(manager: PoolManager) -> None:
    manager.pool_classes_by_scheme = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _BoundedAdapter(HTTPAdapter):
    """requests' adapter whose connections a query's deadline can cut, proxied ones included (a SOCKS proxy's are
    not: its pools are its own)."""

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        _watch_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            _watch_pools(manager)
        return manager


_query_pool: ThreadPoolExecutor | None = None
_query_pool_lock = threading.Lock()


def query_pool() -> ThreadPoolExecutor:
    """The process's ``QUERY_THREADS`` Prometheus query threads (made on first use), apart from the threads that
    call the Kubernetes API (asyncio's default executor)."""
    global _query_pool
    with _query_pool_lock:
        if _query_pool is None:
            _query_pool = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="prometheus query")
        return _query_pool


_T = TypeVar("_T")
_R = TypeVar("_R")


def _in_turn(pool: ThreadPoolExecutor, fn: Callable[[_T], _R], items: Iterable[_T], width: int) -> Iterator[_R]:
    """``pool.map(fn, items)`` with at most ``width`` of them submitted at once: answers in order, the first failure
    raised where it stands, and what was not yet sent is never sent."""
    todo = iter(items)
    running: deque[Future[_R]] = deque()
    try:
        for item in itertools.islice(todo, width):
            running.append(pool.submit(fn, item))
        while running:
            answer = running.popleft().result()
            for item in itertools.islice(todo, 1):
                running.append(pool.submit(fn, item))
            yield answer
    finally:
        for future in running:
            future.cancel()


def _read_capped(response: requests.Response, limit: int, call: _Call) -> tuple[bytearray, bool]:
    """At most ``limit`` bytes of the body, and whether there was more. Decoded bytes: urllib3 inflates gzip a read at a
    time, so a compressed bomb stops at the cap too. One buffer, never joined or copied (json reads a bytearray); each
    chunk is taken from the process's budget first (``call.held``: the caller gives it back)."""
    body = bytearray()
    while True:
        want = min(READ_CHUNK, limit + 1 - len(body))
        if len(body) + want > FREE_BODY_BYTES:
            if not _BODIES.take(want):
                raise AnswerTooLarge(
                    f"over {_mib(len(body))} while other answers hold the {_mib(_BODIES.limit)} all may hold at once"
                )
            call.held += want
        chunk = response.raw.read(want, decode_content=True)
        if not chunk:
            return body, False
        body += chunk
        if len(body) > limit:
            del body[limit:]
            return body, True


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


_REFUSED = {
    401: "Prometheus refused the credentials (HTTP 401): check the token, or the basic auth username and password",
    403: "Prometheus refused access (HTTP 403): the credentials are not allowed this tenant or these queries",
}


def _tls_reason(exc: BaseException) -> str | None:
    """The certificate check's own words (``IP address mismatch, ...``, ``unable to get local issuer certificate``),
    found down the exception's chain; None when it was no TLS failure."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return str(current.verify_message or current.reason or current)
        if isinstance(current, ssl.SSLError):
            return str(current.reason or current)
        todo.extend(a for a in current.args if isinstance(a, BaseException))
        todo.extend(e for e in (getattr(current, "reason", None), current.__cause__, current.__context__) if e)
    return None


def _describe(exc: BaseException) -> str:
    """A one-line reason, without the URL-encoded query noise of requests' messages: bounded and printable, as
    status carries it, and never a header's value (a token)."""
    return printable(_reason(exc))


def _reason(exc: BaseException) -> str:
    reason = exc.args[0].reason if exc.args and isinstance(exc.args[0], MaxRetryError) else None
    if isinstance(exc, QueryDeadlineExceeded):
        return f"Prometheus timed out: {exc}"
    if isinstance(exc, requests.Timeout) or isinstance(reason, TimeoutError | ReadTimeoutError):
        return f"Prometheus timed out: {type(reason or exc).__name__}"
    if isinstance(exc, requests.exceptions.SSLError):
        return (
            f"Prometheus's TLS certificate was not accepted: {_tls_reason(exc) or 'TLS handshake failed'} "
            "(trust its CA with a CA file; skip verification only where nobody can intercept)"
        )
    if isinstance(exc, requests.ConnectionError):
        return "Prometheus unreachable: connection failed"
    if isinstance(exc, requests.exceptions.InvalidHeader):  # its message holds the header's value: a token
        return "a header for Prometheus is not a valid HTTP header value (a line break or control character in it)"
    if isinstance(exc, PrometheusHTTPError):
        code = exc.status
        if 300 <= code < 400:
            return f"Prometheus answered with a redirect (HTTP {code}), which is not followed"
        body = exc.body[:300].decode("utf-8", "replace")
        return _REFUSED.get(code, f"Prometheus answered with an error: HTTP {code}: {body}")
    if isinstance(exc, AnswerTooLarge):
        return f"Prometheus's answer is too large to read: {exc}"
    if isinstance(exc, requests.exceptions.RetryError):
        return f"Prometheus answered with an error: {str(exc)[:300]}"
    if isinstance(exc, TemplateError):  # only extraMatchers is parsed on the way out
        return f"spec.prometheus.extraMatchers cannot be used: {str(exc)[:200]}"
    if isinstance(exc, ValueError | KeyError | TypeError | IndexError):
        return f"Prometheus answer not understood: {type(exc).__name__}: {str(exc)[:200]}"
    return f"Prometheus query failed: {type(exc).__name__}: {str(exc)[:200]}"

"""A load generator that replays a real reuse pattern: the Mooncake request traces.

Each trace line carries one hash id per 512-token prompt block; equal ids at
the same position are a shared prefix. Every block id maps to a fixed run of
token ids, so two requests that share ids share a token prefix, and an engine's
prefix cache (real or emulated) sees the same reuse Moonshot's service saw.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import aiohttp

TRACE_BLOCK_TOKENS = 512
VOCAB = 32_000
BUNDLED_TRACE = "mooncake-conversation.jsonl.gz"


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives and what prompt blocks it carries."""

    at: float
    """Seconds from the start of the trace."""
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(path: Path | None = None, limit: int | None = None) -> list[TraceRequest]:
    """Requests of a Mooncake JSONL trace (plain or .gz); the bundled conversation trace by default."""
    if path is None:
        raw = (resources.files("kvoffload_lab") / "data" / BUNDLED_TRACE).read_bytes()
        text = gzip.decompress(raw).decode()
    elif path.suffix == ".gz":
        text = gzip.decompress(path.read_bytes()).decode()
    else:
        text = path.read_text()
    out: list[TraceRequest] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        out.append(
            TraceRequest(
                at=row["timestamp"] / 1000.0,
                input_length=int(row["input_length"]),
                output_length=int(row["output_length"]),
                hash_ids=tuple(int(h) for h in row["hash_ids"]),
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


def block_tokens(hash_id: int, block_tokens: int = TRACE_BLOCK_TOKENS) -> list[int]:
    """The fixed token ids that stand for one trace block (the same id always gives the same tokens)."""
    rng = random.Random(hash_id)
    return [rng.randrange(1, VOCAB) for _ in range(block_tokens)]


def prompt_tokens(request: TraceRequest, scale: float = 1.0, limit: int | None = None) -> list[int]:
    """The prompt of a trace request as token ids, optionally shrunk by ``scale`` (0 < scale <= 1).

    Shrinking keeps the block structure (each block becomes ``512 * scale`` tokens) so reuse is
    preserved while engines and payloads stay small enough for a laptop. ``limit`` cuts longer
    prompts to their first ``limit`` tokens, as a context limit would; the shared prefix stays.
    """
    per_block = max(1, round(TRACE_BLOCK_TOKENS * scale))
    want = max(1, round(request.input_length * scale))
    if limit is not None:
        want = min(want, limit)
    tokens: list[int] = []
    for hash_id in request.hash_ids:
        tokens.extend(block_tokens(hash_id, per_block))
        if len(tokens) >= want:
            break
    return tokens[:want]


def session_key(request: TraceRequest) -> bytes:
    """What identifies a conversation: its first two blocks (the first is the system prompt every
    request of the Mooncake traces shares, the second starts the conversation)."""
    return repr(request.hash_ids[:2]).encode()


def _bucket(key: bytes, salt: bytes = b"") -> int:
    return int.from_bytes(hashlib.blake2b(key + salt, digest_size=8).digest(), "big")


def route(request: TraceRequest, endpoints: Sequence[str]) -> str:
    """The engine a prefix-aware router sends a request to: rendezvous hashing on its conversation,
    so every turn of a conversation finds the engine that holds its KV, and a change of endpoints
    moves only the conversations of the engines that came or went."""
    key = session_key(request)
    return max(endpoints, key=lambda url: _bucket(key, url.encode()))


def schedule(
    trace: Sequence[TraceRequest], speedup: float, duration: float | None = None, sessions: int = 1
) -> Iterator[tuple[float, TraceRequest]]:
    """(send offset in seconds, request) pairs, the trace's clock divided by ``speedup``.

    ``sessions: k`` keeps one conversation in ``k`` (all of its turns), so the request rate drops
    ``k``-fold while each conversation keeps its own timing, and so its reuse. With a ``duration``
    the trace loops; each lap takes the next ``1/k`` of the conversations, so no lap replays one.
    """
    if not trace:
        return
    span = trace[-1].at + 1.0
    lap = 0
    while True:
        for req in trace:
            if sessions > 1 and _bucket(session_key(req)) % sessions != lap % sessions:
                continue
            offset = (lap * span + req.at) / speedup
            if duration is not None and offset >= duration:
                return
            yield offset, req
        lap += 1
        if duration is None:
            return


@dataclass
class LoadStats:
    """What the generator did: counts, not latencies (Prometheus has those)."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    """Requests not sent because ``max_in_flight`` was reached (the load is shed, not queued)."""
    errors: dict[str, int] = field(default_factory=dict)


async def replay(
    endpoints: Callable[[], Sequence[str]],
    trace: Sequence[TraceRequest],
    *,
    model: str,
    speedup: float = 10.0,
    duration: float = 60.0,
    scale: float = 0.25,
    sessions: int = 1,
    max_prompt_tokens: int | None = None,
    max_tokens: int = 4,
    max_in_flight: int = 32,
    prefix_routing: bool = True,
) -> LoadStats:
    """Send the trace to whichever engines ``endpoints()`` lists at each send, for ``duration`` seconds.

    With ``prefix_routing`` each conversation sticks to one engine (``route``), as with a prefix-aware
    router in front of vLLM; otherwise requests go round-robin, as a plain Service spreads them.
    Either way traffic splits between stable and canary by replica count.
    """
    stats = LoadStats()
    in_flight: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    turn = 0

    async def one(session: aiohttp.ClientSession, url: str, req: TraceRequest) -> None:
        body = {
            "model": model,
            "prompt": prompt_tokens(req, scale, max_prompt_tokens),
            "max_tokens": max(1, min(req.output_length, max_tokens)),
        }
        try:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                await resp.read()  # deadline: the session's total timeout
                if resp.status == 200:
                    stats.ok += 1
                else:
                    stats.failed += 1
                    stats.errors[str(resp.status)] = stats.errors.get(str(resp.status), 0) + 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            stats.failed += 1
            name = type(exc).__name__
            stats.errors[name] = stats.errors.get(name, 0) + 1

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for offset, req in schedule(trace, speedup, duration, sessions):
            delay = offset - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            urls = list(endpoints())
            if not urls or len(in_flight) >= max_in_flight:
                stats.skipped += 1
                continue
            url = route(req, urls) if prefix_routing else urls[turn % len(urls)]
            turn += 1
            stats.sent += 1
            task = asyncio.create_task(one(session, url, req))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight, timeout=30)
    return stats

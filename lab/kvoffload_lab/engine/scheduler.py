"""One engine's scheduler: every request of the engine shares its steps, its GPU KV blocks and its host link.

Clock-agnostic and pure: the caller passes the time (the server the event loop's, the tests a
virtual clock), so a whole workload runs in virtual time. Modelled on vLLM's V1 scheduler:

- **A token budget per step** (``--max-num-batched-tokens``) and at most ``--max-num-seqs``
  running requests. Running requests go first, one token per decoding request, then prefill
  chunks (chunked prefill: a prompt longer than the budget left takes several steps); then the
  waiting queue, first come first served, while the budget, the sequence limit and the GPU KV
  blocks last. A request's prefix is looked up (``KVEngine.admit``) when it is scheduled, as vLLM
  does, not when it arrives.
- **GPU KV blocks**: a scheduled request holds the blocks of its prompt and its ``max_tokens``,
  less the leading blocks it hits in the GPU prefix cache, which it shares (vLLM allocates them
  step by step and preempts when short; here they are taken up front and nothing is preempted).
  A request that needs more than the whole cache waits for an empty engine.
- **Loads**: a request with offloaded hits waits for its load (``WAITING_FOR_REMOTE_KVS`` in
  vLLM) on the host link, then for ``restore_step_s`` (the step the asynchronous load lands in),
  before its first chunk is scheduled.
- **Stores**: after each step the full blocks it computed that the CPU tier did not hold are
  stored (vLLM's offloading connector stores on compute), on the same link; a finished request
  keeps its GPU blocks until its stores are done (the connector's ``request_finished`` delays the
  free while a store is in flight).
- **Step time**: ``CostModel.step_seconds`` of the step's chunks and decode batch, so the ITL a
  request sees grows with the batch and with the prefills sharing its steps.

The prefix caches' contents are the ``KVEngine``'s and change at lookup time (a block is in the
CPU tier from the lookup that computes it, not from the end of its store).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from kvoffload_lab.engine.blockcache import BlockHash, block_hashes
from kvoffload_lab.engine.kvengine import Admission, KVEngine
from kvoffload_lab.engine.pcie import Link, Transfer

WAITING: Final = "waiting"
LOADING: Final = "loading"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
DONE: Final = "done"


@dataclass(eq=False)
class Request:
    """One request as the scheduler sees it, and what happened to it (times on the caller's clock)."""

    tokens: Sequence[int]
    max_tokens: int
    arrived: float
    """When it reached the scheduler (after the API server's fixed cost)."""
    state: str = WAITING
    submitted: float = 0.0
    """When the scheduler got it (``arrived`` may be set earlier: the client's send)."""
    admission: Admission | None = None
    blocks: int = 0
    scheduled_at: float | None = None
    ready_at: float | None = None
    """When a load's blocks are usable (load done plus the engine step it lands in)."""
    load: Transfer | None = None
    computed: int = 0
    """Prompt tokens computed so far."""
    to_store: int = 0
    """Blocks still to store to the CPU tier."""
    stores: set[Transfer] = field(default_factory=set)
    token_times: list[float] = field(default_factory=list)
    """When each output token came out (the first is the first token)."""
    finished_at: float | None = None
    freed_at: float | None = None
    """When its GPU blocks went back (after its stores, if any were in flight)."""
    saved_gpu_s: float = 0.0
    """GPU compute its offloaded hits spared: the prefill with them recomputed less the one it ran."""
    hashes: list[BlockHash] | None = None

    @property
    def ttft(self) -> float | None:
        return None if not self.token_times else self.token_times[0] - self.arrived

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


@dataclass(frozen=True)
class Step:
    """One planned engine step."""

    start: float
    duration: float
    chunks: tuple[tuple[Request, int], ...]
    """(request, tokens computed in this step) of every prefill chunk."""
    decodes: tuple[Request, ...]

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.chunks) + len(self.decodes)


@dataclass
class Totals:
    """What the engine did, cumulative (the emulator's ``/emulator/state``; the demo's report reads it)."""

    steps: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    """Prompt tokens computed."""
    avoided_tokens: int = 0
    """Prompt tokens an offload tier provided (not recomputed)."""
    saved_gpu_s: float = 0.0
    stored_bytes: int = 0
    loaded_bytes: int = 0
    finished: int = 0


class Scheduler:
    """The steps, blocks and link of one engine, over a ``KVEngine``'s caches."""

    def __init__(self, engine: KVEngine, *, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.engine = engine
        self.config = engine.config
        self.cost = engine.config.cost
        self.budget = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.link = Link(self.cost.link_factor)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        """Scheduled and not finished, in the order they were scheduled."""
        self.held: list[Request] = []
        """Finished, their blocks kept until their stores end."""
        self.blocks_used = 0
        self.totals = Totals()
        self.current: Step | None = None

    # --- the queue ------------------------------------------------------------------------------

    def submit(self, tokens: Sequence[int], max_tokens: int, now: float) -> Request:
        request = Request(list(tokens), max_tokens, now, submitted=now)
        self.waiting.append(request)
        return request

    @property
    def capacity(self) -> int:
        return self.config.gpu_kv_blocks

    def _blocks_for(self, request: Request) -> int:
        """New GPU blocks the request takes: its prompt and output, less the leading blocks already cached on the
        GPU, which it shares (vLLM's prefix cache hands the same blocks to every request that hits them)."""
        bs = self.config.block_size
        if request.hashes is None:
            request.hashes = block_hashes(request.tokens, bs)
        shared = self.engine.gpu.prefix_hits(request.hashes)
        need = math.ceil((len(request.tokens) + request.max_tokens) / bs) - shared
        return max(1, min(need, self.capacity))

    # --- transfers ----------------------------------------------------------------------------------

    def _settle(self, now: float) -> None:
        """Move the link to ``now``: loads that ended make their requests ready, stores that ended free blocks."""
        self.link.advance(now)
        for t in self.link.take_completed():
            req = t.owner
            if not isinstance(req, Request):
                continue
            if t is req.load:
                assert t.finished is not None
                req.ready_at = t.finished + self.cost.restore_step_s
            else:
                req.stores.discard(t)
        for req in list(self.held):
            if not req.stores:
                self.held.remove(req)
                self._free(req, max(now, req.finished_at or now))

    def _free(self, req: Request, at: float) -> None:
        self.blocks_used -= req.blocks
        req.freed_at = at

    # --- a step ---------------------------------------------------------------------------------------

    def plan(self, now: float) -> Step | None:
        """Schedule the next step at ``now``; None when nothing can run now (see ``next_event``)."""
        assert self.current is None, "finish the current step first"
        self._settle(now)
        budget = self.budget
        decodes: list[Request] = []
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            if req.state == DECODE and budget > 0:
                decodes.append(req)
                budget -= 1
        for req in self.running:
            if req.state == LOADING and req.ready_at is not None and req.ready_at <= now:
                req.state = PREFILL
            if req.state == PREFILL and budget > 0:
                adm = req.admission
                assert adm is not None
                n = min(adm.computed_tokens - req.computed, budget)
                chunks.append((req, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            req = self.waiting[0]
            if req.submitted > now:
                break  # not there yet at this step's start
            need = self._blocks_for(req)
            if self.blocks_used + need > self.capacity:
                break  # first come, first served: the head waits for blocks, nobody overtakes it
            self.waiting.popleft()
            self._schedule(req, now, need)
            if req.state == PREFILL:
                adm = req.admission
                assert adm is not None
                n = min(adm.computed_tokens, budget)
                chunks.append((req, n))
                budget -= n
        if not chunks and not decodes:
            return None
        cost_chunks = [(n, self._cached(req) + req.computed) for req, n in chunks]
        step = Step(now, self.cost.step_seconds(cost_chunks, len(decodes)), tuple(chunks), tuple(decodes))
        self.current = step
        return step

    def _cached(self, req: Request) -> int:
        adm = req.admission
        assert adm is not None
        return adm.cached_tokens

    def _schedule(self, req: Request, now: float, blocks: int) -> None:
        adm = self.engine.admit(req.tokens)
        req.admission, req.blocks, req.scheduled_at = adm, blocks, now
        req.to_store = adm.stored_blocks
        self.blocks_used += blocks
        self.running.append(req)
        cpu_bytes, disk_bytes = adm.price.cpu_restored_bytes, adm.price.disk_restored_bytes
        if cpu_bytes or disk_bytes:
            req.state = LOADING
            work = self.cost.load_seconds(cpu_bytes, disk_bytes)
            req.load = self.link.submit(now, "h2d", work, req, cpu_bytes + disk_bytes)
            self.totals.loaded_bytes += cpu_bytes + disk_bytes
            self.totals.avoided_tokens += adm.external_tokens
            # What the hits spared: computing them too, against computing only the rest after them.
            whole = self.cost.compute_seconds(adm.computed_tokens + adm.external_tokens, adm.local_hit_tokens)
            req.saved_gpu_s = max(0.0, whole - self.cost.compute_seconds(adm.computed_tokens, adm.cached_tokens))
            self.totals.saved_gpu_s += req.saved_gpu_s
        else:
            req.state = PREFILL

    def finish(self) -> list[Request]:
        """End the current step at its end time: tokens out, stores queued; the requests that finished."""
        step = self.current
        assert step is not None, "no step in flight"
        self.current = None
        end = step.end
        self._settle(end)
        self.totals.steps += 1
        self.totals.busy_s += step.duration
        finished: list[Request] = []
        for req in step.decodes:
            req.token_times.append(end)
            if len(req.token_times) >= req.max_tokens:
                finished.append(req)
        for req, n in step.chunks:
            adm = req.admission
            assert adm is not None
            req.computed += n
            self.totals.prefill_tokens += n
            self._store(req, n, end)
            if req.computed >= adm.computed_tokens:
                req.state = DECODE
                req.token_times.append(end)  # the step that ends a prefill samples the first token
                if req.max_tokens <= 1:
                    finished.append(req)
        for req in finished:
            req.state, req.finished_at = DONE, end
            self.running.remove(req)
            self.totals.finished += 1
            if req.stores:
                self.held.append(req)
            else:
                self._free(req, end)
        return finished

    def _store(self, req: Request, n: int, now: float) -> None:
        """Store the blocks a chunk of ``n`` tokens completed (its share of the request's new blocks)."""
        adm = req.admission
        assert adm is not None
        if req.to_store <= 0 or adm.computed_tokens <= 0:
            return
        blocks = (
            req.to_store
            if req.computed >= adm.computed_tokens
            else min(req.to_store, math.ceil(adm.stored_blocks * n / adm.computed_tokens))
        )
        req.to_store -= blocks
        nbytes = blocks * self.config.block_bytes
        req.stores.add(self.link.submit(now, "d2h", self.cost.store_seconds(nbytes), req, nbytes))
        self.totals.stored_bytes += nbytes

    # --- idling -----------------------------------------------------------------------------------------

    def next_event(self, now: float) -> float | None:
        """When something may change with no new request: a load lands, a store frees blocks. None: nothing pending."""
        self._settle(now)
        times = [r.ready_at for r in self.running if r.state == LOADING and r.ready_at is not None]
        finish = self.link.next_finish()
        if finish is not None:
            times.append(finish)
        return min(times) if times else None

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and not self.held

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.blocks_used / max(1, self.capacity))


def run_virtual(
    scheduler: Scheduler, arrivals: Sequence[tuple[float, Sequence[int], int]], *, base_s: float | None = None
) -> list[Request]:
    """Run ``arrivals`` (time, prompt, max_tokens) through ``scheduler`` on a virtual clock; every request, finished.

    ``base_s`` (default the cost model's) delays each arrival as the API server's fixed cost does; vLLM's block
    hashing of the prompt delays it too.
    """
    delay = scheduler.cost.base_s if base_s is None else base_s
    cost = scheduler.cost
    pending = deque(
        sorted(
            ((at + delay + cost.hash_seconds(len(tokens)), tokens, mt, at) for at, tokens, mt in arrivals),
            key=lambda a: a[0],
        )
    )
    out: list[Request] = []
    now = 0.0
    while pending or not scheduler.idle:
        while pending and pending[0][0] <= now:
            at, tokens, mt, sent = pending.popleft()
            req = scheduler.submit(tokens, mt, at)
            req.arrived = sent  # TTFT counts from the client's send
            out.append(req)
        step = scheduler.plan(now)
        if step is not None:
            scheduler.finish()
            now = step.end
            continue
        wake = [t for t in (scheduler.next_event(now), pending[0][0] if pending else None) if t is not None]
        if not wake:
            break
        now = max(now, min(wake))
    return out

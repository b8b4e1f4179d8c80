"""One engine's host link: loads (host -> GPU) and stores (GPU -> host) in flight, and how they contend.

A fluid model, clock-agnostic (the caller passes the time): each direction is a FIFO queue of
transfers, the head one moving. A transfer's ``work_s`` is what it takes with its direction to
itself (the profile's per-direction rate at the page size, or the laptop's 12.6 GB/s). While both
directions move at once each runs at ``both_ways_factor`` of that: the profile's both-ways rate
over the sum of its one-way rates (H200: 98 GB/s both ways against 55 + 55 one way, 0.89). So a
load queued behind another load waits for it, and a load running under heavy store traffic slows.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Final, Literal

Direction = Literal["h2d", "d2h"]
DIRECTIONS: Final[tuple[Direction, Direction]] = ("h2d", "d2h")
_EPS: Final = 1e-12


@dataclass(eq=False)
class Transfer:
    """One load or store: its work at the direction's own rate, and when it ended."""

    direction: Direction
    work_s: float
    submitted: float
    owner: object = None
    """Who waits for it (the scheduler's request)."""
    nbytes: int = 0
    remaining_s: float = field(init=False)
    finished: float | None = None

    def __post_init__(self) -> None:
        self.remaining_s = self.work_s


class Link:
    """The host link of one engine: a FIFO queue per direction, slowed while both directions move."""

    def __init__(self, both_ways_factor: float = 1.0) -> None:
        if not 0 < both_ways_factor <= 1:
            raise ValueError("both_ways_factor must be in (0, 1]")
        self.both_ways_factor = both_ways_factor
        self.queues: dict[Direction, deque[Transfer]] = {d: deque() for d in DIRECTIONS}
        self.clock = 0.0
        self.busy_s: dict[Direction, float] = dict.fromkeys(DIRECTIONS, 0.0)
        """Seconds each direction has been moving (for utilisation)."""
        self.completed: list[Transfer] = []
        """Transfers that ended and nobody has taken yet (``take_completed``)."""

    def submit(
        self, now: float, direction: Direction, work_s: float, owner: object = None, nbytes: int = 0
    ) -> Transfer:
        """Queue a transfer at ``now`` (the link is advanced to ``now`` first)."""
        self.advance(now)
        transfer = Transfer(direction, max(0.0, work_s), max(now, self.clock), owner, nbytes)
        self.queues[direction].append(transfer)
        self._pop_done(self.clock)  # a zero-work transfer ends at once
        return transfer

    def _rate(self) -> float:
        active = sum(1 for q in self.queues.values() if q)
        return self.both_ways_factor if active == 2 else 1.0

    def _pop_done(self, at: float) -> None:
        for q in self.queues.values():
            while q and q[0].remaining_s <= _EPS:
                t = q.popleft()
                t.remaining_s, t.finished = 0.0, at
                self.completed.append(t)

    def take_completed(self) -> list[Transfer]:
        """The transfers that ended since the last call, in the order they ended."""
        done, self.completed = self.completed, []
        return done

    def advance(self, now: float) -> None:
        """Move the link on to ``now``; what ended meanwhile waits in ``completed``."""
        if now < self.clock:
            return
        self._pop_done(self.clock)
        while self.clock < now:
            heads = [q[0] for q in self.queues.values() if q]
            if not heads:
                self.clock = now
                break
            rate = self._rate()
            dt = min(min(t.remaining_s for t in heads) / rate, now - self.clock)
            for d, q in self.queues.items():
                if q:
                    q[0].remaining_s -= dt * rate
                    self.busy_s[d] += dt
            self.clock += dt
            self._pop_done(self.clock)

    def next_finish(self) -> float | None:
        """When the next transfer ends at the current rates (None when the link is idle)."""
        heads = [q[0] for q in self.queues.values() if q]
        if not heads:
            return None
        return self.clock + min(t.remaining_s for t in heads) / self._rate()

    def backlog_s(self, direction: Direction) -> float:
        """Work queued in one direction, seconds at its own rate."""
        return math.fsum(t.remaining_s for t in self.queues[direction])

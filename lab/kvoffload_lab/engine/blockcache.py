"""Block caches for the GPU KV cache and the offload tiers, LRU and ARC, block by block.

A block is ``block_size`` consecutive prompt tokens. Like vLLM's prefix cache,
a block's identity is a hash chained over its parent's hash, so the same tokens
after a different prefix are a different block, and a prompt can only reuse a
run of leading blocks. Only full blocks are cached. Capacities are in blocks.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

BlockHash = bytes

_ROOT: BlockHash = b"\x00" * 16


def block_hashes(tokens: Sequence[int], block_size: int, parent: BlockHash | None = None) -> list[BlockHash]:
    """Chained hashes of the full ``block_size`` chunks of ``tokens`` (a trailing partial chunk is skipped).

    Deterministic across processes (blake2b, not Python's salted ``hash``).
    """
    if block_size <= 0:
        raise ValueError(f"block_size: must be positive, got {block_size}")
    hashes: list[BlockHash] = []
    prev = parent if parent is not None else _ROOT
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(b",".join(str(t).encode() for t in tokens[start : start + block_size]))
        prev = h.digest()
        hashes.append(prev)
    return hashes


class BlockCache(Protocol):
    """A tier of cached blocks with a fixed capacity."""

    capacity: int

    def __contains__(self, block: object) -> bool: ...

    def __len__(self) -> int: ...

    def prefix_hits(self, blocks: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``blocks`` are cached (no change to recency)."""
        ...

    def touch(self, blocks: Iterable[BlockHash]) -> None:
        """Record a use of cached blocks (the others are ignored)."""
        ...

    def insert(self, blocks: Iterable[BlockHash]) -> list[BlockHash]:
        """Cache ``blocks`` (a cached one counts as a use); returns the blocks evicted to make room."""
        ...

    def remove(self, block: BlockHash) -> None:
        """Drop a block if cached."""
        ...


def _prefix_hits(cache: BlockCache, blocks: Sequence[BlockHash]) -> int:
    n = 0
    for b in blocks:
        if b not in cache:
            break
        n += 1
    return n


class LRUCache:
    """Least-recently-used eviction (vLLM's GPU free-block queue and its default offload policy)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity: must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self._blocks: OrderedDict[BlockHash, None] = OrderedDict()

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def order(self) -> list[BlockHash]:
        """Blocks from least to most recently used."""
        return list(self._blocks)

    def prefix_hits(self, blocks: Sequence[BlockHash]) -> int:
        return _prefix_hits(self, blocks)

    def touch(self, blocks: Iterable[BlockHash]) -> None:
        for b in blocks:
            if b in self._blocks:
                self._blocks.move_to_end(b)

    def insert(self, blocks: Iterable[BlockHash]) -> list[BlockHash]:
        evicted: list[BlockHash] = []
        if self.capacity == 0:
            return evicted
        for b in blocks:
            if b in self._blocks:
                self._blocks.move_to_end(b)
                continue
            self._blocks[b] = None
            while len(self._blocks) > self.capacity:
                old, _ = self._blocks.popitem(last=False)
                evicted.append(old)
        return evicted

    def remove(self, block: BlockHash) -> None:
        self._blocks.pop(block, None)


class ARCCache:
    """Adaptive Replacement Cache (Megiddo & Modha, FAST 2003).

    T1 holds blocks seen once recently, T2 blocks seen at least twice; the ghost
    lists B1/B2 remember what was evicted from each, and a ghost hit moves the
    target size ``p`` of T1. A one-time scan therefore flushes T1 but not a hot
    set in T2, where LRU would lose the hot set.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity: must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self.p = 0.0
        self.t1: OrderedDict[BlockHash, None] = OrderedDict()
        self.t2: OrderedDict[BlockHash, None] = OrderedDict()
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()

    def __contains__(self, block: object) -> bool:
        return block in self.t1 or block in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def prefix_hits(self, blocks: Sequence[BlockHash]) -> int:
        return _prefix_hits(self, blocks)

    def touch(self, blocks: Iterable[BlockHash]) -> None:
        for b in blocks:
            if b in self.t1:
                del self.t1[b]
                self.t2[b] = None
            elif b in self.t2:
                self.t2.move_to_end(b)

    def _replace(self, in_b2: bool, evicted: list[BlockHash]) -> None:
        if self.t1 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p)):
            old, _ = self.t1.popitem(last=False)
            self.b1[old] = None
        elif self.t2:
            old, _ = self.t2.popitem(last=False)
            self.b2[old] = None
        else:  # only T1 holds blocks; p says keep them, but room is needed
            old, _ = self.t1.popitem(last=False)
            self.b1[old] = None
        evicted.append(old)

    def insert(self, blocks: Iterable[BlockHash]) -> list[BlockHash]:
        evicted: list[BlockHash] = []
        c = self.capacity
        if c == 0:
            return evicted
        for x in blocks:
            if x in self:
                self.touch([x])
            elif x in self.b1:
                self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
                self._replace(False, evicted)
                del self.b1[x]
                self.t2[x] = None
            elif x in self.b2:
                self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
                self._replace(True, evicted)
                del self.b2[x]
                self.t2[x] = None
            else:
                l1 = len(self.t1) + len(self.b1)
                total = l1 + len(self.t2) + len(self.b2)
                if l1 == c:
                    if len(self.t1) < c:
                        self.b1.popitem(last=False)
                        if len(self) >= c:
                            self._replace(False, evicted)
                    else:
                        old, _ = self.t1.popitem(last=False)
                        evicted.append(old)
                elif total >= c:
                    if total >= 2 * c:
                        self.b2.popitem(last=False)
                    if len(self) >= c:
                        self._replace(False, evicted)
                self.t1[x] = None
        return evicted

    def remove(self, block: BlockHash) -> None:
        self.t1.pop(block, None)
        self.t2.pop(block, None)


def make_cache(policy: str, capacity: int) -> LRUCache | ARCCache:
    """A cache for an eviction policy name (``lru`` or ``arc``, any case)."""
    kind = policy.lower()
    if kind == "lru":
        return LRUCache(capacity)
    if kind == "arc":
        return ARCCache(capacity)
    raise ValueError(f"eviction policy: must be lru or arc, got {policy!r}")

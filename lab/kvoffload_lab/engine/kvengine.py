"""The cache state of one engine: a request's prompt looked up tier by tier, its prefill priced."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvoffload_lab.engine.blockcache import ARCCache, BlockHash, LRUCache, block_hashes, make_cache
from kvoffload_lab.engine.config import EngineConfig, Tier
from kvoffload_lab.engine.costmodel import Price, price

VOCAB: Final = 151_936


def tokenize(text: str) -> list[int]:
    """A trivial deterministic tokenizer: one token per whitespace-separated word."""
    return [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest(), "big") % VOCAB for w in text.split()]


@dataclass(frozen=True)
class Admission:
    """Where one request's prompt tokens come from, and what its prefill costs."""

    prompt_tokens: int
    local_hit_tokens: int
    """From the GPU prefix cache."""
    cpu_hit_tokens: int
    disk_hit_tokens: int
    computed_tokens: int
    stored_blocks: int
    """Blocks newly written to the CPU tier (an offload store)."""
    price: Price

    @property
    def external_tokens(self) -> int:
        return self.cpu_hit_tokens + self.disk_hit_tokens

    @property
    def cached_tokens(self) -> int:
        return self.local_hit_tokens + self.external_tokens


class KVEngine:
    """The cache state of one engine: a GPU prefix cache and the offload tiers, block by block."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.gpu = LRUCache(config.gpu_kv_blocks)
        cpu = config.cpu_tier()
        self.cpu: LRUCache | ARCCache | None = (
            make_cache(config.eviction_policy, cpu.capacity_blocks) if cpu is not None else None
        )
        self.secondary: list[tuple[Tier, LRUCache]] = [
            (t, LRUCache(t.capacity_blocks)) for t in config.secondary_tiers if self.cpu is not None
        ]

    def admit(self, tokens: Sequence[int]) -> Admission:
        """Look the prompt up tier by tier, price it, and update every tier as vLLM would."""
        cfg = self.config
        bs = cfg.block_size
        hashes = block_hashes(tokens, bs)
        n_local = self.gpu.prefix_hits(hashes)
        rest = hashes[n_local:]
        n_cpu = self.cpu.prefix_hits(rest) if self.cpu is not None else 0
        rest = rest[n_cpu:]
        n_disk = 0
        disk_hits: list[tuple[LRUCache, list[BlockHash]]] = []
        for _, cache in self.secondary:
            k = cache.prefix_hits(rest)
            if k == 0:
                break
            disk_hits.append((cache, rest[:k]))
            n_disk += k
            rest = rest[k:]

        local, cpu_tok, disk_tok = n_local * bs, n_cpu * bs, n_disk * bs
        # vLLM caps a hit at max_cache_hit_length = num_tokens - 1 in whole blocks (kv_cache_manager.py 295):
        # a full hit recomputes its whole last block to get logits, not one token.
        over = local + cpu_tok + disk_tok - max(0, len(tokens) - 1) // bs * bs
        for tier in ("disk", "cpu", "local"):
            if over <= 0:
                break
            if tier == "disk" and disk_tok:
                take = min(over, disk_tok)
                disk_tok -= take
            elif tier == "cpu" and cpu_tok:
                take = min(over, cpu_tok)
                cpu_tok -= take
            elif tier == "local":
                take = min(over, local)
                local -= take
            else:
                continue
            over -= take
        computed = len(tokens) - local - cpu_tok - disk_tok

        self.gpu.touch(hashes[:n_local])
        # vLLM frees a request's blocks tail first, so a prefix outlives its tail.
        self.gpu.insert(reversed(hashes))
        stored = 0
        if self.cpu is not None:
            # vLLM's offloading scheduler touches every block of the request on lookup, GPU hits included,
            # in reverse, so a prefix outlives its tail in the CPU tier too.
            self.cpu.touch(list(reversed(hashes)))
            for cache, blocks in disk_hits:
                cache.touch(blocks)
            new = [h for h in hashes if h not in self.cpu]
            self.cpu.insert(new)  # every computed block is stored (native offload)
            stored = len(new)
            for _, cache in self.secondary:  # tiers below cascade from the CPU tier
                cache.insert(new)

        cost = price(
            cfg.cost,
            computed_tokens=computed,
            cpu_restored_tokens=cpu_tok,
            disk_restored_tokens=disk_tok,
            kv_bytes_per_token=cfg.kv_bytes_per_token,
            gpu_hit_tokens=local,
        )
        return Admission(len(tokens), local, cpu_tok, disk_tok, computed, stored, cost)

    def state(self) -> dict[str, Any]:
        return {
            "gpu_blocks": len(self.gpu),
            "gpu_capacity_blocks": self.gpu.capacity,
            "cpu_blocks": None if self.cpu is None else len(self.cpu),
            "cpu_capacity_blocks": None if self.cpu is None else self.cpu.capacity,
            "secondary": [{"name": t.name, "blocks": len(c), "capacity_blocks": c.capacity} for t, c in self.secondary],
        }

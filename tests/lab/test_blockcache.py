"""Block caches: hash-chained prefix blocks, LRU eviction order, ARC against a scan."""

from __future__ import annotations

import pytest

from kvoffload_lab.engine.blockcache import ARCCache, LRUCache, block_hashes, make_cache


def blocks(n: int, seed: int) -> list[bytes]:
    """``n`` distinct chained blocks of a prompt identified by ``seed``."""
    return block_hashes([seed * 1_000_003 + i for i in range(n * 4)], 4)


def test_a_block_identity_includes_its_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert len(a) == 2
    assert a[1] != b[1]  # same tokens, different prefix
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4) == a  # deterministic


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(1480)), 16)) == 92  # 1,480 = 92 x 16 + 8


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1], 0)


def test_lru_evicts_the_least_recently_used_first() -> None:
    a, b, c, d = blocks(4, 1)
    cache = LRUCache(3)
    assert cache.insert([a, b, c]) == []
    cache.touch([a])
    assert cache.insert([d]) == [b]
    assert cache.order() == [c, a, d]


def test_prefix_hits_stop_at_the_first_missing_block() -> None:
    chain = blocks(4, 2)
    cache = LRUCache(10)
    cache.insert([chain[0], chain[1], chain[3]])
    assert cache.prefix_hits(chain) == 2
    cache.remove(chain[0])
    assert cache.prefix_hits(chain) == 0


def test_zero_capacity_caches_nothing() -> None:
    for cache in (LRUCache(0), ARCCache(0)):
        assert cache.insert(blocks(3, 3)) == []
        assert len(cache) == 0


def hot_set_survival(cache: LRUCache | ARCCache) -> int:
    """Use a hot set twice, then scan once through more blocks than fit; count hot blocks left."""
    hot = blocks(4, 10)
    cache.insert(hot)
    cache.touch(hot)  # a second use: hot
    scan = [h for s in range(20, 23) for h in blocks(4, s)]  # 12 one-time blocks
    cache.insert(scan)
    return sum(h in cache for h in hot)


def test_a_scan_flushes_the_hot_set_from_lru() -> None:
    assert hot_set_survival(LRUCache(8)) == 0


def test_arc_keeps_the_hot_set_through_a_scan() -> None:
    assert hot_set_survival(ARCCache(8)) == 4


def test_arc_never_holds_more_than_its_capacity_and_its_ghosts_stay_bounded() -> None:
    cache = ARCCache(5)
    stream = [h for s in range(30) for h in blocks(2, s % 7)]  # repeats: ghost hits happen
    for i, h in enumerate(stream):
        cache.insert([h])
        if i % 3 == 0:
            cache.touch([h])
        assert len(cache) <= 5
        assert len(cache.t1) + len(cache.b1) <= 5
        assert len(cache) + len(cache.b1) + len(cache.b2) <= 10


def test_arc_ghost_hit_grows_the_recency_target() -> None:
    cache = ARCCache(2)
    a, b, c = blocks(3, 40)
    cache.insert([a])
    cache.touch([a])  # a is frequent (T2)
    cache.insert([b, c])  # b, recent only, is evicted into the B1 ghost list
    assert b in cache.b1
    assert cache.p == 0
    cache.insert([b])  # b was evicted too early: favour recency
    assert cache.p > 0
    assert b in cache.t2


def test_make_cache_knows_lru_and_arc_only() -> None:
    assert isinstance(make_cache("LRU", 1), LRUCache)
    assert isinstance(make_cache("arc", 1), ARCCache)
    with pytest.raises(ValueError, match="eviction policy"):
        make_cache("fifo", 1)

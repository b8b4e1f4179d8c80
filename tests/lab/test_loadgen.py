"""The trace replay keeps the trace's reuse: shared block ids become shared token prefixes."""

from __future__ import annotations

from kvoffload_lab.load import TraceRequest, block_tokens, prompt_tokens, read_trace, route, schedule, session_key


def test_bundled_trace_is_the_mooncake_conversation_trace() -> None:
    trace = read_trace()
    assert len(trace) == 12_031
    assert trace[0].at == 0.0
    assert trace[-1].at == 3536.999
    assert all(len(r.hash_ids) * 512 >= r.input_length for r in trace[:1000])


def test_requests_sharing_leading_block_ids_share_a_token_prefix() -> None:
    a = TraceRequest(0.0, 1024, 1, (7, 8))
    b = TraceRequest(0.0, 1024, 1, (7, 9))
    ta, tb = prompt_tokens(a), prompt_tokens(b)
    assert ta[:512] == tb[:512]
    assert ta[512:] != tb[512:]


def test_scaling_keeps_block_structure_and_length() -> None:
    req = TraceRequest(0.0, 1000, 1, (1, 2))
    tokens = prompt_tokens(req, scale=0.25)
    assert len(tokens) == 250
    assert tokens[:128] == block_tokens(1, 128)
    assert tokens[128:] == block_tokens(2, 128)[:122]


def test_same_block_id_always_maps_to_the_same_tokens() -> None:
    assert block_tokens(42) == block_tokens(42)
    assert block_tokens(42) != block_tokens(43)


def test_schedule_compresses_time_and_loops_to_fill_the_duration() -> None:
    trace = [TraceRequest(0.0, 1, 1, (1,)), TraceRequest(9.0, 1, 1, (2,))]
    sends = list(schedule(trace, speedup=10.0, duration=3.0))
    offsets = [round(o, 3) for o, _ in sends]
    # one lap spans 10 s of trace time = 1 s of wall time at 10x
    assert offsets == [0.0, 0.9, 1.0, 1.9, 2.0, 2.9]


def test_schedule_without_duration_plays_the_trace_once() -> None:
    trace = [TraceRequest(0.0, 1, 1, (1,)), TraceRequest(2.0, 1, 1, (2,))]
    assert [o for o, _ in schedule(trace, speedup=2.0)] == [0.0, 1.0]


def test_every_turn_of_a_conversation_goes_to_the_same_engine() -> None:
    engines = ["http://a", "http://b", "http://c"]
    turns = [TraceRequest(float(t), 1024, 1, (0, 77, 100 + t)) for t in range(5)]
    assert len({route(turn, engines) for turn in turns}) == 1


def test_prefix_routing_spreads_conversations_and_moves_few_when_an_engine_goes() -> None:
    conversations = [TraceRequest(0.0, 1024, 1, (0, c)) for c in range(2000)]
    three = ["http://a", "http://b", "http://c"]
    before = {c.hash_ids: route(c, three) for c in conversations}
    counts = {url: list(before.values()).count(url) for url in three}
    assert all(500 < n < 830 for n in counts.values()), counts
    after = {c.hash_ids: route(c, three[:2]) for c in conversations}
    moved = [k for k in before if before[k] != after[k]]
    # only the conversations of the engine that went move
    assert all(before[k] == "http://c" for k in moved)


def test_session_sampling_keeps_whole_conversations_and_laps_take_new_ones() -> None:
    trace = read_trace(limit=3000)
    kept = [r for _, r in schedule(trace, speedup=1.0, sessions=4)]
    assert 0.15 < len(kept) / len(trace) < 0.35
    kept_keys = {session_key(r) for r in kept}
    # every request of a kept conversation is kept
    assert all(r in kept for r in trace if session_key(r) in kept_keys)
    span = trace[-1].at + 1.0
    two_laps = list(schedule(trace, speedup=1.0, duration=2 * span, sessions=4))
    first = {session_key(r) for o, r in two_laps if o < span}
    second = {session_key(r) for o, r in two_laps if o >= span}
    assert first
    assert second
    assert not first & second


def test_a_prompt_over_the_limit_keeps_its_first_tokens() -> None:
    req = TraceRequest(0.0, 2048, 1, (1, 2, 3, 4))
    assert prompt_tokens(req, limit=600) == prompt_tokens(req)[:600]

"""Traces become one block stream; a bad line is named by file, line and field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.economics.stackdist import reuse_profile
from kvoffload.economics.traces import TraceError, read_mooncake, read_token_ids, read_trace


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def mooncake_row(
    at_ms: float, hash_ids: list[int], input_length: int = 1000, output_length: int = 10
) -> dict[str, Any]:
    return {"timestamp": at_ms, "input_length": input_length, "output_length": output_length, "hash_ids": hash_ids}


# --- Mooncake ---------------------------------------------------------------------------------


def test_mooncake_requests_become_one_stream_in_file_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [mooncake_row(0, [0, 1, 2]), "", mooncake_row(1500, [0, 3], 700, 5)])
    trace = read_mooncake(path)
    assert trace.format == "mooncake"
    assert trace.block_tokens == 512
    assert trace.requests == 2
    assert trace.blocks.tolist() == [0, 1, 2, 0, 3]
    assert trace.offsets.tolist() == [0, 3, 5]
    assert trace.request_blocks(1).tolist() == [0, 3]
    assert trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.input_tokens.tolist() == [1000, 700]
    assert trace.output_tokens.tolist() == [10, 5]


def test_gzipped_traces_read_the_same(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "t.jsonl", [mooncake_row(0, [0, 1]), mooncake_row(3, [0, 2])])
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_trace(packed).blocks.tolist() == read_trace(plain).blocks.tolist() == [0, 1, 0, 2]


@pytest.mark.parametrize(
    ("line", "where", "problem"),
    [
        ("{not json", ":2: ", "not JSON"),
        ("[1, 2]", ":2: ", "expected a JSON object"),
        (json.dumps({"timestamp": 1, "input_length": 1, "output_length": 1}), ":2: hash_ids: ", "missing"),
        (json.dumps(mooncake_row(1, [1, "2", 3])), ":2: hash_ids[1]: ", "expected an integer"),
        (json.dumps(mooncake_row(1, [1, -2])), ":2: hash_ids[1]: ", "expected an integer"),
        (json.dumps(mooncake_row(1, [1, 2**64])), ":2: hash_ids[1]: ", "expected an integer"),
        (json.dumps(mooncake_row(1, [1, True])), ":2: hash_ids[1]: ", "expected an integer"),
        (json.dumps({**mooncake_row(1, [1]), "hash_ids": 5}), ":2: hash_ids: ", "expected a list"),
        (json.dumps(mooncake_row(1, [1], input_length=-1)), ":2: input_length: ", "expected an integer >= 0"),
        (json.dumps(mooncake_row(1, [1], output_length=2.5)), ":2: output_length: ", "expected an integer >= 0"),
        (json.dumps(mooncake_row(True, [1])), ":2: timestamp: ", "expected milliseconds"),
        (json.dumps({k: v for k, v in mooncake_row(1, [1]).items() if k != "timestamp"}), ":2: timestamp: ", "missing"),
    ],
)
def test_a_bad_mooncake_line_is_named_with_its_field(tmp_path: Path, line: str, where: str, problem: str) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [mooncake_row(0, [0]), line])
    with pytest.raises(TraceError) as caught:
        read_mooncake(path)
    assert f"{path}{where}" in str(caught.value)
    assert problem in str(caught.value)
    assert caught.value.line == 2


def test_read_trace_refuses_a_line_of_neither_format(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", ["", {"prompt": "hello"}])
    with pytest.raises(TraceError, match=r":2: neither `hash_ids` \(Mooncake\) nor `token_ids`"):
        read_trace(path)


def test_an_empty_file_is_an_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    trace = read_trace(path)
    assert (trace.requests, trace.blocks.size, trace.offsets.tolist()) == (0, 0, [0])


def test_the_real_traces_hold_the_readmes_requests(mooncake_traces: dict[str, Path]) -> None:
    conversation = read_trace(mooncake_traces["mooncake-conversation.jsonl"])
    synthetic = read_trace(mooncake_traces["mooncake-synthetic.jsonl"])
    assert (conversation.requests, conversation.blocks.size) == (12_031, 288_500)
    assert (synthetic.requests, synthetic.blocks.size) == (3_993, 121_877)
    assert conversation.arrival_s[-1] == pytest.approx(3536.999)


# --- token ids --------------------------------------------------------------------------------


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_equal_prefixes_give_equal_block_ids_until_they_differ(tmp_path: Path) -> None:
    shared = tokens(0, 1024)
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [{"token_ids": shared + tokens(5000, 512)}, {"token_ids": shared + tokens(9000, 600)}],
    )
    trace = read_token_ids(path)
    assert trace.format == "token-ids"
    first, second = trace.request_blocks(0).tolist(), trace.request_blocks(1).tolist()
    assert first == [0, 1, 2]
    assert second == [0, 1, 3]  # its last 88 tokens are no full block: vLLM caches full blocks only
    assert trace.input_tokens.tolist() == [1536, 1624]


def test_the_same_block_after_a_different_prefix_is_a_different_block(tmp_path: Path) -> None:
    block = tokens(100, 512)
    path = write_jsonl(
        tmp_path / "t.jsonl", [{"token_ids": tokens(0, 512) + block}, {"token_ids": tokens(7, 512) + block}]
    )
    trace = read_token_ids(path)
    assert trace.blocks.tolist() == [0, 1, 2, 3]


def test_block_size_is_a_parameter_and_a_short_prompt_has_no_block(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"token_ids": [1, 2, 3, 4, 5], "timestamp": 250, "output_length": 3},
            {"token_ids": [1, 2, 3, 4]},
            {"token_ids": [1]},
        ],
    )
    trace = read_trace(path, block_tokens=2)
    assert trace.blocks.tolist() == [0, 1, 0, 1]
    assert trace.offsets.tolist() == [0, 2, 4, 4]
    assert trace.arrival_s.tolist() == [0.25, 0.0, 0.0]
    assert trace.output_tokens.tolist() == [3, 0, 0]
    with pytest.raises(ValueError, match="block_tokens"):
        read_token_ids(path, block_tokens=0)


def test_a_bad_token_is_named_with_its_index(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"token_ids": [1, 2]}, {"token_ids": [1, 2, None]}])
    with pytest.raises(TraceError, match=r":2: token_ids\[2\]: expected an integer"):
        read_trace(path)


def test_a_token_trace_simulates_like_a_mooncake_one(tmp_path: Path) -> None:
    # Three requests share a 2-block prefix: the 2nd and 3rd hit it.
    prefix = tokens(0, 1024)
    rows = [{"token_ids": prefix + tokens(10_000 * (i + 1), 512)} for i in range(3)]
    trace = read_trace(write_jsonl(tmp_path / "t.jsonl", rows))
    profile = reuse_profile(trace.blocks)
    assert (profile.accesses, profile.unique) == (9, 5)
    assert profile.hits(3) == 4

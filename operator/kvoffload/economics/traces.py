"""Request traces as one stream of KV blocks, for cache simulation.

Two line formats, one JSON object per line (plain or ``.gz``):

- **Mooncake** (kvcache-ai/Mooncake, ``FAST25-release/traces/``): ``timestamp`` (ms from the
  start), ``input_length`` and ``output_length`` (tokens) and ``hash_ids``, one id per 512-token
  block of the prompt. Equal ids are the same block; the ids are taken as they are.
- **Token ids**: ``token_ids`` (the prompt's token ids), with optional ``timestamp`` (ms, 0 when
  absent) and ``output_length`` (0 when absent). Each full block of ``block_tokens`` tokens is
  hashed chained with the hash of the block before it, as vLLM's prefix caching does, so equal
  prefixes give equal block ids and the same tokens after a different prefix do not. A trailing
  partial block is not a block: vLLM caches full blocks only.

Every block of every request is one access, in file order. A bad line raises
:class:`TraceError` naming the file, the line and the field.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

BLOCK_TOKENS = 512
"""Tokens per block of the Mooncake traces' ``hash_ids``."""

_INT64_MAX = 2**63 - 1
_ROOT = b"\x00" * 16  # the parent hash of a prompt's first block

TraceFormat = Literal["mooncake", "token-ids"]


class TraceError(ValueError):
    """A trace line that cannot be read; the message names the file, the line and the field."""

    def __init__(self, source: str, line: int, field: str | None, problem: str) -> None:
        self.source = source
        self.line = line
        self.field = field
        where = f"{source}:{line}" + (f": {field}" if field else "")
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True, eq=False)
class BlockTrace:
    """A trace as one block stream: every prompt block of every request, in file order."""

    source: str
    """The file it was read from."""
    format: TraceFormat
    block_tokens: int
    """Tokens per block."""
    arrival_s: npt.NDArray[np.float64]
    """Per request: seconds from the start of the trace."""
    input_tokens: npt.NDArray[np.int64]
    """Per request: prompt tokens."""
    output_tokens: npt.NDArray[np.int64]
    """Per request: generated tokens."""
    offsets: npt.NDArray[np.int64]
    """Request ``i``'s blocks are ``blocks[offsets[i]:offsets[i + 1]]``; ``len(offsets)`` is requests + 1."""
    blocks: npt.NDArray[np.int64]
    """Block ids, one access each."""

    @property
    def requests(self) -> int:
        """How many requests the trace holds."""
        return len(self.arrival_s)

    def request_blocks(self, index: int) -> npt.NDArray[np.int64]:
        """The block ids of request ``index``, in prompt order."""
        return self.blocks[self.offsets[index] : self.offsets[index + 1]]


def read_trace(path: Path | str, block_tokens: int = BLOCK_TOKENS) -> BlockTrace:
    """Read a Mooncake or token-id trace, telling them apart by the first line's fields.

    ``block_tokens`` applies to token-id traces; Mooncake ids are 512-token blocks by construction.
    An empty file is an empty trace.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens: must be positive, got {block_tokens}")
    source = str(path)
    rows = _rows(path)
    first = next(rows, None)
    if first is None:
        return _build(source, "mooncake", BLOCK_TOKENS, [], [], [], [0], [])
    number, row = first
    chained = itertools.chain([first], rows)
    if "hash_ids" in row:
        return _mooncake(source, chained)
    if "token_ids" in row:
        return _token_ids(source, chained, block_tokens)
    raise TraceError(source, number, None, "neither `hash_ids` (Mooncake) nor `token_ids` (token-id trace)")


def read_mooncake(path: Path | str) -> BlockTrace:
    """Read a Mooncake JSONL trace (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``)."""
    return _mooncake(str(path), _rows(path))


def read_token_ids(path: Path | str, block_tokens: int = BLOCK_TOKENS) -> BlockTrace:
    """Read a token-id JSONL trace (``token_ids``, optional ``timestamp`` and ``output_length``).

    Block ids are numbered 0, 1, 2, ... in order of first appearance; equal chained hashes get the
    same id.
    """
    return _token_ids(str(path), _rows(path), block_tokens)


def _mooncake(source: str, rows: Iterator[tuple[int, dict[str, Any]]]) -> BlockTrace:
    arrival: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    offsets = [0]
    ids: list[int] = []
    for number, row in rows:
        arrival.append(_milliseconds(row, "timestamp", source, number, required=True) / 1000.0)
        inputs.append(_count(row, "input_length", source, number, required=True))
        outputs.append(_count(row, "output_length", source, number, required=True))
        ids.extend(_id_list(row, "hash_ids", source, number))
        offsets.append(len(ids))
    return _build(source, "mooncake", BLOCK_TOKENS, arrival, inputs, outputs, offsets, ids)


def _token_ids(source: str, rows: Iterator[tuple[int, dict[str, Any]]], block_tokens: int) -> BlockTrace:
    if block_tokens <= 0:
        raise ValueError(f"block_tokens: must be positive, got {block_tokens}")
    arrival: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    offsets = [0]
    ids: list[int] = []
    numbering: dict[bytes, int] = {}
    for number, row in rows:
        arrival.append(_milliseconds(row, "timestamp", source, number, required=False) / 1000.0)
        outputs.append(_count(row, "output_length", source, number, required=False))
        tokens = _id_list(row, "token_ids", source, number)
        inputs.append(len(tokens))
        for digest in _chained_digests(tokens, block_tokens):
            ids.append(numbering.setdefault(digest, len(numbering)))
        offsets.append(len(ids))
    return _build(source, "token-ids", block_tokens, arrival, inputs, outputs, offsets, ids)


def _chained_digests(tokens: list[int], block_tokens: int) -> Iterator[bytes]:
    # 8 bytes per token keeps ids of any size distinct; blake2b is deterministic across processes.
    packed = np.asarray(tokens, dtype=np.int64).tobytes()
    width = 8 * block_tokens
    parent = _ROOT
    for start in range(0, len(packed) - width + 1, width):
        parent = hashlib.blake2b(parent + packed[start : start + width], digest_size=16).digest()
        yield parent


def _rows(path: Path | str) -> Iterator[tuple[int, dict[str, Any]]]:
    source = str(path)
    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        raw = gzip.decompress(raw)
    for number, line in enumerate(io.StringIO(raw.decode()), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(source, number, None, f"not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise TraceError(source, number, None, f"expected a JSON object, got {type(row).__name__}")
        yield number, row


def _milliseconds(row: dict[str, Any], field: str, source: str, line: int, *, required: bool) -> float:
    if field not in row:
        if required:
            raise TraceError(source, line, field, "missing")
        return 0.0
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TraceError(source, line, field, f"expected milliseconds >= 0, got {value!r}")
    return float(value)


def _count(row: dict[str, Any], field: str, source: str, line: int, *, required: bool) -> int:
    if field not in row:
        if required:
            raise TraceError(source, line, field, "missing")
        return 0
    value = row[field]
    if type(value) is not int or value < 0:
        raise TraceError(source, line, field, f"expected an integer >= 0, got {value!r}")
    return value


def _id_list(row: dict[str, Any], field: str, source: str, line: int) -> list[int]:
    if field not in row:
        raise TraceError(source, line, field, "missing")
    values = row[field]
    if not isinstance(values, list):
        raise TraceError(source, line, field, f"expected a list of integers, got {type(values).__name__}")
    # One fast pass for the common case; find the culprit only when something is wrong.
    if all(type(v) is int and 0 <= v <= _INT64_MAX for v in values):
        return values
    for index, value in enumerate(values):
        if type(value) is not int or not 0 <= value <= _INT64_MAX:
            raise TraceError(source, line, f"{field}[{index}]", f"expected an integer in [0, 2^63), got {value!r}")
    raise AssertionError("unreachable")  # pragma: no cover


def _build(
    source: str,
    format: TraceFormat,
    block_tokens: int,
    arrival: list[float],
    inputs: list[int],
    outputs: list[int],
    offsets: list[int],
    ids: list[int],
) -> BlockTrace:
    return BlockTrace(
        source=source,
        format=format,
        block_tokens=block_tokens,
        arrival_s=np.asarray(arrival, dtype=np.float64),
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        offsets=np.asarray(offsets, dtype=np.int64),
        blocks=np.asarray(ids, dtype=np.int64),
    )

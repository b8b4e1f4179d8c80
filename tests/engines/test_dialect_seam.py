"""The metric dialect behind the engine seam: each engine hands out its own, and confirming one reads only its own
series (that the core spells none is tests/test_seam.py's)."""

from __future__ import annotations

import pytest

from kvoffload.engines import ENGINES, engine_for
from kvoffload.engines.dialect import Dialect, confirm_dialect
from kvoffload.engines.sglang.dialect import SGLANG
from kvoffload.engines.vllm.dialect import NEWEST, dialect_for
from tests.policy.render_policies import make_policy, sglang_policy


def test_every_engine_hands_out_its_own_dialect() -> None:
    assert engine_for(sglang_policy().spec).dialect(sglang_policy().spec) is SGLANG
    assert engine_for(make_policy().spec).dialect(make_policy().spec) == dialect_for("0.32.0")
    latest = make_policy(model={"image": "vllm/vllm-openai:latest"}).spec
    assert engine_for(latest).dialect(latest) is NEWEST
    for name, engine in ENGINES.items():
        assert engine.name == name


@pytest.mark.parametrize("dialect", [NEWEST, SGLANG], ids=lambda d: d.name)
def test_confirming_reads_only_the_dialects_own_series(dialect: Dialect) -> None:
    # Another engine's names change nothing; its own, with a renamed family, do (vLLM) or cannot (SGLang: none).
    others = {"vllm:time_per_output_token_seconds_bucket", "sglang:num_requests_total", "up"} - {
        n + "_bucket" for n in dialect.histograms()
    }
    assert confirm_dialect(dialect, {n for n in others if not n.startswith(dialect.series_prefix)}) is dialect
    own = {dialect.ttft_bucket, *(n for n in others if n.startswith(dialect.series_prefix))}
    confirmed = confirm_dialect(dialect, own)
    if dialect.renamed:
        assert confirmed.itl == "vllm:time_per_output_token_seconds"
    else:
        assert confirmed == dialect

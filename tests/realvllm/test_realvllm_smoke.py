"""Real vLLM 0.32 for CPU serves the tiny model, and its /metrics has every family our capture has.

The analysis queries and the emulator are written against tests/data/vllm-0.32.0-cpu-metrics.txt;
this proves that capture still describes the vLLM that setup installs.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import paths
from tests.support.prometheus import wait_until
from tests.support.vllm import TINY_MODEL_NAME, http_get, http_post_json

pytestmark = pytest.mark.realvllm

CAPTURE = paths.VLLM_CAPTURE
PROMPTS = [
    "the canary keeps a small cpu tier",
    "p99 ttft stays within the budget",
    "roll back the newest tier on a sustained breach",
]
MAX_TOKENS = 8


def vllm_families(text: str) -> set[str]:
    """The `vllm:` metric family names in an exposition (counters without their `_total`)."""
    return {family.name for family in text_string_to_metric_families(text) if family.name.startswith("vllm:")}


def request_successes(text: str) -> float:
    """Finished requests counted by vLLM, over every finish reason."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


def test_tiny_model_answers_completions_with_the_tokens_asked_for(live_vllm: str) -> None:
    for prompt in PROMPTS:
        answer = http_post_json(
            f"{live_vllm}/v1/completions",
            # ignore_eos: random weights may pick the end token at once; we want exactly MAX_TOKENS.
            {
                "model": TINY_MODEL_NAME,
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        assert answer["model"] == TINY_MODEL_NAME
        assert isinstance(answer["choices"][0]["text"], str)
        assert answer["usage"]["completion_tokens"] == MAX_TOKENS
        assert answer["usage"]["prompt_tokens"] > 0


def test_metrics_keep_every_vllm_family_of_the_capture(live_vllm: str) -> None:
    before = request_successes(http_get(f"{live_vllm}/metrics"))
    for prompt in PROMPTS:
        http_post_json(f"{live_vllm}/v1/completions", {"model": TINY_MODEL_NAME, "prompt": prompt, "max_tokens": 4})

    # The engine reports its stats to the API server asynchronously: wait for our requests to show.
    def metrics_counting_our_requests() -> str | None:
        text = http_get(f"{live_vllm}/metrics")
        return text if request_successes(text) >= before + len(PROMPTS) else None

    text = wait_until(metrics_counting_our_requests, 30.0, f"/metrics to count {len(PROMPTS)} more finished requests")

    expected = vllm_families(CAPTURE.read_text())
    live = vllm_families(text)
    assert len(expected) > 40, "the capture should hold vLLM's whole metric set"
    assert sorted(expected - live) == []
    # Colons survive: the classic text format, not OpenMetrics with `:` rewritten to `_`.
    assert "vllm:time_to_first_token_seconds" in live

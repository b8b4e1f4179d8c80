"""What real vLLM (0.32 for CPU) counts in the series the error gate reads, ``vllm:request_success_total``.

A client that hangs up is not the engine failing, and a request refused at validation never reaches the engine:
the gate must count neither as failed. Real vLLM counts a finished request by its reason, and neither of these at
all (its front end aborts a dropped request without recording it: ``OutputProcessor.abort_requests``, 0.32-0.34);
the dropped one still got its first token, so it is in the TTFT histogram.
"""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis.errorgate import failed_share, http_failed_share
from kvoffload.engines.dialect import LABEL_FINISHED_REASON
from kvoffload.engines.vllm.dialect import NEWEST
from tests.support.vllm import TINY_MODEL_NAME, http_get

pytestmark = pytest.mark.realvllm


def finished_by_reason(base_url: str) -> dict[str, float]:
    """``vllm:request_success_total`` by ``finished_reason``, as the gate's query sums it."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(http_get(f"{base_url}/metrics")):
        for sample in family.samples:
            if sample.name == NEWEST.request_success:
                reason = sample.labels[LABEL_FINISHED_REASON]
                out[reason] = out.get(reason, 0.0) + sample.value
    return out


def answers_by_status(base_url: str) -> dict[str, float]:
    """``http_requests_total`` by status class, summed over handlers, as the gate's query sums it."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(http_get(f"{base_url}/metrics")):
        for sample in family.samples:
            if sample.name == NEWEST.http_requests:
                out[sample.labels["status"]] = out.get(sample.labels["status"], 0.0) + sample.value
    return out


def sample_value(base_url: str, name: str) -> float:
    for family in text_string_to_metric_families(http_get(f"{base_url}/metrics")):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name}")


def test_a_client_that_hangs_up_and_a_refused_request_are_not_failed_requests(live_vllm: str) -> None:
    before = finished_by_reason(live_vllm)
    http_before = answers_by_status(live_vllm)
    ttft_before = sample_value(live_vllm, "vllm:time_to_first_token_seconds_count")
    assert {"stop", "length", "abort", "error"} <= set(before)  # the reasons the gate reads are exported

    completion = {"model": TINY_MODEL_NAME, "prompt": "hello world", "max_tokens": 8}
    assert requests.post(f"{live_vllm}/v1/completions", json=completion, timeout=60).ok
    # A streamed request the client drops after its first chunk, far from its end (400 tokens, EOS ignored).
    dropped = {**completion, "max_tokens": 400, "stream": True, "ignore_eos": True}
    with requests.post(f"{live_vllm}/v1/completions", json=dropped, stream=True, timeout=60) as stream:
        assert next(stream.iter_lines()).startswith(b"data: ")
    # A request vLLM refuses before its engine sees it.
    refused = requests.post(f"{live_vllm}/v1/completions", json={**completion, "max_tokens": 100_000}, timeout=60)
    assert refused.status_code == 400
    deadline = time.monotonic() + 30
    # Until the dropped request left the engine and the finished one is counted (vLLM records stats after it
    # answered).
    while sample_value(live_vllm, "vllm:num_requests_running") > 0 or sum(
        finished_by_reason(live_vllm).values()
    ) <= sum(before.values()):
        assert time.monotonic() < deadline, "the requests never left the engine"
        time.sleep(0.2)  # polling interval of the condition wait

    after = finished_by_reason(live_vllm)
    delta = {reason: after[reason] - before.get(reason, 0.0) for reason in after}
    # The one that ran to its end, and the dropped one too when its 400 tokens came before vLLM saw the hang-up: on
    # 2 busy cores the tiny model once ran them all first (a fresh-clone CI run, 2026-12-06). Either way a client
    # that hangs up is never a failed request.
    assert delta["length"] in (1, 2), delta
    assert delta["stop"] == 0, delta
    assert delta["abort"] == 0, delta
    assert delta["error"] == 0, delta
    share = failed_share(delta)
    assert share is not None
    assert share.failed == 0
    assert share.total == delta["length"]
    # The API server answered the dropped one 200 and the refused one 400: no 5xx for the gate's other count.
    http_after = answers_by_status(live_vllm)
    http_delta = {status: http_after[status] - http_before.get(status, 0.0) for status in http_after}
    assert http_delta.get("5xx", 0.0) == 0, http_delta
    assert http_delta["4xx"] == 1, http_delta
    http = http_failed_share(http_delta)
    assert http is not None
    assert http.failed == 0
    # Both got a first token: the gate's denominator (finished) is not the request count (the TTFT histogram's).
    assert sample_value(live_vllm, "vllm:time_to_first_token_seconds_count") - ttft_before == 2

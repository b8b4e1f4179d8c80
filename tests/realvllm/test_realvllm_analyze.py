"""`kvoffload analyze` against a live vLLM for CPU scraped by the real Prometheus.

The analysis queries are proven against the metric schema real vLLM exports, not only against
our emulator: the guard judges the live engine as a policy's stable variant and must come back
with numbers for p99 TTFT, p99 ITL and the request count, never "no data".
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.cli.main import main
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import parse_policy
from tests.support.prometheus import PrometheusServer
from tests.support.vllm import TINY_MODEL_NAME, http_post_json

pytestmark = pytest.mark.realvllm

WINDOW_S = 30
POLICY_YAML = f"""\
apiVersion: kvoffload.io/v1alpha1
kind: KVOffloadPolicy
metadata: {{name: tiny, namespace: llm}}
spec:
  model:
    {{name: Qwen/Qwen3-0.6B, servedModelName: {TINY_MODEL_NAME}, image: "vllm/vllm-openai:v0.32.0", maxModelLen: 512}}
  gpu: {{class: nvidia-l4}}
  replicas: 2
  resources: {{baseMemory: 4Gi}}
  offload: {{cpu: 512Mi}}
  analysis: {{window: {WINDOW_S}s, interval: 1s, ttftP99: 30s, itlP99: 10s, minRequests: 5}}
"""


def test_analyze_reads_numbers_from_a_live_vllm(live_vllm: str, prometheus: PrometheusServer, tmp_path: Path) -> None:
    # Given the live engine scraped as the stable variant of policy llm/tiny, as a PodMonitor would label it
    # (the GPU-only level's name and config hash: vLLM for CPU refuses offloading)
    gpu_only = build_ladder(parse_policy(yaml.safe_load(POLICY_YAML), "tiny").spec)[0]
    engine_hash = config_hash(parse_policy(yaml.safe_load(POLICY_YAML), "tiny"), gpu_only)
    prometheus.add_engine(urlsplit(live_vllm).netloc, policy="tiny", level=gpu_only.name, config_hash=engine_hash)
    stop = threading.Event()
    sent: list[int] = []

    def load() -> None:
        while not stop.is_set():
            http_post_json(
                f"{live_vllm}/v1/completions",
                {"model": TINY_MODEL_NAME, "prompt": f"request {len(sent)} " * 20, "max_tokens": 8},
            )
            sent.append(1)

    worker = threading.Thread(target=load, name="vllm load", daemon=True)
    worker.start()
    try:
        # When enough requests have been scraped over the whole window
        prometheus.wait_for_series(
            'sum(increase(vllm:time_to_first_token_seconds_count{kvoffload_io_policy="tiny"}[30s])) >= 10',
            deadline=180,
        )
        policy = tmp_path / "tiny.yaml"
        policy.write_text(POLICY_YAML)
        result = CliRunner().invoke(
            # vLLM for CPU refuses offloading, so the engine runs the GPU-only level (0)
            main,
            ["analyze", str(policy), "--prometheus", prometheus.url, "--guard", "--level", "0", "-o", "json"],
        )
    finally:
        stop.set()
        worker.join(timeout=60)

    # Then every core metric is a number read from real vLLM series, and the verdict follows from them
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    metrics = {m["name"]: m for m in doc["metrics"]}
    assert metrics["requests"]["stable"] >= 5
    assert 0 < metrics["ttftP99"]["stable"] < 30
    assert 0 < metrics["itlP99"]["stable"] < 10
    assert metrics["kvUsage"]["stable"] is not None
    assert "matches" in metrics["liveConfig"]["message"]  # cache_config_info: no offloading, as level 0
    # The error gate reads vllm:request_success_total: every request of the load finished, none failed.
    assert metrics["errorShare"]["stable"] == 0.0
    assert metrics["errorShare"]["passed"] is True
    assert doc["verdict"] == "Pass"

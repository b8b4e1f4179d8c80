"""`kvoffload analyze`'s table and JSON: how sure each row is, printed from an assessment (Prometheus and the
judgment stand in: tests/analysis/test_analyze_integration.py runs them for real)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvoffload.analysis import assess as assess_module
from kvoffload.analysis import prometheus
from kvoffload.analysis.assess import Assessment
from kvoffload.api.status import MetricResult, Verdict
from kvoffload.cli.main import main

POLICY = """\
apiVersion: kvoffload.io/v1alpha1
kind: KVOffloadPolicy
metadata: {name: chat, namespace: llm}
spec:
  model: {name: Qwen/Qwen3-0.6B, image: "vllm/vllm-openai:v0.32.0", maxModelLen: 2048}
  gpu: {class: nvidia-h100-80gb}
  replicas: 2
  resources: {baseMemory: 8Gi}
  offload: {cpu: 512Mi}
  prometheus: {url: "http://prometheus.test"}
"""

PLAIN = (
    MetricResult(name="requests", canary=412, threshold=50, passed=True),
    MetricResult(name="ttftP99", canary=0.412, stable=0.388, threshold=0.5, passed=True),
)
SURE = (
    *PLAIN[:1],
    MetricResult(
        name="ttftP99Ratio",
        canary=1.31,
        threshold=1.2,
        passed=None,
        message="over 1.20x, not yet sure",
        p_value=0.0021,
        alpha=8.3e-05,
        interval=[1.02, 1.61],
        requests_needed=640,
    ),
    MetricResult(name="ttftP99", canary=0.412, stable=0.388, threshold=0.5, passed=True, p_value=0.93, alpha=8.3e-05),
)


class Provider:
    """Answers as a Prometheus holding no vLLM series would; the assessment is what the test gives."""

    def __init__(self, url: str, **_: Any) -> None:
        self.url = url

    def present_metric_names(self, target: Any = None) -> frozenset[str]:
        return frozenset()

    def measure(self, targets: Any) -> dict[Any, Any]:
        return {t.key: None for t in targets}


def analyze(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: tuple[MetricResult, ...], *args: str
) -> tuple[int, str]:
    file = tmp_path / "chat.yaml"
    file.write_text(POLICY)
    verdict = Verdict.INCONCLUSIVE if any(m.passed is None for m in metrics) else Verdict.PASS
    monkeypatch.setattr(prometheus, "PrometheusProvider", Provider)
    monkeypatch.setattr(assess_module, "assess", lambda *a, **k: Assessment(verdict, metrics, "judged"))
    result = CliRunner().invoke(main, ["analyze", str(file), "--prometheus-allow-private", *args])
    return result.exit_code, result.output


def test_the_table_gains_an_evidence_column_when_a_row_has_some(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = analyze(tmp_path, monkeypatch, SURE)
    assert code == 3, output
    rows = {line.split()[0]: re.split(r" {2,}", line.strip()) for line in output.splitlines()[1:-1]}
    assert rows["METRIC"] == ["METRIC", "CANARY", "STABLE", "THRESHOLD", "RESULT", "EVIDENCE", "WHY"]
    assert rows["ttftP99Ratio"] == [
        "ttftP99Ratio", "1.31x", "-", "<= 1.20x", "-", "[1.02x, 1.61x] p=0.0021 (alpha 8.3e-05)",
        "over 1.20x, not yet sure; needs ~640 canary requests",
    ]  # fmt: skip
    assert rows["ttftP99"][5] == "p=0.93 (alpha 8.3e-05)"
    assert rows["requests"][5:] == ["-"]
    assert output.splitlines()[-1] == "verdict: Inconclusive: judged"


def test_a_table_without_evidence_reads_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = analyze(tmp_path, monkeypatch, PLAIN)
    assert code == 0, output
    assert output.splitlines()[1:] == [
        "METRIC    CANARY   STABLE   THRESHOLD   RESULT  WHY",
        "requests  412      -        >= 50       pass    ",
        "ttftP99   412.0ms  388.0ms  <= 500.0ms  pass    ",
        "verdict: Pass: judged",
    ]


def test_json_carries_the_evidence_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = analyze(tmp_path, monkeypatch, SURE, "-o", "json")
    assert code == 3, output
    by_name = {m["name"]: m for m in json.loads(output)["metrics"]}
    ratio = by_name["ttftP99Ratio"]
    assert (ratio["pValue"], ratio["alpha"], ratio["interval"], ratio["requestsNeeded"]) == (
        0.0021,
        8.3e-05,
        [1.02, 1.61],
        640,
    )
    assert (by_name["requests"]["pValue"], by_name["requests"]["interval"]) == (None, None)

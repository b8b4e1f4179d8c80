"""Where things are, for every test folder: the repository, the test data, the examples."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA = TESTS / "data"
GOLDEN = TESTS / "golden"
EXAMPLES = ROOT / "examples"
PACKAGE = ROOT / "operator" / "kvoffload"
VLLM_CAPTURE = DATA / "vllm-0.32.0-cpu-metrics.txt"
"""The real /metrics of vLLM 0.32.0 for CPU serving the tiny model."""

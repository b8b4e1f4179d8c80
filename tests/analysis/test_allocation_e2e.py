"""The live allocated-size check end to end: emulated vLLM 0.33 engines, one with the allocation fault,
scraped by the real Prometheus, read by the provider and judged by assess().

The faulty engine is started with ``--kv-offloading-size 0.5`` and ``--allocate-cpu-gib 0.25``: its
command line (and ``vllm:cache_config_info``) says 0.5 GiB, while ``vllm:kv_offload_config_info`` shows
the quarter GiB it allocated. Only the allocated figure tells them apart.
"""

from __future__ import annotations

import pytest

from kvoffload.analysis.assess import LIVE_CONFIG, assess
from kvoffload.analysis.measurements import Measurements
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.api.quantity import GIB
from kvoffload.api.rollout import AnalysisSpec
from kvoffload.engines.vllm.dialect import dialect_for
from kvoffload.policy.ladder import Level
from tests.support.engines import start_engines, stop_engines
from tests.support.prometheus import PrometheusServer, require_prometheus, synthetic_target

pytestmark = pytest.mark.prometheus

ENGINE_ARGS = ["--max-model-len", "2048", "--gpu-kv-blocks", "48", "--vllm-version", "0.33.0"]
OFFLOAD_ARGS = ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]
CPU_HALF_GIB = Level(1, "cpu", GIB // 2)


def test_an_engine_that_allocated_a_quarter_of_its_rendered_half_gib_fails_the_live_config(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_prometheus()
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"))
    prometheus.start()
    engines = start_engines(
        [[*ENGINE_ARGS, *OFFLOAD_ARGS, "--allocate-cpu-gib", "0.25"], [*ENGINE_ARGS, *OFFLOAD_ARGS]],
        log_dir=tmp_path_factory.mktemp("engines"),
    )
    try:
        short, right = engines
        prometheus.add_engine(short.target, policy="short", level="canary", config_hash="canary")
        prometheus.add_engine(right.target, policy="right", level="canary", config_hash="canary")
        prometheus.wait_for_series("vllm:kv_offload_config_info", deadline=60, count=2)

        provider = PrometheusProvider(prometheus.url)
        v033 = dialect_for("0.33.0")
        got = provider.measure([synthetic_target("llm", name, "10s", dialect=v033) for name in ("short", "right")])
        results = {}
        for name in ("short", "right"):
            measured = got[("llm", name)]
            assert measured.error is None
            assert measured.canary is not None
            assert measured.canary.config == {"kv_offloading_size": "0.5", "kv_offloading_backend": "native"}
            result = assess(AnalysisSpec(), CPU_HALF_GIB, Measurements(measured.canary, None), warmed_up=True)
            results[name] = result.metric(LIVE_CONFIG)
    finally:
        stop_engines(engines)
        prometheus.stop()

    wrong, fine = results["short"], results["right"]
    assert wrong is not None
    assert fine is not None
    assert fine.passed is True, fine.message
    assert fine.canary is not None
    assert fine.canary <= GIB // 2
    assert wrong.passed is False
    assert wrong.canary is not None
    assert 0 <= GIB // 4 - wrong.canary < 1 << 21  # a quarter GiB, to within a chunk
    assert f"allocated {int(wrong.canary)} B" in wrong.message
    assert f"rendered {GIB // 2} B (0.5 GiB) at level cpu" in wrong.message
    assert "ALLOCATED SIZE MISMATCH" in wrong.message

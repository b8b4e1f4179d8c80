"""The longest test files first, so that ``make test``'s workers (``-n 3 --dist loadfile --no-loadscope-reorder``)
finish together: each file runs whole on one worker, and a long file taken last leaves the others idle.

xdist hands out files in collection order; by default it reorders them by their number of tests, which puts the e2e
files (a few tests that each run for a minute) last. :data:`FILE_SECONDS` holds what each file of 20 s or more took
(the sum of its tests' setup, call and teardown) in a full run on 2 cores and two workers on 2026-12-07. They run
first, the longest first; every other file follows in collection order. A stale figure only reorders the run.
"""

from __future__ import annotations

import pytest

FILE_SECONDS: dict[str, int] = {
    "tests/lab/test_e2e.py": 670,
    "tests/lab/test_demo.py": 440,
    "tests/lab/test_faults.py": 374,
    "tests/test_chart_rbac.py": 330,
    "tests/gitops/test_helm_kstatus.py": 172,
    "tests/lab/test_e2e_offload_hurts.py": 140,
    "tests/lab/test_e2e_takeover.py": 104,
    "tests/lab/test_e2e_errors.py": 97,
    "tests/lab/test_e2e_warmup.py": 96,
    "tests/lab/test_e2e_payoff.py": 85,
    "tests/lab/test_e2e_custom_metrics.py": 82,
    "tests/test_image.py": 68,
    "tests/lab/test_e2e_sglang.py": 66,
    "tests/lab/test_e2e_trtllm.py": 62,
    "tests/lab/test_e2e_observe.py": 61,
    "tests/policy/test_workload_render.py": 57,
    "tests/lab/test_calibrate_engine.py": 55,
    "tests/observability/test_dashboard.py": 53,
    "tests/test_wheel.py": 53,
    "tests/policy/test_vllm_args.py": 47,
    "tests/release/test_release.py": 44,
    "tests/cli/test_watch.py": 43,
    "tests/sglang/test_sglang_parser.py": 38,
    "tests/analysis/test_analyze_integration.py": 38,
    "tests/test_chart.py": 36,
    "tests/lab/test_emulator_conformance.py": 35,
    "tests/controller/test_controller.py": 33,
    "tests/lab/test_kubecluster.py": 32,
    "tests/api/test_tenant.py": 31,
    "tests/controller/test_observe_controller.py": 30,
    "tests/test_deadlines.py": 29,
    "tests/analysis/test_payoff.py": 27,
    "tests/analysis/test_prometheus_provider.py": 26,
    "tests/realvllm/test_managed_flags.py": 26,
    "tests/controller/test_admission_webhook.py": 25,
    "tests/controller/test_operator_kopf.py": 25,
    "tests/realvllm/test_realvllm_smoke.py": 24,
    "tests/api/test_promql_prometheus.py": 24,
    "tests/lab/test_localcluster.py": 23,
    "tests/sglang/test_sglang_args.py": 23,
    "tests/cli/test_kubectl_plugin.py": 22,
    "tests/cli/test_get_e2e.py": 20,
}


def file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # sorted() is stable: tests keep their order inside a file, and the files not listed keep theirs.
    items[:] = sorted(items, key=lambda item: -FILE_SECONDS.get(file_of(item), 0))

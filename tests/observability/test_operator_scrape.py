"""The operator's own /metrics scraped by the real Prometheus as a ServiceMonitor's target: with the target labels
a Prometheus sets (``namespace``, ``pod``, ``service``, ``endpoint``, ``container``, ``job``, ``instance``), and
with ``honor_labels: false`` (what a Prometheus with ``overrideHonorLabels`` makes of every ServiceMonitor) as well
as ``true``. The policy alerts still name the policy's namespace, and every query of the dashboard parses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from kvoffload.api.status import Phase
from kvoffload.controller.metrics import API_OPERATIONS, OperatorMetrics, PolicySeries
from kvoffload_lab.promserver import free_port
from tests.support import paths
from tests.support.prometheus import PrometheusServer, require_prometheus

pytestmark = pytest.mark.prometheus

CHART = paths.ROOT / "charts" / "kvoffload"
RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
OPERATOR_NAMESPACE = "kvoffload-system"
TARGET = {
    "namespace": OPERATOR_NAMESPACE,
    "pod": "kvo-kvoffload-6f7d9-x2x4q",
    "service": "kvo-kvoffload-metrics",
    "endpoint": "metrics",
    "container": "operator",
}
"""The target labels the Prometheus Operator gives a ServiceMonitor's endpoint (job and instance come on top)."""

Obj = dict[str, Any]


def fleet() -> OperatorMetrics:
    """An operator serving three policies: llm/chat's canary OOM-killed (its latest analysis sure of a latency
    ratio breach), llm/steady Stable, staging/chat rolled back on a guard breach (a policy of the same name in
    another namespace)."""
    metrics = OperatorMetrics()
    metrics.leader.set(1)
    metrics.cycle_seconds.observe(0.2)
    chat = PolicySeries("llm", "chat", Phase.ROLLED_BACK.value, (("Degraded", "CanaryOOMKilled", True),))
    evidence = (
        ("ttftP99", 0.93, 8e-05, None),
        ("ttftP99Ratio", 3e-05, 8e-05, (1.18, 1.45)),
        ("errorShare", 0.99, 8e-05, (0.001, 0.012)),
    )
    metrics.publish_policy("1", replace(chat, evidence=evidence))
    metrics.publish_policy("2", PolicySeries("llm", "steady", Phase.STABLE.value, (("Degraded", "AsExpected", False),)))
    metrics.publish_policy(
        "3", PolicySeries("staging", "chat", Phase.ROLLED_BACK.value, (("Degraded", "GuardBreach", True),))
    )
    return metrics


@pytest.fixture(scope="module")
def operator_port() -> Iterator[int]:
    port = free_port()
    server = fleet().serve(port, addr="127.0.0.1")
    try:
        yield port
    finally:
        server.shutdown()


def scraping(tmp_path: Path, port: int, *, honor_labels: bool) -> PrometheusServer:
    """A real Prometheus scraping the operator as one ServiceMonitor endpoint, started and holding its series."""
    require_prometheus()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "kvo-kvoffload-metrics",
                "honor_labels": honor_labels,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": TARGET}],
            }
        ],
    }
    server = PrometheusServer(tmp_path / "prometheus", config=config)
    server.workdir.mkdir()
    server.start()
    server.wait_for_series("kvoffload_policy_condition", count=3)
    return server


def alert_exprs() -> dict[str, str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


def labels_of(result: list[Obj]) -> list[Obj]:
    return sorted((series["metric"] for series in result), key=lambda m: sorted(m.items()))


@pytest.mark.parametrize("honor_labels", [False, True], ids=["honor_labels-false", "honor_labels-true"])
def test_the_policy_alerts_name_the_policy_s_namespace_however_the_operator_is_scraped(
    tmp_path: Path, operator_port: int, honor_labels: bool
) -> None:
    prometheus = scraping(tmp_path, operator_port, honor_labels=honor_labels)
    try:
        scraped = prometheus.query('{__name__=~"kvoffload_.+"}')
        assert scraped
        for series in scraped:
            labels = series["metric"]
            assert not [k for k in labels if k.startswith("exported_")], labels
            assert labels["namespace"] == OPERATOR_NAMESPACE, labels  # the target's: the operator's own
        exprs = alert_exprs()
        assert labels_of(prometheus.query(exprs["KVOffloadCanaryOOMKilled"])) == [
            {"namespace": "llm", "policy_namespace": "llm", "policy": "chat"}
        ]
        assert labels_of(prometheus.query(exprs["KVOffloadPolicyRolledBack"])) == [
            {"namespace": "staging", "policy_namespace": "staging", "policy": "chat", "reason": "GuardBreach"}
        ]
        assert prometheus.query(exprs["KVOffloadPolicyPausedInconclusive"]) == []
        # What the alerts did when the policy's namespace was `namespace`: the target's won, and every alert
        # named the operator's namespace instead (honorLabels: true was the only way out).
        old = 'max by (namespace, policy) (kvoffload_policy_condition{reason="CanaryOOMKilled"}) == 1'
        assert labels_of(prometheus.query(old)) == [{"namespace": OPERATOR_NAMESPACE, "policy": "chat"}]
    finally:
        prometheus.stop()


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expression) of every panel target, annotation and query variable, as Grafana sends them with All
    clusters (``.*``) and llm/chat chosen."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"]]
    found += [(v["name"], v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    fill = {"$__rate_interval": "1m", "$cluster": ".*", "$namespace": "llm", "$policy": "chat"}
    filled = []
    for where, expr in found:
        for variable, value in fill.items():
            expr = expr.replace(variable, value)
        filled.append((where, expr))
    return filled


def test_every_dashboard_query_parses_and_the_fleet_row_reads_the_operator(tmp_path: Path, operator_port: int) -> None:
    prometheus = scraping(tmp_path, operator_port, honor_labels=False)
    try:
        for where, expr in dashboard_exprs():
            if expr.startswith("label_values("):  # Grafana's own function: the selector inside is PromQL
                expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
            answer = requests.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=10)
            assert answer.status_code == 200, f"{where}: {answer.text[:300]}\n{expr}"
        phases = dict(dashboard_exprs())["Policies per phase"]
        counts = {s["metric"]["phase"]: float(s["value"][1]) for s in prometheus.query(phases)}
        assert counts == {p.value: 0.0 for p in Phase} | {"RolledBack": 2.0, "Stable": 1.0}
        # The evidence panels: llm/chat's gates only, and intervals only of the ratios (errorShare's is a share).
        panels: dict[str, list[str]] = {}
        for where, expr in dashboard_exprs():
            panels.setdefault(where, []).append(expr)
        (p_values, alphas) = next(exprs for where, exprs in panels.items() if where.startswith("How sure each gate"))
        (lows, highs) = next(exprs for where, exprs in panels.items() if where.startswith("Canary/stable latency"))

        def read(expr: str) -> dict[str, float]:
            return {s["metric"]["metric"]: float(s["value"][1]) for s in prometheus.query(expr)}

        assert read(p_values) == {"ttftP99": 0.93, "ttftP99Ratio": 3e-05, "errorShare": 0.99}
        assert read(alphas) == {"ttftP99": 8e-05, "ttftP99Ratio": 8e-05, "errorShare": 8e-05}
        assert (read(lows), read(highs)) == ({"ttftP99Ratio": 1.18}, {"ttftP99Ratio": 1.45})
        errors = dict(dashboard_exprs())["Kubernetes API errors"]
        rates = prometheus.wait_for_series(errors, count=len(API_OPERATIONS))  # once a rate has two samples
        assert {float(s["value"][1]) for s in rates} == {0.0}  # a healthy operator's reads 0, not "no data"
    finally:
        prometheus.stop()

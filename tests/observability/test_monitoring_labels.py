"""The chart's monitoring.labels, the kube-prometheus-stack convention (issue 23): a stock stack selects
ServiceMonitors, PodMonitors and PrometheusRules by `release: <its release>`, so the chart puts the labels on its
ServiceMonitor and PrometheusRule, and passes them to `kvoffload run --monitor-label` for the engines' PodMonitors.
NOTES.txt says how to find the label and warns when none is given.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml

from kvoffload.cli.run import run
from kvoffload.policy.loading import load_policy
from kvoffload.policy.render import render_pod_monitor
from tests.support import paths

CHART = paths.ROOT / "charts" / "kvoffload"
STACK = {"release": "kube-prometheus-stack"}
MONITORS = {"metrics": {"serviceMonitor": {"enabled": True}}, "prometheusRule": {"enabled": True}}

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def rendered(chart: helm.Chart, values: Obj) -> dict[str, Obj]:
    """The release's objects by kind (one each of the kinds asked about here)."""
    files = chart.render(values, name="kvo", namespace="kvoffload-system")
    return {
        obj["kind"]: obj
        for path, text in files.items()
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj and obj.get("kind") in ("ServiceMonitor", "PrometheusRule", "Deployment")
    }


def notes(chart: helm.Chart, values: Obj) -> str:
    text: str = chart.render(values, name="kvo", namespace="kvoffload-system")["kvoffload/templates/NOTES.txt"]
    return text


def args(objs: dict[str, Obj]) -> list[str]:
    arguments: list[str] = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    return arguments


def test_monitoring_labels_reach_the_service_monitor_the_rule_and_every_engine_pod_monitor(chart: helm.Chart) -> None:
    objs = rendered(chart, {**MONITORS, "monitoring": {"labels": STACK}})
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert STACK.items() <= objs[kind]["metadata"]["labels"].items(), kind
    assert "--monitor-label=release=kube-prometheus-stack" in args(objs)
    # The arguments parse as `kvoffload run` parses them, and the PodMonitor it renders for a policy carries them.
    with run.make_context("run", args(objs)) as context:
        monitor_labels = context.params["monitor_labels"]
    assert monitor_labels == STACK
    policy = load_policy(paths.EXAMPLES / "qwen3-0.6b-cpu.yaml")
    pod_monitor = render_pod_monitor(policy, monitor_labels)
    assert pod_monitor["kind"] == "PodMonitor"
    assert STACK.items() <= pod_monitor["metadata"]["labels"].items()


def test_without_monitoring_labels_nothing_extra_is_passed(chart: helm.Chart) -> None:
    objs = rendered(chart, MONITORS)
    assert not [a for a in args(objs) if a.startswith("--monitor-label")]
    assert "release" not in objs["ServiceMonitor"]["metadata"]["labels"]


def test_per_object_labels_go_on_top_of_monitoring_labels(chart: helm.Chart) -> None:
    values = {
        "monitoring": {"labels": {"release": "kps", "team": "llm"}},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "other-stack"}}},
        "prometheusRule": {"enabled": True, "labels": {"role": "alert-rules"}},
    }
    objs = rendered(chart, values)
    monitor, rule = objs["ServiceMonitor"]["metadata"]["labels"], objs["PrometheusRule"]["metadata"]["labels"]
    assert (monitor["release"], monitor["team"]) == ("other-stack", "llm")
    assert (rule["release"], rule["team"], rule["role"]) == ("kps", "llm", "alert-rules")
    # The PodMonitors get monitoring.labels only: the ServiceMonitor's own labels are its own.
    assert sorted(a for a in args(objs) if a.startswith("--monitor-label")) == [
        "--monitor-label=release=kps",
        "--monitor-label=team=llm",
    ]


def test_the_service_monitor_does_not_honor_the_target_s_labels(chart: helm.Chart) -> None:
    (endpoint,) = rendered(chart, MONITORS)["ServiceMonitor"]["spec"]["endpoints"]
    assert "honorLabels" not in endpoint  # the default, false: what overrideHonorLabels forces anyway


@pytest.mark.parametrize(
    "labels",
    [
        {"release/": "x"},  # a prefix with no name
        {"-release": "x"},
        {"release": "has space"},
        {"release": "x" * 64},
        {"release": 1},
    ],
)
def test_the_schema_refuses_what_is_no_kubernetes_label(chart: helm.Chart, labels: Obj) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"monitoring": {"labels": labels}})


def test_the_schema_takes_prefixed_labels_and_refuses_unknown_monitoring_keys(chart: helm.Chart) -> None:
    chart.validate_schema({"monitoring": {"labels": {"prometheus.example.com/tenant": "llm", "release": ""}}})
    with pytest.raises(helm.HelmValuesError, match=re.escape("'podMonitorLabels' not allowed")):
        chart.validate_schema({"monitoring": {"labels": {}, "podMonitorLabels": {}}})


def test_notes_say_how_to_find_the_selector_and_warn_when_no_label_is_given(chart: helm.Chart) -> None:
    find = "kubectl get prometheus -A -o jsonpath='{..serviceMonitorSelector}"
    quiet = notes(chart, {})
    assert find in quiet
    assert "WARNING: monitoring.labels is empty" not in quiet  # no ServiceMonitor or rule to be missed
    assert "spec.prometheus.monitorLabels" in quiet  # but the PodMonitors would carry none
    warned = notes(chart, MONITORS)
    assert "WARNING: monitoring.labels is empty while the ServiceMonitor and the PrometheusRule are enabled" in warned
    rule_only = notes(chart, {"prometheusRule": {"enabled": True}})
    assert "WARNING: monitoring.labels is empty while the PrometheusRule is enabled" in rule_only
    labelled = notes(chart, {**MONITORS, "monitoring": {"labels": STACK}})
    assert "WARNING" not in labelled
    assert "carry (monitoring.labels): release=kube-prometheus-stack" in labelled

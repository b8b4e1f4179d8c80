"""The Grafana dashboard (charts/kvoffload/files/dashboard.json): what it shows and reads, the chart's ConfigMap,
and every panel, variable and annotation query run against the lab's real Prometheus while the real operator
takes a policy up its ladder and an OOM-killed canary rolls it back. The same run checks the tier capacity the
operator publishes (scraped, and on the pods) against `kvoffload plan`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import requests
import yaml
from click.testing import CliRunner

from kvoffload.api.conventions import ANNOTATION_TIER_CAPACITY, LABEL_LEVEL
from kvoffload.cli.main import main
from kvoffload.engines.dialect import HISTOGRAM_SUFFIXES
from kvoffload.engines.vllm.dialect import NEWEST
from kvoffload_lab.cluster.laboperator import running_operator
from kvoffload_lab.cluster.localcluster import LocalCluster
from kvoffload_lab.promserver import free_port
from tests.lab.test_e2e import canary_on, in_phase, policy_doc
from tests.support import paths
from tests.support.cluster import ENGINE_GPU_KV_BLOCKS, eventually, load_on
from tests.support.prometheus import require_prometheus

CHART = paths.ROOT / "charts" / "kvoffload"
DASHBOARD = CHART / "files" / "dashboard.json"

Obj = dict[str, Any]


def load_dashboard() -> Obj:
    loaded: Obj = json.loads(DASHBOARD.read_text())
    return loaded


def panel_targets(dashboard: Obj) -> Iterator[tuple[str, Obj]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):  # a row has none
            yield panel["title"], target


def every_expr(dashboard: Obj) -> list[str]:
    exprs = [target["expr"] for _, target in panel_targets(dashboard)]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


# --- what it shows and what it reads ---------------------------------------------------------------


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    titles = [panel["title"] for panel in load_dashboard()["panels"]]
    for wanted in (
        "p99 time to first token",
        "p99 inter-token latency",
        "Prompt-token share by source",
        "Hits per tier",
        "Offload bandwidth",
        "KV cache usage",
        "Failed request share",
        "Pinned memory requested",
        "Tier capacity per pod",
        "Fleet",
        "Policies per phase",
        "Rollbacks per day",
        "Reconcile cycle time",
        "Kubernetes API errors",
        "Custom metrics",
        "How sure each gate is",
        "Canary/stable latency ratio",
        "Live payoff",
    ):
        assert any(title.startswith(wanted) for title in titles), wanted
    annotations = {a["name"]: a for a in load_dashboard()["annotations"]["list"]}
    assert set(annotations) == {"Stage changes", "Rollbacks"}
    assert 'decision=~"Rollback|Abort"' in annotations["Rollbacks"]["expr"]
    assert 'decision!~"Rollback|Abort"' in annotations["Stage changes"]["expr"]
    assert all(a["useValueForTime"] for a in annotations.values())  # the value is the decision's time, in ms


RUNNING = "sum(vllm:num_requests_running{ {{ selector }} })"

FLEET = ("Policies per phase", "Rollbacks per day", "Reconcile cycle time", "Kubernetes API errors")
"""The fleet row's panels: every policy of the chosen clusters, not the chosen one."""
PER_POLICY = (
    "kvoffload_policy_",
    "kvoffload_variant_",
    "kvoffload_tier_capacity_",
    "kvoffload_custom_metric_",
    "kvoffload_analysis_",
    "kvoffload_payoff_",
)
"""The operator's per-policy families: labelled policy_namespace and policy (controller/metrics.py)."""


def test_every_query_goes_to_the_chosen_prometheus_cluster_and_policy() -> None:
    dashboard = load_dashboard()
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "cluster", "namespace", "policy"]
    cluster = dashboard["templating"]["list"][1]
    # All is .*, which also matches series without a cluster label: one Prometheus per cluster works unchanged.
    assert (cluster["includeAll"], cluster["allValue"], cluster["current"]["value"]) == (True, ".*", "$__all")
    for title, target in panel_targets(dashboard):
        assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
    for expr in every_expr(dashboard):
        # Metric names; kvoffload_io_* are the engines' series labels (seriesLabels), not metrics.
        selectors = re.findall(r"(?<![\w:])((?:vllm:|kvoffload_(?!io_))[a-z_:]+)(\{[^}]*\})?", expr)
        assert selectors, expr
        for name, selector in selectors:
            if expr.startswith(f"label_values({name},"):  # the cluster variable's own source
                continue
            assert selector.startswith('{cluster=~"$cluster"'), expr
            if name.startswith("vllm:"):
                assert "kvoffload_io_policy" in selector, expr
            # The operator's own `namespace` is its target's; the policy's is policy_namespace.
            assert not re.search(r"[{ ,]namespace=", selector) or name.startswith("vllm:"), expr
            if name.startswith(PER_POLICY):
                assert 'policy_namespace="$namespace", policy="$policy"' in selector, expr
    for title, target in panel_targets(dashboard):
        assert (title in FLEET) != ('namespace="$namespace"' in target["expr"]), title


def test_the_engine_series_it_reads_are_vllm_0_32_s_names_in_the_dialect_table() -> None:
    known = set(NEWEST.required_families()) | set(NEWEST.offload_families())
    used = {name for expr in every_expr(load_dashboard()) for name in re.findall(r"vllm:[a-z_:]+", expr)}
    assert used
    for name in used:
        base = next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
        assert base in known, f"{name} is not a vLLM {NEWEST.name} series of engines/vllm/dialect.py"


# --- the chart's ConfigMap ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def config_maps(chart: helm.Chart, values: Obj) -> list[Obj]:
    rendered = chart.render(values, name="kvo", namespace="kvoffload-system")
    return [
        obj
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj and obj.get("kind") == "ConfigMap"
    ]


def test_the_chart_ships_no_dashboard_unless_asked(chart: helm.Chart) -> None:
    assert config_maps(chart, {}) == []


def test_the_dashboard_config_map_carries_the_sidecar_label_and_the_file(chart: helm.Chart) -> None:
    (config_map,) = config_maps(chart, {"grafanaDashboard": {"enabled": True}})
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "kvoffload-system"
    assert json.loads(config_map["data"]["kvoffload.json"]) == load_dashboard()


def test_the_dashboard_follows_the_values(chart: helm.Chart) -> None:
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "labels": {"dashboards": "llm"},
            "annotations": {"grafana_folder": "LLM serving"},
            "namespace": "monitoring",
        },
        "seriesLabels": {"policy": "app_policy", "level": "tier", "configHash": "build"},
    }
    (config_map,) = config_maps(chart, values)
    meta = config_map["metadata"]
    # Helm merges maps: the sidecar's default label stays unless set to null.
    assert (meta["namespace"], meta["labels"]["dashboards"], meta["labels"]["grafana_dashboard"]) == (
        "monitoring",
        "llm",
        "1",
    )
    assert meta["annotations"] == {"grafana_folder": "LLM serving"}
    (dropped,) = config_maps(chart, {"grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": None}}})
    assert "grafana_dashboard" not in dropped["metadata"]["labels"]
    text = config_map["data"]["kvoffload.json"]
    assert "kvoffload_io_policy" not in text
    assert "kvoffload_io_level" not in text
    dashboard = json.loads(text)
    assert 'app_policy="$policy"' in dashboard["panels"][3]["targets"][0]["expr"]


# --- every query against the lab's real Prometheus --------------------------------------------------

STEP_S = 5
RATE_INTERVAL = "6s"
"""Grafana's $__rate_interval for a 5 s step at the lab's 1 s scrape: max(step + scrape, 4 x scrape)."""


def grafana(expr: str, namespace: str, policy: str) -> str:
    """The expression as Grafana sends it, the dashboard's variables filled in."""
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$cluster", ".*")  # All
        .replace("$namespace", namespace)
        .replace("$policy", policy)
        .replace("${datasource}", "prometheus")
    )


def query(url: str, expr: str, *, start: float | None = None, end: float | None = None) -> list[Obj]:
    """An instant query at ``end`` (or now), or a range query over [start, end] at STEP_S."""
    if start is None:
        params: Obj = {"query": expr} if end is None else {"query": expr, "time": end}
        answer = requests.get(f"{url}/api/v1/query", params=params, timeout=10)
    else:
        params = {"query": expr, "start": start, "end": end, "step": STEP_S}
        answer = requests.get(f"{url}/api/v1/query_range", params=params, timeout=10)
    assert answer.status_code == 200, f"{answer.status_code} {answer.text[:500]} for {expr}"
    body = answer.json()
    assert body["status"] == "success", body
    result: list[Obj] = body["data"]["result"]
    return result


def label_values(url: str, selector: str, label: str) -> set[str]:
    """What Grafana's label_values(selector, label) lists: the series API, then one label's values."""
    answer = requests.get(f"{url}/api/v1/series", params={"match[]": selector}, timeout=10)
    assert answer.status_code == 200, answer.text[:500]
    return {series[label] for series in answer.json()["data"] if label in series}


def summary(result: list[Obj]) -> str:
    """A line per series: its labels that tell series apart, and its last value."""
    lines = []
    for series in result:
        metric = series["metric"]
        keys = ("kvoffload_io_level", "variant", "level", "source", "tier", "phase", "decision", "stage")
        labels = ",".join(f"{k}={metric[k]}" for k in keys if k in metric)
        value = series["values"][-1][1] if "values" in series else series["value"][1]
        lines.append(f"    {{{labels}}} last={value}")
    return "\n".join(lines)


@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(420)
async def test_every_panel_variable_and_annotation_query_returns_data_from_the_lab(tmp_path: Path) -> None:
    require_prometheus()
    dashboard = load_dashboard()
    async with LocalCluster(tmp_path / "cluster", engine_args=["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS)]) as lab:
        port = free_port()
        # Scraped as the chart's ServiceMonitor would be, without honorLabels (the lab's Prometheus honors none):
        # the target's labels are the operator's, and a Thanos-style cluster label on top.
        target = {"job": "kvo-kvoffload-metrics", "namespace": "kvoffload-system", "pod": "kvo-kvoffload-0"}
        lab.prometheus.set_target("kvoffload-operator", f"127.0.0.1:{port}", target | {"cluster": "lab"})
        url = lab.prometheus.url
        async with running_operator(lab, metrics_port=port):
            doc = policy_doc("chat", lab)  # gpu-only -> cpu -> nvme, every duration in seconds
            # A dry-run custom metric: the custom metrics panel has something to show, and it never decides.
            doc["spec"]["analysis"]["metrics"] = [{"name": "running", "query": RUNNING, "max": 1000, "dryRun": True}]
            await lab.apply(doc)
            start = time.time()
            async with load_on(lab, "chat"):
                await eventually(lambda: canary_on(lab, "chat", "nvme"), "the nvme canary Ready", 200)
                disk_hits = (
                    'sum(increase(vllm:prompt_tokens_cached_by_source_total{kvoffload_io_policy="chat",'
                    'source="disk"}[20s])) > 0'
                )
                await eventually(lambda: asyncio.to_thread(query, url, disk_hits), "hits on the nvme tier", 60)
                # The canary judged against the stable side at least once (on a loaded host, after its warm-up).
                ratio = 'kvoffload_analysis_interval_low{policy="chat",metric=~".+Ratio"}'
                await eventually(lambda: asyncio.to_thread(query, url, ratio), "a ratio's interval scraped", 60)
                (canary,) = lab.pods("kvoffload.io/policy=chat,kvoffload.io/level=nvme")
                await lab.oom_kill(canary.pod)
                await eventually(lambda: in_phase(lab, "chat", "RolledBack"), "RolledBack", 60)
                rollback = 'kvoffload_policy_last_decision_timestamp_seconds{policy="chat",decision="Rollback"}'
                await eventually(lambda: asyncio.to_thread(query, url, rollback), "the rollback scraped", 30)
                await asyncio.sleep(2 * STEP_S)  # a step or two of the rolled-back fleet
            end = time.time()
        seen = await asyncio.to_thread(run_every_query, url, dashboard, start, end)
        seen += "\n" + await asyncio.to_thread(check_capacity, lab, url, end)
    print("\n" + seen)  # what each query returned, for the record (pytest -s shows it)


def check_capacity(lab: LocalCluster, url: str, end: float) -> str:
    """The real operator's kvoffload_tier_capacity_tokens, as Prometheus scraped it, and the running pods'
    annotation, against `kvoffload plan FILE -o json` for the same policy."""
    path = lab.workdir / "chat.yaml"
    path.write_text(yaml.safe_dump(policy_doc("chat", lab)))
    result = CliRunner().invoke(main, ["plan", str(path), "-o", "json", "--prometheus-allow-private"])
    assert result.exit_code == 0, result.output
    plan = {level["name"]: plan_figures(level) for level in json.loads(result.stdout)["levels"]}
    scraped: dict[str, dict[str, int]] = {}
    for series in query(url, 'kvoffload_tier_capacity_tokens{policy_namespace="default", policy="chat"}', end=end):
        labels = series["metric"]
        scraped.setdefault(labels["level"], {})[labels["tier"]] = int(float(series["value"][1]))
    assert scraped == {level: tiers for level, tiers in plan.items() if tiers}
    # The README's query for routers: the capacity of the level each variant runs (only the stable one is left).
    running = query(
        url,
        'kvoffload_tier_capacity_tokens{policy_namespace="default", policy="chat"}'
        " * on (policy_namespace, policy, level) group_left (variant) kvoffload_variant_info",
        end=end,
    )
    assert {(s["metric"]["variant"], s["metric"]["tier"]): int(float(s["value"][1])) for s in running} == {
        ("stable", tier): tokens for tier, tokens in plan["cpu"].items()
    }
    pods = lab.pods("kvoffload.io/policy=chat")
    assert pods
    for engine in pods:
        pod = lab.get("v1", "Pod", "default", engine.pod)
        assert pod is not None
        annotation = json.loads(pod["metadata"]["annotations"][ANNOTATION_TIER_CAPACITY])
        assert annotation == plan[engine.labels[LABEL_LEVEL]], engine.pod
    return f"capacity: kvoffload plan {plan}; scraped {scraped}; pods {[e.labels[LABEL_LEVEL] for e in pods]} agree"


def plan_figures(level: Obj) -> dict[str, int]:
    """What `kvoffload plan -o json` says each offload tier of a level holds per pod."""
    if level["cpuTokens"] is None:
        return {}
    return {"cpu": level["cpuTokens"], **{tier["name"]: tier["tokens"] for tier in level["secondaryTiers"]}}


def run_every_query(url: str, dashboard: Obj, start: float, end: float) -> str:
    """Run each query of the dashboard as Grafana would; fail on an empty answer; say what came back."""
    report = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = grafana(target["expr"], "default", "chat")
            instant = bool(target.get("instant"))
            result = query(url, expr, end=end) if instant else query(url, expr, start=start, end=end)
            assert result, f"panel {panel['title']!r} ({target['refId']}) returned nothing:\n{expr}"
            report.append(f"{panel['title']} [{target['refId']}]: {len(result)} series\n{summary(result)}")
    for annotation in dashboard["annotations"]["list"]:
        result = query(url, grafana(annotation["expr"], "default", "chat"), start=start, end=end)
        assert result, f"annotation {annotation['name']!r} returned nothing"
        times = {float(v) / 1000 for series in result for _, v in series["values"]}
        assert all(start - 60 <= t <= end for t in times), f"{annotation['name']}: times {sorted(times)}"
        report.append(f"annotation {annotation['name']}: {len(result)} series\n{summary(result)}")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", grafana(variable["query"]["query"], "default", "chat"))
        assert match, variable["query"]["query"]
        values = label_values(url, match[1], match[2])
        assert {"cluster": "lab", "namespace": "default", "policy": "chat"}[variable["name"]] in values, (
            variable["name"],
            values,
        )
        report.append(f"variable {variable['name']}: {sorted(values)}")
    # The fleet row counts the OOM rollback (its counter starts at 0, so increase() sees it).
    (rollbacks,) = [t["expr"] for p in dashboard["panels"] if p["title"] == "Rollbacks per day" for t in p["targets"]]
    assert [float(s["value"][1]) > 0 for s in query(url, grafana(rollbacks, "default", "chat"), end=end)] == [True]
    # The alerts read the same operator series: the OOM alert's condition holds for chat, the rollback one's not.
    rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    oom = query(url, exprs["KVOffloadCanaryOOMKilled"], end=end)
    assert [s["metric"] for s in oom] == [{"namespace": "default", "policy_namespace": "default", "policy": "chat"}]
    operator = query(url, '{__name__=~"kvoffload_.+"}', end=end)
    assert operator
    assert not [s["metric"] for s in operator if any(k.startswith("exported_") for k in s["metric"])]
    assert query(url, exprs["KVOffloadPolicyRolledBack"], end=end) == []
    report.append(
        "alerts: KVOffloadCanaryOOMKilled's condition holds for default/chat, KVOffloadPolicyRolledBack's not"
    )
    return "\n".join(report)

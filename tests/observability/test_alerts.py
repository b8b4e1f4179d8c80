"""The alerts: the real promtool checks the rules file and runs its unit tests (tests/observability/alerts-test.yaml),
each alert has a case where it fires and one where it stays quiet, and each case bites: an alert broken to never
fire fails its firing case, one broken to always fire fails its quiet case. The chart's PrometheusRule carries the
same rules, with the series labels the values name.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kvoffload.engines.dialect import HISTOGRAM_SUFFIXES
from kvoffload.engines.vllm.dialect import NEWEST
from tests.support import paths

pytestmark = pytest.mark.prometheus

CHART = paths.ROOT / "charts" / "kvoffload"
RULES = CHART / "files" / "prometheus-rules.yaml"
UNIT_TESTS = Path(__file__).with_name("alerts-test.yaml")
PROMTOOL = os.environ.get("KVOFFLOAD_PROMTOOL_BIN", "/usr/bin/promtool")
NEVER = "vector(1) == 0"
"""An expression that returns nothing, ever."""
ALWAYS = "vector(1)"
"""An expression that returns a sample at every evaluation."""

Obj = dict[str, Any]


def require_promtool() -> None:
    """Skip without promtool on a workstation; fail in CI, where Debian's prometheus package brings it."""
    if shutil.which(PROMTOOL) or Path(PROMTOOL).exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{PROMTOOL} not found (apt-get install prometheus)")
    pytest.skip(f"{PROMTOOL} not found (apt-get install prometheus)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    require_promtool()
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def load(path: Path) -> Obj:
    loaded: Obj = yaml.safe_load(path.read_text())
    return loaded


def alert_rules(rules: Obj) -> Iterator[Obj]:
    for group in rules["groups"]:
        yield from (rule for rule in group["rules"] if "alert" in rule)


ALERTS = [rule["alert"] for rule in alert_rules(load(RULES))]


def cases(alert: str, *, firing: bool) -> list[Obj]:
    """The unit-test groups where ``alert`` fires at some time (``firing``), or is only ever expected quiet;
    each keeping only its checks of that alert."""
    found = []
    for group in load(UNIT_TESTS)["tests"]:
        checks = [c for c in group.get("alert_rule_test", []) if c["alertname"] == alert]
        if not checks:
            continue
        fires = any(c.get("exp_alerts") for c in checks)
        if fires == firing:
            found.append({**group, "alert_rule_test": checks})
    return found


def run_unit_tests(tmp_path: Path, rules: Obj, groups: list[Obj]) -> subprocess.CompletedProcess[str]:
    """promtool test rules: ``groups`` of the unit tests against ``rules``, both written to ``tmp_path``."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    unit = {**load(UNIT_TESTS), "rule_files": ["rules.yaml"], "tests": groups}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    return promtool("test", "rules", "test.yaml", cwd=tmp_path)


def with_expr(alert: str, expr: str) -> Obj:
    """The rules with one alert's expression replaced."""
    rules = copy.deepcopy(load(RULES))
    for rule in alert_rules(rules):
        if rule["alert"] == alert:
            rule["expr"] = expr
    return rules


# --- promtool on the rules as they are -------------------------------------------------------


def test_promtool_checks_the_rules_file() -> None:
    result = promtool("check", "rules", str(RULES), cwd=paths.ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS) + 1} rules found" in result.stdout  # the alerts and the share they read


def test_promtool_passes_every_unit_test_of_the_alerts() -> None:
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_issue_s_six_alerts_are_there() -> None:
    assert ALERTS == [
        "KVOffloadPolicyRolledBack",
        "KVOffloadPolicyPausedInconclusive",
        "KVOffloadPolicyStuck",
        "KVOffloadPolicyAwaitingPromotion",  # issue 24: nothing else fires while a step waits for a person
        "KVOffloadCanaryOOMKilled",
        "KVOffloadExternalShareCollapsed",
        "KVOffloadOperatorDown",
    ]


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_has_a_case_where_it_fires_and_one_where_it_stays_quiet(alert: str) -> None:
    assert cases(alert, firing=True), f"no unit test where {alert} fires"
    assert cases(alert, firing=False), f"no unit test where {alert} stays quiet"


# --- the cases bite ----------------------------------------------------------------------------


@pytest.mark.parametrize("alert", ALERTS)
def test_an_alert_that_never_fires_fails_its_firing_case(alert: str, tmp_path: Path) -> None:
    firing = cases(alert, firing=True)
    assert run_unit_tests(tmp_path, load(RULES), firing).returncode == 0
    broken = run_unit_tests(tmp_path, with_expr(alert, NEVER), firing)
    assert broken.returncode != 0, f"the firing case of {alert} passes an alert that never fires"
    assert "FAILED" in broken.stdout + broken.stderr


@pytest.mark.parametrize("alert", ALERTS)
def test_an_alert_that_always_fires_fails_its_quiet_case(alert: str, tmp_path: Path) -> None:
    quiet = cases(alert, firing=False)
    assert run_unit_tests(tmp_path, load(RULES), quiet).returncode == 0
    broken = run_unit_tests(tmp_path, with_expr(alert, ALWAYS), quiet)
    assert broken.returncode != 0, f"the quiet case of {alert} passes an alert that always fires"


# --- what the rules read -----------------------------------------------------------------------


def test_the_engine_series_the_rules_read_are_vllm_0_32_s_names_in_the_dialect_table() -> None:
    known = set(NEWEST.required_families()) | set(NEWEST.offload_families())
    used = set(re.findall(r"vllm:[a-z_:]+", RULES.read_text()))
    assert used
    for name in used:
        base = next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
        assert base in known, f"{name} is not a vLLM {NEWEST.name} series of engines/vllm/dialect.py"


def test_every_alert_names_the_policy_and_its_namespace_or_is_about_the_operator() -> None:
    for rule in alert_rules(load(RULES)):
        text = rule["annotations"]["summary"] + rule["annotations"]["description"]
        if rule["alert"] != "KVOffloadOperatorDown":
            # policy_namespace: `namespace` on the operator's series is the operator's own.
            assert "{{ $labels.policy_namespace }}/{{ $labels.policy }}" in text, rule["alert"]
            assert "$labels.namespace" not in text, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")


RUNBOOKS = "https://github.com/kvoffload/kvoffload/blob/main/docs/troubleshooting.md"
"""The runbook base written in the rules file: the repository's guide (Chart.yaml's source)."""


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation but - and _ dropped, spaces to -,
    a repeated one numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_github_anchors_are_made_as_github_makes_them() -> None:
    text = "# A\n## The external share stays at zero (no reuse)\n### /dev/shm too small\n## A\n"
    assert github_anchors(text) == {"a", "the-external-share-stays-at-zero-no-reuse", "devshm-too-small", "a-1"}


def test_every_alert_links_its_own_section_of_the_troubleshooting_guide() -> None:
    guide = (paths.ROOT / "docs" / "troubleshooting.md").read_text()
    anchors = github_anchors(guide)
    assert (CHART / "Chart.yaml").read_text().count("https://github.com/kvoffload/kvoffload") == 1
    for rule in alert_rules(load(RULES)):
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert (base, anchor) == (RUNBOOKS, rule["alert"].lower()), url
        assert anchor in anchors, f"{rule['alert']}: no heading of docs/troubleshooting.md makes #{anchor}"
    # Each section's links within the guide land too.
    for link in re.findall(r"\]\(#([^)]+)\)", guide):
        assert link in anchors, link


# --- the chart -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def prometheus_rules(chart: helm.Chart, values: Obj) -> list[Obj]:
    rendered = chart.render(values, name="kvo", namespace="kvoffload-system")
    return [
        obj
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj and obj.get("kind") == "PrometheusRule"
    ]


def test_the_chart_ships_no_rules_unless_asked(chart: helm.Chart) -> None:
    assert prometheus_rules(chart, {}) == []


def test_the_chart_s_prometheus_rule_holds_the_file_promtool_tests(chart: helm.Chart) -> None:
    (rule,) = prometheus_rules(chart, {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}})
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "kvoffload-system"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == load(RULES)


def test_the_chart_s_rules_select_the_series_labels_the_values_name(chart: helm.Chart, tmp_path: Path) -> None:
    labels = {"policy": "app_policy", "level": "tier", "configHash": "build"}
    values = {"prometheusRule": {"enabled": True}, "seriesLabels": labels}
    (rule,) = prometheus_rules(chart, values)
    text = yaml.safe_dump(rule["spec"])
    assert "kvoffload_io_policy" not in text
    exprs = " ".join(r["expr"] for group in rule["spec"]["groups"] for r in group["rules"])
    assert 'vllm:prompt_tokens_by_source_total{app_policy!=""' in exprs
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(text)
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_chart_s_rules_link_the_runbooks_under_the_base_the_values_name(chart: helm.Chart) -> None:
    values = {"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://wiki.example.com/llm/kvoffload"}}
    (rule,) = prometheus_rules(chart, values)
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls == [f"https://wiki.example.com/llm/kvoffload#{alert.lower()}" for alert in ALERTS]
    (default,) = prometheus_rules(chart, {"prometheusRule": {"enabled": True}})
    assert RUNBOOKS in yaml.safe_dump(default["spec"])


def test_alerts_without_the_operator_s_metrics_are_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmError, match=re.escape("prometheusRule.enabled needs metrics.enabled")):
        chart.render({"prometheusRule": {"enabled": True}, "metrics": {"enabled": False}}, name="kvo", namespace="kvo")

"""Custom metrics and the KVOffloadAnalysisTemplate kind: the models, their CRD, and what each refuses."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from kvoffload.api.analysistemplate import KVOffloadAnalysisTemplate, metric_sources
from kvoffload.api.crd import TEMPLATE_CRD_FILE, template_crd_manifest, template_crd_yaml
from kvoffload.api.errors import PolicyError
from kvoffload.cli.main import main
from kvoffload.policy.loading import parse_policy
from tests.support import paths

ABORTS = (
    'sum(rate(vllm:request_success_total{ {{ selector }}, finished_reason="abort"}[{{ window }}]))'
    " / sum(rate(vllm:request_success_total{ {{ selector }} }[{{ window }}]))"
)


def template(name: str = "platform", generation: int = 3, **metric: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kvoffload.io/v1alpha1",
        "kind": "KVOffloadAnalysisTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": {"metrics": [{"name": "abortShare", "query": ABORTS, "max": 0.01, **metric}]},
    }


def test_the_committed_template_crd_is_what_kvoffload_crd_prints_and_is_cluster_scoped() -> None:
    result = CliRunner().invoke(main, ["crd", "--kind", "analysistemplate"])
    assert result.exit_code == 0, result.output
    assert result.stdout == template_crd_yaml() == (paths.ROOT / TEMPLATE_CRD_FILE).read_text()
    chart_copy = paths.ROOT / "charts" / "kvoffload" / "files" / TEMPLATE_CRD_FILE.removeprefix("crds/")
    assert chart_copy.read_text() == result.stdout
    assert template_crd_manifest()["spec"]["scope"] == "Cluster"


def test_the_crd_schema_takes_a_template_and_refuses_unknown_comparisons() -> None:
    schema = template_crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(template(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(template(comparison="percent"), schema)


def test_a_template_names_its_generation_on_every_metric_it_gives() -> None:
    parsed = KVOffloadAnalysisTemplate.model_validate(template(generation=7))
    (source,) = metric_sources([], [parsed])
    assert source.template == "platform@7"
    assert source.metric.name == "abortShare"


def test_two_sources_defining_one_name_are_refused_naming_both() -> None:
    one = KVOffloadAnalysisTemplate.model_validate(template("a"))
    two = KVOffloadAnalysisTemplate.model_validate(template("b"))
    with pytest.raises(ValueError, match="a@3 and b@3"):
        metric_sources([], [one, two])


def policy_with(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    doc = yaml.safe_load((paths.ROOT / "examples" / "qwen3-0.6b-cpu.yaml").read_text())
    doc["spec"].setdefault("analysis", {})["metrics"] = metrics
    return dict(doc)


def test_plan_refuses_a_metric_without_bounds_or_reading_other_series_naming_the_field() -> None:
    doc = policy_with(
        [
            {"name": "ok", "query": ABORTS, "max": 0.01},
            {"name": "leaky", "query": 'sum(rate(vllm:request_success_total{namespace="other"}[5m]))', "max": 1},
            {"name": "unbounded", "query": ABORTS},
        ]
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(doc)
    paths_ = {e.path for e in caught.value.errors}
    assert "spec.analysis.metrics[1].query" in paths_
    assert "spec.analysis.metrics[2]" in paths_
    assert not any(p.startswith("spec.analysis.metrics[0]") for p in paths_)

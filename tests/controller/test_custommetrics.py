"""Reading a policy's KVOffloadAnalysisTemplates: a template that cannot be read, or a bad metric in one, is a
not-judged result naming it, never an error that ends the cycle, and a bad dry-run metric never gates."""

from __future__ import annotations

from typing import Any, cast

from kvoffload.analysis.assess import REQUESTS, Assessment
from kvoffload.analysis.custom import with_custom
from kvoffload.api.status import MetricResult, Verdict
from kvoffload.controller.apierrors import ApiRejectedError, GatewayError
from kvoffload.controller.custommetrics import read_templates
from kvoffload.controller.gateway import KubernetesGateway

QUERY = "sum(rate(vllm:request_success_total{ {{ selector }} }[{{ window }}]))"
BAD_QUERY = "sum(rate(vllm:request_success_total[5m]))"  # no {{ selector }}: refused


def template(name: str, *metrics: dict[str, Any], generation: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kvoffload.io/v1alpha1",
        "kind": "KVOffloadAnalysisTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": {"metrics": list(metrics)},
        **extra,
    }


class Templates:
    """A gateway that knows only templates: each name maps to its object, None (not found) or an error raised."""

    def __init__(self, objects: dict[str, dict[str, Any] | GatewayError | None]) -> None:
        self.objects = objects

    async def read_analysis_template(self, name: str) -> dict[str, Any] | None:
        found = self.objects.get(name)
        if isinstance(found, GatewayError):
            raise found
        return found


async def read(objects: dict[str, dict[str, Any] | GatewayError | None], *names: str) -> tuple[Any, Any]:
    return await read_templates(cast(KubernetesGateway, Templates(objects)), list(names))


def passing() -> Assessment:
    requests = MetricResult(name=REQUESTS, canary=100, threshold=50, passed=True)
    return Assessment(Verdict.PASS, (requests,), "every gated metric passed")


async def test_a_template_the_operator_may_not_read_is_not_judged_naming_it_and_the_error() -> None:
    forbidden = ApiRejectedError(
        'read KVOffloadAnalysisTemplate platform-gates: 403 kvoffloadanalysistemplates "platform-gates" is forbidden',
        403,
    )
    good = template("latency", {"name": "queue", "query": QUERY, "max": 5})
    found, unread = await read({"platform-gates": forbidden, "latency": good}, "platform-gates", "latency")
    assert [t.metadata.name for t in found] == ["latency"]  # the other template is still read and judged
    (row,) = unread
    assert row.gated
    assert row.result.name == "template/platform-gates"
    assert row.result.passed is None
    assert row.result.template == "platform-gates"
    assert "KVOffloadAnalysisTemplate platform-gates could not be read" in row.result.message
    assert "403" in row.result.message
    assert "is forbidden" in row.result.message
    assert with_custom(passing(), unread).verdict is Verdict.INCONCLUSIVE


async def test_a_server_error_reading_a_template_is_not_judged_too() -> None:
    _, unread = await read({"platform-gates": GatewayError("read KVOffloadAnalysisTemplate: 503")}, "platform-gates")
    (row,) = unread
    assert (row.gated, row.result.passed) == (True, None)
    assert "503" in row.result.message


async def test_a_missing_template_is_still_not_judged() -> None:
    _, unread = await read({"platform-gates": None}, "platform-gates")
    (row,) = unread
    assert row.result.message == "KVOffloadAnalysisTemplate platform-gates not found: analysis waits for it"


async def test_a_bad_dry_run_metric_is_shown_not_judged_and_never_gates_while_the_good_ones_are_read() -> None:
    obj = template(
        "platform-gates",
        {"name": "errors", "query": QUERY, "max": 0.01},
        {"name": "queueDepth", "query": BAD_QUERY, "max": 5, "dryRun": True},
    )
    found, unread = await read({"platform-gates": obj}, "platform-gates")
    (kept,) = found
    assert [m.name for m in kept.spec.metrics] == ["errors"]
    assert kept.version == "platform-gates@3"
    (row,) = unread
    assert not row.gated
    assert row.result.name == "template/platform-gates/queueDepth"
    assert (row.result.passed, row.result.dry_run, row.result.template) == (None, True, "platform-gates@3")
    assert row.result.message.startswith("dry run: KVOffloadAnalysisTemplate platform-gates metric queueDepth")
    assert "spec.metrics[1].query" in row.result.message
    # The bad dry run does not decide: the verdict stays Pass.
    assert with_custom(passing(), unread).verdict is Verdict.PASS


async def test_a_bad_gated_metric_is_not_judged_alone_and_the_templates_other_metrics_still_are() -> None:
    obj = template(
        "platform-gates",
        {"name": "errors", "query": QUERY, "min": 2, "max": 1},  # min over max
        {"name": "queueDepth", "query": QUERY, "max": 5, "dryRun": True},
    )
    found, unread = await read({"platform-gates": obj}, "platform-gates")
    (kept,) = found
    assert [m.name for m in kept.spec.metrics] == ["queueDepth"]
    (row,) = unread
    assert row.gated
    assert (row.result.name, row.result.dry_run) == ("template/platform-gates/errors", False)
    assert "min must be at most max" in row.result.message
    assert with_custom(passing(), unread).verdict is Verdict.INCONCLUSIVE


async def test_a_template_invalid_beyond_its_metrics_is_invalid_as_a_whole() -> None:
    obj = template("platform-gates", {"name": "errors", "query": QUERY, "max": 0.01}, status={"x": 1})
    found, unread = await read({"platform-gates": obj}, "platform-gates")
    assert found == []
    (row,) = unread
    assert (row.gated, row.result.name) == (True, "template/platform-gates")
    assert row.result.message.startswith("KVOffloadAnalysisTemplate platform-gates is invalid: ")
    # Duplicate names are the template's fault, not one metric's.
    dup = template("dup", {"name": "a", "query": QUERY, "max": 1}, {"name": "a", "query": QUERY, "max": 2})
    found, unread = await read({"dup": dup}, "dup")
    assert found == []
    assert [r.result.name for r in unread] == ["template/dup"]

"""Wrong policies are refused with every offending field path, by the models, the API server and the CLI.

Each file in tests/data/invalid/ holds one kind of mistake (schema-mistakes.yaml
holds several). The models report a cross-field mistake at the model that
checks it (``spec``), while the CRD's CEL rule points at the field
(``spec.rollout.pilotCpu``), so both paths are listed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.api.errors import PolicyError
from kvoffload.cli.common import EXIT_BAD_INPUT
from kvoffload.cli.main import main
from kvoffload.policy.loading import load_policy, parse_policy
from tests.support import paths
from tests.support.crd_admission import admit

INVALID = paths.DATA / "invalid"

UNKNOWN_FIELD = "spec.offload.cpuSize"
SCHEMA_MISTAKES = {
    "spec.gpu.memoryUtilization",  # 1.5 > 0.99
    "spec.offload.backend",  # not an enum value
    "spec.offload.cpu",  # 32GB is no quantity
    "spec.offload.cpuSize",  # unknown field
    "spec.offload.secondaryTiers[0].name",  # not a DNS label
    "spec.analysis.window",  # not a duration
}

# file -> (paths the models report, paths the API server reports through the CRD schema and CEL rules)
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "pilot-cpu-not-smaller.yaml": ({"spec"}, {"spec.rollout.pilotCpu"}),
    "store-threshold-with-tiers.yaml": ({"spec.offload"}, {"spec.offload.storeThreshold"}),
    "gpu-count-not-tp.yaml": ({"spec"}, {"spec.gpu.count"}),
    "canary-is-whole-fleet.yaml": ({"spec"}, {"spec.rollout.canaryReplicas"}),
    "tier-volume-two-sources.yaml": (
        {"spec.offload.secondaryTiers[0].volume"},
        {"spec.offload.secondaryTiers[0].volume"},
    ),
    "duplicate-tier-names.yaml": ({"spec.offload"}, {"spec.offload.secondaryTiers"}),
    "reserved-tier-name.yaml": ({"spec.offload"}, {"spec.offload.secondaryTiers"}),
    "promotion-steps-fall.yaml": ({"spec.rollout.promotionSteps"}, {"spec.rollout.promotionSteps"}),
    "managed-flag-in-extra-args.yaml": ({"spec.model.extraArgs[1]"}, {"spec.model.extraArgs"}),
    "extra-args-spelt-otherwise.yaml": (
        {"spec.model.extraArgs[0]", "spec.model.extraArgs[1]", "spec.model.extraArgs[3]"},
        {"spec.model.extraArgs"},
    ),
    "loader-env.yaml": ({"spec.model.env[0].name"}, {"spec.model.env[0].name"}),
    "quantity-overflow.yaml": ({"spec.offload.cpu"}, {"spec.offload.cpu"}),
    "deadline-past-int32.yaml": ({"spec.rollout.progressDeadline"}, {"spec.rollout.progressDeadline"}),
    "zero-and-negative-sizes.yaml": (
        {"spec.resources.baseMemory", "spec.resources.headroom", "spec.offload.cpu"},
        {"spec.resources.baseMemory", "spec.resources.headroom", "spec.offload.cpu"},
    ),
    "zero-durations.yaml": (
        {"spec.rollout.stepDuration", "spec.analysis.interval"},
        {"spec.rollout.stepDuration", "spec.analysis.interval"},
    ),
    "architecture-gqa-and-mla.yaml": ({"spec.model.architecture"}, {"spec.model.architecture"}),
    "architecture-and-configmap.yaml": ({"spec"}, {"spec.model.configMap"}),
    # With strict field validation (kubectl's default) the API server refuses an unknown field at
    # decoding and reports nothing else; test_unknown_fields_are_pruned_without_strict_validation.
    "schema-mistakes.yaml": (SCHEMA_MISTAKES, {UNKNOWN_FIELD}),
    "preflight-out-of-range.yaml": (
        {"spec.rollout.preflight.kvPressure", "spec.rollout.preflight.minPrefixReuse"},
        {"spec.rollout.preflight.kvPressure", "spec.rollout.preflight.minPrefixReuse"},
    ),
    "preflight-prompt-too-long.yaml": ({"spec"}, {"spec.rollout.preflight"}),
    "error-budget-out-of-range.yaml": (
        {"spec.analysis.errors.maxShare", "spec.analysis.errors.maxIncrease"},
        {"spec.analysis.errors.maxShare", "spec.analysis.errors.maxIncrease"},
    ),
    "observe-without-selector.yaml": ({"spec.rollout"}, {"spec.rollout.observe"}),
    "scalar-types.yaml": (
        {"spec.replicas", "spec.rollout.autoPromote", "spec.analysis.errors.maxShare"},
        {"spec.replicas", "spec.rollout.autoPromote", "spec.analysis.errors.maxShare"},
    ),
    "toleration-seconds-without-no-execute.yaml": (
        {"spec.gpu.tolerations[0]"},
        {"spec.gpu.tolerations[0].tolerationSeconds"},
    ),
    "observe-selector-widened.yaml": (
        {"spec.rollout.observe.selector.matchLabels.app"},
        {"spec.rollout.observe.selector.matchLabels.app"},
    ),
}

# The words each models error must contain, so the path is not right by accident.
MODEL_MESSAGES = {
    "pilot-cpu-not-smaller.yaml": "rollout.pilotCpu must be smaller than offload.cpu",
    "store-threshold-with-tiers.yaml": "storeThreshold applies only to a single CPU tier",
    "gpu-count-not-tp.yaml": "gpu.count must equal model.tensorParallelSize",
    "canary-is-whole-fleet.yaml": "canaryReplicas must be fewer than replicas",
    "duplicate-tier-names.yaml": "names must be unique",
    "reserved-tier-name.yaml": "may not be named",
    "architecture-and-configmap.yaml": "not both",
    "managed-flag-in-extra-args.yaml": "sets --max-model-len, which the operator manages",
    "extra-args-spelt-otherwise.yaml": "sets --tensor-parallel-size, which the operator manages",
    "loader-env.yaml": "LD_PRELOAD changes what code the engine loads",
    "quantity-overflow.yaml": "is not a Kubernetes quantity",
    "deadline-past-int32.yaml": "must be at most 720h",
    "preflight-prompt-too-long.yaml": "rollout.preflight.promptTokens must be at most model.maxModelLen",
    "observe-without-selector.yaml": "rollout.observe.selector is required when rollout.observeOnly is true",
    "scalar-types.yaml": "must be a number, not str '4'",
    "toleration-seconds-without-no-execute.yaml": "tolerationSeconds needs effect NoExecute",
}

CASES = pytest.mark.parametrize("name", sorted(EXPECTED))


def test_every_invalid_file_has_expectations() -> None:
    assert {p.name for p in INVALID.glob("*.yaml")} == set(EXPECTED)


@CASES
def test_models_name_every_offending_path(name: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(INVALID / name)
    assert {e.path for e in caught.value.errors} == EXPECTED[name][0]
    if name in MODEL_MESSAGES:
        assert any(MODEL_MESSAGES[name] in e.message for e in caught.value.errors), caught.value.render()


@CASES
def test_api_server_names_every_offending_path(name: str) -> None:
    _, problems = admit(yaml.safe_load((INVALID / name).read_text()))
    assert {p.path for p in problems} == EXPECTED[name][1]


def test_unknown_fields_are_pruned_without_strict_validation() -> None:
    """``kubectl apply --validate=warn``: the unknown field is pruned (a warning) and the rest is named."""
    obj = yaml.safe_load((INVALID / "schema-mistakes.yaml").read_text())
    stored, problems = admit(obj, strict=False)
    assert {p.path for p in problems} == SCHEMA_MISTAKES - {UNKNOWN_FIELD}
    assert "cpuSize" not in stored["spec"]["offload"]


def test_cel_rules_are_not_run_on_an_object_that_fails_its_schema() -> None:
    obj = yaml.safe_load((INVALID / "pilot-cpu-not-smaller.yaml").read_text())
    obj["spec"]["gpu"]["memoryUtilization"] = 1.5
    _, problems = admit(obj)
    assert [(p.source, p.path) for p in problems] == [("schema", "spec.gpu.memoryUtilization")]


@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize("name", ["schema-mistakes.yaml", "pilot-cpu-not-smaller.yaml", "tier-volume-two-sources.yaml"])
def test_cli_reports_every_path_and_exits_2_without_a_traceback(command: str, name: str) -> None:
    result = CliRunner().invoke(main, [command, str(INVALID / name)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    for path in EXPECTED[name][0]:
        assert f"  - {path}: " in result.stderr
    assert result.stderr.startswith(f"{INVALID / name}: invalid KVOffloadPolicy")


def test_cli_refuses_a_file_without_a_policy(tmp_path: Path) -> None:
    empty = tmp_path / "nothing.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = CliRunner().invoke(main, ["plan", str(empty)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "expected exactly one KVOffloadPolicy document, found 0" in result.stderr
    assert result.stdout == ""


def test_cli_refuses_yaml_that_does_not_parse(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    result = CliRunner().invoke(main, ["render", str(broken)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "not valid YAML" in result.stderr
    assert "Traceback" not in result.stderr


def test_overlong_quantity_is_refused_by_models_and_schema() -> None:
    # maxLength bounds the cost the API server estimates for the quantity() rules; the models match it.
    obj = yaml.safe_load((paths.EXAMPLES / "qwen3-0.6b-cpu.yaml").read_text())
    obj["spec"]["offload"]["cpu"] = "1" * 65
    _, problems = admit(obj)
    assert {(p.source, p.path) for p in problems} == {("schema", "spec.offload.cpu")}
    with pytest.raises(PolicyError) as caught:
        parse_policy(obj)
    assert [e.path for e in caught.value.errors] == ["spec.offload.cpu"]

"""Every example policy is accepted by the models, by the CRD's schema and by every CEL rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.catalog import find_gpu_class, find_model
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import load_policy as load_any_policy
from kvoffload.policy.tenancy import Tenancy
from kvoffload_lab.demo import planned_seconds
from tests.policy.render_policies import RENDER_TENANCY
from tests.support import paths
from tests.support.crd_admission import admit

ROOT = paths.ROOT
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BY_NAME = pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)


def load_policy(path: Path, tenancy: Tenancy = RENDER_TENANCY) -> KVOffloadPolicy:
    """An example, judged by a cluster that allows what the examples ask (an NVMe hostPath, the demo's lab)."""
    return load_any_policy(path, tenancy)


def test_the_documented_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "qwen3-0.6b-cpu.yaml",
        "llama-3.1-70b-tp4-nvme.yaml",
        "qwen3-8b-lmcache.yaml",
        "demo-two-tier.yaml",
    } <= names


@BY_NAME
def test_example_opens_with_a_comment_that_explains_it(path: Path) -> None:
    header = path.read_text().split("apiVersion:", 1)[0]
    comment_lines = [line for line in header.splitlines() if line.startswith("# ") and len(line) > 10]
    assert len(comment_lines) >= 3


@BY_NAME
def test_example_is_a_valid_policy_for_the_models(path: Path) -> None:
    policy = load_policy(path)
    assert isinstance(policy, KVOffloadPolicy)


@BY_NAME
def test_example_passes_the_crd_schema_and_every_cel_rule(path: Path) -> None:
    _, problems = admit(yaml.safe_load(path.read_text()))
    assert problems == []


@BY_NAME
def test_example_shrunk_to_one_replica_is_refused_by_cel_and_models(path: Path) -> None:
    # Proves the check above is not vacuous: the same pipeline refuses a one-line change.
    obj = yaml.safe_load(path.read_text())
    obj["spec"]["replicas"] = 1
    _, problems = admit(obj)
    assert [(p.source, p.path) for p in problems] == [("cel", "spec.rollout.canaryReplicas")]
    with pytest.raises(ValidationError, match="canaryReplicas must be fewer than replicas"):
        KVOffloadPolicy.model_validate(obj)


@BY_NAME
def test_example_names_a_catalog_model_and_gpu_class(path: Path) -> None:
    spec = load_policy(path).spec
    assert find_gpu_class(spec.gpu.class_) is not None, spec.gpu.class_
    assert spec.model.architecture is not None or find_model(spec.model.name) is not None, spec.model.name


def test_seed_example_mirrors_the_measurement() -> None:
    spec = load_policy(ROOT / "examples" / "qwen3-0.6b-cpu.yaml").spec
    assert (spec.model.name, spec.offload.backend, spec.offload.cpu) == ("Qwen/Qwen3-0.6B", "native", "512Mi")
    assert spec.offload.secondary_tiers == []


def test_demo_example_climbs_two_tiers_within_minutes() -> None:
    spec = load_policy(ROOT / "examples" / "demo-two-tier.yaml").spec
    assert [t.name for t in spec.offload.secondary_tiers] == ["nvme"]
    assert spec.rollout.pilot_cpu is not None
    assert planned_seconds(spec, build_ladder(spec)) <= 10 * 60  # `make demo` is a coffee, not a lunch
    assert spec.model.name == "Qwen/Qwen3-0.6B"

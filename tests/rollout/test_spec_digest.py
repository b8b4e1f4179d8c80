"""The spec digest tells a /scale (``replicas`` alone changed) from a new spec, and stays put across upgrades."""

from __future__ import annotations

from kvoffload.api.rollout import ErrorsSpec
from kvoffload.rollout.context import spec_digest
from tests.rollout.test_rollout import make_spec


def test_replicas_alone_keep_the_digest_and_any_other_change_moves_it() -> None:
    spec = make_spec()
    assert spec_digest(spec.model_copy(update={"replicas": spec.replicas + 2})) == spec_digest(spec)
    looser = spec.analysis.model_copy(update={"errors": ErrorsSpec(max_share=0.2)})
    assert spec_digest(spec.model_copy(update={"analysis": looser})) != spec_digest(spec)


def test_a_field_at_its_default_is_not_in_the_digest() -> None:
    # As if a later release had added analysis.errors: a spec that sets it to its defaults digests as one that
    # never heard of it, so an upgrade does not turn the next /scale into a new ladder.
    spec = make_spec()
    spelt_out = spec.analysis.model_copy(update={"errors": ErrorsSpec(max_share=0.05, max_increase=0.02)})
    assert spec_digest(spec.model_copy(update={"analysis": spelt_out})) == spec_digest(spec)
    assert "errors" not in spec.model_dump(by_alias=True, exclude_defaults=True).get("analysis", {})

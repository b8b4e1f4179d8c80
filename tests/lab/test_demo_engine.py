"""``kvoffload demo --engine``: the demo policy on SGLang, sized as HiCache takes it, or on TensorRT-LLM."""

from __future__ import annotations

import click
import pytest

from kvoffload.policy.engine_config import engine_args
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.renderable import check_renderable
from kvoffload_lab.cluster.laboperator import LAB_TENANCY
from kvoffload_lab.commands import demo as demo_command
from kvoffload_lab.demo import DEMO_ENGINES, TRTLLM_IMAGE, DemoError, default_policy_path, load_policy_doc, on_engine


def test_the_demo_policy_on_sglang_takes_whole_gigabytes_and_renders() -> None:
    doc = load_policy_doc(default_policy_path())
    assert (doc["spec"]["offload"]["cpu"], doc["spec"]["rollout"]["pilotCpu"]) == ("2304Mi", "1536Mi")
    policy = parse_policy(on_engine(doc, "sglang"), tenancy=LAB_TENANCY)
    assert check_renderable(policy) == []
    # 2304Mi is 2.42 GB and 1536Mi 1.61 GB: rounded down to whole GB.
    sizes = {lv.name: engine_args(policy, lv) for lv in build_ladder(policy.spec)}
    assert [args[args.index("--hicache-size") + 1] for name, args in sizes.items() if name != "gpu-only"] == [
        "1",
        "2",
        "2",
    ]
    assert on_engine(doc, "vllm") == doc


def test_a_pilot_no_smaller_than_the_tier_after_rounding_is_left_out() -> None:
    doc = load_policy_doc(default_policy_path())
    doc["spec"]["offload"]["cpu"] = "1800Mi"  # 1.89 GB -> 1G, as the 1536Mi pilot
    out = on_engine(doc, "sglang")
    assert out["spec"]["offload"]["cpu"] == "1G"
    assert "pilotCpu" not in out["spec"]["rollout"]


def test_an_sglang_policy_is_not_turned_back_into_vllm() -> None:
    doc = on_engine(load_policy_doc(default_policy_path()), "sglang")
    with pytest.raises(DemoError, match="give a policy for vllm"):
        on_engine(doc, "vllm")


def test_the_demo_policy_on_trtllm_keeps_its_host_cache_and_drops_the_file_tier() -> None:
    doc = load_policy_doc(default_policy_path())
    out = on_engine(doc, "trtllm")
    assert out["spec"]["engine"] == "trtllm"
    assert out["spec"]["model"]["image"] == TRTLLM_IMAGE
    assert "secondaryTiers" not in out["spec"]["offload"]
    policy = parse_policy(out, tenancy=LAB_TENANCY)
    assert check_renderable(policy) == []
    assert [lv.name for lv in build_ladder(policy.spec)] == ["gpu-only", "cpu-pilot", "cpu"]
    assert [lv.cpu_bytes for lv in build_ladder(policy.spec)][1:] == [1536 * 2**20, 2304 * 2**20]


def test_the_demo_offers_every_engine_it_can_move_the_policy_onto() -> None:
    choices = next(p for p in demo_command.params if p.name == "engine").type
    assert isinstance(choices, click.Choice)
    assert tuple(choices.choices) == DEMO_ENGINES

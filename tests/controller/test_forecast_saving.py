"""The forecast the controller hands the live payoff's row (controller/measuring.py, ``forecast_saving``)."""

from __future__ import annotations

from typing import Any

from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.controller.measuring import forecast_saving
from kvoffload.economics.enginecost import plan_forecast, split


def spec(gpu_class: str, **rollout: Any) -> KVOffloadPolicySpec:
    return KVOffloadPolicySpec.model_validate(
        {
            "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.26.0", "maxModelLen": 8192},
            "gpu": {"class": gpu_class, "count": 1},
            "replicas": 2,
            "resources": {"baseMemory": "24Gi", "headroom": "4Gi"},
            "offload": {"backend": "native", "cpu": "8Gi"},
            "rollout": rollout,
        }
    )


def test_it_is_the_plans_saving_per_restored_token_at_the_preflights_prompt() -> None:
    s = spec("nvidia-h100-80gb", preflight={"promptTokens": 3200})
    plan = plan_forecast("nvidia-h100-80gb", s, 3200)
    assert forecast_saving(s) == plan["savingMs"] * 1e3 / split(3200)[1]


def test_without_a_preflight_prompt_it_prices_the_seeds_1480_tokens() -> None:
    s = spec("nvidia-h100-80gb")
    assert forecast_saving(s) == plan_forecast("nvidia-h100-80gb", s, 1480)["savingMs"] * 1e3 / split(1480)[1]


def test_a_class_without_an_engine_profile_gives_none() -> None:
    assert forecast_saving(spec("nvidia-l4")) is None

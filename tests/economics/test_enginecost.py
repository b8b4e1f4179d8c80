"""The engine's TTFT model (economics/enginecost.py): the fit, the forecast and the profile file."""

from __future__ import annotations

import json
import random

import pytest

from kvoffload.economics.enginecost import (
    TERMS,
    EngineProfile,
    Fit,
    ModelCost,
    Run,
    Sample,
    engine_profile_from_json,
    fit,
    forecast,
    model_cost,
    predict_ms,
    split,
)
from kvoffload.economics.profile import ProfileError

SMALL = ModelCost("Qwen/Qwen3-0.6B", 0.6e9, 28, 114_688)
LARGE = ModelCost("Qwen/Qwen3-8B", 8.2e9, 36, 147_456)
TRUTH = Fit((18.0, 0.7, 1.4, 0.2, 6.0), 0, 0.0)
"""Coefficients in the order of TERMS: fixed, floor per layer, ms per TFLOP, ms per GB read, restore overhead."""


def copy_ms(tokens: int) -> float:
    return tokens * 2e-4


def synthetic_run(model: ModelCost, lengths: list[int], noise: float, seed: int, held_out: tuple[int, ...] = ()) -> Run:
    """Samples of ``model`` drawn from TRUTH with relative noise: three cases at each length, three reps."""
    rng = random.Random(seed)
    samples = []
    for n in [*lengths, *held_out]:
        computed, cached = split(n)
        for _ in range(3):
            for case, c, h, e in (
                ("cold", n, 0, 0),
                ("gpu_hit", computed, cached, 0),
                ("cpu_restore", computed, 0, cached),
            ):
                copy = copy_ms(e)
                ttft = predict_ms(TRUTH, model, "cudagraph", c, h + e, e, copy) * (1 + rng.gauss(0, noise))
                samples.append(Sample(case, n, c, h, e, ttft, copy, held_out=n in held_out))  # type: ignore[arg-type]
    return Run(model, "cudagraph", tuple(samples))


def test_the_fit_recovers_the_coefficients_that_made_noiseless_samples() -> None:
    profile = EngineProfile("gpu", "vllm", "0.26.0", (synthetic_run(SMALL, [256, 1024, 2048, 4096], 0.0, 1),))
    fitted, own = profile.fit_for("cudagraph", SMALL.name)
    assert own
    for term, want, got in zip(TERMS, TRUTH.coefficients, fitted.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6), term
    assert fitted.worst_relative_error < 1e-9


def test_held_out_lengths_are_stored_but_never_fitted() -> None:
    run = synthetic_run(SMALL, [256, 1024, 2048, 4096], 0.0, 1, held_out=(6000,))
    poisoned = Run(
        SMALL,
        "cudagraph",
        tuple(
            Sample(
                s.case,
                s.prompt_tokens,
                s.computed,
                s.local_hit,
                s.external,
                s.ttft_ms * (10 if s.held_out else 1),
                s.restore_copy_ms,
                s.held_out,
            )
            for s in run.samples
        ),
    )
    fitted, _ = EngineProfile("gpu", "vllm", "0.26.0", (poisoned,)).fit_for("cudagraph", SMALL.name)
    assert fitted.coefficients == pytest.approx(TRUTH.coefficients, rel=1e-6, abs=1e-6)
    assert fitted.points == 12  # four lengths x three cases: the 6,000-token medians are not among them


def test_with_noise_the_forecast_of_an_unseen_length_and_model_stays_close() -> None:
    runs = (
        synthetic_run(SMALL, [256, 1024, 2048, 4096], 0.03, 2),
        synthetic_run(LARGE, [256, 1024, 2048, 4096], 0.03, 3),
    )
    profile = EngineProfile("gpu", "vllm", "0.26.0", runs)
    middle = ModelCost("Qwen/Qwen3-4B", 4.0e9, 36, 147_456)
    got = forecast(profile, middle, 3200, "cudagraph", copy_ms)
    assert got.basis == "parameter count"
    computed, cached = split(3200)
    want_cold = predict_ms(TRUTH, middle, "cudagraph", 3200, 0, 0, 0.0)
    want_restore = predict_ms(TRUTH, middle, "cudagraph", computed, cached, cached, copy_ms(cached))
    assert got.cold_ms == pytest.approx(want_cold, rel=0.08)
    assert got.cpu_restore_ms == pytest.approx(want_restore, rel=0.08)
    assert got.saving_ms == pytest.approx(want_cold - want_restore, rel=0.15)


def test_coefficients_are_never_negative() -> None:
    # A hit that gets faster with length would fit a negative read cost; the fit clamps it to zero instead.
    samples = [Sample("gpu_hit", n, 8, n - 8, 0, 20.0 - n / 1000) for n in (512, 1024, 2048, 4096, 8000)]
    samples += [Sample("cold", n, n, 0, 0, 20.0 + n / 100) for n in (512, 1024, 2048, 4096, 8000)]
    fitted = fit([(SMALL, "cudagraph", s) for s in samples])
    assert min(fitted.coefficients) >= 0.0


def test_a_prompt_is_cached_in_whole_blocks_and_never_its_last_token() -> None:
    assert split(1480) == (8, 1472)
    assert split(1472) == (16, 1456)
    assert split(1) == (1, 0)


def test_the_profile_file_round_trips_and_its_fits_are_worked_out_again() -> None:
    profile = EngineProfile("gpu", "vllm", "0.26.0", (synthetic_run(SMALL, [256, 1024, 2048, 4096], 0.02, 4),))
    data = json.loads(profile.dumps())
    data["fits"]["cudagraph"]["class"]["fixedMs"] = 999.0  # a stale or forged figure is not trusted
    again = engine_profile_from_json(data)
    assert again.fits.keys() == profile.fits.keys()
    for key, fitted in profile.fits.items():  # the file keeps TTFTs to a microsecond
        assert again.fits[key].coefficients == pytest.approx(fitted.coefficients, rel=1e-3, abs=1e-4)


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda d: d.update(kind="pytorch"), "not an engine profile"),
        (lambda d: d["runs"][0].update(mode="turbo"), "runs[].mode: 'turbo'"),
        (lambda d: d["runs"][0]["samples"][0].update(case="warm"), "samples[].case: 'warm'"),
        (lambda d: d["runs"][0].pop("model"), "KeyError"),
    ],
)
def test_a_broken_profile_file_names_what_is_wrong(mutate: object, complaint: str) -> None:
    data = json.loads(EngineProfile("gpu", "vllm", "0.26.0", (synthetic_run(SMALL, [256, 1024], 0.0, 5),)).dumps())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ProfileError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        engine_profile_from_json(data)


def test_a_mode_never_measured_is_refused_by_name() -> None:
    profile = EngineProfile("gpu", "vllm", "0.26.0", (synthetic_run(SMALL, [256, 1024], 0.0, 6),))
    with pytest.raises(ProfileError, match="no eager measurements"):
        forecast(profile, SMALL, 1480, "eager", copy_ms)


def test_a_catalog_model_is_priced_from_its_parameters_layers_and_kv_bytes() -> None:
    assert model_cost("Qwen/Qwen3-8B") == ModelCost("Qwen/Qwen3-8B", 8.2e9, 36, 147_456)
    with pytest.raises(ProfileError, match="not in the model catalog"):
        model_cost("someone/unknown")


def test_fewer_medians_than_coefficients_are_refused_by_name() -> None:
    samples = [Sample("cold", n, n, 0, 0, 20.0 + n / 100) for n in (512, 1024, 2048, 4096)]
    with pytest.raises(ProfileError, match=r"too few medians to fit \(4, one a case and length\): 5 at least"):
        fit([(SMALL, "cudagraph", s) for s in samples])

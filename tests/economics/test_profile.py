"""Cost profiles: the shipped ones load and match the catalog, bad files are refused, the helpers interpolate."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any

import pytest

from kvoffload.economics.estimated import derive_estimated
from kvoffload.economics.gpuspec import PUBLISHED_SPECS
from kvoffload.economics.profile import (
    GIB,
    CurvePoint,
    DecodeCurve,
    ModelShape,
    PinPoint,
    PrefillCurve,
    Profile,
    ProfileError,
    RestoreCost,
    Source,
    TransferPoint,
    held_out_errors,
)
from kvoffload.economics.profileload import (
    load_profile,
    loads_profile,
    profile_from_json,
    shipped_profile,
    shipped_profile_names,
)
from kvoffload.policy.catalog import GPU_CLASSES
from tests.support.paths import ROOT

H200 = "nvidia-h200-141gb"
KIB = 1024
SHAPE = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=100)


def synthetic(**changes: Any) -> Profile:
    """A small measured profile with round numbers, to check the arithmetic by hand."""
    base = Profile(
        gpu_class=H200,
        kind="measured",
        source=Source("GPU", "1", "2.11", "13.0", "2026-01-01", "calibrate"),
        transfers=(
            TransferPoint("h2d", "contiguous", GIB, 1, 50e9),
            TransferPoint("d2h", "contiguous", GIB, 1, 40e9),
            TransferPoint("h2d", "batched_dma", 8 * KIB, 100, 10e9),
            TransferPoint("h2d", "batched_dma", 32 * KIB, 100, 30e9),
            TransferPoint("h2d", "batched_dma", 128 * KIB, 100, 50e9),
            TransferPoint("d2h", "batched_dma", 32 * KIB, 100, 20e9),
            TransferPoint("h2d", "zero_copy_12sm", 8 * KIB, 100, 40e9),
            TransferPoint("h2d", "zero_copy_12sm", 16 * KIB, 100, 40e9),
        ),
        bidirectional_bytes_per_second=90e9,
        pinning=(PinPoint(GIB, 0.5), PinPoint(5 * GIB, 2.5)),
        restore=RestoreCost(fixed_seconds=1e-4, submit_seconds_per_page={"batched_dma": 1e-6, "zero_copy_12sm": 0.0}),
        prefill=(PrefillCurve("m", SHAPE, (CurvePoint(100, 0.010), CurvePoint(200, 0.012), CurvePoint(400, 0.020))),),
        decode=(DecodeCurve("m", 1024, (CurvePoint(1, 0.002), CurvePoint(9, 0.004)), True),),
    )
    return Profile(**{**base.__dict__, **changes})


# --- the shipped profiles ------------------------------------------------------------------


def test_every_catalog_gpu_class_ships_a_profile() -> None:
    assert shipped_profile_names() == sorted(g.name for g in GPU_CLASSES)


@pytest.mark.parametrize("name", sorted(g.name for g in GPU_CLASSES))
def test_shipped_profile_loads_and_names_its_class(name: str) -> None:
    profile = shipped_profile(name)
    assert profile.gpu_class == name
    assert profile.kind == ("measured" if name == H200 else "estimated")
    assert profile.source.date
    assert profile.source.command
    assert profile.prefill
    assert profile.decode
    # a profile must price what vLLM does: both contiguous directions, batched loads and stores
    assert profile.contiguous_h2d_bytes_per_second > 0
    assert profile.contiguous_d2h_bytes_per_second > 0
    assert profile.transfer_points("h2d", "batched_dma")
    assert profile.transfer_points("d2h", "batched_dma")


def test_the_measured_profile_says_where_it_comes_from() -> None:
    p = shipped_profile(H200)
    assert p.source.device == "NVIDIA H200"
    assert p.source.driver
    assert p.source.torch.startswith("2.")
    assert p.source.cuda
    assert "--gpu-class nvidia-h200-141gb" in p.source.command
    assert p.derivation is None
    assert {c.mode for c in p.prefill} == {"eager", "cuda_graph"}
    assert {c.model for c in p.prefill} == {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B"}


@pytest.mark.parametrize("name", sorted(g.name for g in GPU_CLASSES if g.name != H200))
def test_estimated_profiles_cite_their_figures_and_scale_from_the_measured_one(name: str) -> None:
    p = shipped_profile(name)
    assert p.derivation is not None
    assert p.derivation.base_profile == H200
    assert p.derivation.target_spec == PUBLISHED_SPECS[name]
    assert all(c.startswith("https://") for c in p.derivation.target_spec.citations)
    assert p.notes
    assert "not measured on this class" in p.notes[0]
    gpu = next(g for g in GPU_CLASSES if g.name == name)
    assert PUBLISHED_SPECS[name].memory_bytes == gpu.memory_bytes


def test_published_figures_cover_every_catalog_class() -> None:
    assert set(PUBLISHED_SPECS) == {g.name for g in GPU_CLASSES}


def test_estimated_profiles_follow_their_specifications() -> None:
    h200, a100, b200 = shipped_profile(H200), shipped_profile("nvidia-a100-80gb"), shipped_profile("nvidia-b200")
    # PCIe Gen4 halves every rate; Gen5 keeps it
    assert a100.contiguous_h2d_bytes_per_second == pytest.approx(h200.contiguous_h2d_bytes_per_second / 2)
    assert b200.contiguous_h2d_bytes_per_second == pytest.approx(h200.contiguous_h2d_bytes_per_second)
    # prefill by dense bf16, decode by HBM
    assert a100.prefill_seconds("Qwen/Qwen3-8B", 4096) == pytest.approx(
        h200.prefill_seconds("Qwen/Qwen3-8B", 4096) * 989 / 312
    )
    assert b200.decode_itl_seconds("Qwen/Qwen3-8B", 8) == pytest.approx(
        h200.decode_itl_seconds("Qwen/Qwen3-8B", 8) * 4.8 / 8.0
    )
    # a model that does not fit one GPU gets no curve
    with pytest.raises(ProfileError, match="no eager prefill curve"):
        shipped_profile("nvidia-l4").prefill_curve("Qwen/Qwen3-32B")


# --- the held-out check -----------------------------------------------------------------------


def test_held_out_measurements_match_the_interpolation() -> None:
    # Prompt lengths 1,480, 3,200 and 12,000 and four whole-prompt restores were timed on the
    # H200 but never interpolated from: the curve and the restore model must predict them.
    errors = held_out_errors(shipped_profile(H200))
    assert len(errors) >= 15
    prefill = [e for e in errors if e.what.startswith("prefill ")]
    restores = [e for e in errors if e.what.startswith("restore ")]
    assert restores
    worst = max(prefill, key=lambda e: abs(e.relative_error))
    assert abs(worst.relative_error) < 0.10, f"{worst.what}: {worst.relative_error:+.1%}"
    # The shipped profile prices the submit at the median of three H200 hosts' (0.47, 0.74 and 0.72 µs a page,
    # issue 25); these restores were timed on the first, the fastest, and read up to +24% high at the median
    # (5,152 pages at 0.25 µs more each). The restore model is judged here with that host's own submit cost.
    raw = json.loads((ROOT / "bench/calibration/nvidia-h200-141gb.raw.json").read_text())
    own = dataclasses.replace(
        shipped_profile(H200).restore,
        submit_seconds_per_page=raw["restoreAsMeasured"]["submitSecondsPerPage"],
    )
    on_its_host = dataclasses.replace(shipped_profile(H200), restore=own)
    restores = [e for e in held_out_errors(on_its_host) if e.what.startswith("restore ")]
    worst = max(restores, key=lambda e: abs(e.relative_error))
    assert abs(worst.relative_error) < 0.15, f"{worst.what}: {worst.relative_error:+.1%}"


# --- reading and validating ------------------------------------------------------------------


def test_a_profile_survives_json() -> None:
    for name in shipped_profile_names():
        p = shipped_profile(name)
        assert loads_profile(p.dumps()) == p


def test_load_profile_reads_a_file(tmp_path: Any) -> None:
    path = tmp_path / "p.json"
    path.write_text(synthetic().dumps())
    assert load_profile(path) == synthetic()
    with pytest.raises(ProfileError, match="No such file"):
        load_profile(tmp_path / "missing.json")


def _broken(edit: Any) -> dict[str, Any]:
    data = copy.deepcopy(synthetic().to_json())
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("gpuClass"), r"profile\.gpuClass: missing"),
        (lambda d: d.update(schemaVersion=2), "schemaVersion: 2 is not supported"),
        (lambda d: d.update(kind="guessed"), "'guessed' is not one of measured, estimated"),
        (lambda d: d.update(kind="estimated"), "an estimated profile must say what it was derived from"),
        (lambda d: d["transfers"][0].update(bytesPerSecond=0), r"transfers\[0\]\.bytesPerSecond: must be > 0"),
        (lambda d: d["transfers"][0].update(bytesPerSecond="fast"), "must be a finite number"),
        (lambda d: d["transfers"][2].update(path="teleport"), "'teleport' is not one of"),
        (lambda d: d.update(transfers=[t for t in d["transfers"] if t["direction"] == "h2d"]), "no d2h contiguous"),
        (lambda d: d["restore"]["submitSecondsPerPage"].update(warp=1.0), "warp: not a transfer path"),
        (lambda d: d["prefill"][0].update(points=[]), r"prefill\[0\]\.points: empty"),
        (lambda d: d["prefill"][0]["points"].append({"tokens": 100, "seconds": 1}), "two points at the same tokens"),
        (lambda d: d["prefill"].append(d["prefill"][0]), "a second eager curve for m"),
        (lambda d: d["decode"][0].update(cudaGraph="yes"), "must be true or false"),
        (lambda d: d["pinning"][0].update(bytes=True), "must be an integer >= 1"),
    ],
)
def test_the_reader_names_the_bad_field(edit: Any, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        profile_from_json(_broken(edit))


def test_not_json_is_refused() -> None:
    with pytest.raises(ProfileError, match="not valid JSON"):
        loads_profile("{", "x.json")


def test_an_unknown_class_has_no_shipped_profile() -> None:
    with pytest.raises(ProfileError, match="no shipped profile for GPU class 'tpu'"):
        shipped_profile("tpu")


# --- interpolation ------------------------------------------------------------------------------


def test_prefill_is_piecewise_linear_and_extends_its_end_segments() -> None:
    p = synthetic()
    assert p.prefill_seconds("m", 200) == pytest.approx(0.012)
    assert p.prefill_seconds("m", 300) == pytest.approx(0.016)
    assert p.prefill_seconds("m", 800) == pytest.approx(0.036)  # last segment: 0.04 ms a token
    assert p.prefill_seconds("m", 50) == pytest.approx(0.009)  # first segment, the fixed cost kept
    assert p.prefill_seconds("m", 0) == 0.0
    assert p.prefill_tokens_per_second("m", 400) == pytest.approx(20_000)
    assert p.prefill_seconds("M", 200) == pytest.approx(0.012)  # ids are case-insensitive
    with pytest.raises(ProfileError, match="no eager prefill curve for 'other'"):
        p.prefill_seconds("other", 100)
    with pytest.raises(ValueError, match="tokens"):
        p.prefill_seconds("m", -1)


def test_decode_itl_grows_with_the_batch() -> None:
    p = synthetic()
    assert p.decode_itl_seconds("m", 1) == pytest.approx(0.002)
    assert p.decode_itl_seconds("m", 5) == pytest.approx(0.003)
    h200 = shipped_profile(H200)
    for model in ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B"):
        itl = [h200.decode_itl_seconds(model, b) for b in (1, 8, 32, 128)]
        assert itl == sorted(itl)


def test_bandwidth_is_linear_in_log_page_size_and_flat_outside() -> None:
    p = synthetic()
    assert p.bandwidth("h2d", "batched_dma", 32 * KIB) == pytest.approx(30e9)
    assert p.bandwidth("h2d", "batched_dma", 16 * KIB) == pytest.approx(20e9)  # half way in log
    assert p.bandwidth("h2d", "batched_dma", 4 * KIB) == pytest.approx(10e9)
    assert p.bandwidth("h2d", "batched_dma", 1 << 30) == pytest.approx(50e9)
    with pytest.raises(ProfileError, match="no h2d memcpy_per_page"):
        p.bandwidth("h2d", "memcpy_per_page", 8 * KIB)


@pytest.mark.parametrize(
    ("page", "pages", "path"),
    [
        (8 * KIB, 16, "zero_copy_12sm"),
        (28 * KIB - 8, 100, "zero_copy_12sm"),
        (28 * KIB, 100, "batched_dma"),  # vLLM: Triton only below 28 KiB
        (8 * KIB, 15, "batched_dma"),  # too few pages to pay the launch
        (8 * KIB + 4, 100, "batched_dma"),  # not 8-byte aligned
        (32 * KIB, 5000, "batched_dma"),
    ],
)
def test_the_load_path_is_vllms(page: int, pages: int, path: str) -> None:
    assert synthetic().load_path(page, pages) == path


def test_restore_adds_the_fixed_and_per_page_costs_to_the_bytes() -> None:
    p = synthetic()
    # 100 pages of 32 KiB by DMA: 0.1 ms + 100 × 1 µs + 3,276,800 B / 30 GB/s
    assert p.restore_seconds(100 * 32 * KIB, 32 * KIB) == pytest.approx(1e-4 + 1e-4 + 3_276_800 / 30e9)
    # 100 pages of 8 KiB by the zero-copy kernel: no per-page cost, 40 GB/s
    assert p.restore_seconds(100 * 8 * KIB, 8 * KIB) == pytest.approx(1e-4 + 819_200 / 40e9)
    assert p.restore_seconds(0, 32 * KIB) == 0.0
    assert p.store_seconds(100 * 32 * KIB, 32 * KIB) == pytest.approx(2e-4 + 3_276_800 / 20e9)


def test_pinning_is_linear_between_the_measured_sizes() -> None:
    p = synthetic()
    assert p.pin_seconds(3 * GIB) == pytest.approx(1.5)
    assert p.pin_seconds(9 * GIB) == pytest.approx(4.5)
    assert p.pin_seconds(0) == 0.0
    assert p.pin_seconds_per_gib == pytest.approx(0.5)
    h200 = shipped_profile(H200)
    assert 0.2 < h200.pin_seconds_per_gib < 1.0


def test_an_engine_start_is_priced_by_vllms_own_pinning_path_where_it_was_measured() -> None:
    torch_only = synthetic()
    both = dataclasses.replace(
        torch_only,
        pinning=(
            *torch_only.pinning,
            PinPoint(GIB, 0.25, "vllm_shm_register"),
            PinPoint(5 * GIB, 1.25, "vllm_shm_register"),
        ),
    )
    assert both.pin_seconds(3 * GIB) == pytest.approx(0.75)
    assert torch_only.pin_seconds(3 * GIB) == pytest.approx(1.5)
    assert loads_profile(both.dumps()) == both
    # a file from before paths were recorded reads as torch's path
    old = json.loads(torch_only.dumps())
    for point in old["pinning"]:
        del point["path"]
    assert loads_profile(json.dumps(old)) == torch_only
    h200 = shipped_profile(H200)
    assert {p.path for p in h200.pinning} == {"torch_pin_memory", "vllm_shm_register"}
    assert [p.path for p in h200.pin_points()] == ["vllm_shm_register"] * 3


def test_model_shape_counts_kv_and_parameters() -> None:
    qwen3_8b = ModelShape(layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936)
    assert qwen3_8b.kv_bytes_per_token == 147_456
    assert qwen3_8b.params == pytest.approx(7.57e9, rel=0.01)  # the 8.2B of the card counts the untied head too


# --- deriving -------------------------------------------------------------------------------------


def test_derive_scales_by_the_spec_ratios() -> None:
    base = synthetic()
    target = PUBLISHED_SPECS["nvidia-a100-80gb"]
    est = derive_estimated(base, target, date="2026-01-02", command="derive")
    assert est.kind == "estimated"
    assert est.gpu_class == "nvidia-a100-80gb"
    assert est.bandwidth("h2d", "batched_dma", 32 * KIB) == pytest.approx(15e9)
    assert est.prefill_seconds("m", 200) == pytest.approx(0.012 * 989 / 312)
    assert est.decode_itl_seconds("m", 1) == pytest.approx(0.002 * 4.8 / 2.039)
    assert est.pinning == base.pinning
    assert est.restore == base.restore
    assert loads_profile(est.dumps()) == est
    with pytest.raises(ProfileError, match="derive from a measured profile"):
        derive_estimated(est, target, date="x", command="y")


def test_derive_drops_models_that_do_not_fit() -> None:
    big = ModelShape(layers=64, hidden=5120, intermediate=25600, heads=64, kv_heads=8, head_dim=128, vocab=151936)
    base = synthetic(prefill=(PrefillCurve("big", big, (CurvePoint(100, 1.0),)),), decode=())
    est = derive_estimated(base, PUBLISHED_SPECS["nvidia-l4"], date="x", command="y")
    assert est.prefill == ()
    assert any("No curves for big" in n for n in est.notes)


def test_shipped_json_is_what_dumps_writes() -> None:
    # The files are generated, never hand-edited: each is byte for byte what its profile dumps.
    from importlib import resources

    for name in shipped_profile_names():
        text = resources.files("kvoffload.economics").joinpath("profiles", f"{name}.json").read_text()
        assert text == shipped_profile(name).dumps()
        assert not math.isnan(json.loads(text)["bidirectionalBytesPerSecond"])

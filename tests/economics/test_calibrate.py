"""The calibration's pure parts: shapes, assembling a profile from raw samples, the CLI without a GPU.

The measurement itself needs a GPU, PyTorch and Triton; it ran on an H200 (bench/calibration/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvoffload.economics.profile import ProfileError
from kvoffload.economics.profileload import load_profile, shipped_profile
from kvoffload.policy.catalog import find_model
from kvoffload.policy.kvshape import bytes_per_token
from kvoffload_lab import calibrate
from tests.support import paths

ROOT = paths.ROOT
CALIBRATION = ROOT / "bench" / "calibration"
PROFILES = ROOT / "operator" / "kvoffload" / "economics" / "profiles"


@pytest.mark.parametrize("name", sorted(calibrate.MODEL_SHAPES))
def test_model_shapes_agree_with_the_catalog(name: str) -> None:
    shape = calibrate.MODEL_SHAPES[name]
    entry = find_model(name)
    assert entry is not None
    arch = entry.architecture
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (arch.num_layers, arch.num_kv_heads, arch.head_dim)
    assert shape.kv_bytes_per_token == bytes_per_token(arch, 2)
    # random weights of the right size: within 10% of the catalog's count (which adds the untied head)
    assert shape.params == pytest.approx(entry.params, rel=0.1)


def test_importing_the_calibration_loads_no_torch() -> None:
    # torch is no dependency of the operator: the module imports it only when it measures
    code = "import sys, kvoffload_lab.calibrate, kvoffload.economics.breakeven; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _raw() -> dict[str, Any]:
    shape = {"layers": 2, "hidden": 8, "intermediate": 16, "heads": 2, "kvHeads": 1, "headDim": 4, "vocab": 10}
    t = [
        ("h2d", "contiguous", 1 << 20, 1, 20e-6),
        ("d2h", "contiguous", 1 << 20, 1, 25e-6),
        ("h2d", "batched_dma", 32768, 100, 80e-6),
        ("d2h", "batched_dma", 32768, 100, 90e-6),
        ("h2d", "zero_copy_12sm", 8192, 100, 25e-6),
    ]
    return {
        "date": "2026-01-01",
        "command": "python -m kvoffload_lab.calibrate --gpu-class x -o y",
        "environment": {"device": "GPU", "driver": "1", "torch": "2.11", "cuda": "13.0", "cpu": "cpu", "cpus": 4},
        "transfers": [
            {"direction": d, "path": p, "pageBytes": b, "pages": n, "seconds": s, "hostExposedReps": 0}
            for d, p, b, n, s in t
        ],
        "bidirectional": {"bytes": 2 << 20, "seconds": 25e-6},
        "pinning": [{"bytes": 1 << 30, "seconds": 0.5}],
        "restore": {"fixedSeconds": 5e-5, "submitSecondsPerPage": {"batched_dma": 4e-7}},
        "restoreChecks": [
            {"label": "c", "pageBytes": 32768, "pages": 100, "path": "batched_dma", "seconds": 1.4e-4, "x": 1}
        ],
        "prefill": [
            {
                "model": "m",
                "shape": shape,
                "mode": "eager",
                "points": [{"tokens": 10, "seconds": 0.01}, {"tokens": 20, "seconds": 0.02}],
                "heldOut": [{"tokens": 15, "seconds": 0.015}],
            },
            {"model": "m", "shape": shape, "mode": "cuda_graph", "points": [], "heldOut": []},  # none measured
        ],
        "decode": [{"model": "m", "contextTokens": 8, "cudaGraph": True, "points": [{"batch": 1, "seconds": 0.001}]}],
    }


def test_a_profile_is_assembled_from_raw_samples() -> None:
    p = calibrate.build_profile(_raw(), "nvidia-h200-141gb", "cmd")
    assert p.kind == "measured"
    assert p.source.command == "cmd"
    assert p.bandwidth("h2d", "batched_dma", 32768) == pytest.approx(32768 * 100 / 80e-6)
    assert p.bidirectional_bytes_per_second == pytest.approx((2 << 20) / 25e-6)
    assert [c.mode for c in p.prefill] == ["eager"]  # a curve with no point is left out
    assert p.restore_checks[0].bytes == 3_276_800


def test_assembly_says_what_is_missing() -> None:
    raw = _raw()
    raw["transfers"] = [t for t in raw["transfers"] if t["path"] != "batched_dma"]
    with pytest.raises(ProfileError, match="no h2d batched_dma measurement"):
        calibrate.build_profile(raw, "x", "cmd")


def test_timings_the_host_showed_in_are_flagged() -> None:
    raw = _raw()
    raw["transfers"][2]["hostExposedReps"] = 5
    notes = calibrate.build_profile(raw, "x", "cmd").notes
    assert any("h2d batched_dma 32768 B" in n and "lower bounds" in n for n in notes)


def test_the_shipped_h200_profile_is_its_raw_samples(tmp_path: Path) -> None:
    # bench/calibration holds what the device run wrote; --from-raw rebuilds the shipped file from it.
    out = tmp_path / "h200.json"
    args = ["--gpu-class", "nvidia-h200-141gb", "--from-raw", str(CALIBRATION / "nvidia-h200-141gb.raw.json")]
    assert calibrate.main([*args, "-o", str(out)]) == 0
    rebuilt, shipped = load_profile(out), shipped_profile("nvidia-h200-141gb")
    assert rebuilt.notes[:-1] == shipped.notes[:-1]  # the last note names the assembling command
    assert rebuilt.to_json() | {"notes": []} == shipped.to_json() | {"notes": []}


def test_the_device_log_is_kept_beside_the_raw_samples() -> None:
    log = (CALIBRATION / "nvidia-h200-141gb.log").read_text()
    assert "device NVIDIA H200" in log
    assert "wrote /root/out/nvidia-h200-141gb.json (measured" in log


@pytest.mark.parametrize("name", ["nvidia-a100-80gb", "nvidia-l4", "amd-mi300x"])
def test_estimated_profiles_are_regenerated_by_the_cli(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    rc = calibrate.main(
        ["--gpu-class", name, "--estimate-from", str(PROFILES / "nvidia-h200-141gb.json"), "-o", str(out)]
    )
    assert rc == 0
    fresh, shipped = load_profile(out).to_json(), shipped_profile(name).to_json()
    for key in ("transfers", "prefill", "decode", "pinning", "restore", "derivation", "notes"):
        assert fresh[key] == shipped[key], key


def test_without_torch_the_calibration_says_so(monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert calibrate.main(["--gpu-class", "x", "-o", str(tmp_path / "p.json")]) == 2
    assert "PyTorch is not installed" in capsys.readouterr().err


def test_unknown_models_and_classes_are_refused(capsys: Any, tmp_path: Path) -> None:
    assert calibrate.main(["--gpu-class", "x", "--models", "gpt-5", "-o", str(tmp_path / "p.json")]) == 2
    assert "unknown model shape(s): gpt-5" in capsys.readouterr().err
    base = str(PROFILES / "nvidia-h200-141gb.json")
    assert calibrate.main(["--gpu-class", "tpu-v5", "--estimate-from", base, "-o", str(tmp_path / "p.json")]) == 2


def test_the_comparison_table_uses_eager_prefill_only() -> None:
    raw = json.loads((CALIBRATION / "nvidia-h200-141gb.raw.json").read_text())
    got = {k: v for k, v, _ in calibrate.comparisons(raw)}
    eager = next(c for c in raw["prefill"] if c["model"] == "Qwen/Qwen3-0.6B" and c["mode"] == "eager")
    at_1480 = next(p for p in eager["heldOut"] if p["tokens"] == 1480)
    assert got["prefill Qwen/Qwen3-0.6B 1480 tok/s"] == pytest.approx(1480 / at_1480["seconds"])
    assert "ratio" in calibrate.format_comparisons(raw)

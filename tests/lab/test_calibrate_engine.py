"""`kvoffload calibrate --engine-url` against emulated engines over HTTP: what it measures, writes and refuses.

The real runs (vLLM 0.26 on an H100) are in bench/gpu/ and checked by tests/economics/test_engine_forecast.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvoffload.economics.enginecost import load_engine_profile, median_ms, relative_error, split
from tests.support.engines import EngineFactory

CLI = [sys.executable, "-c", "from kvoffload.cli.main import main; main()"]
# A 4 GiB CPU tier (37,000 tokens of Qwen3-0.6B) keeps the prompt while 7 fillers turn 520 GPU blocks over.
ENGINE = [
    "--model",
    "Qwen/Qwen3-0.6B",
    "--kv-offloading-size",
    "4",
    "--num-gpu-blocks-override",
    "520",
    "--gpu-class",
    "nvidia-h100-80gb",
]


def calibrate(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *CLI,
            "calibrate",
            "--engine-url",
            url,
            "--model",
            "Qwen/Qwen3-0.6B",
            "--gpu-class",
            "nvidia-h100-80gb",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_it_measures_each_case_with_the_engines_own_split_and_fits_a_profile(
    engine_factory: EngineFactory, tmp_path: Path
) -> None:
    (engine,) = engine_factory([ENGINE])
    out = tmp_path / "profile.json"
    done = calibrate(
        engine.url,
        out,
        "--lengths",
        "512,1024,2048,3072",
        "--hold-out",
        "1480",
        "--reps",
        "2",
        "--raw",
        str(tmp_path / "raw.json"),
    )
    assert done.returncode == 0, done.stderr
    assert "8,320 tokens; 7 fillers" in done.stderr
    profile = load_engine_profile(out)
    (run,) = profile.runs
    restored = [s for s in run.samples if s.case == "cpu_restore" and s.prompt_tokens == 1480]
    hits = [s for s in run.samples if s.case == "gpu_hit" and s.prompt_tokens == 1480]
    assert len(restored) == len(hits) == 2
    assert all(s.held_out for s in restored)
    assert {(s.computed, s.external) for s in restored} == {split(1480)}
    assert {(s.computed, s.local_hit) for s in hits} == {split(1480)}
    assert all(s.restore_copy_ms > 0 for s in restored)
    assert ("cudagraph", "Qwen/Qwen3-0.6B") in profile.fits
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert len(raw["requests"]) == 1 + 2 * 5  # a warm-up round, then two of each length
    assert all(len(r["fillersTtftMs"]) == 7 for r in raw["requests"])


def test_its_forecast_of_a_held_out_length_matches_what_the_engine_did(
    engine_factory: EngineFactory, tmp_path: Path
) -> None:
    # A differential check of the whole loop: the emulator prices requests with the class's costs, the
    # calibration learns them from its /metrics, and the forecast of a length it never fitted must agree.
    (engine,) = engine_factory([ENGINE])
    out = tmp_path / "profile.json"
    done = calibrate(engine.url, out, "--lengths", "512,1024,2048,4096", "--hold-out", "3200", "--reps", "3")
    assert done.returncode == 0, done.stderr
    profile = load_engine_profile(out)
    from kvoffload.economics.enginecost import copy_pricer, forecast, model_cost

    cost = model_cost("Qwen/Qwen3-0.6B")
    got = forecast(profile, cost, 3200, "cudagraph", copy_pricer("nvidia-h100-80gb", cost))
    samples = profile.runs[0].samples
    for case, predicted in (("cold", got.cold_ms), ("gpu_hit", got.gpu_hit_ms), ("cpu_restore", got.cpu_restore_ms)):
        measured = median_ms(samples, case, 3200)  # type: ignore[arg-type]
        assert measured is not None
        assert relative_error(predicted, measured) < 0.25, (case, predicted, measured)


def test_a_tier_too_small_to_keep_the_prompt_is_refused_with_the_reason(
    engine_factory: EngineFactory, tmp_path: Path
) -> None:
    (engine,) = engine_factory(
        [["--model", "Qwen/Qwen3-0.6B", "--kv-offloading-size", "1", "--num-gpu-blocks-override", "520"]]
    )
    done = calibrate(engine.url, tmp_path / "p.json", "--lengths", "1024", "--reps", "1")
    assert done.returncode == 1
    assert "no prompt came back from the CPU tier" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "p.json").exists()


def test_an_engine_with_a_large_gpu_cache_is_refused_before_any_filler(
    engine_factory: EngineFactory, tmp_path: Path
) -> None:
    (engine,) = engine_factory(
        [["--model", "Qwen/Qwen3-0.6B", "--kv-offloading-size", "4", "--num-gpu-blocks-override", "100000"]]
    )
    done = calibrate(engine.url, tmp_path / "p.json", "--lengths", "1024", "--reps", "1")
    assert done.returncode == 1
    assert "--num-gpu-blocks-override" in done.stderr
    assert "--max-fillers 64" in done.stderr


def test_sglang_is_read_through_its_own_series(engine_factory: EngineFactory, tmp_path: Path) -> None:
    (engine,) = engine_factory([[*ENGINE, "--speak", "sglang", "--enable-metrics"]])
    out = tmp_path / "profile.json"
    done = calibrate(
        engine.url,
        out,
        "--engine",
        "sglang",
        "--gpu-tokens",
        "8320",
        "--engine-version",
        "0.5.23",
        "--lengths",
        "512,1024,2048",
        "--reps",
        "1",
    )
    assert done.returncode == 0, done.stderr
    profile = load_engine_profile(out)
    assert (profile.engine, profile.engine_version) == ("sglang", "0.5.23")
    cases = {s.case for s in profile.runs[0].samples}
    assert cases == {"cold", "gpu_hit", "cpu_restore"}

"""The H100 engine profile from issue 26's real vLLM 0.26 runs (bench/gpu/2026-12-05-h100-*results.json).

Usage: .venv/bin/python bench/gpu/issue26_profile.py \
         > operator/kvoffload/economics/profiles/engine/nvidia-h100-80gb.vllm.json
       FITTED_LENGTHS=3200 .venv/bin/python bench/gpu/issue26_profile.py > /tmp/p.json  (1,480 held out)

Each request of those runs was timed by the engine (its TTFT histogram's sum across the request) with its token
split (``prompt_tokens_by_source``), as ``kvoffload calibrate --engine-url`` records them: they become the samples
of one run per model and mode. The lengths in FITTED_LENGTHS (both, by default) are fitted, the others held out
(stored, never fitted). The GPU-only engine that ran beside the 0.6B canary (``stable``) is held out whole.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kvoffload.economics.enginecost import EngineMode, EngineProfile, Run, Sample, case_of, copy_pricer, model_cost

HERE = Path(__file__).resolve().parent
GPU = "nvidia-h100-80gb"
FITTED_LENGTHS = tuple(int(x) for x in os.environ.get("FITTED_LENGTHS", "1480,3200").split(","))
SOURCES = {"local_compute": "computed", "local_cache_hit": "local_hit", "external_kv_transfer": "external"}
# (results file, run name) -> model, mode; every run added --num-gpu-blocks-override 520 and a 4 GiB (0.6B) or
# 8 GiB (8B) CPU tier; the 0.6B pair shared the GPU at --gpu-memory-utilization 0.4 each.
RUNS: tuple[tuple[str, str, str, EngineMode], ...] = (
    ("2026-12-05-h100-results.json", "canary", "Qwen/Qwen3-0.6B", "cudagraph"),
    ("2026-12-05-h100-results.json", "canary_eager", "Qwen/Qwen3-0.6B", "eager"),
    ("2026-12-05-h100-s2-results.json", "big8b_econ", "Qwen/Qwen3-8B", "cudagraph"),
    ("2026-12-05-h100-s2-eager8b-results.json", "big8b_eager", "Qwen/Qwen3-8B", "eager"),
)


def split_of(delta: dict[str, float]) -> dict[str, int]:
    out = {"computed": 0, "local_hit": 0, "external": 0}
    for key, value in delta.items():
        if key.startswith("vllm:prompt_tokens_by_source_total{source="):
            out[SOURCES[key.split("=", 1)[1].rstrip("}")]] += round(value)
    return out


def samples_of(record: dict[str, Any], model: str, held_out_all: bool = False) -> list[Sample]:
    cost = model_cost(model)
    copy = copy_pricer(GPU, cost)
    samples: list[Sample] = []
    for tokens, econ in record["econ"].items():
        for row in econ["rows"]:
            if row["rep"] < 0:  # the warm-up round
                continue
            for case in ("cold", "gpu_hit", "cpu_restore"):
                if "server_ttft_ms" not in row[case]:
                    continue
                s = split_of(row["d_" + case])
                samples.append(
                    Sample(
                        case=case_of(s["computed"], s["local_hit"], s["external"]),
                        prompt_tokens=int(tokens),
                        computed=s["computed"],
                        local_hit=s["local_hit"],
                        external=s["external"],
                        ttft_ms=float(row[case]["server_ttft_ms"]),
                        restore_copy_ms=copy(s["external"]) if s["external"] else 0.0,
                        held_out=held_out_all or int(tokens) not in FITTED_LENGTHS,
                    )
                )
    return samples


def build() -> EngineProfile:
    runs = []
    for file, name, model, mode in RUNS:
        record = json.loads((HERE / file).read_text())["runs"][name]
        runs.append(
            Run(
                model=model_cost(model),
                mode=mode,
                samples=tuple(samples_of(record, model)),
                device="NVIDIA H100 80GB HBM3 (issue 26)",
                engine_version="0.26.0",
                date="2026-12-05",
                command=f"tests/gpu/gpu_tier.py, {file} runs.{name}: rows of the economics protocol",
            )
        )
    # The GPU-only engine beside the 0.6B canary (cold and GPU hit only): another engine, held out whole.
    record = json.loads((HERE / RUNS[0][0]).read_text())["runs"]["stable"]
    runs.append(
        Run(
            model=model_cost("Qwen/Qwen3-0.6B"),
            mode="cudagraph",
            samples=tuple(samples_of(record, "Qwen/Qwen3-0.6B", held_out_all=True)),
            device="NVIDIA H100 80GB HBM3 (issue 26)",
            engine_version="0.26.0",
            date="2026-12-05",
            command=f"tests/gpu/gpu_tier.py, {RUNS[0][0]} runs.stable (GPU-only, no CPU tier): held out",
        )
    )
    notes = (
        "Fitted on issue 26's economics runs (real vLLM 0.26.0 on an H100, 2026-12-05, 1,480 and 3,200 tokens, "
        "five requests of each case); the GPU-only engine that ran beside the 0.6B canary is held out. Built by "
        "bench/gpu/issue26_profile.py. The calibration runs of issue 38 on a GPU did not happen: no device machine "
        "could be started in that session.",
    )
    profile = EngineProfile(GPU, "vllm", "0.26.0", tuple(runs), notes)
    return profile


if __name__ == "__main__":
    sys.stdout.write(build().dumps())

"""Issue 26, part 4: the GPU engine's cold, GPU-hit and CPU-restore TTFT beside the predictions.

Reads the device run (bench/gpu/2026-12-05-h100-results.json: real vLLM 0.26.0 on one H100, a random-weight
Qwen3-0.6B, native CPU tier of 4 GiB) and prices the same requests with

- the shipped profiles (operator/kvoffload/economics/profiles/): the measured H200 one the issue names, and
  the estimated H100 one (the device was an H100), each with its own eager and cuda_graph prefill curves;
- the emulator's cost model (``lab.engine.costmodel.class_cost`` + ``price``), which prices every mode with
  the eager curve.

The token split of each request (GPU hit, CPU-restored, computed) is the engine's own, read from its
``vllm:prompt_tokens_by_source_total`` deltas; the times are predicted. Nothing is fitted: these points are
held out. Measured = the median over five runs of the engine's own TTFT (the increase of
``vllm:time_to_first_token_seconds_sum`` over one request; requests ran one at a time).

Run: .venv/bin/python bench/gpu/economics.py  (writes bench/gpu/economics.json, prints a table)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvoffload.economics.breakeven import vllm_page_bytes
from kvoffload.economics.profile import shipped_profile
from kvoffload.lab.engine.costmodel import class_cost, price

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "2026-12-05-h100-results.json"
MODEL = "Qwen/Qwen3-0.6B"
KV_BYTES_PER_TOKEN = 114_688
LAYERS = 28
RUNS = {"cuda_graph": "canary", "eager": "canary_eager"}
SOURCE = "vllm:prompt_tokens_by_source_total{source=%s}"


def split(row: dict[str, Any], phase: str) -> dict[str, int]:
    d = row["d_" + phase]
    return {
        "computed": int(d.get(SOURCE % "local_compute", 0)),
        "gpu_hit": int(d.get(SOURCE % "local_cache_hit", 0)),
        "cpu": int(d.get(SOURCE % "external_kv_transfer", 0)),
    }


def profile_seconds(gpu_class: str, mode: str, s: dict[str, int]) -> float:
    p = shipped_profile(gpu_class)
    cached = s["gpu_hit"] + s["cpu"]
    total = cached + s["computed"]
    if cached == 0:
        compute = p.prefill_seconds(MODEL, total, mode)
    else:
        grow = p.prefill_seconds(MODEL, total, mode) - p.prefill_seconds(MODEL, cached, mode)
        compute = p.prefill_seconds(MODEL, 1, mode) + max(0.0, grow)
    page = vllm_page_bytes(KV_BYTES_PER_TOKEN, LAYERS)
    restore = p.restore_seconds(s["cpu"] * KV_BYTES_PER_TOKEN, page) if s["cpu"] else 0.0
    return compute + restore


def emulator_seconds(gpu_class: str, s: dict[str, int]) -> float:
    cost = class_cost(gpu_class, MODEL)
    return price(
        cost,
        computed_tokens=s["computed"],
        cpu_restored_tokens=s["cpu"],
        disk_restored_tokens=0,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        gpu_hit_tokens=s["gpu_hit"],
    ).ttft_s


def main() -> None:
    res = json.loads(RESULTS.read_text())
    rows_out = []
    for mode, run in RUNS.items():
        for length in ("1480", "3200"):
            econ = res["runs"][run]["econ"][length]
            rows = [r for r in econ["rows"] if r["rep"] >= 0]
            for phase in ("cold", "gpu_hit", "cpu_restore"):
                xs = sorted(r[phase]["server_ttft_ms"] for r in rows)
                client = sorted(r[phase]["ttft_ms"] for r in rows)
                s = split(rows[0], phase)
                assert all(split(r, phase) == s for r in rows), (mode, length, phase)
                measured = xs[len(xs) // 2]
                out: dict[str, Any] = {
                    "mode": mode,
                    "tokens": int(length),
                    "phase": phase,
                    "split": s,
                    "measured_server_ms": xs,
                    "measured_client_ms": client,
                    "median_ms": measured,
                }
                for name, gpu_class in (("h200_profile", "nvidia-h200-141gb"), ("h100_profile", "nvidia-h100-80gb")):
                    ms = profile_seconds(gpu_class, mode, s) * 1e3
                    out[name + "_ms"] = round(ms, 2)
                    out[name + "_error"] = round(ms / measured - 1.0, 3)
                for name, gpu_class in (("emulator_h200", "nvidia-h200-141gb"), ("emulator_h100", "nvidia-h100-80gb")):
                    ms = emulator_seconds(gpu_class, s) * 1e3
                    out[name + "_ms"] = round(ms, 2)
                    out[name + "_error"] = round(ms / measured - 1.0, 3)
                rows_out.append(out)
    (HERE / "economics.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    cols = ("h200_profile", "h100_profile", "emulator_h200", "emulator_h100")
    print("mode        tokens phase        split(c/g/cpu)   measured  " + "  ".join(f"{c:>20}" for c in cols))
    for r in rows_out:
        s = r["split"]
        preds = "  ".join(f"{r[c + '_ms']:8.2f} ({r[c + '_error']:+6.0%})" for c in cols)
        print(
            f"{r['mode']:<11} {r['tokens']:>6} {r['phase']:<12} {s['computed']:>4}/{s['gpu_hit']:>4}/{s['cpu']:>4}"
            f"  {r['median_ms']:8.2f}  {preds}"
        )


if __name__ == "__main__":
    main()

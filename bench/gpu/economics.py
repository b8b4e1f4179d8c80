"""Issue 26, part 4: the GPU engine's cold, GPU-hit and CPU-restore TTFT beside the predictions.

Reads the device runs (real vLLM 0.26.0 on one H100): bench/gpu/2026-12-05-h100-results.json (a random-weight
Qwen3-0.6B, native CPU tier of 4 GiB), and the second session's 2026-12-05-h100-s2-results.json and
-s2-eager8b-results.json (a random-weight Qwen3-8B, CPU tier of 8 GiB, the same protocol: 520 GPU blocks).
It prices the same requests with

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
from kvoffload.economics.profileload import shipped_profile
from kvoffload_lab.engine.costmodel import class_cost, price

HERE = Path(__file__).resolve().parent
DATASETS: tuple[dict[str, Any], ...] = (
    {
        "model": "Qwen/Qwen3-0.6B",
        "kv_bytes_per_token": 114_688,
        "layers": 28,
        "runs": {
            "cuda_graph": ("2026-12-05-h100-results.json", "canary"),
            "eager": ("2026-12-05-h100-results.json", "canary_eager"),
        },
    },
    {
        "model": "Qwen/Qwen3-8B",
        "kv_bytes_per_token": 147_456,
        "layers": 36,
        "runs": {
            "cuda_graph": ("2026-12-05-h100-s2-results.json", "big8b_econ"),
            "eager": ("2026-12-05-h100-s2-eager8b-results.json", "big8b_eager"),
        },
    },
)
SOURCE = "vllm:prompt_tokens_by_source_total{source=%s}"


def split(row: dict[str, Any], phase: str) -> dict[str, int]:
    d = row["d_" + phase]
    return {
        "computed": int(d.get(SOURCE % "local_compute", 0)),
        "gpu_hit": int(d.get(SOURCE % "local_cache_hit", 0)),
        "cpu": int(d.get(SOURCE % "external_kv_transfer", 0)),
    }


def profile_seconds(gpu_class: str, mode: str, s: dict[str, int], data: dict[str, Any]) -> float:
    p = shipped_profile(gpu_class)
    model, per_token = data["model"], data["kv_bytes_per_token"]
    cached = s["gpu_hit"] + s["cpu"]
    total = cached + s["computed"]
    if cached == 0:
        compute = p.prefill_seconds(model, total, mode)
    else:
        grow = p.prefill_seconds(model, total, mode) - p.prefill_seconds(model, cached, mode)
        compute = p.prefill_seconds(model, 1, mode) + max(0.0, grow)
    page = vllm_page_bytes(per_token, data["layers"])
    restore = p.restore_seconds(s["cpu"] * per_token, page, data["layers"]) if s["cpu"] else 0.0
    return compute + restore


def emulator_seconds(gpu_class: str, s: dict[str, int], data: dict[str, Any]) -> float:
    cost = class_cost(gpu_class, data["model"])
    return price(
        cost,
        computed_tokens=s["computed"],
        cpu_restored_tokens=s["cpu"],
        disk_restored_tokens=0,
        kv_bytes_per_token=data["kv_bytes_per_token"],
        gpu_hit_tokens=s["gpu_hit"],
    ).ttft_s


def main() -> None:
    rows_out = []
    for data, (mode, (results, run)) in ((d, r) for d in DATASETS for r in d["runs"].items()):
        res = json.loads((HERE / results).read_text())
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
                    "model": data["model"],
                    "mode": mode,
                    "tokens": int(length),
                    "phase": phase,
                    "split": s,
                    "measured_server_ms": xs,
                    "measured_client_ms": client,
                    "median_ms": measured,
                }
                for name, gpu_class in (("h200_profile", "nvidia-h200-141gb"), ("h100_profile", "nvidia-h100-80gb")):
                    ms = profile_seconds(gpu_class, mode, s, data) * 1e3
                    out[name + "_ms"] = round(ms, 2)
                    out[name + "_error"] = round(ms / measured - 1.0, 3)
                for name, gpu_class in (("emulator_h200", "nvidia-h200-141gb"), ("emulator_h100", "nvidia-h100-80gb")):
                    ms = emulator_seconds(gpu_class, s, data) * 1e3
                    out[name + "_ms"] = round(ms, 2)
                    out[name + "_error"] = round(ms / measured - 1.0, 3)
                rows_out.append(out)
    (HERE / "economics.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    cols = ("h200_profile", "h100_profile", "emulator_h200", "emulator_h100")
    print(
        "model           mode        tokens phase        split(c/g/cpu)   measured  "
        + "  ".join(f"{c:>20}" for c in cols)
    )
    for r in rows_out:
        s = r["split"]
        preds = "  ".join(f"{r[c + '_ms']:8.2f} ({r[c + '_error']:+6.0%})" for c in cols)
        print(
            f"{r['model']:<15} {r['mode']:<11} {r['tokens']:>6} {r['phase']:<12} "
            f"{s['computed']:>4}/{s['gpu_hit']:>4}/{s['cpu']:>4}"
            f"  {r['median_ms']:8.2f}  {preds}"
        )


if __name__ == "__main__":
    main()

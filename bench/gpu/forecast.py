"""The engine forecast (economics/enginecost.py) against every real vLLM 0.26 run on a GPU (issue 38).

Usage: .venv/bin/python bench/gpu/forecast.py [--gpu-class nvidia-h100-80gb] [--json bench/gpu/forecast.json]

Rows: issue 26's runs (economics.json, 2026-12-05, never fitted), and the calibration day's held-out medians
(lengths never fitted on fitted models; models never fitted, priced from their parameter count). Each row
gives the forecast, the measured median and the error; the saving is cold minus CPU restore.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvoffload.economics.enginecost import (
    CASES,
    EngineMode,
    copy_pricer,
    forecast,
    load_engine_profile,
    median_ms,
    model_cost,
    shipped_engine_profile,
)

HERE = Path(__file__).resolve().parent
MODES: dict[str, EngineMode] = {"cuda_graph": "cudagraph", "eager": "eager"}


def rows(gpu_class: str) -> list[dict[str, Any]]:
    profile = shipped_engine_profile(gpu_class)
    out: list[dict[str, Any]] = []

    def add(source: str, model: str, mode: EngineMode, tokens: int, measured: dict[str, float]) -> None:
        cost = model_cost(model)
        try:
            f = forecast(profile, cost, tokens, mode, copy_pricer(gpu_class, cost))
        except ValueError as exc:  # ProfileError too: a mode the profile lacks is a row that says so
            out.append({"source": source, "model": model, "mode": mode, "tokens": tokens, "error": str(exc)})
            return
        got = {"cold": f.cold_ms, "gpu_hit": f.gpu_hit_ms, "cpu_restore": f.cpu_restore_ms}
        row: dict[str, Any] = {"source": source, "model": model, "mode": mode, "tokens": tokens, "basis": f.basis}
        for case in CASES:
            row[case] = {
                "forecast": round(got[case], 2),
                "measured": measured[case],
                "error": round(got[case] / measured[case] - 1, 3),
            }
        saving = measured["cold"] - measured["cpu_restore"]
        row["saving"] = {
            "forecast": round(f.saving_ms, 2),
            "measured": round(saving, 2),
            "errorMs": round(f.saving_ms - saving, 2),
        }
        out.append(row)

    if gpu_class == "nvidia-h100-80gb":
        issue26 = json.loads((HERE / "economics.json").read_text())
        for key in sorted({(r["model"], r["mode"], r["tokens"]) for r in issue26}):
            measured = {r["phase"]: r["median_ms"] for r in issue26 if (r["model"], r["mode"], r["tokens"]) == key}
            add("issue 26 (2026-12-05)", key[0], MODES[key[1]], key[2], measured)
    held = [("calibration, held-out length", r) for r in profile.runs]
    held += [
        ("calibration, held-out model", r)
        for p in sorted(HERE.glob(f"*-heldout-*.{gpu_class}.json"))
        for r in load_engine_profile(p).runs
    ]
    for source, run in held:
        for n in sorted({s.prompt_tokens for s in run.samples if s.held_out}):
            measured = {c: median_ms([s for s in run.samples if s.held_out], c, n) for c in CASES}
            if None not in measured.values():
                add(source, run.model.name, run.mode, n, measured)  # type: ignore[arg-type]
    return out


def table(found: list[dict[str, Any]]) -> str:
    head = "| source | model | mode | tokens | basis | cold ms (err) | GPU hit ms (err) | CPU restore ms (err) |"
    lines = [head + " saving ms: forecast / measured |", "|---" * 9 + "|"]
    for r in found:
        if "error" in r:
            lines.append(
                f"| {r['source']} | {r['model']} | {r['mode']} | {r['tokens']:,} | not priced: {r['error']} | | | | |"
            )
            continue
        cells = [f"{r[c]['forecast']:.1f} / {r[c]['measured']:.1f} ({r[c]['error']:+.0%})" for c in CASES]
        lines.append(
            f"| {r['source']} | {r['model']} | {r['mode']} | {r['tokens']:,} | {r['basis']} | "
            + " | ".join(cells)
            + f" | {r['saving']['forecast']:.1f} / {r['saving']['measured']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu-class", default="nvidia-h100-80gb")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    found = rows(args.gpu_class)
    print(table(found))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()

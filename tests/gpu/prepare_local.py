"""Local side of the GPU tier (issue 26): rendered levels -> tests/gpu/levels.json for the device script.

Reads the Deployments that `kvoffload render` wrote under tests/gpu/rendered/ and keeps, per level, exactly
what the device must reproduce: the container's command and args, the memory request (= limit), the
/dev/shm emptyDir sizeLimit, and the series labels the PodMonitor gives the pods.
Run: .venv/bin/python tests/gpu/prepare_local.py
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kvoffload.api.quantity import parse_quantity

HERE = Path(__file__).resolve().parent


def level(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]
    (ctr,) = pod["spec"]["containers"]
    (shm,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    labels = pod["metadata"]["labels"]
    req = ctr["resources"]["requests"]["memory"]
    assert req == ctr["resources"]["limits"]["memory"]
    return {
        "file": str(path.relative_to(HERE.parents[1])),
        "command": ctr["command"],
        "args": ctr["args"],
        "memory": req,
        "memory_bytes": int(parse_quantity(req)),
        "shm_size_limit": shm["emptyDir"]["sizeLimit"],
        "shm_bytes": int(parse_quantity(shm["emptyDir"]["sizeLimit"])),
        "tiers": pod["metadata"]["annotations"].get("kvoffload.io/tiers", ""),
        "tier_capacity_tokens": pod["metadata"]["annotations"].get("kvoffload.io/tier-capacity-tokens"),
        "series_labels": {
            "namespace": dep["metadata"]["namespace"],
            "kvoffload_io_policy": labels["kvoffload.io/policy"],
            "kvoffload_io_level": labels["kvoffload.io/level"],
            "kvoffload_io_config_hash": labels["kvoffload.io/config-hash"],
        },
    }


def main() -> None:
    out = {p.stem: level(p) for p in sorted((HERE / "rendered").glob("*.yaml"))}
    (HERE / "levels.json").write_text(json.dumps(out, indent=1) + "\n")
    for k, v in out.items():
        print(k, v["memory"], v["shm_size_limit"], " ".join(v["args"]))


if __name__ == "__main__":
    main()

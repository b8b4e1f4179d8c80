"""Check `vllm serve` command lines with vLLM's own parser and config classes.

Run with the vLLM venv's Python (``.venv-vllm/bin/python tests/vllm_argcheck.py``):
it reads a JSON list of ``{"id": ..., "args": [...]}`` on stdin and writes one JSON
object per line on stdout, in order. One process checks every command line,
because importing vLLM takes seconds.

Per command line it does what ``vllm serve`` does before it loads a model: the
serve parser (frontend and engine flags), ``AsyncEngineArgs.from_cli_args``, then
a ``VllmConfig`` built from the parsed cache and KV-transfer settings, whose
post-init merges ``--kv-offloading-size`` into the final ``KVTransferConfig``. For
the OffloadingConnector it also resolves the offloading spec and every secondary
tier through vLLM's factories, binds each tier's settings to its constructor, and
lists ``kv_connector_extra_config`` keys that no offloading code of this vLLM reads.
No model config is loaded, so no network is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import vllm
from vllm.config import CacheConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

try:  # 0.33 moved the serve parser to entrypoints/common
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:  # 0.32
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[no-redef]

VLLM_DIR = Path(vllm.__file__).parent

# From 0.34 the CPU platform's config hook (platforms/cpu.py check_and_update_config) refuses an x86 host without
# triton-cpu, where 0.32 and 0.33 only warned. That judges the host this checker runs on, not the command line
# (which is for a GPU): for 0.34 on, say Triton is here so the rest of the check runs as it does for the others.
if tuple(int(p) for p in re.findall(r"\d+", vllm.__version__)[:2]) >= (0, 34):
    import vllm.triton_utils

    vllm.triton_utils.HAS_TRITON = True
# Where vLLM's native offloading reads kv_connector_extra_config.
OFFLOAD_SOURCES = [
    VLLM_DIR / "v1" / "kv_offload",
    VLLM_DIR / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "offloading",
    VLLM_DIR / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "offloading_connector.py",
]
# Tier settings the factory injects or consumes itself (SecondaryTierFactory.create_secondary_tier).
TIER_INJECTED = {"offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector"}
TIER_CONSUMED = {"type", "module_path", "backpressure"}


class RaisingParser(FlexibleArgumentParser):
    """argparse exits on unknown flags even with exit_on_error=False (Python < 3.13)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise ValueError(message)


def known_extra_config_keys() -> set[str]:
    pattern = re.compile(r"""(?:extra_config\.get|get_from_extra_config|extra_config\[)\(?\s*["']([a-z_]+)["']""")
    keys: set[str] = set()
    for source in OFFLOAD_SOURCES:
        files = [source] if source.is_file() else sorted(source.rglob("*.py"))
        for file in files:
            keys.update(pattern.findall(file.read_text()))
    return keys


def check_tiers(extra: dict[str, Any]) -> list[dict[str, Any]]:
    tiers = []
    for config in extra.get("secondary_tiers", []):
        cls = SecondaryTierFactory.get_tier_class(config)
        settings = {k: v for k, v in config.items() if k not in TIER_CONSUMED}
        params = inspect.signature(cls.__init__).parameters
        unknown = sorted(k for k in settings if k not in params or k in TIER_INJECTED)
        missing = sorted(
            name
            for name, p in params.items()
            if name not in ("self", *TIER_INJECTED)
            and p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            and name not in settings
        )
        tiers.append({"type": config.get("type"), "class": cls.__name__, "unknown": unknown, "missing": missing})
    return tiers


def check(args: list[str], known_keys: set[str]) -> dict[str, Any]:
    parser = make_arg_parser(RaisingParser(prog="vllm serve", exit_on_error=False))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = parser.parse_args(args)
        if ns.model_tag is not None:
            ns.model = ns.model_tag
        engine = AsyncEngineArgs.from_cli_args(ns)
        cache = CacheConfig(
            kv_offloading_size=engine.kv_offloading_size,
            kv_offloading_backend=engine.kv_offloading_backend,
            cache_dtype=engine.kv_cache_dtype,
            gpu_memory_utilization=engine.gpu_memory_utilization,
        )
        config = VllmConfig(cache_config=cache, kv_transfer_config=engine.kv_transfer_config)
    except (ValueError, TypeError, argparse.ArgumentError, SystemExit) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result: dict[str, Any] = {
        "ok": True,
        "model": engine.model,
        "served_model_name": engine.served_model_name,
        "port": ns.port,
        "max_model_len": engine.max_model_len,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "kv_offloading_size": cache.kv_offloading_size,
        "kv_offloading_backend": cache.kv_offloading_backend,
        "kv_transfer_config": None,
    }
    ktc = config.kv_transfer_config
    if ktc is not None:
        final = dataclasses.asdict(ktc)
        final.pop("engine_id", None)  # a fresh uuid per run
        final.pop("kv_buffer_device", None)  # the platform's device: cpu here, cuda in a cluster
        result["kv_transfer_config"] = final
        result["connector_registered"] = ktc.kv_connector in KVConnectorFactory._registry
        if ktc.kv_connector == "OffloadingConnector":
            extra = ktc.kv_connector_extra_config
            try:
                result["spec_class"] = OffloadingSpecFactory.get_spec_cls(extra).__name__
                result["tiers"] = check_tiers(extra)
            except (ValueError, ImportError, AttributeError) as exc:
                result["ok"] = False
                result["error"] = f"{type(exc).__name__}: {exc}"
            result["unknown_extra_keys"] = sorted(set(extra) - known_keys)
    return result


def main() -> None:
    requests = json.load(sys.stdin)
    known_keys = known_extra_config_keys()
    for request in requests:
        out = {"id": request["id"], "vllm_version": vllm.__version__, **check(list(request["args"]), known_keys)}
        sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

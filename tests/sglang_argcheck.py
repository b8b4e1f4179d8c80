"""Check `python3 -m sglang.launch_server` command lines with SGLang 0.5.23's own parser and resolution steps.

Run with the vLLM venv's Python and SGLang's sources first on the path (``scripts/setup-sglang-sources.sh``
installs them into ``.sglang-05``)::

    PYTHONPATH=.sglang-05 .venv-vllm/bin/python tests/sglang_argcheck.py            < requests.json
    PYTHONPATH=.sglang-05 .venv-vllm/bin/python tests/sglang_argcheck.py --metrics
    PYTHONPATH=.sglang-05 .venv-vllm/bin/python tests/sglang_argcheck.py --where

What is loaded: the ``sglang`` package of the sglang==0.5.23 wheel (requirements/sglang-0.5.lock), installed
--no-deps into ``.sglang-05``; ``ServerArgs`` comes from ``.sglang-05/sglang/srt/server_args.py`` (``--where``
prints the version, the file, the steps run and skipped, and what was stubbed; every result line carries
``sglang_version``). The lock adds orjson, torchvision (for torch 2.13.0) and gguf to that folder, which
SGLang imports at module level on these paths and .venv-vllm lacks. Everything else (torch 2.13 CPU-capable,
transformers, pydantic, fastapi, msgspec, prometheus_client, ...) is .venv-vllm's.

Default mode: reads a JSON list of ``{"id": ..., "args": [...]}`` on stdin (``args``: everything after
``python3 -m sglang.launch_server``) and writes one JSON object per line, in order, from one process
(importing SGLang takes seconds)::

    {"id", "sglang_version", "ok": bool, "error": str | null,
     "server_args": {field: parsed value} | null,   # the record as parsed: what the command line says
     "resolved": {field: value} | null,            # after the steps below: defaults filled, rewrites applied
     "warnings": [str]}                             # WARNING+ log lines of sglang.* loggers while resolving

``server_args``/``resolved`` fields: model_path, served_model_name, host, port, context_length, tp_size,
kv_cache_dtype, mem_fraction_static, page_size, enable_metrics, enable_hierarchical_cache,
hicache_host_memory_mode, hicache_ratio, hicache_size, hicache_host_memory_fraction, hicache_write_policy,
hicache_io_backend, hicache_mem_layout, hicache_storage_backend, hicache_storage_prefetch_policy,
hicache_storage_backend_extra_config (all exist in 0.5.23). ``warnings`` matter: SGLang rewrites some
HiCache combinations with only a warning (e.g. ``--hicache-mem-layout page_first`` with
``--hicache-io-backend direct`` becomes ``page_first_direct``).

Once, as ``sglang.launch_server`` does first: ``sglang.srt.plugins.load_plugins()`` (entry-point plugins,
which may register resolution hooks; .venv-vllm has none). Then per command line, what SGLang does before it
touches the model or a GPU:

1. ``sglang.srt.server_args.prepare_server_args(args)`` itself, as ``sglang.launch_server`` calls it: the
   argparse parser from ``ServerArgs.add_cli_args``, ``--config`` merging, ``parse_args``,
   ``ServerArgs.from_cli_args``. An argparse refusal (unknown flag, bad choice, bad int) is its own
   ``sglang serve: error: ...`` line.
2. ``ServerArgs.resolve_once()`` itself, which runs ``run_resolution_pipeline`` (srt/arg_groups/pipeline.py):
   every step before the model boundary (the "model-independent" prefix, pipeline.py:42-104, which includes
   ``handle_hicache_ratio_default``). The pipeline is stopped at its first model step,
   ``handle_model_source_paths`` (pipeline.py:116), by SGLang's own plugin API
   (``register_resolution_hook``), which replaces that step with one that raises. ``--model-path dummy``
   ends the pipeline there by itself.
3. Then, with the record sealed as ``resolve_once`` seals it and through the same ``run_hook``, the two later
   steps that read flags only: ``handle_hicache`` (pipeline.py:272: layout/IO rewrites, buffer_only rules,
   the unified-linker exclusions) and ``handle_cache_compatibility`` (pipeline.py:334: HiCache vs
   --disable-radix-cache and vs --enable-lmcache, radix eviction settings).

Skipped, because they need the model's files/config (``model_config_of``: a download or a local checkpoint)
or the GPU (memory, compute capability, platform defaults): every other pipeline step from
``handle_model_source_paths`` on (``--where`` lists them by name, read from pipeline.py), and
``ServerArgs.check_server_args()`` (called by the Engine, srt/entrypoints/engine.py:1165), which reads
values those steps resolve (chunked_prefill_size, page_size, served_model_name, ...). Within
``handle_hicache``, the ``--dcp-size > 1`` branch asks whether the model uses MLA (model config): with
HF_HUB_OFFLINE=1, which this checker sets, such a command line gets ``ok: false`` and an error that starts
with ``not checked:`` and quotes the loader's OSError.
Two prefix steps read the platform of the machine running this checker (a CPU here, not the pod's GPU):
``handle_mega_moe`` only with ``--moe-a2a-backend megamoe``, ``validate_prefill_cp_platform`` only with
``--enable-prefill-cp`` on MUSA.

``--metrics``: prints one JSON object ``{"sglang_version", "method", "families": [...]}``, each family
``{"name", "type", "labels", "samples", "help", "registry", "defined_at"}``: ``name`` and ``samples`` as
Prometheus stores them (a counter's ``..._total``; a histogram's ``_bucket``/``_sum``/``_count``; no
``_created``, which SGLang's multiprocess exposition drops), ``labels`` without a histogram's ``le`` (the
``GaugeHistogram`` gauges keep their own ``gt``/``le``). Obtained by
instantiating SGLang's collectors (``method: "instantiated"``): ``TokenizerMetricsCollector``,
``SchedulerMetricsCollector.init_new`` (HiCache and LoRA on), ``StorageMetricsCollector``,
``RadixCacheMetricsCollector``, ``ExpertDispatchCollector`` and ``EncoderMetricsCollector`` against a fresh
``prometheus_client.CollectorRegistry`` (through the collectors' own ``_counter_cls``/``_gauge_cls``/...
injection hooks; ``registry: "fresh"``), plus what registers itself into prometheus_client's default
REGISTRY instead (``GaugeHistogram``'s gauges, ``init_http_request_metrics``, ``enable_func_timer``,
``enable_startup_timer``; ``registry: "default"``), after ``resolve_once`` of
``--model-path dummy --enable-metrics --enable-hierarchical-cache --hicache-storage-backend file
--enable-streaming-session --expert-balancedness-report-mode prometheus`` (so the optional families exist) and
``publish(role="scheduler", ranks=SpawnRanks(world_rank=0))``. Labels are the ones SGLang computes for
that launch (``tokenizer_metric_labels()``, ``init_new``'s, ``radix_cache_metric_labels()``); the storage
collector's and the encoder's are built where the engine builds them (storage_attachment.py:330-338,
encoder/runtime.py:1590-1593), so their keys are copied here. Families only defined at a module's import
(mooncake) or in a thread starter (cpu_monitor) or the encoder dispatcher are read from the source with
``ast`` (``registry: null``, ``"source": "ast"``). ``defined_at`` is the ``Counter(``/``Gauge(``/... call's
file:line under sglang/, from the same ``ast`` scan.

Stubbed, minimally, and only when absent from the venv (.venv-vllm has neither):

* ``triton``: ``sglang/srt/utils/common.py:91`` imports it at module level and kernel modules decorate
  functions with ``@triton.jit`` at import. The stub is SGLang's own macOS one: ``_MockModule`` and
  ``_TritonFinder`` from ``sglang/_platform_stubs.py`` (loaded as a file, not through ``sglang``), set up as
  ``install_platform_stubs`` does (``triton``, ``triton.language`` with ``constexpr``, ``cdiv``,
  ``next_power_of_2``, ``Config``), no kernel ever runs. Installed only after torch has imported what asks
  whether Triton exists (``torch._dynamo``, its ``repro.after_dynamo`` reached by a module-level
  ``torch.compile`` in ``srt/layers/moe/moe_runner/deep_gemm.py:93``), so torch keeps its no-Triton paths.
* ``IPython.display``: imported by ``sglang/utils.py:25`` (the frontend language's notebook helpers, reached
  from ``sglang/__init__.py``); the stub has ``HTML = display = None``. Nothing on these paths calls them.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import io
import json
import logging
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

# Run as a script, Python puts this file's folder first on sys.path, and tests/sglang (the test package) would
# then be the `sglang` that imports find. This checker imports nothing of its own folder.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]
# Nothing here may fetch a model; the one step that would (--dcp-size > 1 with HiCache) fails fast instead.
os.environ["HF_HUB_OFFLINE"] = "1"

FIELDS = (
    "model_path",
    "served_model_name",
    "host",
    "port",
    "context_length",
    "tp_size",
    "kv_cache_dtype",
    "mem_fraction_static",
    "page_size",
    "enable_metrics",
    "enable_hierarchical_cache",
    "hicache_host_memory_mode",
    "hicache_ratio",
    "hicache_size",
    "hicache_host_memory_fraction",
    "hicache_write_policy",
    "hicache_io_backend",
    "hicache_mem_layout",
    "hicache_storage_backend",
    "hicache_storage_prefetch_policy",
    "hicache_storage_backend_extra_config",
)
# The pipeline's first step that needs the model (pipeline.py:116); the checker stops resolve_once there.
MODEL_BOUNDARY_STEP = "handle_model_source_paths"
# Steps after that boundary that read flags only, run in pipeline order (pipeline.py:272, :334).
LATE_STEPS = ("handle_hicache", "handle_cache_compatibility")
# What SGLang raises for a configuration it refuses; anything else is this checker's problem and ends it.
REFUSALS = (ValueError, TypeError, NotImplementedError, AssertionError)


def _sglang_dir() -> Path:
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not importable: put .sglang-05 on PYTHONPATH (scripts/setup-sglang-sources.sh)")
    return Path(next(iter(spec.submodule_search_locations)))


def install_stubs() -> list[str]:
    """Stub triton and IPython.display where the venv lacks them; returns what was stubbed."""
    import torch._dynamo.repro.after_dynamo  # noqa: F401  (before the triton stub: see the docstring)
    from torch.utils._triton import has_triton_package

    stubbed = []
    if not has_triton_package():
        path = _sglang_dir() / "_platform_stubs.py"
        spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", path)
        assert spec is not None
        assert spec.loader is not None
        stubs = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = stubs  # its dataclasses look their module up
        spec.loader.exec_module(stubs)
        sys.meta_path.insert(0, stubs._TritonFinder())
        triton = stubs._make_mock("triton")
        triton.__version__ = "3.0.0"
        triton.cdiv = stubs._cdiv
        triton.next_power_of_2 = stubs._next_power_of_2
        triton.Config = stubs._Config
        language = stubs._make_mock("triton.language")

        class constexpr:  # tl.constexpr, as install_platform_stubs defines it
            def __init__(self, value: Any = None) -> None:
                self.value = value

        language.constexpr = constexpr
        triton.language = language
        stubbed.append(f"triton (SGLang's macOS mock, {path})")
    if importlib.util.find_spec("IPython") is None:
        ipython = types.ModuleType("IPython")
        display = types.ModuleType("IPython.display")
        display.HTML = display.display = None  # type: ignore[attr-defined]
        ipython.display = display  # type: ignore[attr-defined]
        sys.modules["IPython"], sys.modules["IPython.display"] = ipython, display
        stubbed.append("IPython.display (HTML = display = None)")
    return stubbed


class _ModelBoundary(Exception):
    """Raised in place of the pipeline's first model step."""


@functools.cache
def _stop_at_model_boundary() -> None:
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    steps, boundary = pipeline_steps()
    first = next(name for name, line in steps if line >= boundary.stop)
    assert first == MODEL_BOUNDARY_STEP, f"pipeline.py's first step after the model boundary is now {first}"

    @register_resolution_hook(MODEL_BOUNDARY_STEP)
    def stop(server_args: Any, previous: Any) -> None:
        raise _ModelBoundary


@functools.cache
def pipeline_steps() -> tuple[list[tuple[str, int]], range]:
    """The steps of run_resolution_pipeline in source order (name, line), and the lines of its model boundary.

    A step is a statement calling run_hook(step, ...), run_post_process_pass(..., step) or step(server_args).
    The boundary is the `if cfg.model_path.lower() in ["none", "dummy"]: ... return` block.
    """
    from sglang.srt.arg_groups import pipeline

    tree = ast.parse(Path(inspect.getsourcefile(pipeline) or "").read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_resolution_pipeline")
    steps = []
    boundary = None
    for node in ast.walk(function):
        if isinstance(node, ast.If) and "model_path" in ast.unparse(node.test) and boundary is None:
            boundary = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        if not isinstance(call.func, ast.Name):
            continue
        if call.func.id == "run_hook":
            steps.append((ast.unparse(call.args[0]), node.lineno))
        elif call.func.id == "run_post_process_pass":
            steps.append((ast.unparse(call.args[1]), node.lineno))
        elif [ast.unparse(a) for a in call.args] == ["server_args"]:
            steps.append((call.func.id, node.lineno))
    assert boundary is not None, "pipeline.py has no model-path boundary any more"
    return sorted(steps, key=lambda s: s[1]), boundary


@functools.cache
def late_steps() -> list[Any]:
    from sglang.srt.arg_groups.hicache_hook import handle_hicache
    from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility

    found = {handle_hicache.__name__: handle_hicache, handle_cache_compatibility.__name__: handle_cache_compatibility}
    order = [name for name, _ in pipeline_steps()[0] if name in LATE_STEPS]
    assert order == list(LATE_STEPS), f"pipeline.py no longer runs {LATE_STEPS} in this order: {order}"
    return [found[name] for name in order]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _argparse_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error:" in line]
    return lines[-1] if lines else stderr.strip()[-500:]


def resolve(server_args: Any) -> None:
    """Steps 2 and 3 of the docstring."""
    from sglang.srt.arg_groups.resolution_hooks import run_hook

    _stop_at_model_boundary()
    with contextlib.suppress(_ModelBoundary):
        server_args.resolve_once()
    server_args._input_frozen = True  # as resolve_once seals the record while it resolves
    try:
        for step in late_steps():
            run_hook(step, server_args)
    finally:
        server_args._input_frozen = False


def check(args: list[str]) -> dict[str, Any]:
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import prepare_server_args

    stderr = io.StringIO()
    log = _Lines()
    sglang_logger = logging.getLogger("sglang")  # prepare_server_args resets the root logger's handlers
    sglang_logger.addHandler(log)
    result: dict[str, Any] = {"ok": False, "error": None, "server_args": None, "resolved": None, "warnings": log.lines}
    try:
        with contextlib.redirect_stderr(stderr):
            try:
                server_args = prepare_server_args(list(args))
            except SystemExit:
                result["error"] = _argparse_error(stderr.getvalue())
                return result
            result["server_args"] = {f: getattr(server_args, f) for f in FIELDS}
            try:
                resolve(server_args)
            except REFUSALS as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
                return result
            except OSError as exc:  # a step reached for the model's config (HF_HUB_OFFLINE=1): not judged
                result["error"] = f"not checked: a step needs the model's config: {type(exc).__name__}: {exc}"
                return result
        result["resolved"] = {f: resolution_result(server_args, f) for f in FIELDS}
        result["ok"] = True
        return result
    finally:
        sglang_logger.removeHandler(log)


# --- metrics -------------------------------------------------------------------------------------------

_METRIC_CALLS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}


def _stored_name(name: str, kind: str) -> str:
    return name if kind != "counter" or name.endswith("_total") else f"{name}_total"


@functools.cache
def source_metrics() -> dict[str, dict[str, Any]]:
    """Every `sglang:` metric the sources define: stored name -> type, help, labels (if literal), file:line."""
    root = _sglang_dir()
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((root / "srt").rglob("*.py")):
        text = path.read_text()
        if '"sglang:' not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            kwargs = {k.arg: k.value for k in node.keywords}
            name_node = kwargs.get("name", node.args[0] if node.args else None)
            if not (isinstance(name_node, ast.Constant) and str(name_node.value).startswith("sglang:")):
                continue
            kind = _METRIC_CALLS.get(called, "gauge" if called == "GaugeHistogram" else None)
            if kind is None:
                continue
            help_node = kwargs.get("documentation", node.args[1] if len(node.args) > 1 else None)
            labels_node = kwargs.get("labelnames")
            try:
                labels = sorted(ast.literal_eval(labels_node)) if labels_node is not None else []
            except ValueError:
                labels = None  # computed at run time
            entry = {
                "type": kind,
                "help": ast.literal_eval(help_node) if isinstance(help_node, ast.Constant) else None,
                "labels": labels,
                "defined_at": f"sglang/{path.relative_to(root).as_posix()}:{node.lineno}",
            }
            found.setdefault(_stored_name(str(name_node.value), kind), entry)
    return found


def _families(registry: Any, collectors: list[Any], tag: str) -> list[dict[str, Any]]:
    """Families of these collectors as a text exposition shows them (one child per labelled metric)."""
    from prometheus_client.exposition import generate_latest

    scratch = type(registry)() if tag == "default" else registry
    for collector in collectors:
        if tag == "default":
            scratch.register(collector)
        names = getattr(collector, "_labelnames", ())
        if names:
            collector.labels(**dict.fromkeys(names, "x"))
    families: dict[str, dict[str, Any]] = {}
    current = None
    for line in generate_latest(scratch).decode().splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            entry = {"name": name, "type": kind, "labels": set(), "samples": set(), "registry": tag}
            current = None if name.endswith("_created") else families.setdefault(name, entry)
            continue
        if current is None or not line:
            continue
        sample = re.match(r"([^{ ]+)(?:\{(.*)\})?", line)
        assert sample is not None
        if sample.group(1).endswith("_created"):
            continue
        current["samples"].add(sample.group(1))
        implied = {"histogram": "le", "summary": "quantile"}.get(current["type"])  # a gauge may have its own `le`
        current["labels"].update(n for n in re.findall(r'(\w+)="', sample.group(2) or "") if n != implied)
    for collector in collectors:
        if tag == "default":
            scratch.unregister(collector)
    return list(families.values())


def metrics() -> dict[str, Any]:
    import sglang.srt.observability.metrics_collector as mc
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Summary
    from sglang.srt.observability.func_timer import enable_func_timer
    from sglang.srt.observability.http_request_metrics import init_http_request_metrics
    from sglang.srt.observability.startup_func_log_and_timer import enable_startup_timer
    from sglang.srt.runtime_context import SpawnRanks, get_observability, get_parallel, get_serving, publish
    from sglang.srt.server_args import prepare_server_args

    args = ["--model-path", "dummy", "--served-model-name", "m", "--enable-metrics"]
    args += ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]
    # What the scheduler collector's optional families hang on (metrics_collector.py:797-809, :1025).
    args += ["--enable-streaming-session", "--expert-balancedness-report-mode", "prometheus"]
    with contextlib.redirect_stderr(io.StringIO()):
        server_args = prepare_server_args(args)
    server_args.resolve_once()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))

    fresh = CollectorRegistry()
    inject = {
        "_counter_cls": functools.partial(Counter, registry=fresh),
        "_gauge_cls": functools.partial(Gauge, registry=fresh),
        "_histogram_cls": functools.partial(Histogram, registry=fresh),
        "_summary_cls": functools.partial(Summary, registry=fresh),
    }

    def fresh_registry(cls: type) -> Any:
        return type(cls.__name__, (cls,), inject)

    before = set(REGISTRY._collector_to_names)
    observability = get_observability()
    # As tokenizer_manager.py:837-849 builds it.
    fresh_registry(mc.TokenizerMetricsCollector)(
        server_args=server_args,
        labels=mc.tokenizer_metric_labels(),
        bucket_time_to_first_token=observability.bucket_time_to_first_token,
        bucket_e2e_request_latency=observability.bucket_e2e_request_latency,
        bucket_inter_token_latency=observability.bucket_inter_token_latency,
    )
    fresh_registry(mc.SchedulerMetricsCollector).init_new(
        server_args=server_args, enable_priority_scheduling=False, enable_lora=True, enable_hierarchical_cache=True
    )
    # The keys of mem_cache/unified_cache/storage_attachment.py:330-338.
    storage_labels = ["storage_backend", "tp_rank", "dp_rank", "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size"]
    fresh_registry(mc.StorageMetricsCollector)(labels=dict.fromkeys(storage_labels, 0) | {"storage_backend": "file"})
    radix_labels = mc.radix_cache_metric_labels("HiRadixCache", get_parallel(), False)  # as base_prefix_cache.py:408
    fresh_registry(mc.RadixCacheMetricsCollector)(labels=radix_labels)
    fresh_registry(mc.ExpertDispatchCollector)(ep_size=1)
    # The keys of disaggregation/encoder/runtime.py:1590-1593.
    fresh_registry(mc.EncoderMetricsCollector)(labels={"model_name": get_serving().served_model_name, "dp_rank": "0"})
    init_http_request_metrics()
    enable_func_timer()
    enable_startup_timer()
    default = [c for c in REGISTRY._collector_to_names if c not in before]

    families = _families(fresh, list(fresh._collector_to_names), "fresh") + _families(REGISTRY, default, "default")
    sources = source_metrics()
    for family in families:
        source = sources.get(family["name"], {})
        family.update(
            labels=sorted(family["labels"]),
            samples=sorted(family["samples"]),
            help=source.get("help"),
            defined_at=source.get("defined_at"),
            source="instantiated",
        )
    seen = {f["name"] for f in families}
    for name, source in sorted(sources.items()):
        if name in seen:
            continue
        kind = source["type"]
        samples = [f"{name}_bucket", f"{name}_count", f"{name}_sum"] if kind == "histogram" else [name]
        families.append({"name": name, "samples": samples, "registry": None, "source": "ast", **source})
    from sglang.version import __version__

    return {"sglang_version": __version__, "method": "instantiated", "families": families}


def where(stubbed: list[str]) -> dict[str, Any]:
    import sglang.srt.server_args
    from sglang.version import __version__

    steps, boundary = pipeline_steps()
    return {
        "sglang_version": __version__,
        "sglang_dir": str(_sglang_dir()),
        "server_args_file": sglang.srt.server_args.__file__,
        "stubbed": stubbed,
        "steps_run": [f"{n} (pipeline.py:{line})" for n, line in steps if line < boundary.start or n in LATE_STEPS],
        "steps_run_for_a_dummy_model_only": [f"{n} (pipeline.py:{line})" for n, line in steps if line in boundary],
        "steps_skipped": [
            f"{n} (pipeline.py:{line})" for n, line in steps if line >= boundary.stop and n not in LATE_STEPS
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--metrics", action="store_true", help="print the sglang: metric families as JSON")
    mode.add_argument("--where", action="store_true", help="print what was loaded, run, skipped and stubbed")
    options = parser.parse_args()
    stubbed = install_stubs()
    from sglang.srt.plugins import load_plugins
    from sglang.version import __version__

    load_plugins()

    if options.where:
        print(json.dumps(where(stubbed), indent=1))
        return
    if options.metrics:
        print(json.dumps(metrics(), default=str))
        return
    requests = json.load(sys.stdin)
    for request in requests:
        out = {"id": request["id"], "sglang_version": __version__, **check(list(request["args"]))}
        sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Print TensorRT-LLM's option and field tables as JSON, in the format the operator ships
(``operator/kvoffload/engines/trtllm/data/trtllm-options.json``), read from TensorRT-LLM's own sources saved
under ``tools/trtllm-sources/`` (their README says which files, from which commit, and how they were fetched).

PyPI carries no TensorRT-LLM wheel (only wheel-stub sdists that download from pypi.nvidia.com), so its classes
cannot be imported here: this script parses the saved sources with ``ast`` and never imports them.

    .venv/bin/python scripts/trtllm_options.py > operator/kvoffload/engines/trtllm/data/trtllm-options.json

The table holds:

- ``options``: ``trtllm-serve``'s click options (``tensorrt_llm/commands/serve.py``), keyed by every option
  string, with ``dest`` and ``nargs`` as the vLLM/SGLang tables have them, plus type, default and choices;
- ``llmArgs``: the top-level fields of ``TorchLlmArgs`` (with those of ``BaseLlmArgs``), the keys the
  ``--extra_llm_api_options`` (``--config``) YAML maps onto, and their ``extra`` rule;
- ``kvCacheConfig``: ``KvCacheConfig``'s fields (declared type, default, constraints, description);
- ``metrics``: the series ``tensorrt_llm/metrics/collector.py`` declares, with their type and the sample
  names Prometheus sees, and whether an ITL/TPOT series and host-cache series exist.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCES = Path(__file__).resolve().parents[1] / "tools" / "trtllm-sources"
REPOSITORY = "NVIDIA/TensorRT-LLM"
# Each saved file, by its path in the repository: the commit it was read at and where it lies here.
LLM_ARGS = ("tensorrt_llm/llmapi/llm_args.py", "44373a31ee62ab48501d4d14dc2b6ec7f71df403")
SERVE = ("tensorrt_llm/commands/serve.py", "44373a31ee62ab48501d4d14dc2b6ec7f71df403")
COLLECTOR = ("tensorrt_llm/metrics/collector.py", "050f80def8df236e326949c8bd9dee10fd896a83")

# The Field(...) keywords that bound a value, as pydantic reads them.
CONSTRAINTS = ("gt", "ge", "lt", "le", "min_length", "max_length")
# prometheus_client's classes and the sample names each family exposes (the _created samples aside).
METRIC_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}


def saved(source: tuple[str, str]) -> Path:
    path, commit = source
    stem, dot, suffix = Path(path).name.partition(".")
    return SOURCES / commit[:8] / Path(path).parent / f"{stem}.excerpt{dot}{suffix}"


def parse(source: tuple[str, str]) -> ast.Module:
    return ast.parse(saved(source).read_text(encoding="utf-8"))


def classes(module: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}


def literal(node: ast.expr) -> Any:
    """A node's value when it is a literal, else ``{"expr": <its source>}`` (never evaluated)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return {"expr": ast.unparse(node)}


def is_call_to(node: ast.expr | None, *names: str) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in names


def keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


# --- pydantic models -------------------------------------------------------------------------------------


def model_field(stmt: ast.AnnAssign) -> dict[str, Any] | None:
    """One ``name: type = Field(...)`` (or ``= value``) of a pydantic model; None for private attributes."""
    assert isinstance(stmt.target, ast.Name)
    if stmt.target.id.startswith("_") or is_call_to(stmt.value, "PrivateAttr"):
        return None
    entry: dict[str, Any] = {"type": ast.unparse(stmt.annotation)}
    value = stmt.value
    if value is None:
        entry["required"] = True
    elif is_call_to(value, "Field"):
        assert isinstance(value, ast.Call)
        kw = keywords(value)
        if value.args:
            entry["default"] = literal(value.args[0])
        elif "default" in kw:
            entry["default"] = literal(kw["default"])
        elif "default_factory" in kw:
            entry["defaultFactory"] = ast.unparse(kw["default_factory"])
        else:
            entry["required"] = True
        bounds = {name: literal(kw[name]) for name in CONSTRAINTS if name in kw}
        if bounds:
            entry["constraints"] = bounds
        for name in ("alias", "status"):
            if name in kw:
                entry[name] = literal(kw[name])
        if "deprecated" in kw:
            entry["deprecated"] = literal(kw["deprecated"])
        if "description" in kw:
            entry["description"] = literal(kw["description"])
    else:
        entry["default"] = literal(value)
    return entry


def model_fields(node: ast.ClassDef) -> dict[str, dict[str, Any]]:
    fields: dict[str, dict[str, Any]] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            entry = model_field(stmt)
            if entry is not None:
                fields[stmt.target.id] = entry
    return fields


def extra_rule(node: ast.ClassDef) -> str | None:
    """The ``extra`` setting a class declares itself (``model_config = ConfigDict(extra=...)``), if any."""
    for stmt in node.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "model_config" for t in stmt.targets)
            and isinstance(stmt.value, ast.Call)
            and "extra" in keywords(stmt.value)
        ):
            value = literal(keywords(stmt.value)["extra"])
            return value if isinstance(value, str) else None
    return None


def bases(node: ast.ClassDef) -> list[str]:
    return [ast.unparse(base) for base in node.bases]


def enum_members(node: ast.ClassDef) -> list[str]:
    return [
        target.id
        for stmt in node.body
        if isinstance(stmt, ast.Assign)
        for target in stmt.targets
        if isinstance(target, ast.Name)
    ]


def llm_args_tables(module: ast.Module) -> tuple[dict[str, Any], dict[str, Any]]:
    found = classes(module)
    base, torch, kv = found["BaseLlmArgs"], found["TorchLlmArgs"], found["KvCacheConfig"]
    assert bases(torch) == ["BaseLlmArgs"], bases(torch)
    # TorchLlmArgs redeclares a few of BaseLlmArgs' fields (backend, load_format): the subclass wins.
    fields = {**model_fields(base), **model_fields(torch)}
    base_extra = extra_rule(base)
    llm_args = {
        "class": "TorchLlmArgs",
        "bases": ["BaseLlmArgs", *bases(base)],
        "extra": base_extra,
        "extraDeclaredBy": "BaseLlmArgs.model_config" if base_extra else None,
        "enums": {"LoadFormat": enum_members(found["LoadFormat"])},
        "fields": dict(sorted(fields.items())),
    }
    assert "StrictBaseModel" in bases(kv), bases(kv)
    kv_cache = {
        "class": "KvCacheConfig",
        "bases": bases(kv),
        # KvCacheConfig declares no model_config of its own: its rule is StrictBaseModel's, whose definition
        # (tensorrt_llm/llmapi/utils.py) is not among the saved sources; the name and BaseLlmArgs' own
        # extra="forbid" are the evidence. Recorded as such, not as read.
        "extra": extra_rule(kv) or "forbid",
        "extraDeclaredBy": "KvCacheConfig.model_config" if extra_rule(kv) else "StrictBaseModel (inherited)",
        "fields": model_fields(kv),
    }
    return llm_args, kv_cache


# --- trtllm-serve's click options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Defaults:
    """What ``_LLM_ARGS_FIELDS["x"].default`` (``TorchLlmArgs.model_fields``) resolves to."""

    fields: dict[str, dict[str, Any]]

    def resolve(self, node: ast.expr) -> Any:
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "default"
            and isinstance(node.value, ast.Subscript)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "_LLM_ARGS_FIELDS"
        ):
            name = literal(node.value.slice)
            assert isinstance(name, str), ast.unparse(node)
            return self.fields[name]["default"]
        return literal(node)


def click_type(kw: dict[str, ast.expr]) -> tuple[str, Any]:
    """The option's type name and its choices (a list, or ``{"expr": ...}`` when built at run time)."""
    if kw.get("is_flag") is not None and literal(kw["is_flag"]) is True:
        return "flag", None
    node = kw.get("type")
    if node is None:
        return "str", None  # click's default type
    if is_call_to(node, "Choice"):
        assert isinstance(node, ast.Call)
        return "choice", literal(node.args[0])
    if isinstance(node, ast.Call):
        return ast.unparse(node.func).removeprefix("click."), None
    return ast.unparse(node), None


def click_dest(decls: list[str]) -> str:
    """Click's parameter name: an undashed declaration, else the longest-prefixed option (first of equals)."""
    for decl in decls:
        if not decl.startswith("-"):
            return decl
    names = [d.split("/")[0] for d in decls]
    longest = max(names, key=lambda d: len(d) - len(d.lstrip("-")))
    return longest.lstrip("-").replace("-", "_").lower()


def serve_options(module: ast.Module, defaults: Defaults) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    serve = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "serve")
    arguments: list[dict[str, Any]] = []
    options: dict[str, Any] = {}
    for deco in serve.decorator_list:
        if not isinstance(deco, ast.Call):
            continue
        decls = [literal(a) for a in deco.args]
        kw = keywords(deco)
        if is_call_to(deco, "argument"):
            arguments.append({"name": decls[0], "type": click_type(kw)[0]})
            continue
        if not is_call_to(deco, "option", "stability_option"):
            continue
        type_name, choices = click_type(kw)
        dest = click_dest(decls)
        entry: dict[str, Any] = {
            "dest": dest,
            "nargs": 1,
            "type": type_name,
            "default": defaults.resolve(kw["default"]) if "default" in kw else None,
            "choices": choices,
            "multiple": literal(kw["multiple"]) is True if "multiple" in kw else False,
        }
        if "status" in kw:
            entry["status"] = literal(kw["status"])
        for decl in decls:
            if not decl.startswith("-"):
                continue
            if "/" in decl:  # a boolean pair such as --telemetry/--no-telemetry: both are switches
                for switch in decl.split("/"):
                    options[switch] = {**entry, "nargs": 0, "type": "flag"}
            else:
                options[decl] = {**entry, "nargs": 0} if type_name == "flag" else entry
    return arguments, dict(sorted(options.items()))


# --- the Prometheus collector --------------------------------------------------------------------------------


def metric_prefix(init: ast.FunctionDef) -> str:
    for node in ast.walk(init):
        if (
            isinstance(node, ast.Assign)
            and any(ast.unparse(t) == "self.metric_prefix" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise SystemExit(f"{COLLECTOR[0]}: no self.metric_prefix")


def metric_name(node: ast.expr, prefix: str) -> str:
    """``self.metric_prefix + "x"`` or a string constant."""
    if isinstance(node, ast.BinOp) and ast.unparse(node.left) == "self.metric_prefix":
        right = literal(node.right)
        assert isinstance(right, str), ast.unparse(node)
        return prefix + right
    value = literal(node)
    assert isinstance(value, str), ast.unparse(node)
    return value


def samples(kind: str, name: str) -> list[str]:
    # prometheus_client drops a counter's "_total" suffix from the family and adds it back to the sample.
    if kind == "counter":
        return [name.removesuffix("_total") + "_total"]
    if kind == "histogram":
        return [f"{name}_bucket", f"{name}_sum", f"{name}_count"]
    return [name]


def metric_calls(cls: ast.ClassDef) -> Iterator[tuple[str, ast.Call]]:
    for method in cls.body:
        if isinstance(method, ast.FunctionDef):
            for node in ast.walk(method):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in METRIC_KINDS:
                    yield method.name, node


def metrics_table(module: ast.Module) -> dict[str, Any]:
    collector = classes(module)["MetricsCollector"]
    init = next(n for n in collector.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    prefix = metric_prefix(init)
    series: dict[str, Any] = {}
    for method, call in metric_calls(collector):
        assert isinstance(call.func, ast.Name)
        kind = METRIC_KINDS[call.func.id]
        kw = keywords(call)
        name = metric_name(kw["name"], prefix)
        family = name.removesuffix("_total") if kind == "counter" else name
        series[family] = {
            "type": kind,
            "declared": name,
            "samples": samples(kind, name),
            "labels": ast.unparse(kw["labelnames"]),
            "documentation": literal(kw["documentation"]),
            "declaredIn": f"MetricsCollector.{method}",
        }
    families = dict(sorted(series.items()))
    itl = sorted(f for f in families if "per_output_token" in f or "inter_token" in f)
    host = sorted(f for f in families if "host" in f or "offload" in f or "onboard" in f)
    return {
        "prefix": prefix,
        "series": families,
        # TPOT is one sample per finished request (MetricNames.TPOT), not a per-token inter-token latency.
        "itl": {"present": bool(itl), "series": itl, "kind": "per-request time per output token (TPOT)"},
        "hostCache": {"present": bool(host), "series": host},
    }


def table() -> dict[str, Any]:
    llm_args, kv_cache = llm_args_tables(parse(LLM_ARGS))
    arguments, options = serve_options(parse(SERVE), Defaults(llm_args["fields"]))
    return {
        "comment": "trtllm-serve's options and the LLM API's fields, from TensorRT-LLM's own sources saved in "
        "tools/trtllm-sources (scripts/trtllm_options.py); do not edit",
        "versions": [f"git:{SERVE[1][:8]}"],
        "sources": {
            path: {"repository": REPOSITORY, "commit": commit, "saved": str(saved((path, commit)).relative_to(SOURCES))}
            for path, commit in (LLM_ARGS, SERVE, COLLECTOR)
        },
        # click matches option names exactly: no abbreviations.
        "allowAbbrev": False,
        "arguments": arguments,
        "options": options,
        "llmArgs": llm_args,
        "kvCacheConfig": kv_cache,
        "metrics": metrics_table(parse(COLLECTOR)),
    }


if __name__ == "__main__":
    json.dump(table(), sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")

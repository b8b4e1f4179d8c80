"""What the CRD knows of the engines (``api/data/engines.json``) is what the registered engines say.

api may import nothing of the package, so it reads the engines' names, titles and managed-flag patterns from a file
that ``scripts/engine_tables.py`` writes from ``kvoffload.engines.ENGINES``. Here: the committed file is the script's
output (it cannot go stale), ``spec.engine`` takes exactly the registered engines (models and CRD alike, an unknown
one named by its field), and a managed flag in ``extraArgs`` is still refused by the judgment the admission webhook
and the operator run (``parse_policy``: the engine's own option table), naming the item.
"""

from __future__ import annotations

import importlib.util
import json
import re
from types import ModuleType
from typing import Any

import pytest

from kvoffload.api.errors import PolicyError
from kvoffload.api.serving import DEFAULT_ENGINE, ENGINE_NAMES, KNOWN_ENGINES
from kvoffload.engines import ENGINES
from kvoffload.engines.options import managed_patterns
from kvoffload.policy.loading import parse_policy
from kvoffload_lab.demo import SGLANG_IMAGE
from tests.policy.render_policies import policy_object
from tests.support import paths
from tests.support.crd_admission import admit, openapi_schema

DATA = paths.ROOT / "operator" / "kvoffload" / "api" / "data" / "engines.json"


def engine_tables() -> ModuleType:
    """scripts/engine_tables.py, loaded as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("engine_tables", paths.ROOT / "scripts" / "engine_tables.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_file_is_what_the_script_writes_from_the_engines() -> None:
    assert DATA.read_text(encoding="utf-8") == engine_tables().text(), (
        "api/data/engines.json is stale: run .venv/bin/python scripts/engine_tables.py, then regenerate the CRD"
    )


def test_the_script_reads_every_registered_engine() -> None:
    script = engine_tables()
    written = json.loads(script.text())
    assert [e["name"] for e in written["engines"]] == list(ENGINES)
    assert [e["title"] for e in written["engines"]] == [e.title for e in ENGINES.values()]
    assert written["default"] in ENGINES
    for entry, engine in zip(written["engines"], ENGINES.values(), strict=True):
        patterns = [re.compile(p) for p in entry["managedPatterns"]]
        assert all(len(p) <= script.MAX_PATTERN for p in entry["managedPatterns"])
        # Together the patterns match every managed spelling, with a value or a dotted key, and no other option.
        for flag in engine.managed_flags:
            spelt = [flag, f"{flag}=1"]
            if flag.startswith("--"):  # a long name also with underscores, and with a dotted key
                spelt += ["--" + flag[2:].replace("-", "_"), f"{flag}.key=1"]
            for arg in spelt:
                assert sum(bool(p.match(arg)) for p in patterns) == 1, arg
        assert not any(p.match("--enable-prefix-caching") or p.match("--trust-remote-code") for p in patterns)


def test_a_pattern_too_long_for_one_rule_is_split() -> None:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett"]
    flags = [f"--{w}-{v}-size" for w in words for v in ("pool", "cache")] + ["-x"]
    (whole,) = managed_patterns(flags)
    parts = managed_patterns(flags, 120)
    assert len(parts) > 1
    assert all(len(p) <= 120 for p in parts)
    for arg in [*flags, "--golf_cache_size=3", "--juliett-pool-size.key=1", "-x=2", "--kilo-pool-size", "-y"]:
        assert bool(re.match(whole, arg)) == any(re.match(p, arg) for p in parts), arg


def test_api_reads_the_file() -> None:
    assert tuple(ENGINES) == ENGINE_NAMES
    assert DEFAULT_ENGINE == "vllm"
    written = json.loads(DATA.read_text(encoding="utf-8"))
    assert {e.name: list(e.managed_patterns) for e in KNOWN_ENGINES} == {
        e["name"]: e["managedPatterns"] for e in written["engines"]
    }


def test_the_crd_allows_the_registered_engines_and_defaults_to_vllm() -> None:
    engine = openapi_schema()["properties"]["spec"]["properties"]["engine"]
    assert engine["enum"] == list(ENGINES)
    assert engine["default"] == "vllm"
    assert engine["type"] == "string"


def test_an_unknown_engine_is_refused_naming_the_field_and_the_known_ones() -> None:
    obj = policy_object(engine="tgi")
    with pytest.raises(PolicyError) as caught:
        parse_policy(obj)
    (error,) = caught.value.errors
    assert error.path == "spec.engine"
    assert "'tgi'" in error.message
    for name in ENGINES:
        assert name in error.message
    _, problems = admit(obj)
    assert [p.path for p in problems] == ["spec.engine"]


def test_an_absent_engine_is_vllm() -> None:
    obj = policy_object()
    obj["spec"].pop("engine", None)
    assert parse_policy(obj).spec.engine == "vllm"


SGLANG: dict[str, Any] = {"engine": "sglang", "model": {"image": SGLANG_IMAGE}, "offload": {"cpu": "32G"}}


@pytest.mark.parametrize(
    ("patch", "args", "index", "flag"),
    [
        ({}, ["--enable-prefix-caching", "--max-model-len=4096"], 1, "--max-model-len"),
        ({}, ["--max-model", "9"], 0, "--max-model-len"),  # an abbreviation: CEL cannot see it, the judge does
        (SGLANG, ["--enable-mixed-chunk", "--context_length=4096"], 1, "--context-length"),
        (SGLANG, ["--tp-size", "2"], 0, "--tensor-parallel-size"),  # its other name
    ],
    ids=["vllm-spelt", "vllm-abbreviated", "sglang-spelt", "sglang-tp"],
)
def test_the_webhook_and_the_operator_refuse_a_managed_flag_naming_the_item(
    patch: dict[str, Any], args: list[str], index: int, flag: str
) -> None:
    # parse_policy is what the admission webhook (controller/admission.py) and the operator's reconcile run.
    obj = policy_object(**patch)
    obj["spec"]["model"]["extraArgs"] = args
    with pytest.raises(PolicyError) as caught:
        parse_policy(obj)
    (error,) = caught.value.errors
    assert error.path == f"spec.model.extraArgs[{index}]"
    assert f"sets {flag}" in error.message
    assert "which the operator manages" in error.message

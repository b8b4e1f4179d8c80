"""The package's house rules: subpackages import one way, no import circles, the lab stays apart.

The import graph is read from the source (every ``import``, also those inside functions), so
a lazy import cannot hide a circle. The lab is a distribution of its own (``lab/kvoffload_lab``): the
operator's package never names it, and ``kvoffload run`` is started for real and must not have
loaded a single lab module.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import tomllib
from pathlib import Path

import pytest

from tests.controller.test_operator_kopf import quick_spec
from tests.support import paths
from tests.support.kube import EmulatedCluster, kvoffload_run_recording_modules, policy_manifest, wait_for

PACKAGE = paths.PACKAGE
LAB = paths.ROOT / "lab" / "kvoffload_lab"
"""The lab's package, a distribution of its own (lab/pyproject.toml): it may import anything of the operator's."""

# What each subpackage may import, besides itself: the core at the bottom, the CLI on top.
ALLOWED: dict[str, set[str]] = {
    "api": set(),
    # engines: each serving engine's command line and checks; the rest reach it through the seam only (below).
    "engines": {"api"},
    "policy": {"api", "engines"},
    "analysis": {"api", "policy", "engines"},
    "rollout": {"api", "policy", "analysis", "engines"},
    "economics": {"api", "policy", "engines"},
    # notify: derives notifications from the status (api) and delivers them; the controller calls it.
    "notify": {"api"},
    # economics: the preflight's restore-vs-recompute price on the GPU class's shipped profile (the judgment
    # itself is pure, in rollout/preflight.py, which may not import economics).
    "controller": {"api", "policy", "analysis", "rollout", "economics", "notify", "engines"},
    "cli": {"api", "policy", "analysis", "rollout", "economics", "controller", "notify", "engines"},
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = (package.name, *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, package): path for path in sorted(package.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The kvoffload modules a file imports, resolved to modules (``from pkg import mod`` names ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("kvoffload"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("kvoffload")}
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(path, known) - {name} for name, path in found.items()}


def subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_package_has_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    # Proves the check above is live.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_lives_in_a_subpackage_with_rules() -> None:
    loose = [m for m in modules() if m != "kvoffload" and subpackage(m) not in ALLOWED]
    assert loose == []


def test_subpackages_import_only_downwards() -> None:
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        for target in targets
        if (a := subpackage(source)) is not None
        and (b := subpackage(target)) is not None
        and a != b
        and b not in ALLOWED[a]
    )
    assert wrong == []


# The seam: outside engines/, only these modules may be imported (not an engine's own package). The lab, outside the
# package, may import an engine's own: its emulator plays each engine and reads its flags.
ENGINE_SEAM = {
    "kvoffload.engines",
    "kvoffload.engines.engine",
    "kvoffload.engines.dialect",
    "kvoffload.engines.options",
}


def test_only_the_seam_reaches_an_engine() -> None:
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        for target in targets
        if subpackage(source) != "engines" and subpackage(target) == "engines" and target not in ENGINE_SEAM
    )
    assert wrong == []


def test_the_seam_check_sees_an_engine_module() -> None:
    # Proves the check above is live: render.py's seam import resolves to a module the rule knows.
    graph = import_graph()
    assert "kvoffload.engines" in graph["kvoffload.policy.render"]
    engine_modules = {"kvoffload.engines.vllm.command", "kvoffload.engines.sglang.command"}
    assert engine_modules <= set(graph)
    assert {subpackage(m) for m in engine_modules} == {"engines"}
    assert not engine_modules & ENGINE_SEAM


def names_of_the_lab(source: str) -> list[str]:
    """What a module's source says of the lab: imports of ``kvoffload_lab``, and strings naming one of its modules
    (what ``importlib.import_module`` or an entry point would load)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "kvoffload_lab"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvoffload_lab":
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += re.findall(r"\bkvoffload_lab(?:\.\w+)*", node.value)
    return found


def test_the_operator_package_never_names_the_lab() -> None:
    wrong = {name: said for name, path in modules().items() if (said := names_of_the_lab(path.read_text()))}
    assert wrong == {}


def test_the_lab_finder_sees_the_lab_named() -> None:
    # Proves the check above is live, for each way a module could reach the lab.
    source = (
        "import kvoffload_lab.demo\nfrom kvoffload_lab import load\n"
        "importlib.import_module('kvoffload_lab.commands')\nimport kvoffload_labour\nx = 'kvoffload-lab'\n"
    )
    assert names_of_the_lab(source) == ["kvoffload_lab.demo", "kvoffload_lab", "kvoffload_lab.commands"]


def test_the_lab_imports_only_modules_the_operator_and_the_lab_have() -> None:
    # The lab may import anything of the operator's, but only what is there and public: a module that moved
    # or a private one (a name starting with _) fails here, not when a demo runs.
    product, lab = modules(), modules(LAB)
    known = set(product) | set(lab)
    imported = {name: imports_of(path, known) for name, path in lab.items()}
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in imported.items()
        for target in targets
        if target not in known or any(part.startswith("_") for part in target.split("."))
    )
    assert wrong == []
    reached = {target for targets in imported.values() for target in targets}
    assert {"kvoffload.cli.common", "kvoffload.policy.catalog", "kvoffload_lab.engine.config"} <= reached


def test_every_lab_module_imports() -> None:
    # What the source check above cannot see: a name taken from an operator module that no longer defines it.
    names = sorted(modules(LAB))
    assert len(names) > 30
    for name in names:
        importlib.import_module(name)


def test_the_lab_distribution_pins_the_operator_and_the_test_extra_brings_its_dependencies() -> None:
    product = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]
    lab = tomllib.loads((LAB.parent / "pyproject.toml").read_text())["project"]
    operator, *libraries = lab["dependencies"]
    assert operator == f"kvoffload=={product['version']}"
    # make setup installs the lab with --no-deps: its libraries come from the test lock, through the test extra.
    assert set(libraries) <= set(product["optional-dependencies"]["test"])
    assert "lab" not in product["optional-dependencies"]
    assert set(lab["entry-points"]["kvoffload.commands"]) == {"demo", "emulate", "cluster", "calibrate"}


@pytest.mark.e2e
async def test_kvoffload_run_never_loads_a_lab_module(kube: EmulatedCluster, tmp_path: Path) -> None:
    out = tmp_path / "modules.json"
    spec = quick_spec(prometheus="http://127.0.0.1:9")  # nothing listens: the baseline holds
    async with kvoffload_run_recording_modules(
        kube, out, "-A", "--standalone", "--metrics-port", "0", "--prometheus-allow-private"
    ) as process:
        await kube.emulator.create_object(policy_manifest("chat", "default", spec=spec))

        def stable_deployment() -> bool:
            return kube.emulator.read_object("apps/v1", "Deployment", "default", "chat-gpu-only") is not None

        await wait_for(stable_deployment, "the operator to render the stable Deployment", 30)
        process.terminate()
        await process.wait()
    loaded = json.loads(out.read_text())
    assert "kvoffload.controller.handlers" in loaded  # it did run the operator
    assert [m for m in loaded if m.startswith("kvoffload_lab") or m.split(".")[0] in ("kmock", "matplotlib")] == []

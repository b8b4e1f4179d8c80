"""The runtime dependencies in pyproject.toml are exactly what the operator's own modules import: none declared for
the lab's sake (it has its extra), none left over after the code that needed it went."""

from __future__ import annotations

import ast
import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "operator" / "kvoffload"


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}


def imported_by_the_product() -> dict[str, set[str]]:
    """Distribution name -> the product modules that import one of its top-level modules."""
    owners = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                for dist in owners.get(name.partition(".")[0], []):
                    found.setdefault(canonicalize_name(dist), set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_runtime_dependency_is_imported_by_the_operator_itself() -> None:
    # aiohttp stays: controller/admission.py serves the webhook on kopf's aiohttp server, not only the lab.
    unused = declared() - set(imported_by_the_product())
    assert not unused, f"declared in [project.dependencies] but imported by no module outside the lab: {sorted(unused)}"


def test_the_check_sees_a_lab_only_import() -> None:
    lab_only = {canonicalize_name(d) for d in ("kmock", "matplotlib")}
    assert lab_only.isdisjoint(imported_by_the_product())
    assert "aiohttp" in imported_by_the_product()

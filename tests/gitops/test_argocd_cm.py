"""The argocd-cm snippet carries exactly the tested Lua files, in the keys and shape Argo CD reads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvoffload.cli.control import VERBS
from tests.support import lua
from tests.support.paths import ROOT
from tests.support.status_fixtures import NAMES, load


def _load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("argocd_cm", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("argocd_cm", module)
    spec.loader.exec_module(module)
    return module


argocd_cm = _load_script(ROOT / "scripts" / "argocd_cm.py")
SOURCES: Path = argocd_cm.SOURCES


@pytest.mark.parametrize("path", list(argocd_cm.outputs()), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_committed_snippet_is_what_the_generator_writes(path: Path) -> None:
    expected = argocd_cm.outputs()[path]
    assert path.read_text() == expected, f"{path.relative_to(ROOT)} is stale: run python scripts/argocd_cm.py"


@pytest.mark.parametrize("path", argocd_cm.VALUES_OUTPUTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_argo_cd_chart_values_hold_exactly_the_argocd_cm_keys(path: Path) -> None:
    """Argo CD's chart (argo/argo-cd) writes configs.cm into argocd-cm: the same keys, byte for byte."""
    values = yaml.safe_load(path.read_text())
    assert values == {"configs": {"cm": snippet()["data"]}}


def test_the_drift_check_notices_a_hand_edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = tmp_path / "argocd-cm.yaml"
    edited.write_text(argocd_cm.render().replace('hs.status = "Healthy"', 'hs.status = "Progressing"'))
    monkeypatch.setattr(argocd_cm, "OUTPUTS", (edited,))
    monkeypatch.setattr(argocd_cm, "VALUES_OUTPUTS", ())
    monkeypatch.setattr(argocd_cm, "ROOT", tmp_path)
    assert argocd_cm.main(["--check"]) == 1


def snippet() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(argocd_cm.OUTPUTS[0].read_text())
    return data


def test_the_snippet_is_a_valid_argocd_cm_configmap_with_the_two_keys_argo_cd_reads() -> None:
    configmap = snippet()
    kubernetes_validate.validate(configmap, kubernetes_validate.latest_version(), strict=True)
    assert configmap["metadata"]["name"] == "argocd-cm"
    assert set(configmap["data"]) == {
        "resource.customizations.health.kvoffload.io_KVOffloadPolicy",
        "resource.customizations.actions.kvoffload.io_KVOffloadPolicy",
    }


def test_the_health_key_is_the_health_lua_file() -> None:
    health = snippet()["data"]["resource.customizations.health.kvoffload.io_KVOffloadPolicy"]
    assert health == (SOURCES / "health.lua").read_text()


def test_the_actions_key_holds_discovery_and_one_definition_per_cli_verb() -> None:
    actions = yaml.safe_load(snippet()["data"]["resource.customizations.actions.kvoffload.io_KVOffloadPolicy"])
    assert set(actions) == {"discovery.lua", "definitions"}
    assert actions["discovery.lua"] == (SOURCES / "actions" / "discovery.lua").read_text()
    assert [d["name"] for d in actions["definitions"]] == list(VERBS)
    for definition in actions["definitions"]:
        assert set(definition) == {"name", "action.lua"}
        assert definition["action.lua"] == (SOURCES / "actions" / definition["name"] / "action.lua").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_the_lua_as_argo_cd_reads_it_from_argocd_cm_runs(name: str) -> None:
    data = snippet()["data"]
    health = lua.run(data["resource.customizations.health.kvoffload.io_KVOffloadPolicy"], load(name))
    actions = yaml.safe_load(data["resource.customizations.actions.kvoffload.io_KVOffloadPolicy"])
    offered = lua.run(actions["discovery.lua"], load(name))
    assert health["status"] in {"Healthy", "Progressing", "Degraded", "Suspended"}
    assert set(offered) == set(VERBS)

"""`kubectl kvoffload`: the same commands as a kubectl plugin, run through the real kubectl, and its krew manifest.

kubectl runs the first ``kubectl-kvoffload`` on $PATH with the arguments after ``kubectl kvoffload``. The
executable here is the launcher a krew install links (``deploy/krew/kubectl-kvoffload``), run with this test's
Python through ``$KVOFFLOAD_PYTHON``. The commands list and watch policies on the real kube-apiserver. The krew
archive and manifest are release artifacts: tests/release/test_release.py builds them with the release's wheel, checks
the manifest, and has the launcher install that wheel into a venv of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND
from kvoffload.cli.common import EXIT_BAD_INPUT, EXIT_INCONCLUSIVE
from kvoffload.cli.main import main
from tests.support.controlplane import Kube
from tests.support.paths import ROOT
from tests.support.status_fixtures import load


def _load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("krew_script", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("krew_script", module)
    spec.loader.exec_module(module)
    return module


krew = _load_script(ROOT / "scripts" / "krew.py")


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


# --- the launcher's entry point -------------------------------------------------------------------------------


def test_the_bin_krew_links_is_the_kubectl_kvoffload_entry_point() -> None:
    scripts = pyproject()["project"]["scripts"]
    # krew links `bin` as kubectl-kvoffload; pip installs the console script of the same name.
    assert krew.manifest("0" * 64, "0.1.0", "kvoffload-0.1.0-py3-none-any.whl")["spec"]["platforms"][0]["bin"] == (
        "kubectl-kvoffload"
    )
    assert scripts["kubectl-kvoffload"] == "kvoffload.cli.main:kubectl_plugin"
    # and the launcher runs exactly that function
    module, function = scripts["kubectl-kvoffload"].split(":")
    assert f"from {module} import {function}\n" in krew.LAUNCHER.read_text()
    assert f"\n{function}()\n" in krew.LAUNCHER.read_text()


# --- the plugin, through the real kubectl ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The launcher as krew installs it (executable, named kubectl-kvoffload), alone in a folder for $PATH."""
    where = tmp_path_factory.mktemp("krew-plugin")
    shutil.copy(krew.LAUNCHER, where / "kubectl-kvoffload")
    (where / "kubectl-kvoffload").chmod(0o755)
    return where


def plugin_env(plugin_dir: Path, kube: Kube | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{plugin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
    env.setdefault("KVOFFLOAD_PYTHON", sys.executable)
    if kube is not None:
        env["KUBECONFIG"] = str(kube.kubeconfig)
    return env


def kubectl(kube: Kube, plugin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl ARGS`` with the plugin on PATH and the control plane's kubeconfig in $KUBECONFIG (kubectl takes no
    flag before a plugin's name: everything after ``kvoffload`` goes to the plugin)."""
    return subprocess.run(
        [kube.kubectl_path, *args],
        env=plugin_env(plugin_dir, kube),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def create(kube: Kube, namespace: str, name: str, capture: str) -> None:
    policy = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": capture}},
        "spec": load("stable")["spec"],
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
    patch = [{"op": "add", "path": "/status", "value": load(capture)["status"]}]
    kube.kubectl("patch", "kvop", name, "-n", namespace, "--subresource=status", "--type=json", "-p", json.dumps(patch))


@pytest.fixture(scope="module")
def fleet(kube_crd: Kube) -> tuple[str, str]:
    """Two namespaces: chat (stable) and search (canary) in the first, batch (rolled back) in the second."""
    first, second = kube_crd.namespace("plugin"), kube_crd.namespace("plugin")
    create(kube_crd, first, "chat", "stable")
    create(kube_crd, first, "search", "canary")
    create(kube_crd, second, "batch", "rolled-back")
    return first, second


def rows(output: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in output.strip().splitlines()]


@pytest.mark.kube
def test_kubectl_finds_the_plugin_on_path(kube_crd: Kube, plugin_dir: Path) -> None:
    listed = kubectl(kube_crd, plugin_dir, "plugin", "list")
    assert str(plugin_dir / "kubectl-kvoffload") in listed.stdout, listed.stdout + listed.stderr


@pytest.mark.kube
def test_kubectl_kvoffload_list_shows_the_policies_of_one_namespace(
    kube_crd: Kube, plugin_dir: Path, fleet: tuple[str, str]
) -> None:
    first, _ = fleet
    done = kubectl(kube_crd, plugin_dir, "kvoffload", "list", "-n", first)
    assert done.returncode == 0, done.stderr
    table = rows(done.stdout)
    assert table[0] == ["NAME", "PHASE", "LEVEL", "STEP", "TIERS", "CANARY/STABLE", "P99 TTFT", "AGE"]
    assert [r[:6] for r in table[1:]] == [
        ["chat", "Stable", "2 nvme", "✓", "cpu+nvme", "0/2"],
        ["search", "Canary", "1 cpu", "canary", "cpu", "1/2"],
    ]
    assert all(re.fullmatch(r"\d+s|\d+m(\d+s)?", r[-1]) for r in table[1:])  # just created


@pytest.mark.kube
def test_kubectl_kvoffload_list_all_namespaces_adds_the_namespace_column(
    kube_crd: Kube, plugin_dir: Path, fleet: tuple[str, str]
) -> None:
    first, second = fleet
    done = kubectl(kube_crd, plugin_dir, "kvoffload", "list", "--all-namespaces")
    assert done.returncode == 0, done.stderr
    table = rows(done.stdout)
    assert table[0][:3] == ["NAMESPACE", "NAME", "PHASE"]
    ours = [r[:5] for r in table[1:] if r[0] in fleet]  # the shared control plane may hold other tests' policies
    expected = [
        [first, "chat", "Stable", "2 nvme", "✓"],
        [first, "search", "Canary", "1 cpu", "canary"],
        [second, "batch", "RolledBack", "1 cpu", "-"],
    ]
    assert ours == sorted(expected, key=lambda r: (r[0], r[1]))  # by namespace as text: plugin-10 before plugin-9


@pytest.mark.kube
def test_kubectl_kvoffload_list_selects_by_label_and_prints_json(
    kube_crd: Kube, plugin_dir: Path, fleet: tuple[str, str]
) -> None:
    first, _ = fleet
    done = kubectl(kube_crd, plugin_dir, "kvoffload", "list", "-n", first, "-l", "team=canary", "-o", "json")
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(done.stdout)
    assert (entry["namespace"], entry["name"], entry["phase"], entry["level"], entry["step"]) == (
        first,
        "search",
        "Canary",
        1,
        "canary",
    )
    assert (entry["generation"], entry["observedGeneration"]) == (1, 1)


@pytest.mark.kube
def test_an_empty_namespace_lists_nothing_and_says_so(kube_crd: Kube, plugin_dir: Path) -> None:
    empty = kube_crd.namespace("plugin-empty")
    done = kubectl(kube_crd, plugin_dir, "kvoffload", "list", "-n", empty)
    assert done.returncode == 0
    assert done.stdout == ""
    assert f"No KVOffloadPolicies found in {empty} namespace." in done.stderr


@pytest.mark.kube
def test_kubectl_passes_the_watch_exit_code_through(kube_crd: Kube, plugin_dir: Path, fleet: tuple[str, str]) -> None:
    first, second = fleet
    stable = kubectl(kube_crd, plugin_dir, "kvoffload", "status", "chat", "-n", first, "--watch", "--timeout", "30s")
    assert stable.returncode == 0, stable.stderr
    rolled_back = kubectl(kube_crd, plugin_dir, "kvoffload", "status", "batch", "-n", second, "--watch")
    assert rolled_back.returncode == 1, rolled_back.stderr
    assert f"`kubectl kvoffload retry batch -n {second}` starts it again" in rolled_back.stderr
    slow = kubectl(kube_crd, plugin_dir, "kvoffload", "status", "search", "-n", first, "--watch", "--timeout", "1s")
    assert slow.returncode == EXIT_INCONCLUSIVE, slow.stderr
    assert "timed out after 1s" in slow.stderr


@pytest.mark.kube
def test_the_plugin_names_itself_kubectl_kvoffload(kube_crd: Kube, plugin_dir: Path) -> None:
    done = kubectl(kube_crd, plugin_dir, "kvoffload", "list", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: kubectl kvoffload list [OPTIONS]")


# --- the launcher, where the package is missing ----------------------------------------------------------------------


def launcher(plugin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plugin_dir / "kubectl-kvoffload"), *args],
        env=plugin_env(plugin_dir, **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_launcher_says_what_to_install_when_there_is_no_python(plugin_dir: Path) -> None:
    done = launcher(plugin_dir, "list", KVOFFLOAD_PYTHON="no-such-python3")
    assert done.returncode == EXIT_BAD_INPUT
    assert "no no-such-python3 found (KVOFFLOAD_PYTHON): set it to the python of an environment that has kvoffload" in (
        done.stderr
    )


def test_the_launcher_says_what_to_install_when_python_lacks_the_package(plugin_dir: Path, tmp_path: Path) -> None:
    # A python that sees no site-packages (-S) and no $PYTHONPATH (-I): kvoffload cannot be imported there.
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    bare.chmod(0o755)
    done = launcher(plugin_dir, "list", KVOFFLOAD_PYTHON=str(bare))
    assert done.returncode == EXIT_BAD_INPUT
    assert "cannot import the kvoffload package" in done.stderr
    assert "install the kvoffload wheel there, or unset KVOFFLOAD_PYTHON" in done.stderr


def test_the_kubectl_kvoffload_entry_point_runs_the_same_commands(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvoffload.cli.main import kubectl_plugin

    monkeypatch.setattr(sys, "argv", ["kubectl-kvoffload", "--help"])
    with pytest.raises(SystemExit) as exited:
        kubectl_plugin()
    assert exited.value.code == 0
    as_plugin = capsys.readouterr().out
    assert as_plugin.startswith("Usage: kubectl kvoffload [OPTIONS] COMMAND [ARGS]...")
    as_kvoffload = CliRunner().invoke(main, ["--help"]).output
    assert commands(as_plugin) == commands(as_kvoffload)
    assert {"list", "status", "promote", "abort", "retry", "pause", "resume"} <= commands(as_plugin)


def commands(help_text: str) -> set[str]:
    """The command names a group's --help lists."""
    listed = help_text.split("\nCommands:\n", 1)[1]
    return {line.split()[0] for line in listed.splitlines() if line.startswith("  ") and not line.startswith("   ")}

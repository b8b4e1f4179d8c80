"""The wheel alone, with the runtime lock alone: every import of the operator is declared.

Builds the wheel as the Dockerfile does (hatchling, ``--no-build-isolation``), installs
``requirements/runtime.lock`` with ``--require-hashes`` into a fresh venv, then the wheel with
``--no-deps``, and runs every subcommand's ``--help``, ``kvoffload simulate`` on the lab's Mooncake trace (read
from the repository: the wheel carries no lab file, the lab being a distribution of its own), and an import of
every module. A package that the code imports but ``pyproject.toml`` does not declare is missing there, and the
test fails naming it. The lab's commands, listed without the lab, say what to install.

pip downloads from PyPI the first time and from its cache after (CI's `make setup` has filled it with the
same pins: test.lock is compiled against runtime.lock); the module took 56-58 s here on 2 shared cores.
Without PyPI and with an empty cache it skips, except under ``$CI``, where it fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest

from kvoffload.cli.main import LAB_COMMANDS, main
from tests.support import paths

pytestmark = pytest.mark.wheel

OFFLINE = re.compile(r"NewConnectionError|Temporary failure in name resolution|Network is unreachable")
"""pip's words when PyPI cannot be reached."""
TRACE = paths.ROOT / "lab" / "kvoffload_lab" / "data" / "mooncake-conversation.jsonl.gz"
"""The Mooncake trace the lab bundles: the operator's wheel has no copy."""
POLICY = paths.EXAMPLES / "demo-two-tier.yaml"
INSTALL_THE_LAB = ("pip install kvoffload-lab", "pip install -e ./lab")
REQUIRED_BY_DEMO = ("kmock", "matplotlib", "jsonpatch", "attrs", "cryptography")


def run(*command: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # Nothing of the repository or the dev venv leaks in: no PYTHONPATH, and run from a temporary directory.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def pip_install(python: Path, *args: str | Path, cwd: Path) -> None:
    done = run(python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *args, cwd=cwd)
    if done.returncode != 0:
        if OFFLINE.search(done.stderr) and not os.environ.get("CI"):
            pytest.skip(f"PyPI unreachable and not in pip's cache: {done.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"pip install {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr}")


class Installed:
    """A fresh venv holding runtime.lock and the wheel, nothing else."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root = root
        self.wheel = wheel
        self.python = root / "venv" / "bin" / "python"
        self.kvoffload = root / "venv" / "bin" / "kvoffload"

    def __call__(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return run(self.kvoffload, *args, cwd=self.root, timeout=120)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    built = run(
        sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--quiet",
        "--no-deps", "--no-build-isolation", "--wheel-dir", root / "dist", paths.ROOT,
        cwd=root,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("kvoffload-*.whl")
    venv = run(sys.executable, "-m", "venv", root / "venv", cwd=root)
    assert venv.returncode == 0, venv.stderr
    env = Installed(root, wheel)
    pip_install(env.python, "--require-hashes", "-r", paths.ROOT / "requirements" / "runtime.lock", cwd=root)
    pip_install(env.python, "--no-deps", wheel, cwd=root)
    return env


def locked_names() -> set[str]:
    text = (paths.ROOT / "requirements" / "runtime.lock").read_text()
    return {re.sub(r"[-_.]+", "-", name).lower() for name in re.findall(r"^([A-Za-z0-9][\w.-]*)==", text, re.M)}


def test_the_venv_holds_the_runtime_lock_and_the_wheel_and_nothing_else(installed: Installed) -> None:
    listed = run(
        installed.python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check", cwd=installed.root
    )
    names = {re.sub(r"[-_.]+", "-", d["name"]).lower() for d in json.loads(listed.stdout)}
    assert names - {"pip", "setuptools", "wheel"} == locked_names() | {"kvoffload"}
    # The lab's own dependencies are not there: what works below works without them.
    lab_only = run(installed.python, "-c", "import matplotlib", cwd=installed.root)
    assert "No module named 'matplotlib'" in lab_only.stderr


def test_the_wheel_carries_the_operator_and_no_lab_file(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    assert "kvoffload/cli/main.py" in names
    assert "kvoffload/templates/deployment.yaml.j2" in names
    lab = [n for n in names if n.split("/")[0] == "kvoffload_lab" or "/lab/" in n or n.endswith(".jsonl.gz")]
    assert lab == []
    assert [n for n in names if "calibrate" in n] == [], "the GPU and engine calibrations are the lab's"


def test_the_wheel_installs_no_lab_module(installed: Installed) -> None:
    done = run(installed.python, "-c", "import kvoffload_lab", cwd=installed.root)
    assert "No module named 'kvoffload_lab'" in done.stderr


def test_every_module_imports_with_the_runtime_set(installed: Installed) -> None:
    script = """
import importlib, pkgutil, kvoffload
names = [m.name for m in pkgutil.walk_packages(kvoffload.__path__, "kvoffload.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""
    done = run(installed.python, "-c", script, cwd=installed.root)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 40, "walked the whole package"


def commands() -> list[str]:
    with click.Context(main) as ctx:
        return main.list_commands(ctx)


@pytest.mark.parametrize("command", commands())
def test_each_subcommand_answers_help(installed: Installed, command: str) -> None:
    done = installed(command, "--help")
    assert done.returncode == 0, done.stderr
    assert re.search(rf"^usage: \S*kvoffload\S* {command}", done.stdout, re.I | re.M)
    if command in LAB_COMMANDS:  # listed without the lab, whose commands they are: they say what to install
        unwrapped = " ".join(done.stdout.split())  # as click wrapped it to the terminal's width
        assert all(words in unwrapped for words in INSTALL_THE_LAB)


def test_the_top_level_help_lists_every_command(installed: Installed) -> None:
    done = installed("--help")
    assert done.returncode == 0, done.stderr
    assert set(commands()) <= set(re.findall(r"^  (\w+)", done.stdout, re.M))


@pytest.mark.parametrize("command", ["demo", "calibrate"])
def test_a_lab_command_without_the_lab_says_what_to_install_and_exits_2(installed: Installed, command: str) -> None:
    done = installed(command, "--gpu-class", "nvidia-l4")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"kvoffload {command} needs the lab: ")
    assert all(words in done.stderr for words in INSTALL_THE_LAB)


def test_the_lab_beside_the_operator_adds_its_commands_and_names_the_libraries_it_lacks(
    installed: Installed, tmp_path: Path
) -> None:
    # The lab's wheel, installed without its dependencies: its commands are there (entry points), and one that
    # needs kmock and the rest says which are missing instead of failing on an import.
    built = run(
        sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--quiet",
        "--no-deps", "--no-build-isolation", "--wheel-dir", tmp_path / "dist", paths.ROOT / "lab",
        cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("kvoffload_lab-*.whl")
    pip_install(installed.python, "--no-deps", "--target", tmp_path / "lab", wheel, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PYTHONPATH": str(tmp_path / "lab")}

    def kvoffload(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(installed.kvoffload), *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)

    emulate = kvoffload("emulate", "--help")
    assert emulate.returncode == 0, emulate.stderr
    assert "Run an emulated vLLM engine" in emulate.stdout
    demo = kvoffload("demo", "--fast")
    assert demo.returncode == 2, demo.stderr
    assert "kvoffload demo needs the lab" in demo.stderr
    missing = re.search(r"\(missing: ([\w, ]+)\)", demo.stderr)
    assert missing is not None, demo.stderr
    # attrs and jsonpatch come with the operator's own (aiohttp, kubernetes): only what the runtime set lacks is named.
    assert {"kmock", "matplotlib"} <= set(missing.group(1).split(", ")) <= set(REQUIRED_BY_DEMO)


def test_simulate_runs_on_the_lab_trace_with_the_runtime_set_alone(installed: Installed) -> None:
    done = installed("simulate", TRACE, "--policy", POLICY, "--prometheus-allow-private", "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["trace"]["format"] == "mooncake"
    assert report["trace"]["requests"] == 12031
    hit_ratios = [row["hitRatio"] for row in report["lru"]]
    assert hit_ratios == sorted(hit_ratios), "LRU hits never fall as the cache grows"
    assert 0 < hit_ratios[-1] <= report["trace"]["infiniteHitRatio"]


def test_the_wheel_installs_the_kubectl_plugin_beside_the_command(installed: Installed) -> None:
    # pip puts kubectl-kvoffload in the venv's bin: with that on $PATH, `kubectl kvoffload` finds it.
    plugin = installed.kvoffload.with_name("kubectl-kvoffload")
    assert plugin.is_file()
    done = run(plugin, "list", "--help", cwd=installed.root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: kubectl kvoffload list [OPTIONS]")

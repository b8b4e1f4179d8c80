"""The wheel alone, with the runtime lock alone: every import of the operator is declared.

Builds the wheel as the Dockerfile does (hatchling, ``--no-build-isolation``), installs
``requirements/runtime.lock`` with ``--require-hashes`` into a fresh venv, then the wheel with
``--no-deps``, and runs every subcommand's ``--help``, ``kvoffload simulate`` on the Mooncake trace the
wheel carries (``kvoffload/lab/data``: the lab's files ship in every wheel; only the lab's
dependencies are the ``lab`` extra), and an import of every module outside the lab. A package that
the code imports but ``pyproject.toml`` does not declare is missing there, and the test fails naming it.

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
from pathlib import Path

import click
import pytest

from kvoffload.cli.main import main
from kvoffload.lab.commands import REQUIRES
from tests.support import paths

pytestmark = pytest.mark.wheel

OFFLINE = re.compile(r"NewConnectionError|Temporary failure in name resolution|Network is unreachable")
"""pip's words when PyPI cannot be reached."""
BUNDLED_TRACE = Path("kvoffload") / "lab" / "data" / "mooncake-conversation.jsonl.gz"
BUNDLED_POLICY = Path("kvoffload") / "lab" / "data" / "demo-policy.yaml"


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

    def site_packages(self) -> Path:
        done = run(self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=self.root)
        return Path(done.stdout.strip())

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


def test_every_module_outside_the_lab_imports_with_the_runtime_set(installed: Installed) -> None:
    script = """
import importlib, pkgutil, kvoffload
walked = pkgutil.walk_packages(kvoffload.__path__, "kvoffload.")
names = [m.name for m in walked if not m.name.startswith("kvoffload.lab")]
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
    # calibrate hands its arguments to argparse (python -m kvoffload.economics.calibrate)
    assert re.search(
        rf"^usage: \S*kvoffload\S* {command}|^usage: python -m kvoffload\.economics\.{command}",
        done.stdout,
        re.I | re.M,
    )
    if REQUIRES.get(command):  # a lab command whose extra is not installed says what to install
        assert "pip install 'kvoffload[lab]'" in done.stdout


def test_the_top_level_help_lists_every_command(installed: Installed) -> None:
    done = installed("--help")
    assert done.returncode == 0, done.stderr
    assert set(commands()) <= set(re.findall(r"^  (\w+)", done.stdout, re.M))


def test_a_lab_command_without_the_lab_extra_says_what_to_install_and_exits_2(installed: Installed) -> None:
    done = installed("demo")
    assert done.returncode == 2
    assert "pip install 'kvoffload[lab]'" in done.stderr


def test_simulate_runs_on_the_bundled_trace_with_the_runtime_set_alone(installed: Installed) -> None:
    site = installed.site_packages()
    trace, policy = site / BUNDLED_TRACE, site / BUNDLED_POLICY
    done = installed("simulate", trace, "--policy", policy, "--prometheus-allow-private", "-o", "json")
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

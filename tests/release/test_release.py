"""`make release` (scripts/release.py): what a release publishes, built twice, checked, installed and rendered.

One release into a temporary folder serves every assertion; a second one serves only the check that two
builds give the same bytes. The wheel is installed alone from that folder into a fresh venv (its dependencies
from the hash-pinned runtime lock, as tests/test_wheel.py does), the krew launcher installs the wheel its
archive carries into a venv of its own, and the chart renders from the packaged ``.tgz`` through the real
Helm SDK. pip needs PyPI or its cache: without both it skips, except under ``$CI``, where it fails.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.support import paths
from tests.test_wheel import OFFLINE, Installed, pip_install, run

pytestmark = pytest.mark.wheel

SCRIPTS = paths.ROOT / "scripts"


def _load_script(name: str) -> ModuleType:
    # scripts/ is not a package: load each script as release.py itself imports krew (by name, from scripts/).
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = sys.modules.get(name) or importlib.util.module_from_spec(spec)
    if name not in sys.modules:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


release_script = _load_script("release")
krew = _load_script("krew")


def version() -> str:
    with (paths.ROOT / "pyproject.toml").open("rb") as f:
        found: str = tomllib.load(f)["project"]["version"]
    return found


VERSION = version()
WHEEL = f"kvoffload-{VERSION}-py3-none-any.whl"
SDIST = f"kvoffload-{VERSION}.tar.gz"
CHART = f"kvoffload-{VERSION}.tgz"
IMAGE_SBOM = f"kvoffload-{VERSION}-image.cdx.json"
WHEEL_SBOM = f"kvoffload-{VERSION}-wheel.cdx.json"
KREW_ARCHIVE = f"kubectl-kvoffload_v{VERSION}.tar.gz"


@dataclass(frozen=True)
class Release:
    out: Path
    stdout: str

    def __truediv__(self, name: str) -> Path:
        return self.out / name


def make_release(out: Path) -> Release:
    done = run(sys.executable, SCRIPTS / "release.py", "--out", out, cwd=paths.ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return Release(out, done.stdout)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return make_release(tmp_path_factory.mktemp("release") / "dist")


def sums(release: Release) -> dict[str, str]:
    """SHA256SUMS as name -> hash, in the `sha256sum` format (two spaces: text mode)."""
    listed = {}
    for line in (release / "SHA256SUMS").read_text().splitlines():
        matched = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line)
        assert matched, f"not a sha256sum line: {line!r}"
        listed[matched[2]] = matched[1]
    return listed


# --- the set, and two builds ------------------------------------------------------------------------------------


def test_the_release_writes_every_artifact_and_says_so(dist: Release) -> None:
    assert {p.name for p in dist.out.iterdir()} == {
        WHEEL, SDIST, CHART, IMAGE_SBOM, WHEEL_SBOM, KREW_ARCHIVE, "kvoffload.yaml", "RELEASE-NOTES.md", "SHA256SUMS",
    }  # fmt: skip
    lines = dist.stdout.splitlines()
    assert all(line.startswith("release: ") for line in lines)
    assert lines[-1] == f"release: SHA256SUMS over 8 artifacts in {dist.out}"


def changed_sources(first: Path, second: Path) -> list[str]:
    """The files two sdists hold with other bytes, or only one of them holds: the tree changed between builds."""

    def contents(sdist: Path) -> dict[str, bytes]:
        with tarfile.open(sdist) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]

    a, b = contents(first), contents(second)
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def test_two_releases_of_one_tree_are_the_same_bytes(dist: Release, tmp_path: Path) -> None:
    again = make_release(tmp_path / "dist")
    # Where the tree itself changed in between (someone editing it during the test), say so rather than blame the build.
    assert changed_sources(dist / SDIST, again / SDIST) == [], "the source tree changed between the two builds"
    assert (again / WHEEL).read_bytes() == (dist / WHEEL).read_bytes()
    assert (again / SDIST).read_bytes() == (dist / SDIST).read_bytes()
    # and everything else: the chart, the SBOMs, the krew archive and manifest
    assert sums(again) == sums(dist)


def test_sha256sums_lists_every_artifact_with_its_hash(dist: Release) -> None:
    listed = sums(dist)
    assert set(listed) == {p.name for p in dist.out.iterdir()} - {"SHA256SUMS"}
    for name, digest in listed.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name


def test_a_second_release_into_the_same_folder_replaces_the_first(dist: Release, tmp_path: Path) -> None:
    out = tmp_path / "dist"
    out.mkdir()
    (out / "kvoffload-0.0.1-py3-none-any.whl").write_bytes(b"an older release")
    release_script.write_sums(out, ["kvoffload-0.0.1-py3-none-any.whl"])
    (out / "nested").mkdir()
    with pytest.raises(release_script.ReleaseError, match="holds folders \\(nested\\)"):
        release_script.replace_contents(out, dist.out)
    (out / "nested").rmdir()
    built = tmp_path / "built"
    shutil.copytree(dist.out, built)
    release_script.replace_contents(out, built)
    assert sums(Release(out, "")) == sums(dist)
    assert not (out / "kvoffload-0.0.1-py3-none-any.whl").exists()


# --- one version ---------------------------------------------------------------------------------------------------


def chart_yaml_in(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("kvoffload/Chart.yaml")
        assert member is not None
        data: dict[str, Any] = yaml.safe_load(member.read())
    return data


def test_the_chart_package_carries_the_version_of_pyproject(dist: Release) -> None:
    chart = chart_yaml_in(dist / CHART)
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)


@pytest.mark.parametrize("field", ["version", "appVersion"])
def test_a_chart_version_that_disagrees_stops_the_release_naming_the_field(tmp_path: Path, field: str) -> None:
    root = tmp_path / "repo"
    (root / "charts" / "kvoffload").mkdir(parents=True)
    shutil.copy(paths.ROOT / "pyproject.toml", root / "pyproject.toml")
    chart = yaml.safe_load((paths.ROOT / "charts" / "kvoffload" / "Chart.yaml").read_text())
    chart[field] = "9.9.9"
    (root / "charts" / "kvoffload" / "Chart.yaml").write_text(yaml.safe_dump(chart))
    with pytest.raises(release_script.ReleaseError, match=rf"Chart.yaml: {field} is '9.9.9', but pyproject"):
        release_script.check_chart_version(root, VERSION)


# --- the SBOMs -----------------------------------------------------------------------------------------------------


def locked_version(name: str) -> str:
    pinned: str = release_script.locked(paths.ROOT / "requirements" / "runtime.lock")[name][0]
    return pinned


# cyclonedx-python-lib's strict validator, run in the SBOM tool's venv (requirements/sbom.in says why it is apart).
VALIDATE_SBOM = """
import sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(sys.stdin.read())
print("" if error is None else error, end="")
"""


def cyclonedx_error(text: str) -> str:
    """What the validator says is wrong with a CycloneDX 1.6 JSON document; empty when it is valid."""
    sbom_python = release_script.SBOM_TOOL.with_name("python")  # the venv release.py runs cyclonedx-py from
    done = subprocess.run(
        [sbom_python, "-c", VALIDATE_SBOM], input=text, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_validator_refuses_a_document_that_is_not_cyclonedx() -> None:
    assert cyclonedx_error('{"bomFormat": "CycloneDX", "specVersion": "1.6", "version": "one"}') != ""


@pytest.mark.parametrize("sbom", [IMAGE_SBOM, WHEEL_SBOM])
def test_each_sbom_is_valid_cyclonedx_naming_kopf_at_its_locked_version(dist: Release, sbom: str) -> None:
    text = (dist / sbom).read_text()
    error = cyclonedx_error(text)
    assert error == "", f"{sbom}: {error}"
    bom = json.loads(text)
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.6")
    assert (bom["metadata"]["component"]["name"], bom["metadata"]["component"]["version"]) == ("kvoffload", VERSION)
    (kopf,) = (c for c in bom["components"] if c["name"] == "kopf")
    assert kopf["version"] == locked_version("kopf")
    assert kopf["purl"] == f"pkg:pypi/kopf@{locked_version('kopf')}"


def test_the_image_sbom_is_every_package_of_the_runtime_lock(dist: Release) -> None:
    bom = json.loads((dist / IMAGE_SBOM).read_text())
    lock = release_script.locked(paths.ROOT / "requirements" / "runtime.lock")
    assert {(c["name"], c["version"]) for c in bom["components"]} == {(n, v) for n, (v, _) in lock.items()}


def test_the_wheel_sbom_is_the_wheel_and_the_dependencies_it_declares(dist: Release) -> None:
    bom = json.loads((dist / WHEEL_SBOM).read_text())
    root = bom["metadata"]["component"]
    assert root["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256((dist / WHEEL).read_bytes()).hexdigest()}]
    assert root["purl"] == f"pkg:pypi/kvoffload@{VERSION}"
    declared = {release_script.canonicalize_name(r.name) for r in release_script.declared(dist / WHEEL)}
    assert {c["name"] for c in bom["components"]} == declared
    assert "kmock" not in declared, "the lab's extra is not a dependency of the wheel"
    (graph,) = (d for d in bom["dependencies"] if d["ref"] == root["bom-ref"])
    assert set(graph["dependsOn"]) == {c["bom-ref"] for c in bom["components"]}


# --- the changelog section ----------------------------------------------------------------------------------------


def test_the_release_notes_are_the_unreleased_section_of_the_changelog(dist: Release) -> None:
    notes = (dist / "RELEASE-NOTES.md").read_text()
    changelog = (paths.ROOT / "CHANGELOG.md").read_text()
    assert notes.startswith(f"# kvoffload {VERSION}\n\n### ")
    body = notes.split("\n", 2)[2]
    assert body.strip() in changelog
    assert "\n## " not in body, "one section only"


def test_a_section_of_the_version_wins_over_unreleased_and_fences_hide_headings() -> None:
    changelog = (
        "# Changelog\n\n## Unreleased\n\n- next\n\n"
        "## [0.2.0] - 2027-01-05\n\n- shipped\n\n```md\n## 0.1.0\n```\n\n- still 0.2.0\n\n"
        "## 0.1.0\n\n- first\n"
    )
    assert release_script.release_notes(changelog, "0.2.0") == (
        "# kvoffload 0.2.0\n\n- shipped\n\n```md\n## 0.1.0\n```\n\n- still 0.2.0\n"
    )
    assert release_script.release_notes(changelog, "0.1.0") == "# kvoffload 0.1.0\n\n- first\n"
    assert release_script.release_notes(changelog, "0.3.0") == "# kvoffload 0.3.0\n\n- next\n"
    with pytest.raises(release_script.ReleaseError, match=re.escape("no '## 0.3.0' or '## Unreleased' section")):
        release_script.release_notes("# Changelog\n\n## 0.1.0\n\n- first\n", "0.3.0")


# --- the krew archive and manifest --------------------------------------------------------------------------------


def krew_manifest(release: Release) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((release / "kvoffload.yaml").read_text())
    return data


def test_the_krew_manifest_names_the_archive_by_its_sha256_and_release_url(dist: Release) -> None:
    doc = krew_manifest(dist)
    (platform,) = doc["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256((dist / KREW_ARCHIVE).read_bytes()).hexdigest()
    assert platform["uri"] == f"https://github.com/kvoffload/kvoffload/releases/download/v{VERSION}/{KREW_ARCHIVE}"
    with tarfile.open(dist / KREW_ARCHIVE) as tar:
        members = {m.name: m for m in tar.getmembers()}
        bundled = tar.extractfile(WHEEL)
        assert bundled is not None
        assert bundled.read() == (dist / WHEEL).read_bytes(), "the archive carries the release's wheel"
    assert (
        set(members)
        == {op["from"] for op in platform["files"]}
        == {"kubectl-kvoffload", "LICENSE", "runtime.lock", WHEEL}
    )
    assert members[platform["bin"]].mode == 0o755


def test_the_krew_manifest_passes_the_checks_krew_makes_before_it_installs(dist: Release) -> None:
    # The rules of krew's internal/index/validation (ValidatePlugin, validatePlatform, validateSelector).
    doc = krew_manifest(dist)
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert doc["kind"] == "Plugin"
    assert doc["metadata"]["name"] == "kvoffload"  # the index file is named after the plugin: kvoffload.yaml
    spec = doc["spec"]
    assert spec["shortDescription"]
    assert "\n" not in spec["shortDescription"]
    assert spec["version"] == f"v{VERSION}"
    assert re.fullmatch(r"v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", spec["version"])  # semver, with krew's v
    for platform in spec["platforms"]:
        assert platform["uri"].startswith("https://")
        assert platform["uri"].endswith((".tar.gz", ".zip"))
        assert all(op["from"] and op["to"] for op in platform["files"])
        selector = platform["selector"]
        keys = [*selector.get("matchLabels", {}), *(e["key"] for e in selector.get("matchExpressions", []))]
        assert set(keys) == {"os"}


def test_the_krew_archive_is_the_same_bytes_from_the_same_wheel(dist: Release) -> None:
    assert krew.archive_bytes(dist / WHEEL) == (dist / KREW_ARCHIVE).read_bytes()


def test_krew_refuses_a_wheel_of_another_version(tmp_path: Path) -> None:
    other = tmp_path / "kvoffload-9.9.9-py3-none-any.whl"
    other.write_bytes(b"")
    with pytest.raises(ValueError, match=re.escape("kvoffload-9.9.9-py3-none-any.whl is version 9.9.9, but pyproject")):
        krew.write(other, tmp_path / "out")


def launcher_env(**extra: str) -> dict[str, str]:
    """The environment krew's user has, with no KVOFFLOAD_PYTHON: only the archive's wheel can answer."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KVOFFLOAD_PYTHON")}
    return {**clean, **extra}


def launch(plugin: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plugin), *args], cwd=cwd, env=launcher_env(**env), capture_output=True, text=True, timeout=600, check=False
    )


@dataclass(frozen=True)
class FirstRun:
    """The krew plugin unpacked as krew does (the archive in a store folder, ``bin`` linked from another), and its
    first run, started in the background so that its install overlaps the wheel test's own."""

    store: Path
    plugin: Path
    process: subprocess.Popen[str]


@pytest.fixture(scope="module")
def krew_first_run(dist: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstRun]:
    root = tmp_path_factory.mktemp("krew")
    store, bin_dir = root / "store" / "kvoffload" / f"v{VERSION}", root / "bin"
    store.mkdir(parents=True)
    bin_dir.mkdir()
    with tarfile.open(dist / KREW_ARCHIVE) as tar:
        tar.extractall(store, filter="data")
    (bin_dir / "kubectl-kvoffload").symlink_to(store / "kubectl-kvoffload")
    process = subprocess.Popen(
        [str(bin_dir / "kubectl-kvoffload"), "list", "--help"],
        cwd=root,
        env=launcher_env(KVOFFLOAD_BASE_PYTHON=sys.executable),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield FirstRun(store, bin_dir / "kubectl-kvoffload", process)
    if process.poll() is None:  # a test failed before waiting on it
        process.kill()
        process.communicate()


def test_the_krew_launcher_without_python_says_what_to_install(dist: Release, tmp_path: Path) -> None:
    with tarfile.open(dist / KREW_ARCHIVE) as tar:
        tar.extractall(tmp_path, filter="data")
    done = launch(tmp_path / "kubectl-kvoffload", "list", cwd=tmp_path, KVOFFLOAD_BASE_PYTHON="no-such-python3")
    assert done.returncode == 2
    assert "no no-such-python3 found: install Python 3.11 or newer, or set KVOFFLOAD_BASE_PYTHON" in done.stderr
    assert not (tmp_path / "venv").exists()


# --- installed and rendered from dist/ ----------------------------------------------------------------------------


def test_the_wheel_alone_from_dist_installs_in_a_fresh_venv_and_answers_its_version(
    dist: Release, tmp_path: Path, krew_first_run: FirstRun
) -> None:
    # krew_first_run: the launcher's own install runs meanwhile (tested below), halving the wait.
    venv = run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    assert venv.returncode == 0, venv.stderr
    env = Installed(tmp_path, dist / WHEEL)
    pip_install(env.python, "--require-hashes", "-r", paths.ROOT / "requirements" / "runtime.lock", cwd=tmp_path)
    pip_install(env.python, "--no-deps", env.wheel, cwd=tmp_path)
    done = env("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"kvoffload, version {VERSION}\n"


def test_the_packaged_chart_renders_the_operator_deployment_of_this_version(dist: Release) -> None:
    with helm.Chart.load(dist / CHART) as chart:
        rendered = chart.render({}, name="kvo", namespace="kvoffload-system")
    objs = [obj for path, text in rendered.items() if path.endswith(".yaml") for obj in yaml.safe_load_all(text) if obj]
    (deployment,) = (obj for obj in objs if obj["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/kvoffload/kvoffload:{VERSION}"
    assert deployment["metadata"]["namespace"] == "kvoffload-system"


# After the wheel test: the first run has had that test's time to install.
def test_the_krew_launcher_installs_the_wheel_it_carries_into_a_venv_of_its_own(krew_first_run: FirstRun) -> None:
    stdout, stderr = krew_first_run.process.communicate(timeout=600)
    if krew_first_run.process.returncode != 0 and OFFLINE.search(stderr) and not os.environ.get("CI"):
        pytest.skip(f"PyPI unreachable and not in pip's cache: {stderr.strip().splitlines()[-1]}")
    assert krew_first_run.process.returncode == 0, stderr
    assert stdout.startswith("Usage: kubectl kvoffload list [OPTIONS]")
    venv = krew_first_run.store / "venv"
    assert f"first run: installing {WHEEL} into {venv}" in stderr
    where = run(venv / "bin" / "python", "-c", "import kvoffload; print(kvoffload.__file__)", cwd=venv)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    again = launch(krew_first_run.plugin, "--version", cwd=venv, KVOFFLOAD_BASE_PYTHON=sys.executable)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"kvoffload, version {VERSION}\n"
    assert again.stderr == "", "the second run reuses the venv"

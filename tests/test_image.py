"""The operator image, built from the Dockerfile and run: as uid 65532, read-only, without pip or the lab.

No Docker engine and no registry here: ``scripts/build-image.sh BASE=debian`` makes the base from Debian's own
packages (mmdebstrap: python3, python3-venv) and builds the image with Debian's buildah (no daemon) into a containers
storage of this module's own; Debian's podman runs it with runc (crun refuses hybrid cgroups). The base tarball is
cached under build/image, so only the first run pays for mmdebstrap (about 1.5 min on 2 cores; the image build
about 2.5 min more).

Without buildah, podman, runc or mmdebstrap these tests skip, except under ``$CI``, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import paths
from tests.support.summary import report

# A cold run builds the Debian base and pip-installs the runtime lock inside the build: minutes, not the default 300 s.
pytestmark = pytest.mark.timeout(1200)

ROOT = paths.ROOT
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TAG = f"localhost/kvoffload-image-test:{VERSION}"
TOOLS = ("buildah", "podman", "runc", "mmdebstrap")
INSTALL = "apt-get install buildah podman runc mmdebstrap"


def unavailable(reason: str) -> None:
    """Skip on a developer's machine; fail under CI, where `make system-deps` installs the tools."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)")
    pytest.skip(reason)


def tool(name: str) -> str | None:
    """The tool on $PATH, else in /usr/sbin (runc lives there, outside a user's PATH)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


@dataclass(frozen=True)
class Image:
    store: Path
    runroot: Path
    """podman refuses a runroot over 50 characters, as a pytest-xdist worker's tmp path is: a short one of its own."""
    env: dict[str, str]
    build_seconds: float

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """podman on this image's storage, with runc and cgroupfs (no systemd here)."""
        command = ["podman", "--root", str(self.store), "--runroot", str(self.runroot)]
        command += ["--cgroup-manager", "cgroupfs", "--runtime", str(tool("runc")), *args]
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def run(
        self, *args: str, user: str | None = None, entrypoint: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The image run as it would be in a locked-down pod: read-only root, no network."""
        options = ["run", "--rm", "--read-only", "--network", "none"]
        options += ["--user", user] if user else []
        options += ["--entrypoint", entrypoint] if entrypoint else []
        return self.podman(*options, TAG, *args)

    def python(self, code: str, user: str | None = None) -> Any:
        """What `code` prints as JSON, run by the image's own python3 (the operator's venv)."""
        result = self.run("-c", code, user=user, entrypoint="python3")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def inspect(self) -> dict[str, Any]:
        result = self.podman("image", "inspect", TAG)
        assert result.returncode == 0, result.stderr
        (config,) = json.loads(result.stdout)
        return dict(config)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Image]:
    """The image, built once for this module by scripts/build-image.sh into a storage of its own."""
    missing = [name for name in TOOLS if tool(name) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not found ({INSTALL})")
    if os.geteuid() != 0:
        unavailable("building the image needs root here (buildah with chroot isolation, mmdebstrap)")
    work = tmp_path_factory.mktemp("image")
    store = work / "storage"
    conf = work / "containers.conf"
    # As root, podman raises RLIMIT_NOFILE past a lower hard limit unless told not to (runc: "setting rlimit type 7").
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    env["PATH"] = f"{env.get('PATH', '')}:/usr/sbin:/sbin"
    command = [str(ROOT / "scripts" / "build-image.sh"), "BASE=debian", f"STORAGE_ROOT={store}", f"IMAGE={TAG}"]
    start = time.monotonic()
    build = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100)
    seconds = time.monotonic() - start
    if build.returncode != 0:
        pytest.fail(
            f"scripts/build-image.sh failed ({build.returncode}):\n{build.stdout[-4000:]}\n{build.stderr[-4000:]}"
        )
    runroot = Path(tempfile.mkdtemp(prefix="kvo-podman-", dir="/tmp"))
    built = Image(store=store, runroot=runroot, env=env, build_seconds=seconds)
    size = built.inspect()["Size"]
    report(pytestconfig, f"image {TAG}: {size / 1e6:.0f} MB on a Debian bookworm base, built in {seconds:.0f} s")
    yield built
    # Nothing stays mounted once the builds and runs are over (checked here), so the storage is plain files.
    assert [line for line in Path("/proc/mounts").read_text().splitlines() if str(store) in line] == []
    shutil.rmtree(store)
    shutil.rmtree(runroot, ignore_errors=True)


def test_the_image_prints_the_version_of_its_package(image: Image) -> None:
    result = image.run("--version", user="65532:65532", entrypoint="kvoffload")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kvoffload, version {VERSION}"


def test_the_image_starts_kvoffload_run_by_default(image: Image) -> None:
    result = image.run("--help", user="65532:65532")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: kvoffload run [OPTIONS]")
    assert "--leader-elect" in result.stdout


def test_the_image_runs_as_65532_without_a_user_flag(image: Image) -> None:
    config = image.inspect()["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["kvoffload", "run"]
    assert image.python("import json, os; print(json.dumps([os.getuid(), os.getgid()]))") == [65532, 65532]


def test_the_root_filesystem_is_read_only_even_for_root(image: Image) -> None:
    # As root, so a permission error cannot stand in for the read-only mount.
    code = """
import errno, json
try:
    open("/opt/kvoffload/x", "w")
except OSError as e:
    print(json.dumps(errno.errorcode[e.errno]))
"""
    assert image.python(code, user="0:0") == "EROFS"


def test_the_operator_venv_has_no_pip_no_build_tools_and_no_lab(image: Image) -> None:
    code = """
import importlib.metadata as md, importlib.util, json
dists = sorted(d.metadata["Name"].lower() for d in md.distributions())
lab = [str(f) for d in md.distributions() for f in d.files or () if str(f).split("/")[0] == "kvoffload_lab"]
lab_module = importlib.util.find_spec("kvoffload_lab") is not None
print(json.dumps({"dists": dists, "lab_files": lab, "lab_module": lab_module}))
"""
    found = image.python(code)
    assert {"pip", "setuptools", "wheel", "hatchling"}.isdisjoint(found["dists"]), found["dists"]
    assert "kvoffload" in found["dists"]
    assert "kvoffload-lab" not in found["dists"]
    assert found["lab_files"] == []
    assert found["lab_module"] is False


def test_the_image_names_its_version_and_base(image: Image) -> None:
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    labels = image.inspect()["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.base.name"].startswith(f"localhost/kvoffload-base:bookworm-{arch}-")

"""`make release`: every artifact a kvoffload release publishes, reproducibly, into one directory.

    .venv/bin/python scripts/release.py --out dist

writes, for pyproject.toml's version V:

- ``kvoffload-V-py3-none-any.whl`` and ``kvoffload-V.tar.gz``, built by the hatchling that
  ``requirements/build.lock`` pins (the running venv's, without isolation), with ``SOURCE_DATE_EPOCH`` set to
  the last commit's time: two builds of one tree give the same bytes;
- ``kvoffload-V.tgz``, the chart ``charts/kvoffload`` packaged by Helm (helm-python-sdk). Helm stamps each
  member with its file's mtime, so it packs a copy whose mtimes are ``SOURCE_DATE_EPOCH``;
- ``kvoffload-V-image.cdx.json``, the CycloneDX SBOM (cyclonedx-bom, from ``.venv-sbom``) of what the image installs
  (``requirements/runtime.lock``), and ``kvoffload-V-wheel.cdx.json``, the one of the wheel: the wheel itself
  (with its sha256) and the dependencies it declares, at the versions the runtime lock pins;
- ``kubectl-kvoffload_vV.tar.gz`` and ``kvoffload.yaml``, the krew archive (launcher, wheel, lock) and its
  manifest (``scripts/krew.py``);
- ``RELEASE-NOTES.md``, the section of ``CHANGELOG.md`` for V (``## V``, else ``## Unreleased``);
- ``SHA256SUMS`` over all of the above (``sha256sum -c SHA256SUMS`` checks it).

Everything is built from the files a clone would have (tracked, plus untracked ones that git does not
ignore), copied apart: nothing ignored (venvs, kits, caches) reaches the sdist.

The version lives in ONE place, pyproject.toml's ``project.version``. The chart's ``version`` and
``appVersion`` must equal it: the release stops, naming the field, when ``charts/kvoffload/Chart.yaml``
disagrees, rather than rewrite a committed file behind the author's back (bump the three together).
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pip_requirements_parser import RequirementsFile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import krew  # scripts/ is not a package: found through sys.path, above

ROOT = Path(__file__).resolve().parents[1]
CHART = Path("charts") / "kvoffload"
RUNTIME_LOCK = Path("requirements") / "runtime.lock"
BUILD_LOCK = Path("requirements") / "build.lock"
SBOM_TOOL = ROOT / ".venv-sbom" / "bin" / "cyclonedx-py"
"""cyclonedx-bom's CLI, in a venv of its own (`make setup` installs it from requirements/sbom.lock, which says why)."""
CHANGELOG = "CHANGELOG.md"
SUMS = "SHA256SUMS"
NOTES = "RELEASE-NOTES.md"
BACKEND = "hatchling"


class ReleaseError(Exception):
    """A release that cannot be made as asked; the message names the file and field."""


def say(line: str) -> None:
    print(f"release: {line}", flush=True)


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stderr.strip()}")
    return done.stdout


# --- one version -----------------------------------------------------------------------------------------------


def project_version(root: Path) -> str:
    with (root / "pyproject.toml").open("rb") as f:
        found: str = tomllib.load(f)["project"]["version"]
    return found


def check_chart_version(root: Path, version: str) -> None:
    """The chart's version and appVersion are pyproject.toml's version, or the release stops naming the field."""
    chart = yaml.safe_load((root / CHART / "Chart.yaml").read_text())
    for field in ("version", "appVersion"):
        if str(chart.get(field)) != version:
            raise ReleaseError(
                f"{CHART / 'Chart.yaml'}: {field} is {chart.get(field)!r}, but pyproject.toml's project.version is "
                f"{version!r}: set them to the same version"
            )


# --- the locks ---------------------------------------------------------------------------------------------------


def locked(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """Each package a hash-pinned lock pins: canonical name -> (version, its requirement line's hash options)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    for req in RequirementsFile.from_file(str(lock)).requirements:
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise ReleaseError(f"{lock.name}: {req.name} is not pinned with ==")
        pins[canonicalize_name(req.name)] = (specs[0].version, list(req.hash_options))
    return pins


def check_backend(root: Path) -> str:
    """The running venv's hatchling is the one build.lock pins; returns its version."""
    pinned, _ = locked(root / BUILD_LOCK).get(BACKEND, ("", []))
    have = importlib.metadata.version(BACKEND)
    if have != pinned:
        raise ReleaseError(
            f"{BUILD_LOCK}: pins {BACKEND}=={pinned}, but {sys.executable} has {have}: "
            "run the release from the project's .venv (make release)"
        )
    return have


# --- the source tree -------------------------------------------------------------------------------------------


def source_date_epoch(root: Path) -> str:
    """$SOURCE_DATE_EPOCH if set, else the last commit's time."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given:
        if not given.isdigit():
            raise ReleaseError(f"SOURCE_DATE_EPOCH is {given!r}, not a number of seconds")
        return given
    return run("git", "log", "-1", "--format=%ct", cwd=root).strip()


def stage(root: Path, into: Path, epoch: int) -> Path:
    """Copy what a clone would hold (tracked, plus untracked files git does not ignore) into ``into``, every
    file and folder at ``epoch``; returns the copy's root."""
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=root)
    names = sorted({name for name in listed.split("\0") if name})
    copy = into / "src"
    folders = {copy}
    for name in names:
        source = root / name
        if not source.is_file():  # deleted in the working tree, or a submodule
            continue
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        folders.update(target.parents)
        shutil.copy2(source, target)
        os.utime(target, (epoch, epoch))
    for folder in folders:
        if folder.is_relative_to(copy):
            os.utime(folder, (epoch, epoch))
    return copy


def dirty(root: Path) -> bool:
    return bool(run("git", "status", "--porcelain", "--untracked-files=normal", cwd=root).strip())


# --- the artifacts -----------------------------------------------------------------------------------------------


def build_python(src: Path, out: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """The wheel and the sdist, by the pinned hatchling without isolation."""
    run(sys.executable, "-m", "hatchling", "build", "-d", out, cwd=src, env=env)
    (wheel,) = out.glob("kvoffload-*-py3-none-any.whl")
    (sdist,) = out.glob("kvoffload-*.tar.gz")
    return wheel, sdist


def package_chart(src: Path, out: Path, version: str) -> Path:
    import helm_python as helm  # a test dependency, in .venv: imported only when packaging

    packed = Path(helm.package(src / CHART, destination=out))
    if packed.name != f"kvoffload-{version}.tgz":
        raise ReleaseError(f"helm packaged {packed.name}, not kvoffload-{version}.tgz")
    return packed


def cyclonedx(src: Path, requirements: str | Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """cyclonedx-py over a requirements file (or text on stdin), the project as the root component."""
    cli = SBOM_TOOL
    if not cli.is_file():
        raise ReleaseError(f"{cli} not found: `make setup` installs it from requirements/sbom.lock")
    stdin = requirements if isinstance(requirements, str) else None
    source = "-" if stdin is not None else requirements
    run(
        cli, "requirements", "--pyproject", src / "pyproject.toml", "--mc-type", "application", "--sv", "1.6",
        "--output-reproducible", "--of", "JSON", "-o", out, source,
        cwd=src, env=env, stdin=stdin,
    )  # fmt: skip
    bom: dict[str, Any] = json.loads(out.read_text())
    return bom


def declared(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist without an extra: what `pip install` of the wheel alone asks for."""
    with zipfile.ZipFile(wheel) as zf:
        (metadata,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.BytesParser().parsebytes(zf.read(metadata))
    found = [Requirement(line) for line in message.get_all("Requires-Dist") or []]
    return [req for req in found if req.marker is None or req.marker.evaluate({"extra": ""})]


def wheel_sbom(src: Path, wheel: Path, pins: dict[str, tuple[str, list[str]]], out: Path, env: dict[str, str]) -> None:
    """The wheel's SBOM: its declared dependencies at the versions the runtime lock pins, the wheel (with its
    sha256 and purl) as the root component, which depends on each of them."""
    lines = []
    for req in declared(wheel):
        name = canonicalize_name(req.name)
        if name not in pins:
            raise ReleaseError(f"{RUNTIME_LOCK}: the wheel declares {req}, which the lock does not pin")
        pinned, hashes = pins[name]
        if not req.specifier.contains(pinned, prereleases=True):
            raise ReleaseError(f"{RUNTIME_LOCK}: pins {name}=={pinned}, outside the wheel's {req}")
        lines.append(" ".join([f"{name}=={pinned}", *(f"--hash={h}" for h in hashes)]))
    bom = cyclonedx(src, "\n".join(lines) + "\n", out, env)
    root = bom["metadata"]["component"]
    version = root["version"]
    root["purl"] = f"pkg:pypi/kvoffload@{version}"
    root["hashes"] = [{"alg": "SHA-256", "content": sha256(wheel)}]
    root["properties"] = [{"name": "kvoffload:wheel", "value": wheel.name}]
    refs = sorted(c["bom-ref"] for c in bom["components"])
    bom["dependencies"] = [d for d in bom.get("dependencies", []) if d["ref"] != root["bom-ref"]]
    bom["dependencies"].insert(0, {"ref": root["bom-ref"], "dependsOn": refs})
    out.write_text(json.dumps(bom, indent=2) + "\n")


def release_notes(changelog: str, version: str) -> str:
    """The CHANGELOG section ``## VERSION`` (also ``## [VERSION]``, ``## vVERSION``, with a date after), else
    ``## Unreleased``, under a heading naming the version. Headings inside fenced code blocks do not count."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fence: str | None = None
    for line in changelog.splitlines():
        marker = re.match(r"\s{0,3}(`{3,}|~{3,})", line)
        if marker:
            if fence is None:
                fence = marker[1]
            elif marker[1].startswith(fence[0]) and len(marker[1]) >= len(fence):
                fence = None
        heading = re.match(r"## (?!#)\s*(.*?)\s*$", line) if fence is None else None
        if heading:
            title = re.match(r"\[?v?([^\]\s]+)\]?", heading[1])
            current = sections.setdefault(title[1] if title else heading[1], [])
            continue
        if fence is None and re.match(r"# (?!#)", line):
            current = None
        if current is not None:
            current.append(line)
    body = sections.get(version) or sections.get("Unreleased")
    if body is None or not "".join(body).strip():
        raise ReleaseError(f"{CHANGELOG}: no '## {version}' or '## Unreleased' section with content")
    return f"# kvoffload {version}\n\n" + "\n".join(body).strip() + "\n"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(out: Path, names: Iterable[str]) -> Path:
    sums = out / SUMS
    sums.write_text("".join(f"{sha256(out / name)}  {name}\n" for name in sorted(names)))
    return sums


def replace_contents(out: Path, built: Path) -> None:
    """Move the built files into ``out``, after removing the files it held (a stale version's): a folder there
    stops the release, since ``out`` holds artifacts only."""
    out.mkdir(parents=True, exist_ok=True)
    folders = [p.name for p in out.iterdir() if p.is_dir() and not p.is_symlink()]
    if folders:
        raise ReleaseError(f"--out {out}: holds folders ({', '.join(sorted(folders))}); give an artifacts-only folder")
    for old in out.iterdir():
        old.unlink()
    for new in sorted(built.iterdir()):
        shutil.move(new, out / new.name)


def size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def release(root: Path, out: Path) -> list[Path]:
    """Build every artifact into ``out``; returns them, SHA256SUMS last."""
    version = project_version(root)
    check_chart_version(root, version)
    backend = check_backend(root)
    epoch = source_date_epoch(root)
    env = {**os.environ, "SOURCE_DATE_EPOCH": epoch}
    say(f"kvoffload {version}, SOURCE_DATE_EPOCH={epoch}, {BACKEND} {backend}")
    if dirty(root):
        say("the working tree has changes that are not committed: these artifacts are not those of HEAD")
    with tempfile.TemporaryDirectory(prefix="kvoffload-release-") as tmp:
        work = Path(tmp)
        src = stage(root, work, int(epoch))
        built = work / "out"
        built.mkdir()
        wheel, sdist = build_python(src, built, env)
        say(f"wheel {wheel.name} ({size(wheel)}), sdist {sdist.name} ({size(sdist)})")
        chart = package_chart(src, built, version)
        say(f"chart {chart.name} ({size(chart)})")
        image_bom = built / f"kvoffload-{version}-image.cdx.json"
        bom = cyclonedx(src, src / RUNTIME_LOCK, image_bom, env)
        say(f"SBOM {image_bom.name}: {len(bom['components'])} components of {RUNTIME_LOCK}")
        wheel_bom = built / f"kvoffload-{version}-wheel.cdx.json"
        wheel_sbom(src, wheel, locked(src / RUNTIME_LOCK), wheel_bom, env)
        say(f"SBOM {wheel_bom.name}: the wheel and {len(declared(wheel))} declared dependencies")
        archive, manifest = krew.write(wheel, built, src / RUNTIME_LOCK)
        say(f"krew {archive.name} ({size(archive)}) and {manifest.name}")
        notes = built / NOTES
        notes.write_text(release_notes((src / CHANGELOG).read_text(), version))
        say(f"notes {NOTES} from {CHANGELOG}")
        names = [p.name for p in built.iterdir()]
        write_sums(built, names)
        replace_contents(out, built)
    say(f"{SUMS} over {len(names)} artifacts in {out}")
    return [*(out / name for name in sorted(names)), out / SUMS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "dist", metavar="DIR", help="where the artifacts go")
    args = parser.parse_args(argv)
    try:
        release(ROOT, args.out.resolve())
    except (ReleaseError, ValueError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

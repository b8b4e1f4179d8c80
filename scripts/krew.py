"""Pack the kubectl plugin for krew, and write its manifest, for one release's wheel.

krew installs a plugin from an archive at a URL, checked against a sha256, and links the archive's
``bin`` as ``kubectl-<name>``. kvoffload is a Python package, which krew cannot install, and which no
package index publishes: the archive carries the release's wheel and ``requirements/runtime.lock``
beside ``deploy/krew/kubectl-kvoffload``, a POSIX sh launcher that installs that wheel (its
dependencies hash-pinned by the lock) into a venv of its own on first use, then runs its
``kubectl-kvoffload`` entry point (``kvoffload.cli.main:kubectl_plugin``). The LICENSE comes too.

The archive is byte-for-byte reproducible from the same wheel (fixed times, owners and order; gzip
without a timestamp). Its sha256 depends on the wheel, so the manifest is a release artifact written
beside the archive (``scripts/release.py`` does both), never a committed file: a committed sha256
would go stale with every change to the package.

    python scripts/krew.py --wheel dist/kvoffload-0.1.0-py3-none-any.whl --out dist
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KREW = ROOT / "deploy" / "krew"
LAUNCHER = KREW / "kubectl-kvoffload"
LOCK = ROOT / "requirements" / "runtime.lock"
PLUGIN = "kvoffload"
MANIFEST_NAME = f"{PLUGIN}.yaml"
"""krew's index wants the manifest named after the plugin."""
BIN = "kubectl-kvoffload"
"""The archive's executable, and the console script of the same name in pyproject.toml."""
LOCK_NAME = "runtime.lock"
"""The lock's name in the archive: the launcher installs the wheel's dependencies from it, hash-pinned."""
RELEASES = "https://github.com/kvoffload/kvoffload/releases/download"
EPOCH = 315532800
"""1980-01-01T00:00:00Z: every member's mtime, so the archive does not depend on when it was packed."""
WHEEL = re.compile(r"kvoffload-(?P<version>[^-]+)-py3-none-any\.whl")

HEADER = """\
# krew's manifest of the kvoffload kubectl plugin (`kubectl krew install --manifest=kvoffload.yaml`).
# Written by scripts/release.py (scripts/krew.py) beside the archive whose sha256 it names; the release
# uploads that archive as `uri`.
"""

DESCRIPTION = """\
kvoffload rolls out vLLM KV-cache offloading tier by tier (GPU -> pinned CPU -> filesystem), one
measured stage at a time, and takes the newest tier away when p99 TTFT or ITL breaks its budget.
This plugin is its command line:
  kubectl kvoffload list -A                           every policy: phase, level, step, tiers, age
  kubectl kvoffload status NAME --watch --timeout 10m  follow a rollout; exit 0 Stable, 1 RolledBack,
                                                      Invalid or Held, 3 Paused or timed out
  kubectl kvoffload promote|abort|retry|pause|resume NAME
"""


def version() -> str:
    """The package's version, from pyproject.toml."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        found: str = tomllib.load(f)["project"]["version"]
    return found


def archive_name(ver: str) -> str:
    return f"{BIN}_v{ver}.tar.gz"


def wheel_version(wheel: Path) -> str:
    """The version in a kvoffload wheel's file name; a ValueError for any other file."""
    matched = WHEEL.fullmatch(wheel.name)
    if matched is None:
        raise ValueError(f"--wheel: {wheel.name} is not a kvoffload-VERSION-py3-none-any.whl")
    return matched["version"]


def members(wheel: Path, lock: Path = LOCK) -> list[tuple[str, bytes, int]]:
    """(name, bytes, mode) of each archive member, in archive order."""
    return [
        (BIN, LAUNCHER.read_bytes(), 0o755),
        ("LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644),
        (LOCK_NAME, lock.read_bytes(), 0o644),
        (wheel.name, wheel.read_bytes(), 0o644),
    ]


def archive_bytes(wheel: Path, lock: Path = LOCK) -> bytes:
    """The release's archive: the launcher (0755), the LICENSE, the lock and the wheel (0644), owned by root,
    at :data:`EPOCH`."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in members(wheel, lock):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, compresslevel=9, mtime=0) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def manifest(sha256: str, ver: str, wheel_name: str) -> dict[str, Any]:
    """krew's Plugin (apiVersion krew.googlecontainertools.github.com/v1alpha2) for this version's archive."""
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": PLUGIN},
        "spec": {
            "version": f"v{ver}",
            "homepage": "https://github.com/kvoffload/kvoffload",
            "shortDescription": "Follow and steer vLLM KV-cache offload rollouts",
            "description": DESCRIPTION,
            "caveats": (
                "This plugin carries the kvoffload wheel and needs Python 3.11 or newer (python3 on PATH,\n"
                "or $KVOFFLOAD_BASE_PYTHON). Its first run installs the wheel into a venv of its own beside\n"
                "the plugin ($KVOFFLOAD_VENV to put it elsewhere), with the dependencies pinned by hash in\n"
                "runtime.lock, from PyPI. Set KVOFFLOAD_PYTHON to the python of an environment that already\n"
                f"has kvoffload {ver} to use that one and install nothing.\n"
            ),
            "platforms": [
                {
                    # A POSIX sh launcher and a pure-Python wheel: the same archive on every Unix, none on Windows.
                    "selector": {"matchExpressions": [{"key": "os", "operator": "In", "values": ["darwin", "linux"]}]},
                    "uri": f"{RELEASES}/v{ver}/{archive_name(ver)}",
                    "sha256": sha256,
                    "files": [{"from": name, "to": "."} for name in (BIN, "LICENSE", LOCK_NAME, wheel_name)],
                    "bin": BIN,
                }
            ],
        },
    }


class _Literal(str):
    """A string dumped as a YAML literal block (``|``)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Literal, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style="|")
)


def render(sha256: str, ver: str, wheel_name: str) -> str:
    """The manifest file for the archive whose sha256 is given."""
    doc = manifest(sha256, ver, wheel_name)
    spec = doc["spec"]
    spec["description"], spec["caveats"] = _Literal(spec["description"]), _Literal(spec["caveats"])
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True)


def write(wheel: Path, out: Path, lock: Path = LOCK) -> tuple[Path, Path]:
    """Write the archive and its manifest into ``out``; returns (archive, manifest)."""
    ver = wheel_version(wheel)
    if ver != version():
        raise ValueError(f"--wheel: {wheel.name} is version {ver}, but pyproject.toml's project.version is {version()}")
    data = archive_bytes(wheel, lock)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / archive_name(ver)
    archive.write_bytes(data)
    manifest_file = out / MANIFEST_NAME
    manifest_file.write_text(render(hashlib.sha256(data).hexdigest(), ver, wheel.name))
    return archive, manifest_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, required=True, help="the release's kvoffload wheel")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the archive and manifest go")
    args = parser.parse_args(argv)
    try:
        for path in write(args.wheel, args.out):
            print(path)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Jinja2 templates and YAML around them: loading the packaged templates, rendering one, and the digests
of what a render reads (``renderer_version``, ``render_input``).
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import yaml

from kvoffload import __version__
from kvoffload.api.types import KVOffloadPolicy

# --- templates ------------------------------------------------------------------------------


# libyaml's loader and dumper when PyYAML has them (its wheels do): every cycle renders every level, and the
# pure-Python scanner was a third of the operator's time at 1,000 policies (bench/operator).
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _flow_yaml(value: Any) -> str:
    """One line of flow YAML that ``yaml.safe_load`` turns back into exactly ``value``."""
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, allow_unicode=True, sort_keys=False, width=2**30)
    return text.rstrip("\n").removesuffix("\n...")


def _templates_dir() -> Path:
    packaged = resources.files("kvoffload") / "templates"
    if packaged.is_dir():  # the wheel: force-included as kvoffload/templates
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "templates"  # the editable install: <repo>/templates


@functools.cache
def renderer_version() -> str:
    """A digest of what renders a policy besides the policy itself: the package's version and its templates.
    Equal inputs under an equal renderer render equal manifests, so the operator compares inputs, not renders."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(_templates_dir().glob("*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def render_input(policy: KVOffloadPolicy) -> str:
    """A digest of everything a render reads: the policy's name, namespace and resolved spec (but its
    ``notifications``, which no render reads), the referenced pod template where spec.workloadRef was read, and
    the renderer."""
    meta = policy.metadata
    spec = policy.spec.model_dump_json(by_alias=True, exclude={"notifications"})
    text = f"{renderer_version()}\0{meta.namespace}/{meta.name}\0{spec}"
    workload = policy.spec.workload
    if workload is not None:  # only then, so that every other policy's digest stays what it was
        text += f"\0{workload.digest}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_templates_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        auto_reload=False,  # the templates ship with the package: no stat() per render
    )
    env.filters["yaml"] = _flow_yaml
    return env


def from_template(template: str, /, **context: Any) -> dict[str, Any]:
    text = _environment().get_template(template).render(**context)
    obj = yaml.load(text, Loader=_Loader)  # a safe loader: libyaml's CSafeLoader
    if not isinstance(obj, dict):  # pragma: no cover - a template bug, not bad input
        raise TypeError(f"template {template} did not render a mapping")
    return obj

"""How a pod's engine container runs in the lab: one speaker per engine, chosen by the engine's name.

A speaker turns an engine container (its command, args and env, and the files mounted into it from ConfigMaps)
into ``kvoffload emulate`` options, ending with ``--speak NAME`` where the engine is not vLLM, and says where its
engine serves Prometheus' text. Each lives in a module of its own (``vllmargs``, ``sglangargs``, ``trtllmargs``),
named as ``kvoffload.engines.ENGINES`` names the engine; a new engine adds its module and one line to
:data:`SPEAKERS`, and nothing else in the lab changes.

The speaker of a pod is the one its ``app.kubernetes.io/name`` label names (what rendering gives every engine pod:
``Engine.name``); for a container without it, that of the first engine in ``ENGINES`` that ``recognises`` it; else
vLLM's, whose image's entrypoint is ``vllm serve``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Protocol

from kvoffload.engines import DEFAULT_ENGINE, ENGINES
from kvoffload_lab.cluster import sglangargs, trtllmargs, vllmargs
from kvoffload_lab.cluster.podengine import LocalClusterError

LABEL_NAME: Final = "app.kubernetes.io/name"
"""The pod label that names its engine (``policy/render.py`` sets it to ``Engine.name``)."""


class Speaker(Protocol):
    """One engine as the emulator runs it."""

    @property
    def name(self) -> str:
        """The engine's name in ``kvoffload.engines.ENGINES`` (and ``--speak``)."""
        ...

    @property
    def title(self) -> str:
        """The engine's name in messages."""
        ...

    @property
    def metrics_path(self) -> str:
        """Where the engine serves Prometheus' text (what its PodMonitor scrapes)."""
        ...

    def emulate_args(self, container: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
        """The emulator's options for ``container``, with the files mounted into it (absolute path -> text).
        Raises ValueError naming the flag, key or field it cannot translate."""
        ...


SPEAKERS: Final[Mapping[str, Speaker]] = MappingProxyType(
    {speaker.name: speaker for speaker in (vllmargs.SPEAKER, sglangargs.SPEAKER, trtllmargs.SPEAKER)}
)


def speaker_for(container: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Speaker:
    """The speaker of an engine container whose pod has ``labels``."""
    named = (labels or {}).get(LABEL_NAME)
    if named is not None and named in SPEAKERS:
        return SPEAKERS[named]
    for engine in ENGINES.values():
        if engine.name in SPEAKERS and engine.recognises(container):
            return SPEAKERS[engine.name]
    return SPEAKERS[DEFAULT_ENGINE]


def emulate_options(
    container: Mapping[str, Any], labels: Mapping[str, str] | None = None, files: Mapping[str, str] | None = None
) -> tuple[Speaker, list[str]]:
    """The speaker of ``container`` and the emulator's options for it; LocalClusterError names what it refuses."""
    speaker = speaker_for(container, labels)
    try:
        return speaker, speaker.emulate_args(container, files or {})
    except ValueError as exc:
        raise LocalClusterError(f"cannot run this {speaker.title} engine in the lab: {exc}") from exc


def config_map_mounts(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The ConfigMap volumes mounted into ``container``: (mount path, the volume's ``configMap``), in mount order.
    A ``subPath`` mount is refused: the files would not be where the engine's flags say."""
    volumes = {v.get("name"): v for v in pod_spec.get("volumes") or []}
    mounts: list[tuple[str, Mapping[str, Any]]] = []
    for mount in container.get("volumeMounts") or []:
        source = (volumes.get(mount.get("name")) or {}).get("configMap")
        if source is None:
            continue
        if mount.get("subPath"):
            raise LocalClusterError(f"volumeMounts[{mount.get('name')}].subPath: not emulated for a ConfigMap volume")
        mounts.append((str(mount["mountPath"]), source))
    return mounts


def mounted_files(
    mounts: list[tuple[str, Mapping[str, Any]]], config_maps: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, str]:
    """The files the mounts put into the container (absolute path -> text), from the ConfigMaps by name (None: not
    there); an optional one missing mounts nothing, a required one missing is refused."""
    files: dict[str, str] = {}
    for path, source in mounts:
        name = str(source.get("name", ""))
        found = config_maps.get(name)
        if found is None:
            if source.get("optional"):
                continue
            raise LocalClusterError(f"configMap {name}: not found (a kubelet would not start the container)")
        data: Mapping[str, str] = found.get("data") or {}
        items = source.get("items")
        chosen = {i["key"]: i.get("path", i["key"]) for i in items} if items else {k: k for k in data}
        for key, relative in chosen.items():
            if key not in data:
                raise LocalClusterError(f"configMap {name}: has no key {key!r}")
            files[posixpath.normpath(posixpath.join(path, relative))] = str(data[key])
    return files

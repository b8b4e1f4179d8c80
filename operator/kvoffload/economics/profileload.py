"""Reading cost profiles: from JSON text or a file, with the path of every bad field in the error, and the
profiles shipped in the package (``profiles/<gpu-class>.json``).

Pure: standard library only, as ``profile`` is, so the calibration can import it on a GPU image."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, cast

from kvoffload.economics.gpuspec import GpuSpec
from kvoffload.economics.profile import (
    DIRECTIONS,
    KINDS,
    PIN_PATHS,
    SCHEMA_VERSION,
    TRANSFER_PATHS,
    VLLM_ZERO_COPY_MAX_PAGE_BYTES,
    VLLM_ZERO_COPY_MIN_PAGES,
    CurvePoint,
    DecodeCurve,
    Derivation,
    Direction,
    HitCost,
    Kind,
    ModelShape,
    PinPath,
    PinPoint,
    PrefillCurve,
    Profile,
    ProfileError,
    RestoreCheck,
    RestoreCost,
    Source,
    TransferPath,
    TransferPoint,
)


class _Obj:
    """A JSON object read with the path of every field in its errors."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise ProfileError(f"{path}: must be an object")
        self.value: dict[str, Any] = value
        self.path = path

    def _get(self, key: str) -> object:
        if key not in self.value:
            raise ProfileError(f"{self.path}.{key}: missing")
        return self.value[key]

    def get_str(self, key: str, default: str | None = None) -> str:
        if default is not None and key not in self.value:
            return default
        v = self._get(key)
        if not isinstance(v, str):
            raise ProfileError(f"{self.path}.{key}: must be a string")
        return v

    def get_int(self, key: str, minimum: int = 0, default: int | None = None) -> int:
        if default is not None and key not in self.value:
            return default
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ProfileError(f"{self.path}.{key}: must be an integer >= {minimum}")
        return v

    def get_num(self, key: str, positive: bool = True) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ProfileError(f"{self.path}.{key}: must be a finite number")
        if v < 0 or (positive and v == 0):
            raise ProfileError(f"{self.path}.{key}: must be {'> 0' if positive else '>= 0'}")
        return float(v)

    def get_bool(self, key: str) -> bool:
        v = self._get(key)
        if not isinstance(v, bool):
            raise ProfileError(f"{self.path}.{key}: must be true or false")
        return v

    def get_choice(self, key: str, choices: tuple[str, ...]) -> str:
        v = self.get_str(key)
        if v not in choices:
            raise ProfileError(f"{self.path}.{key}: {v!r} is not one of {', '.join(choices)}")
        return v

    def get_obj(self, key: str) -> _Obj:
        return _Obj(self._get(key), f"{self.path}.{key}")

    def get_objs(self, key: str, required: bool = True) -> list[_Obj]:
        if not required and key not in self.value:
            return []
        v = self._get(key)
        if not isinstance(v, list):
            raise ProfileError(f"{self.path}.{key}: must be a list")
        return [_Obj(item, f"{self.path}.{key}[{i}]") for i, item in enumerate(v)]

    def get_strs(self, key: str) -> tuple[str, ...]:
        if key not in self.value:
            return ()
        v = self.value[key]
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise ProfileError(f"{self.path}.{key}: must be a list of strings")
        return tuple(v)


def _points(items: list[_Obj], x_key: str, path: str) -> tuple[CurvePoint, ...]:
    points = tuple(CurvePoint(o.get_int(x_key, minimum=1), o.get_num("seconds")) for o in items)
    xs = [p.x for p in points]
    if len(set(xs)) != len(xs):
        raise ProfileError(f"{path}: two points at the same {x_key}")
    return tuple(sorted(points, key=lambda p: p.x))


def _read_spec(o: _Obj) -> GpuSpec:
    return GpuSpec(
        gpu_class=o.get_str("gpuClass"),
        product=o.get_str("product"),
        host_link=o.get_str("hostLink"),
        host_link_bytes_per_second=o.get_num("hostLinkBytesPerSecond"),
        hbm_bytes_per_second=o.get_num("hbmBytesPerSecond"),
        bf16_dense_flops=o.get_num("bf16DenseFlops"),
        memory_bytes=o.get_int("memoryBytes", minimum=1),
        citations=o.get_strs("citations"),
    )


def profile_from_json(data: object, origin: str = "profile") -> Profile:
    """A Profile from its parsed JSON; ProfileError names the first bad field."""
    root = _Obj(data, origin)
    version = root.get_int("schemaVersion", minimum=1)
    if version != SCHEMA_VERSION:
        raise ProfileError(f"{origin}.schemaVersion: {version} is not supported (this code reads {SCHEMA_VERSION})")
    src = root.get_obj("source")
    source = Source(
        device=src.get_str("device"),
        driver=src.get_str("driver"),
        torch=src.get_str("torch"),
        cuda=src.get_str("cuda"),
        date=src.get_str("date"),
        command=src.get_str("command"),
        host=src.get_str("host", default=""),
    )
    transfers = tuple(
        TransferPoint(
            direction=cast(Direction, o.get_choice("direction", DIRECTIONS)),
            path=cast(TransferPath, o.get_choice("path", TRANSFER_PATHS)),
            page_bytes=o.get_int("pageBytes", minimum=1),
            pages=o.get_int("pages", minimum=1),
            bytes_per_second=o.get_num("bytesPerSecond"),
        )
        for o in root.get_objs("transfers")
    )
    for direction in DIRECTIONS:
        if not any(t.direction == direction and t.path == "contiguous" for t in transfers):
            raise ProfileError(f"{origin}.transfers: no {direction} contiguous measurement")
    if not any(t.direction == "h2d" and t.path == "batched_dma" for t in transfers):
        raise ProfileError(f"{origin}.transfers: no h2d batched_dma measurement (vLLM's load path for large pages)")
    if not any(t.direction == "d2h" and t.path == "batched_dma" for t in transfers):
        raise ProfileError(f"{origin}.transfers: no d2h batched_dma measurement (vLLM's store path)")
    rest = root.get_obj("restore")
    submit = rest.get_obj("submitSecondsPerPage")
    per_page: dict[str, float] = {}
    for key in submit.value:
        if key not in TRANSFER_PATHS:
            raise ProfileError(f"{submit.path}.{key}: not a transfer path ({', '.join(TRANSFER_PATHS)})")
        per_page[key] = submit.get_num(key, positive=False)
    restore = RestoreCost(
        fixed_seconds=rest.get_num("fixedSeconds", positive=False),
        submit_seconds_per_page=per_page,
        zero_copy_max_page_bytes=rest.get_int("zeroCopyMaxPageBytes", default=VLLM_ZERO_COPY_MAX_PAGE_BYTES),
        zero_copy_min_pages=rest.get_int("zeroCopyMinPages", default=VLLM_ZERO_COPY_MIN_PAGES),
        fill_seconds_per_layer=rest.get_num("fillSecondsPerLayer", positive=False)
        if "fillSecondsPerLayer" in rest.value
        else 0.0,
    )
    hit = HitCost()
    if "hit" in root.value:
        h = root.get_obj("hit")
        hit = HitCost(
            hash_seconds_per_block=h.get_num("hashSecondsPerBlock", positive=False),
            hbm_bytes_per_second=h.get_num("hbmBytesPerSecond", positive=False),
            source=h.get_str("source", default=""),
        )
    prefill: list[PrefillCurve] = []
    for o in root.get_objs("prefill"):
        s = o.get_obj("shape")
        shape = ModelShape(
            layers=s.get_int("layers", 1),
            hidden=s.get_int("hidden", 1),
            intermediate=s.get_int("intermediate", 1),
            heads=s.get_int("heads", 1),
            kv_heads=s.get_int("kvHeads", 1),
            head_dim=s.get_int("headDim", 1),
            vocab=s.get_int("vocab", 1),
        )
        points = _points(o.get_objs("points"), "tokens", f"{o.path}.points")
        if not points:
            raise ProfileError(f"{o.path}.points: empty")
        held = _points(o.get_objs("heldOut", required=False), "tokens", f"{o.path}.heldOut")
        curve = PrefillCurve(o.get_str("model"), shape, points, held, o.get_str("mode", default="eager"))
        if any(c.model == curve.model and c.mode == curve.mode for c in prefill):
            raise ProfileError(f"{o.path}: a second {curve.mode} curve for {curve.model}")
        prefill.append(curve)
    decode: list[DecodeCurve] = []
    for o in root.get_objs("decode"):
        points = _points(o.get_objs("points"), "batch", f"{o.path}.points")
        if not points:
            raise ProfileError(f"{o.path}.points: empty")
        decode.append(DecodeCurve(o.get_str("model"), o.get_int("contextTokens", 1), points, o.get_bool("cudaGraph")))
    checks = tuple(
        RestoreCheck(
            label=o.get_str("label"),
            page_bytes=o.get_int("pageBytes", 1),
            pages=o.get_int("pages", 1),
            path=cast(TransferPath, o.get_choice("path", TRANSFER_PATHS)),
            seconds=o.get_num("seconds"),
            layers=o.get_int("layers", 0, default=0),
        )
        for o in root.get_objs("restoreChecks", required=False)
    )
    derivation = None
    if "derivation" in root.value:
        d = root.get_obj("derivation")
        derivation = Derivation(
            base_profile=d.get_str("baseProfile"),
            base_spec=_read_spec(d.get_obj("baseSpec")),
            target_spec=_read_spec(d.get_obj("targetSpec")),
            method=d.get_str("method"),
        )
    kind = cast(Kind, root.get_choice("kind", KINDS))
    if kind == "estimated" and derivation is None:
        raise ProfileError(f"{origin}.derivation: an estimated profile must say what it was derived from")
    return Profile(
        gpu_class=root.get_str("gpuClass"),
        kind=kind,
        source=source,
        transfers=transfers,
        bidirectional_bytes_per_second=root.get_num("bidirectionalBytesPerSecond"),
        pinning=tuple(
            PinPoint(
                o.get_int("bytes", 1),
                o.get_num("seconds"),
                cast(PinPath, o.get_choice("path", PIN_PATHS) if "path" in o.value else "torch_pin_memory"),
            )
            for o in root.get_objs("pinning")
        ),
        restore=restore,
        prefill=tuple(prefill),
        decode=tuple(decode),
        restore_checks=checks,
        derivation=derivation,
        notes=root.get_strs("notes"),
        schema_version=version,
        hit=hit,
    )


def loads_profile(text: str, origin: str = "profile") -> Profile:
    """A Profile from JSON text."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{origin}: not valid JSON: {exc}") from None
    return profile_from_json(data, origin)


def load_profile(path: Path) -> Profile:
    """A Profile from a JSON file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: {exc.strerror or exc}") from None
    return loads_profile(text, str(path))


def shipped_profile_names() -> list[str]:
    """The GPU classes with a profile shipped in the package, sorted."""
    folder = resources.files("kvoffload.economics").joinpath("profiles")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def shipped_profile(gpu_class: str) -> Profile:
    """The profile shipped for ``gpu_class``; ProfileError when there is none."""
    res = resources.files("kvoffload.economics").joinpath("profiles", f"{gpu_class}.json")
    if not res.is_file():
        known = ", ".join(shipped_profile_names())
        raise ProfileError(f"no shipped profile for GPU class {gpu_class!r} (shipped: {known})")
    profile = loads_profile(res.read_text(), f"profiles/{gpu_class}.json")
    if profile.gpu_class != gpu_class:
        raise ProfileError(f"profiles/{gpu_class}.json: gpuClass is {profile.gpu_class!r}")
    return profile

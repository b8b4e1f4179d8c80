"""A Deployment the team already runs (``spec.workloadRef``), read into the policy it serves.

Pure: ``adopt`` takes the Deployment as the API server returned it and gives the policy whose spec carries it
(``KVOffloadPolicySpec.workload``), its engine recognised from the container and checked against the spec;
rendering derives each level from its pod template (``policy/render.py``). ``workload_warnings`` says what the
derived levels change or leave that the team should know of.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kvoffload.api.conventions import ANNOTATION_ORIGINAL_REPLICAS
from kvoffload.api.errors import FieldError, PolicyError, errors_from
from kvoffload.api.quantity import quantity_bytes
from kvoffload.api.serving import AdoptedWorkload
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines import ENGINES, Engine, engine_for
from kvoffload.policy.catalog import find_gpu_class
from kvoffload.policy.nodefit import check_policy

WHERE = "spec.workloadRef"
# Resources whose quantities the derived levels compare and raise.
_RAISED = ("memory", "ephemeral-storage")


def template_digest(template: Mapping[str, Any]) -> str:
    """A digest of a pod template: equal templates, equal digests, whatever the key order."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def original_replicas(deployment: Mapping[str, Any]) -> int:
    """What the Deployment ran before a takeover: the count recorded on it, else its spec.replicas."""
    meta = deployment.get("metadata") or {}
    recorded = (meta.get("annotations") or {}).get(ANNOTATION_ORIGINAL_REPLICAS)
    if recorded is not None and str(recorded).isdigit():
        return int(recorded)
    replicas = (deployment.get("spec") or {}).get("replicas")
    return replicas if isinstance(replicas, int) and replicas >= 0 else 1


def adopted_container(workload: AdoptedWorkload) -> dict[str, Any]:
    """The engine container of an adopted pod template."""
    containers = (workload.template.get("spec") or {}).get("containers") or []
    return next(c for c in containers if c.get("name") == workload.container)


def _container(policy: KVOffloadPolicy, containers: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    ref = policy.spec.workload_ref
    assert ref is not None
    named = {str(c.get("name")): c for c in containers}
    if ref.container is not None:
        if ref.container not in named:
            raise PolicyError(
                [FieldError(f"{WHERE}.container", f"the pod has no container {ref.container!r} ({', '.join(named)})")]
            )
        return named[ref.container]
    if len(containers) == 1:
        return containers[0]
    engines = [c for c in containers if any(e.recognises(c) for e in ENGINES.values())]
    if len(engines) == 1:
        return engines[0]
    raise PolicyError(
        [FieldError(f"{WHERE}.container", f"the pod has {len(containers)} containers ({', '.join(named)}): name one")]
    )


def _engine(policy: KVOffloadPolicy, container: Mapping[str, Any]) -> Engine:
    """The engine the container runs: spec.engine where the policy names it (and the container does not run
    another), else the one its command, args or image show."""
    spec = policy.spec
    name = container.get("name")
    found = [e for e in ENGINES.values() if e.recognises(container)]
    if "engine" in spec.model_fields_set:
        engine = engine_for(spec)
        if found and engine not in found:
            raise PolicyError(
                [FieldError("spec.engine", f"is {engine.name} but container {name!r} runs {found[0].title}")]
            )
        return engine
    if len(found) == 1:
        return found[0]
    what = "none of " if not found else "more than one of "
    raise PolicyError(
        [
            FieldError(
                WHERE,
                f"container {name!r} runs {what}{', '.join(e.title for e in ENGINES.values())} as far as its "
                "command, args and image tell: name the engine with spec.engine",
            )
        ]
    )


def _with_engine(policy: KVOffloadPolicy, engine: Engine) -> KVOffloadPolicy:
    """The policy validated again with the engine its container runs (so every default and check is that
    engine's)."""
    spec = policy.spec
    if engine.name == spec.engine:
        return policy
    data = spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
    try:
        revalidated = KVOffloadPolicySpec.model_validate({**data, "engine": engine.name})
    except ValidationError as exc:
        raise PolicyError(errors_from(exc, ("spec",)), policy.metadata.name) from None
    policy = policy.model_copy(update={"spec": revalidated})
    if problems := check_policy(policy):
        raise PolicyError(problems, policy.metadata.name)
    return policy


def _served_problems(spec: KVOffloadPolicySpec, engine: Engine, container: Mapping[str, Any]) -> list[FieldError]:
    """Where the container's own flags say otherwise than the spec the sizing reads."""
    name = container.get("name")
    served = engine.served(container)
    model = spec.model
    errors: list[FieldError] = []
    if served.model is None:
        errors.append(
            FieldError("spec.model.name", f"container {name!r} names no model: the operator cannot tell it serves it")
        )
    elif served.model.value != model.name:
        errors.append(
            FieldError(
                "spec.model.name",
                f"is {model.name!r} but container {name!r} serves {served.model.value!r} ({served.model.flag})",
            )
        )
    length = served.max_model_len
    if length is not None and length.number != model.max_model_len:
        errors.append(
            FieldError(
                "spec.model.maxModelLen",
                f"is {model.max_model_len} but container {name!r} sets {length.flag} {length.value}",
            )
        )
    ranks = served.tensor_parallel_size
    runs = ranks.number if ranks is not None else 1
    if runs != model.tensor_parallel_size:
        how = f"{ranks.flag} {ranks.value}" if ranks is not None else "no parallelism flag: 1"
        errors.append(
            FieldError(
                "spec.model.tensorParallelSize",
                f"is {model.tensor_parallel_size} but container {name!r} runs {how}",
            )
        )
    dtype = served.kv_cache_dtype
    stored = dtype.value if dtype is not None else "auto"
    if stored != model.kv_cache_dtype.value:
        how = f"{dtype.flag} {dtype.value}" if dtype is not None else "no KV cache dtype: auto"
        errors.append(
            FieldError("spec.model.kvCacheDtype", f"is {model.kv_cache_dtype.value} but container {name!r} sets {how}")
        )
    return errors


def _resource_problems(spec: KVOffloadPolicySpec, container: Mapping[str, Any]) -> list[FieldError]:
    """GPUs other than the class's, or another count of them; quantities the derived levels cannot compare."""
    name = container.get("name")
    resources = container.get("resources") or {}
    gpu = find_gpu_class(spec.gpu.class_)  # an unknown class: check_renderable names it
    errors: list[FieldError] = []
    for part in ("limits", "requests"):
        asked = resources.get(part) or {}
        for key in _RAISED:
            if key in asked:
                try:
                    quantity_bytes(str(asked[key]))
                except ValueError:
                    errors.append(
                        FieldError(WHERE, f"container {name!r} resources.{part}.{key} {asked[key]!r} is no quantity")
                    )
        if gpu is None:
            continue
        if gpu.resource in asked and str(asked[gpu.resource]) != str(spec.gpu.count):
            errors.append(
                FieldError(
                    "spec.gpu.count",
                    f"is {spec.gpu.count} but container {name!r} asks for {asked[gpu.resource]} {gpu.resource} "
                    f"(resources.{part})",
                )
            )
        errors += [
            FieldError(
                "spec.gpu.class",
                f"is {spec.gpu.class_} ({gpu.resource}) but container {name!r} asks for {key} (resources.{part})",
            )
            for key in asked
            if key != gpu.resource and key.endswith("/gpu")
        ]
    return list(dict.fromkeys(errors))


def adopt(policy: KVOffloadPolicy, deployment: Mapping[str, Any]) -> KVOffloadPolicy:
    """``policy`` with the Deployment its spec.workloadRef names read in; PolicyError names what is wrong."""
    if policy.spec.workload_ref is None:
        raise ValueError("the policy has no workloadRef")
    template = (deployment.get("spec") or {}).get("template")
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    if not isinstance(template, Mapping) or not containers:
        raise PolicyError([FieldError(WHERE, "the Deployment has no pod template with containers")])
    container = _container(policy, containers)
    image = container.get("image")
    if not isinstance(image, str) or not image:
        raise PolicyError([FieldError(WHERE, f"container {container.get('name')!r} has no image")])
    policy = _with_engine(policy, _engine(policy, container))
    engine = engine_for(policy.spec)
    errors = [FieldError(WHERE, p) for p in engine.adoption_problems(container)]
    errors += _served_problems(policy.spec, engine, container)
    errors += _resource_problems(policy.spec, container)
    if errors:
        raise PolicyError(errors, policy.metadata.name)
    workload = AdoptedWorkload(
        name=str((deployment.get("metadata") or {}).get("name")),
        replicas=original_replicas(deployment),
        template=json.loads(json.dumps(template)),  # a deep copy: nothing the caller holds is shared
        container=str(container.get("name")),
        image=image,
        digest=template_digest(template),
    )
    return policy.model_copy(update={"spec": policy.spec.with_workload(workload)})


__all__ = ["WHERE", "adopt", "adopted_container", "original_replicas", "template_digest"]

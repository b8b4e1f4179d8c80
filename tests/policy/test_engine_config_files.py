"""An engine that reads its options from a file gets a ConfigMap per level, mounted read-only at CONFIG_DIR.

The engine is vLLM with one config file per level (tests/support/files_engine.py): the level's ConfigMap holds
the file, the Deployment mounts it, and the file's text enters the config hash, so a changed file rolls the
pods. vLLM's and SGLang's renders are unchanged (their golden files); a referenced Deployment is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_LEVEL
from kvoffload.api.errors import PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines.engine import CONFIG_DIR
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.ladder import Level, build_ladder, find_level
from kvoffload.policy.render import CONFIG_VOLUME, render, render_config_map
from tests.policy import workload_cases
from tests.policy.render_policies import make_policy, sglang_policy
from tests.policy.test_manifests_valid import validate
from tests.support.files_engine import FILE, FilesEngine, files_engine

__all__ = ["files_engine"]  # the fixture, used by name


def cpu(policy: KVOffloadPolicy) -> Level:
    return find_level(build_ladder(policy.spec), name="cpu")


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def engine_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]
    return pod


def test_a_level_of_an_engine_with_files_renders_its_config_map_first_and_mounts_it(
    files_engine: FilesEngine,
) -> None:
    policy = make_policy()
    docs = render(policy, cpu(policy))

    assert kinds(docs) == ["ConfigMap", "Deployment", "Service", "PodMonitor"]
    config_map, deployment = docs[0], docs[1]
    assert config_map["metadata"]["name"] == deployment["metadata"]["name"] == "chat-cpu"
    assert config_map["metadata"]["namespace"] == "llm"
    assert config_map["data"] == {FILE: f"# chat\nhost_cache_size: {32 * 2**30}\nnote: first\n"}
    # labelled as the Deployment, config hash included
    assert config_map["metadata"]["labels"] == deployment["metadata"]["labels"]
    assert config_map["metadata"]["labels"][LABEL_LEVEL] == "cpu"
    pod = engine_pod(docs)
    assert {"name": CONFIG_VOLUME, "configMap": {"name": "chat-cpu"}} in pod["spec"]["volumes"]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True} in mounts
    for doc in docs[:2]:
        validate(doc)


def test_every_level_gets_its_own_config_map(files_engine: FilesEngine) -> None:
    policy = make_policy()
    names = []
    for level in build_ladder(policy.spec):
        config_map = render_config_map(policy, level)
        assert config_map is not None
        names.append(config_map["metadata"]["name"])
        assert config_map["metadata"]["labels"][LABEL_CONFIG_HASH] == config_hash(policy, level)
    assert names == ["chat-gpu-only", "chat-cpu"]


def test_the_files_text_enters_the_config_hash(files_engine: FilesEngine) -> None:
    policy = make_policy()
    level = cpu(policy)
    before = config_hash(policy, level)
    args = render(policy, level)[1]["spec"]["template"]["spec"]["containers"][0]["args"]

    files_engine.note = "second"  # only the file changes
    after = render(policy, level)
    assert after[1]["spec"]["template"]["spec"]["containers"][0]["args"] == args
    assert config_hash(policy, level) != before
    assert after[0]["metadata"]["labels"][LABEL_CONFIG_HASH] == config_hash(policy, level)
    assert after[1]["metadata"]["labels"][LABEL_CONFIG_HASH] == config_hash(policy, level)


def test_an_engine_without_files_renders_no_config_map_and_keeps_the_hash_it_had(files_engine: FilesEngine) -> None:
    policy = make_policy()
    level = cpu(policy)
    with_files = config_hash(policy, level)
    files_engine.note = None  # vLLM as it is: no file
    docs = render(policy, level)
    assert kinds(docs) == ["Deployment", "Service", "PodMonitor"]
    assert render_config_map(policy, level) is None
    assert all(v["name"] != CONFIG_VOLUME for v in engine_pod(docs)["spec"]["volumes"])
    assert config_hash(policy, level) != with_files
    assert docs[0]["metadata"]["labels"][LABEL_CONFIG_HASH] == config_hash(policy, level)


def test_sglang_renders_no_config_map() -> None:
    policy = sglang_policy()
    level = find_level(build_ladder(policy.spec), name="cpu")
    assert kinds(render(policy, level)) == ["Deployment", "Service", "PodMonitor"]
    assert render_config_map(policy, level) is None


def test_vllm_itself_renders_no_config_map() -> None:
    policy = make_policy()
    docs = render(policy, cpu(policy))
    assert kinds(docs) == ["Deployment", "Service", "PodMonitor"]
    assert render_config_map(policy, cpu(policy)) is None
    assert all(v["name"] != CONFIG_VOLUME for v in engine_pod(docs)["spec"]["volumes"])


def test_a_referenced_deployment_is_refused_for_an_engine_with_files(files_engine: FilesEngine) -> None:
    policy = workload_cases.adopted("production-stack")
    level = build_ladder(policy.spec)[-1]
    with pytest.raises(PolicyError) as caught:
        render(policy, level)
    assert [e.path for e in caught.value.errors] == ["spec.workloadRef"]
    assert "config file" in str(caught.value)

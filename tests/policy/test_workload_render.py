"""spec.workloadRef, rendered: each level's pod template is the referenced one with only what offload needs changed
(golden files; the changed paths, exactly); the team's own flags, memory and volumes kept; every derived command
line taken by the engine's own parser; and ``kvoffload render/plan --workload`` (issue 35).

Regenerate the golden files after an intended change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/policy/test_workload_render.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_LEVEL, LABEL_POLICY
from kvoffload.api.quantity import quantity_bytes
from kvoffload.cli.main import main
from kvoffload.engines import engine_for
from kvoffload.policy.hostmemory import host_memory
from kvoffload.policy.ladder import build_ladder, find_level
from kvoffload.policy.render import dump_yaml, render, render_deployment, render_level
from tests.policy.workload_cases import (
    GOLDEN,
    LAB,
    NAMES,
    WorkloadCase,
    adopted,
    deployment,
    engine_container,
    policy_file,
    workload_cases,
    workload_file,
)

CASES = workload_cases()
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())


def derived_template(case: WorkloadCase) -> dict[str, Any]:
    template: dict[str, Any] = render_deployment(case.policy, case.level, 1)["spec"]["template"]
    return template


def user_template(case: WorkloadCase) -> dict[str, Any]:
    template: dict[str, Any] = deployment(case.name)["spec"]["template"]
    return template


def container_name(case: WorkloadCase) -> str:
    assert case.policy.spec.workload is not None
    return case.policy.spec.workload.container


def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Leaves by path; lists of named items by name (``containers[vllm]``), other lists whole."""
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            found |= flatten(item, f"{path}.{key}" if path else key)
        return found or {path: {}}
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return {k: v for item in value for k, v in flatten(item, f"{path}[{item['name']}]").items()}
    return {path: value}


def changed_paths(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    old, new = flatten(before), flatten(after)
    return {p for p in old.keys() | new.keys() if old.get(p, object()) != new.get(p, object())}


# --- golden files ----------------------------------------------------------------------------------------------


def golden_path(case: WorkloadCase) -> Path:
    return GOLDEN / case.name / f"{case.level.index}-{case.level.name}.yaml"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_derived_levels_match_the_golden_files(case: WorkloadCase) -> None:
    text = dump_yaml(render_level(case.policy, case.level))
    path = golden_path(case)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}; run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{path} differs; if intended, regenerate with UPDATE_GOLDEN=1"


def test_every_workload_golden_file_belongs_to_a_level() -> None:
    expected = {golden_path(c) for c in CASES}
    stale = sorted(p for p in GOLDEN.rglob("*.yaml") if p not in expected)
    if UPDATE:
        for p in stale:
            p.unlink()
        return
    assert not stale, f"golden files without a level (delete them or rerun with UPDATE_GOLDEN=1): {stale}"


# --- only what offload needs changes -------------------------------------------------------------------------------


def allowed_paths(case: WorkloadCase) -> set[str]:
    """Every path a level may change: the operator's labels and annotations, the engine container's command line,
    offload variables, memory and ephemeral storage, and the /dev/shm and tier volumes."""
    c = f"spec.containers[{container_name(case)}]"
    user = user_template(case)
    env = engine_container(user, container_name(case)).get("env") or []
    offload_env = {"vllm": "LMCACHE_", "sglang": "SGLANG_HICACHE_"}[case.policy.spec.engine]
    names = {e["name"] for e in env if e["name"].startswith(offload_env)}
    names |= {e["name"] for e in engine_for(case.policy.spec).offload_env(case.policy.spec, case.level)}
    volumes = {"dshm", *(f"kv-{t.name}" for t in case.level.secondary_tiers)}
    return {
        *(f"metadata.labels.{k}" for k in (LABEL_POLICY, LABEL_LEVEL, LABEL_CONFIG_HASH)),
        *(
            f"metadata.annotations.{k}"
            for k in (
                "kubectl.kubernetes.io/default-container",
                "kvoffload.io/tiers",
                "kvoffload.io/tier-capacity-tokens",
            )
        ),
        f"{c}.command",
        f"{c}.args",
        *(f"{c}.env[{n}].{f}" for n in names for f in ("name", "value", "valueFrom")),
        *(f"{c}.resources.{part}.{r}" for part in ("requests", "limits") for r in ("memory", "ephemeral-storage")),
        *(f"{c}.volumeMounts[{v}].{f}" for v in volumes for f in ("name", "mountPath")),
        *(f"spec.volumes[{v}].{f}" for v in volumes for f in ("name", "emptyDir.medium", "emptyDir.sizeLimit")),
        *(
            f"spec.volumes[kv-{t.name}].{f}"
            for t in case.level.secondary_tiers
            for f in ("persistentVolumeClaim.claimName", "emptyDir")
        ),
        "spec.volumes[shm].emptyDir.sizeLimit",  # the team's own /dev/shm, grown to hold the pool
    }


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_level_changes_only_what_offload_needs(case: WorkloadCase) -> None:
    changed = changed_paths(user_template(case), derived_template(case))
    assert changed <= allowed_paths(case), sorted(changed - allowed_paths(case))


LABELS = {f"metadata.labels.{k}" for k in (LABEL_POLICY, LABEL_LEVEL, LABEL_CONFIG_HASH)}
ANNOTATIONS = {
    "metadata.annotations.kubectl.kubernetes.io/default-container",
    "metadata.annotations.kvoffload.io/tiers",
    "metadata.annotations.kvoffload.io/tier-capacity-tokens",
}
LMCACHE_ENV = {
    f"spec.containers[vllm].env[{n}].{f}"
    for n in ("LMCACHE_LOG_LEVEL", "LMCACHE_LOCAL_CPU", "LMCACHE_MAX_LOCAL_CPU_SIZE")
    for f in ("name", "value")
}


def dshm(container: str) -> set[str]:
    return {
        f"spec.containers[{container}].volumeMounts[dshm].name",
        f"spec.containers[{container}].volumeMounts[dshm].mountPath",
        "spec.volumes[dshm].name",
        "spec.volumes[dshm].emptyDir.medium",
        "spec.volumes[dshm].emptyDir.sizeLimit",
    }


def tier(container: str, name: str, source: str) -> set[str]:
    return {
        f"spec.containers[{container}].volumeMounts[kv-{name}].name",
        f"spec.containers[{container}].volumeMounts[kv-{name}].mountPath",
        f"spec.volumes[kv-{name}].name",
        f"spec.volumes[kv-{name}].{source}",
    }


# What each level changes, exactly: a memory request the team set larger stays theirs (gpu-only), their own
# /dev/shm grows only where the pool needs more, their offload flags and variables go on every level.
EXACT: dict[str, set[str]] = {
    "production-stack/0-gpu-only": LABELS | ANNOTATIONS | LMCACHE_ENV | {"spec.containers[vllm].command"},
    "production-stack/2-cpu": LABELS
    | ANNOTATIONS
    | LMCACHE_ENV
    | {
        "spec.containers[vllm].command",
        "spec.containers[vllm].args",
        "spec.containers[vllm].resources.requests.memory",
        "spec.volumes[shm].emptyDir.sizeLimit",
    },
    "production-stack/3-nvme": LABELS
    | ANNOTATIONS
    | LMCACHE_ENV
    | tier("vllm", "nvme", "emptyDir.sizeLimit")
    | {
        "spec.containers[vllm].command",
        "spec.containers[vllm].args",
        "spec.containers[vllm].resources.requests.memory",
        "spec.containers[vllm].resources.requests.ephemeral-storage",
        "spec.volumes[shm].emptyDir.sizeLimit",
    },
    "llm-d/0-gpu-only": LABELS | ANNOTATIONS | dshm("vllm"),
    "llm-d/3-nvme": LABELS
    | ANNOTATIONS
    | dshm("vllm")
    | tier("vllm", "nvme", "persistentVolumeClaim.claimName")
    | {
        "spec.containers[vllm].args",
        "spec.containers[vllm].resources.requests.memory",
        "spec.containers[vllm].resources.limits.memory",
    },
    "sglang/3-disk": LABELS
    | ANNOTATIONS
    | tier("sglang", "disk", "emptyDir.sizeLimit")
    | {
        "spec.containers[sglang].args",
        "spec.containers[sglang].env[SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR].value",
        "spec.containers[sglang].resources.requests.memory",
        "spec.containers[sglang].resources.limits.memory",
        "spec.containers[sglang].resources.requests.ephemeral-storage",
    },
}


@pytest.mark.parametrize("case_id", list(EXACT))
def test_a_level_changes_exactly_these_paths(case_id: str) -> None:
    case = next(c for c in CASES if c.id == case_id)
    assert changed_paths(user_template(case), derived_template(case)) == EXACT[case_id]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_teams_own_flags_stay_as_written_and_the_levels_offload_flags_follow(case: WorkloadCase) -> None:
    engine = engine_for(case.policy.spec)
    user = engine_container(user_template(case), container_name(case))
    derived = engine_container(derived_template(case), container_name(case))
    before = [*user.get("command", []), *user.get("args", [])]
    after = [*derived.get("command", []), *derived.get("args", [])]
    offload = engine.offload_args(case.policy.spec, case.level)
    assert after[len(after) - len(offload) :] == offload
    kept, _ = engine.split_offload(before)
    assert after[: len(after) - len(offload)] == kept
    assert engine.split_offload(after) == (kept, offload)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_memory_is_raised_to_the_sized_host_memory_never_lowered(case: WorkloadCase) -> None:
    sized = host_memory(case.policy.spec, case.level).request
    user = engine_container(user_template(case), container_name(case))["resources"]
    derived = engine_container(derived_template(case), container_name(case))["resources"]
    for part in ("requests", "limits"):
        if "memory" not in user.get(part, {}):
            assert "memory" not in derived.get(part, {})  # no limit stays no limit
            continue
        mine = quantity_bytes(user[part]["memory"])
        if mine >= sized:
            assert derived[part]["memory"] == user[part]["memory"]  # as written
        else:
            assert quantity_bytes(derived[part]["memory"]) == sized


def test_the_teams_labels_stay_so_their_service_selects_the_canary_too() -> None:
    for case in CASES:
        derived = derived_template(case)["metadata"]["labels"]
        assert user_template(case)["metadata"]["labels"].items() <= derived.items()
        canary = render(case.policy, case.level, "canary")[0]
        assert canary["spec"]["template"] == derived_template(case)  # the role changes replicas only


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_derived_deployments_are_valid_kubernetes(case: WorkloadCase) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(render_deployment(case.policy, case.level, 2), version, strict=True)


@pytest.mark.parametrize(
    ("name", "endpoint"),
    [
        ("production-stack", {"port": "container-port"}),
        ("llm-d", {"portNumber": 8200}),  # llm-d's vLLM port has no name
        ("sglang", {"port": "http"}),
    ],
)
def test_the_podmonitor_reaches_the_engines_own_port_and_no_service_is_rendered(
    name: str, endpoint: dict[str, Any]
) -> None:
    taken = adopted(name)
    docs = render_level(taken, build_ladder(taken.spec)[-1])
    assert [d["kind"] for d in docs] == ["Deployment", "PodMonitor"]  # the team's own Service routes
    (scraped,) = docs[1]["spec"]["podMetricsEndpoints"]
    assert {k: v for k, v in scraped.items() if k in ("port", "portNumber")} == endpoint


# --- the engines' own parsers ---------------------------------------------------------------------------------------


def engine_options(case: WorkloadCase) -> list[str]:
    """The derived container's command line after the engine's entry point (``vllm serve``, ``launch_server``)."""
    container = engine_container(derived_template(case), container_name(case))
    tokens = [*container.get("command", []), *container.get("args", [])]
    start = engine_for(case.policy.spec).launch(tokens)  # type: ignore[attr-defined]
    assert start is not None
    options: list[str] = tokens[start[0] :]
    return options


VLLM_CASES = [c for c in CASES if c.policy.spec.engine == "vllm"]
SGLANG_CASES = [c for c in CASES if c.policy.spec.engine == "sglang"]


@pytest.fixture(scope="module", params=["0.32.0", "0.33.0", "0.34.0"])
def vllm_verdicts(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    from tests.policy import test_vllm_args as harness

    version: str = request.param
    overlay = harness.VLLM_OVERLAYS[version]
    if not harness.VLLM_PYTHON.exists():
        harness._missing(str(harness.VLLM_PYTHON))
    if overlay is not None and not (overlay / "vllm" / "__init__.py").exists():
        harness._missing(f"{overlay} (scripts/setup-vllm-sources.sh)")
    requests = [{"id": c.id, "args": engine_options(c)} for c in VLLM_CASES]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    import subprocess

    proc = subprocess.run(
        [str(harness.VLLM_PYTHON), str(harness.ARGCHECK)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=harness.ROOT,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"vllm_argcheck.py exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["id"] for r in results] == [r["id"] for r in requests], proc.stderr[-2000:]
    assert all(r["vllm_version"].startswith(version) for r in results)
    return {r["id"]: r for r in results}


@pytest.mark.realvllm
@pytest.mark.parametrize("case", VLLM_CASES, ids=[c.id for c in VLLM_CASES])
def test_vllm_takes_every_derived_command_line(vllm_verdicts: dict[str, dict[str, Any]], case: WorkloadCase) -> None:
    result = vllm_verdicts[case.id]
    assert result["ok"], result.get("error")
    spec = case.policy.spec
    served = engine_for(spec).served(engine_container(user_template(case), container_name(case)))
    assert result["model"] == spec.model.name
    assert result["port"] == served.port  # the team's own, kept
    assert result["max_model_len"] == spec.model.max_model_len
    assert result["tensor_parallel_size"] == spec.model.tensor_parallel_size
    transfer = result["kv_transfer_config"]
    if case.level.cpu_bytes is None:
        assert transfer is None  # the team's LMCache connector is gone from the baseline too
        assert result["kv_offloading_size"] is None
        return
    assert transfer["kv_connector"] == "OffloadingConnector"
    assert transfer["kv_connector_extra_config"]["cpu_bytes_to_use"] == case.level.cpu_bytes
    assert result["spec_class"] == ("TieringOffloadingSpec" if case.level.secondary_tiers else "CPUOffloadingSpec")
    assert result["unknown_extra_keys"] == []


@pytest.mark.realsglang
def test_sglang_takes_every_derived_command_line() -> None:
    from tests.sglang.test_sglang_parser import _run_checker

    requests = [{"id": c.id, "args": engine_options(c)} for c in SGLANG_CASES]
    results = {
        r["id"]: r for r in (json.loads(line) for line in _run_checker(stdin=json.dumps(requests)).splitlines() if line)
    }
    for case in SGLANG_CASES:
        verdict = results[case.id]
        assert verdict["ok"], (case.id, verdict["error"])
        assert verdict["warnings"] == [], case.id
        got = verdict["resolved"]
        assert got["model_path"] == case.policy.spec.model.name
        assert (got["host"], got["port"]) == ("0.0.0.0", 30000)
        assert got["enable_hierarchical_cache"] is case.level.offloads
        assert "--hicache-ratio" not in engine_options(case)  # the team's ratio no longer sizes the pool
        assert got["hicache_write_policy"] == "write_through"  # the team's own tuning stays
        assert got["page_size"] == 64
        if case.level.cpu_bytes is not None:
            assert got["hicache_size"] * 10**9 == case.level.cpu_bytes
        assert got["hicache_storage_backend"] == ("file" if case.level.secondary_tiers else None)


# --- kvoffload render/plan --workload -------------------------------------------------------------------------------


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("name", NAMES)
def test_render_workload_prints_the_derived_level_and_warns_on_stderr(name: str) -> None:
    taken = adopted(name)
    result = cli("render", str(policy_file(name)), "--workload", str(workload_file(name)), "--level", "2", *LAB)
    assert result.exit_code == 0, result.output
    level = find_level(build_ladder(taken.spec), index=2)
    assert result.stdout == dump_yaml(render_level(taken, level))
    warnings = [line.removeprefix("warning: ") for line in result.stderr.splitlines()]
    from kvoffload.policy.adoptwarnings import workload_warnings
    from kvoffload.policy.sized import size_policy

    assert warnings == workload_warnings(taken, size_policy(taken))


def test_render_workload_defaults_to_the_top_level_and_docs_load_as_yaml() -> None:
    result = cli("render", str(policy_file("llm-d")), "--workload", str(workload_file("llm-d")), *LAB)
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["Deployment", "PodMonitor"]
    assert docs[0]["metadata"]["name"] == "qwen3-decode-nvme"
    assert result.stderr == ""


def test_plan_workload_sizes_the_recognised_engine() -> None:
    result = cli("plan", str(policy_file("sglang")), "--workload", str(workload_file("sglang")), "-o", "json", *LAB)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [lv["name"] for lv in doc["levels"]] == ["gpu-only", "cpu-pilot", "cpu", "disk"]
    assert doc["levels"][2]["shmBytes"] == 0  # SGLang pins anonymous memory, not /dev/shm
    assert "--enable-hierarchical-cache, --hicache-ratio" in result.stderr


def test_a_policy_with_workloadref_needs_workload(tmp_path: Path) -> None:
    for command in ("render", "plan"):
        result = cli(command, str(policy_file("llm-d")), *LAB)
        assert result.exit_code == 2
        assert "spec.workloadRef: the policy takes over Deployment ms-qwen3-llm-d-modelservice-decode: pass " in (
            result.stderr
        )
        assert "--workload DEPLOYMENT.yaml" in result.stderr
        assert result.stdout == ""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d["metadata"].update(name="other"), "spec.workloadRef.name: "),
        (lambda d: d["metadata"].update(namespace="prod"), "is in namespace prod, not the policy's (llm)"),
        (
            lambda d: d.update(kind="StatefulSet"),
            "holds no Deployment ms-qwen3-llm-d-modelservice-decode (it holds: none)",
        ),
        (lambda d: d.update(apiVersion="apps/v1beta1"), "is apps/v1beta1, not apps/v1"),
        (lambda d: engine_container(d, "vllm")["args"].__setitem__(0, "Qwen/Qwen3-4B"), "spec.model.name: "),
    ],
)
def test_a_workload_file_that_does_not_fit_is_bad_input_by_field(tmp_path: Path, change: Any, says: str) -> None:
    obj = deployment("llm-d")
    change(obj)
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(obj))
    result = cli("render", str(policy_file("llm-d")), "--workload", str(path), *LAB)
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert "Traceback" not in result.output


def test_workload_on_a_policy_without_workloadref_is_bad_input(tmp_path: Path) -> None:
    result = cli(
        "render",
        str(Path(__file__).parents[1] / "data" / "render-qwen3-small.yaml"),
        "--workload",
        str(workload_file("llm-d")),
    )
    assert result.exit_code == 2
    assert "spec.workloadRef: --workload" in result.stderr
    assert "the policy has no workloadRef" in result.stderr


def test_the_workload_is_judged_against_the_admins_allow_lists() -> None:
    result = cli("render", str(policy_file("sglang")), "--workload", str(workload_file("sglang")))
    assert result.exit_code == 2
    assert "spec.workloadRef: Deployment sglang-qwen3: volume 'hf-cache' is a hostPath" in result.stderr


@pytest.mark.parametrize("command", ["render", "plan"])
def test_help_explains_workload(command: str) -> None:
    result = cli(command, "--help")
    assert result.exit_code == 0
    assert "--workload DEPLOYMENT.yaml" in result.stdout
    assert "spec.workloadRef" in result.stdout

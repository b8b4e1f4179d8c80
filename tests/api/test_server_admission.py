"""Bad input judged by the real kube-apiserver, with the project's CRD installed, through a real kubectl.

The offline checks (tests/api/test_bad_input.py with tests/support/crd_admission.py, and
tests/api/test_cel.py with cel-python) say what the API server would do; here the session's
real control plane says what it does, and every case must come out the same:

- every example is accepted, and stored with the schema defaults filled in, as the offline
  admission predicts;
- every invalid file is refused at ``kubectl apply``, and kubectl's message names exactly the
  field paths that the offline admission names;
- every cel-python case (valid and invalid) gets the same verdict from the server;
- ``kubectl get kvop`` prints the printer columns, ``kubectl explain`` the descriptions.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, PLURAL
from kvoffload.api.crd import crd_manifest
from tests.api.test_bad_input import EXPECTED, INVALID, SCHEMA_MISTAKES
from tests.api.test_cel import (
    CASE_PARAMS,
    CUSTOM_METRIC_RULES,
    ENGINE_RULES,
    NODE_LEVEL,
    POD_TEMPLATE_AT,
    SPEC_LEVEL,
    _spec_with,
    rules_by_message,
    spec,
    tier,
)
from tests.support import paths
from tests.support.cel_k8s import evaluate
from tests.support.controlplane import Kube
from tests.support.crd_admission import admit, openapi_schema

pytestmark = pytest.mark.kube

EXAMPLES = sorted(paths.EXAMPLES.glob("*.yaml"))
POLICY_API = f"{API_GROUP}/{API_VERSION}"
UNKNOWN_FIELD = "spec.offload.cpuSize"
# "* spec.x: ...", "is invalid: spec.x: ..." and "unknown field \"spec.x\"" in kubectl's message.
_PATH = re.compile(r'(?:^\* |is invalid: |unknown field ")(spec[^\s:"]*)', re.M)


def field_paths(message: str) -> set[str]:
    """The field paths that kubectl's error message names."""
    return set(_PATH.findall(message))


def policies(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            yield doc


@pytest.fixture(scope="module")
def server(kube_crd: Kube) -> Kube:
    """The control plane with the CRD, and the namespaces the examples and test files name."""
    namespaces = {
        doc["metadata"].get("namespace", "default") for p in [*EXAMPLES, *INVALID.glob("*.yaml")] for doc in policies(p)
    }
    for namespace in sorted(namespaces):
        kube_crd.ensure_namespace(namespace)
    return kube_crd


# --- the examples --------------------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_and_stored_with_the_defaults_the_offline_admission_predicts(
    server: Kube, example: Path
) -> None:
    result = server.run("apply", "-f", str(example))
    assert result.returncode == 0, result.stderr
    for doc in policies(example):
        meta = doc["metadata"]
        shown = yaml.safe_load(
            server.kubectl("get", "kvop", meta["name"], "-n", meta.get("namespace", "default"), "-o", "yaml")
        )
        predicted, problems = admit(doc)
        assert problems == []
        assert shown["spec"] == predicted["spec"]
        assert shown["spec"] != doc["spec"]  # the defaults are there to see


def test_stored_defaults_are_visible_with_kubectl_get_o_yaml(server: Kube) -> None:
    ns = server.namespace("defaults")
    minimal = {
        "apiVersion": POLICY_API,
        "kind": KIND,
        "metadata": {"name": "minimal", "namespace": ns},
        "spec": {
            "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
            "gpu": {"class": "nvidia-l4"},
            "replicas": 2,
            "resources": {"baseMemory": "4Gi"},
            "offload": {"cpu": "8Gi"},
        },
    }
    server.kubectl("apply", "-f", "-", stdin=json.dumps(minimal))
    shown = yaml.safe_load(server.kubectl("get", "kvop", "minimal", "-n", ns, "-o", "yaml"))["spec"]
    assert shown["offload"]["backend"] == "native"
    assert shown["gpu"]["count"] == 1
    assert shown["analysis"]["interval"] == "30s"
    assert "promotionSteps" in shown["rollout"]
    assert shown == admit(minimal)[0]["spec"]


# --- invalid policies ------------------------------------------------------------------------------


# What a strict kubectl apply (the default) reports for each file: the offline admission's paths, but
# for a file with an unknown field only that field, as the server stops at decoding.
SERVER_PATHS = {name: api for name, (_, api) in EXPECTED.items()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_invalid_file_is_refused_at_kubectl_apply_naming_the_field_paths(server: Kube, name: str) -> None:
    result = server.run("apply", "-f", str(INVALID / name))
    print(f"\n{name}: {result.stderr.strip()}")
    assert result.returncode != 0
    assert field_paths(result.stderr) == SERVER_PATHS[name]
    assert admit(yaml.safe_load((INVALID / name).read_text()))[1], "the offline admission must refuse it too"


def test_an_unknown_field_is_a_warning_with_validate_warn_and_the_rest_is_refused(server: Kube) -> None:
    result = server.run("apply", "--validate=warn", "-f", str(INVALID / "schema-mistakes.yaml"))
    assert result.returncode != 0
    assert f'Warning: unknown field "{UNKNOWN_FIELD}"' in result.stderr
    assert field_paths(result.stderr) - {UNKNOWN_FIELD} == SCHEMA_MISTAKES - {UNKNOWN_FIELD}
    # CEL rules are not run on an object that fails its schema; the server says so.
    assert "some validation rules were not checked because the object was invalid" in result.stderr


def test_an_overlong_quantity_is_refused_by_the_schema(server: Kube) -> None:
    obj = yaml.safe_load((paths.EXAMPLES / "qwen3-0.6b-cpu.yaml").read_text())
    obj["metadata"]["name"] = "overlong"
    obj["spec"]["offload"]["cpu"] = "1" * 65
    result = server.run("apply", "-f", "-", stdin=json.dumps(obj))
    assert result.returncode != 0
    assert field_paths(result.stderr) == {"spec.offload.cpu"}
    assert "Too long" in result.stderr


# --- the CEL rules: cel-python's verdict against the server's ---------------------------------------


def dry_run(server: Kube, spec_value: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """Create a policy with ``dryRun=All``; the status and the causes of a refusal."""
    ns = "default"
    body = {"apiVersion": POLICY_API, "kind": KIND, "metadata": {"name": "probe", "namespace": ns}, "spec": spec_value}
    request = server.api_client.param_serialize(
        method="POST",
        resource_path=f"/apis/{POLICY_API}/namespaces/{ns}/{PLURAL}",
        query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = server.api_client.call_api(*request)  # answers errors too; only the deserializer raises
    response.read()  # type: ignore[no-untyped-call]
    if response.status < 300:
        return response.status, []
    details = json.loads(response.data or b"{}").get("details") or {}
    return response.status, list(details.get("causes") or [{"message": response.data.decode()}])


def whole_spec(message: str, value: Any) -> dict[str, Any]:
    """A spec that carries ``value`` where the rule that says ``message`` judges it."""
    if message in SPEC_LEVEL or message in ENGINE_RULES:
        return copy.deepcopy(value)  # type: ignore[no-any-return]
    if message in POD_TEMPLATE_AT:
        return spec(podTemplate=POD_TEMPLATE_AT[message](value))
    if message.startswith("set exactly one of emptyDir"):
        return spec(offload__secondaryTiers=[tier(volume=value)])
    if message in CUSTOM_METRIC_RULES:
        return _spec_with("analysis.metrics", [value])
    return _spec_with(NODE_LEVEL[message], value)


def server_verdict(server: Kube, message: str, value: Any) -> bool:
    """True when the server accepts the object; False when it refuses it with this rule's message."""
    status, causes = dry_run(server, whole_spec(message, value))
    if status < 300:
        return True
    assert any(message in str(cause.get("message")) for cause in causes), (
        f"refused for something else than the rule: {causes}"
    )
    return False


@pytest.mark.parametrize(("message", "value", "ok"), CASE_PARAMS)
def test_the_server_and_cel_python_agree_on_every_case(server: Kube, message: str, value: Any, ok: bool) -> None:
    cel_python = bool(evaluate(rules_by_message()[message], value))
    assert server_verdict(server, message, value) == cel_python == ok


QUANTITY_PAIRS = [
    ("4Gi", "32Gi"),
    ("32Gi", "32Gi"),
    ("32767Mi", "32Gi"),
    ("34359738368", "32Gi"),
    ("34359738367", "32Gi"),
    ("1e3", "1Ki"),
    ("1024", "1Ki"),
    ("1023", "1Ki"),
    ("1k", "1Ki"),
    ("1Ki", "1k"),
    ("999m", "1"),
    ("1000m", "1"),
    ("0.5Gi", "512Mi"),
    ("0.4Gi", "512Mi"),
    ("+2Ki", "3Ki"),
    ("1E3", "1001"),
    ("1.5G", "1500M"),
    ("1.5G", "1500000001"),
    ("1P", "1Pi"),
    ("1Ei", "1E"),
    (1024, "2Ki"),
    ("12e-1", "2"),
]


@pytest.mark.parametrize(("pilot", "cpu"), QUANTITY_PAIRS)
def test_the_server_and_the_projects_quantity_library_compare_alike(server: Kube, pilot: Any, cpu: Any) -> None:
    message = "rollout.pilotCpu must be smaller than offload.cpu"
    value = spec(rollout__pilotCpu=pilot, offload__cpu=cpu)
    schema = openapi_schema()["properties"]["spec"]
    (rule,) = [e["rule"] for e in schema.get("x-kubernetes-validations", []) if e["message"] == message]
    assert server_verdict(server, message, value) == bool(evaluate(rule, value))


# --- what kubectl shows ----------------------------------------------------------------------------


def test_kubectl_get_kvop_shows_the_printer_columns(server: Kube) -> None:
    ns = server.namespace("columns")
    obj = yaml.safe_load((paths.EXAMPLES / "qwen3-0.6b-cpu.yaml").read_text())
    obj["metadata"]["namespace"] = ns
    server.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    name = obj["metadata"]["name"]
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "RolloutInProgress",
        "lastTransitionTime": "2026-12-07T00:00:00Z",
    }
    status = {
        "phase": "Canary",
        "stage": {"index": 1, "name": "cpu"},
        "tiersSummary": "cpu",
        "message": "step 1",
        "conditions": [ready],
    }
    server.kubectl(
        "patch", "kvop", name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status})
    )
    (version,) = crd_manifest()["spec"]["versions"]
    columns = version["additionalPrinterColumns"]

    table = server.kubectl("get", "kvop", "-n", ns).splitlines()
    wide = server.kubectl("get", "kvop", "-n", ns, "-o", "wide").splitlines()
    print("\n" + "\n".join(wide))

    header = re.split(r"\s{2,}", table[0].strip())
    assert header == ["NAME"] + [c["name"].upper() for c in columns if not c.get("priority")]
    assert re.split(r"\s{2,}", wide[0].strip()) == ["NAME"] + [c["name"].upper() for c in columns]
    row = re.split(r"\s{2,}", wide[1].strip())
    assert row[0] == name
    assert row[1:4] == ["Canary", "cpu", "cpu"]
    # kubectl leaves an empty cell blank: read Ready and Reason at their header's offset.
    starts, at = [], 0
    for title in ["NAME"] + [c["name"].upper() for c in columns]:
        at = wide[0].index(title, at)
        starts.append(at)
    cells = {wide[0][a:b].strip(): wide[1][a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}
    assert (cells["READY"], cells["REASON"]) == ("False", "RolloutInProgress")
    assert row[-1] == "step 1"


def test_the_server_refuses_two_conditions_of_one_type(server: Kube) -> None:
    """status.conditions is a map list keyed by type: a second Ready is a duplicate, not a second entry."""
    ns = server.namespace("conditions")
    obj = yaml.safe_load((paths.EXAMPLES / "qwen3-0.6b-cpu.yaml").read_text())
    obj["metadata"]["namespace"] = ns
    server.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": "RolloutInProgress",
        "lastTransitionTime": "2026-12-07T00:00:00Z",
    }
    twice = json.dumps({"status": {"conditions": [ready, {**ready, "status": "True"}]}})
    name = obj["metadata"]["name"]
    refused = server.run("patch", "kvop", name, "-n", ns, "--subresource=status", "--type=merge", "-p", twice)
    assert refused.returncode != 0
    assert 'status.conditions[1]: Duplicate value: {"type":"Ready"}' in refused.stderr


def test_kubectl_explain_prints_the_descriptions(server: Kube) -> None:
    text = server.kubectl("explain", "kvop.spec.offload")
    schema = openapi_schema()["properties"]["spec"]["properties"]["offload"]
    print("\n" + text)
    flat = " ".join(text.split())
    assert " ".join(schema["description"].split()) in flat
    for field, sub in schema["properties"].items():
        assert re.search(rf"^\s+{field}\s", text, re.M), field
        assert " ".join(sub["description"].split())[:60] in flat, field

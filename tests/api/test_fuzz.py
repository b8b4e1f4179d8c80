"""Policies generated from the CRD's own schema, mutated, and judged by everything that reads them.

Hypothesis starts from the valid policies the repository holds (the examples and tests/data/render-*.yaml)
and replaces one to three fields, chosen among every field the CRD's openAPIV3Schema names, with values drawn
from that field's schema: its boundaries and one past them, strings its pattern matches and strings past its
length, every enum value, quantities Kubernetes takes but no node holds (1e999999999), wrong types, and deletions.

Each case goes to:

- the real kube-apiserver (server-side dry run, strict field validation), with the CRD's CEL rules and the
  operator's admission webhook registered with ``failurePolicy: Fail`` so that an answer of 500 surfaces;
- ``kvoffload plan`` with the same admin leave as the operator (``--allowed-host-path`` ...);
- the operator, for a sample of what the server accepted: created for real, and reconciled by ``kvoffload run``.

For every case: the webhook never fails, ``plan`` exits 0 or 2 without a traceback, the server's verdict and the
CLI's agree, and the operator gives every created policy a status without one failed cycle. The number of cases
is printed in the test summary (``KVOFFLOAD_FUZZ_CASES`` sets it; the seed is fixed so CI is reproducible).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL
from kvoffload.api.quantity import QUANTITY_PATTERN
from kvoffload.cli.main import main
from kvoffload.controller import admission
from kvoffload_lab.controlplane import free_port
from tests.controller.test_admission_webhook import operator
from tests.policy.render_policies import policy_files
from tests.support.certificates import serving_certificate
from tests.support.controlplane import Kube, wait_for
from tests.support.crd_admission import openapi_schema
from tests.support.fuzz import fixed_seed
from tests.support.summary import report

pytestmark = pytest.mark.kube

CASES = int(os.environ.get("KVOFFLOAD_FUZZ_CASES", "300"))
CREATED_AT_MOST = 20
"""Accepted cases created for real for the operator to reconcile (each makes Deployments and a Service)."""
# The admin's leave, the same for the operator and for `kvoffload plan`.
LEAVE = ("--allowed-host-path", "/mnt", "--allowed-image", "docker.io/vllm/*")
DELETE = object()
"""A mutation that takes the field away."""
# Paths whose judgement needs what a file cannot hold (a ConfigMap in the cluster): not mutated.
SKIPPED = ("spec.model.configMap",)


def _bases() -> list[dict[str, Any]]:
    """The repository's valid policies, in the namespace the webhook watches (set per case)."""
    found = []
    for path in policy_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if (
                isinstance(doc, dict)
                and doc.get("kind") == "KVOffloadPolicy"
                and "configMap" not in doc["spec"]["model"]
            ):
                # Judged as the fuzzed operator judges: the lab's 127.0.0.1 Prometheus is not allowed it.
                doc["spec"].pop("prometheus", None)
                found.append(doc)
    return found


BASES = _bases()


def _fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field the schema names, with its node; list items as index 0, map values under key ``k``."""
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        if path != "" or name in ("spec", "metadata"):
            yield from _fields(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from _fields(schema["items"], f"{path}[0]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _fields(schema["additionalProperties"], f"{path}.k")


FIELDS = [(p, node) for p, node in _fields(openapi_schema(), "") if p.startswith("spec.") and not p.startswith(SKIPPED)]
JUNK = st.sampled_from([None, "", [], {}, True, -1, 0, 2**31, 2**63 - 1, "∞", "😀" * 3, "a\x00b"])
QUANTITIES = st.one_of(
    st.from_regex(QUANTITY_PATTERN, fullmatch=True).filter(lambda q: len(q) <= 64),
    st.sampled_from(["1e999999999", "9e5000", "1Pi", "1025Ti", "1e15", "1e16", "0", "-1Gi", "500m", "1.5Gi", "8Ei"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


def values_for(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values for one schema node: what it takes, its boundaries, and one past them."""
    if node.get("x-kubernetes-int-or-string"):
        return st.one_of(QUANTITIES, JUNK)
    options: list[st.SearchStrategy[Any]] = [JUNK, st.just(DELETE)]
    kind = node.get("type")
    if "enum" in node:
        options.append(st.sampled_from(node["enum"]))
    if kind == "integer":
        low, high = node.get("minimum", -(2**31)), node.get("maximum", 2**31)
        options += [st.integers(low - 2, low + 2), st.integers(high - 2, high + 2), st.integers(low, high)]
    elif kind == "number":
        low, high = node.get("minimum", -1e6), node.get("maximum", 1e6)
        options += [st.floats(low - 1, high + 1, allow_nan=False), st.sampled_from([1e308, -1e308, low, high])]
    elif kind == "boolean":
        options.append(st.booleans())
    elif kind == "string":
        longest = node.get("maxLength", 64)
        if "pattern" in node:
            options.append(st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: len(s) <= longest + 1))
        options += [st.text(max_size=12), st.just("x" * (longest + 1))]
        if node.get("pattern", "").startswith("^([0-9]+"):  # a duration
            options.append(st.sampled_from(["600000h", "721h", "720h", "0s", "1ns", "9" * 31 + "h"]))
    elif kind == "array":
        item = node.get("items") or {}
        # DELETE takes a field away; inside a list it would be a value no JSON can hold.
        items = values_for(item).filter(lambda v: v is not DELETE)
        options += [st.lists(items, max_size=3), st.just([]), st.just(["x"] * (node.get("maxItems", 8) + 1))]
    elif kind == "object":
        options.append(st.just({}))
    return st.one_of(options)


def mutated(base: dict[str, Any], changes: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    for path, value in changes:
        parts = [int(p) if p.isdigit() else p for p in re.split(r"\.|\[(\d+)\]", path) if p]
        node: Any = obj
        for part, after in zip(parts, [*parts[1:], None], strict=False):
            if after is None:
                break
            if isinstance(part, int):
                if not isinstance(node, list):
                    return obj  # the parent was replaced by something that is no list: nothing to change
                while len(node) <= part:
                    node.append({})
                node = node[part]
            else:
                if not isinstance(node, dict):
                    return obj
                if not isinstance(node.get(part), dict | list):
                    node[part] = [] if isinstance(after, int) else {}
                node = node[part]
        last = parts[-1]
        # A copy: JUNK's [] and {} are the same objects in every draw, and a later change would write into them
        # (once into themselves: a circular value no JSON holds).
        value = value if value is DELETE else copy.deepcopy(value)
        if isinstance(last, int):
            if isinstance(node, list) and value is not DELETE:
                node[last:] = [value]
        elif isinstance(node, dict):
            if value is DELETE:
                node.pop(last, None)
            else:
                node[last] = value
    return obj


CHANGES = st.lists(
    st.sampled_from(FIELDS).flatmap(lambda f: st.tuples(st.just(f[0]), values_for(f[1]))), min_size=1, max_size=3
)


@dataclass
class Tally:
    cases: int = 0
    accepted: int = 0
    refused_by_server: int = 0
    created: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)


def plan_verdict(tmp: Path, obj: dict[str, Any]) -> tuple[bool, str]:
    path = tmp / "policy.yaml"
    path.write_text(json.dumps(obj))  # JSON is YAML, and keeps every value's type as the API server gets it
    result = CliRunner().invoke(main, ["plan", str(path), *LEAVE])
    assert result.exit_code in (0, 2), f"plan exited {result.exit_code}: {result.output}\n{json.dumps(obj)}"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code == 0, result.stderr


def server_verdict(api: kubernetes.client.CustomObjectsApi, ns: str, obj: dict[str, Any]) -> tuple[bool, str]:
    refusal: ApiException | None = None
    try:
        api.create_namespaced_custom_object(
            API_GROUP, API_VERSION, ns, PLURAL, obj, dry_run="All", field_validation="Strict"
        )
    except ApiException as exc:
        refusal = exc
    if refusal is None:
        return True, ""
    body = str(refusal.body or "")
    assert refusal.status in (400, 422), f"the API server answered {refusal.status}: {body}\n{json.dumps(obj)}"
    assert "failed calling webhook" not in body, f"the webhook failed: {body}"
    return False, body


@pytest.fixture(scope="module")
def fuzzed(kube_crd: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kube, str, Path]]:
    """A namespace judged by the operator's webhook (failurePolicy Fail), with the operator running on it."""
    kube = kube_crd
    ns = kube.namespace("fuzz")
    tmp = tmp_path_factory.mktemp("fuzz")
    serving = serving_certificate(tmp / "tls")
    port = free_port()
    configuration = admission.validating_webhook_configuration(
        url=f"https://127.0.0.1:{port}",
        ca_bundle=serving.ca_pem,
        name=f"kvoffload-{ns}",
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": ns}},
    )
    configuration["webhooks"][0]["failurePolicy"] = "Fail"  # a 500 must show, not be ignored
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(configuration))
    try:
        with operator(kube, ns, serving, port, tmp / "operator.log", *LEAVE):
            yield kube, ns, tmp
    finally:
        kube.run("delete", "validatingwebhookconfiguration", f"kvoffload-{ns}")


def test_every_generated_policy_gets_the_same_verdict_everywhere_and_crashes_nothing(
    fuzzed: tuple[Kube, str, Path], request: pytest.FixtureRequest
) -> None:
    kube, ns, tmp = fuzzed
    api = kubernetes.client.CustomObjectsApi(kube.api_client)
    tally = Tally()

    @fixed_seed(CASES)
    @given(base=st.sampled_from(BASES), changes=CHANGES)
    def case(base: dict[str, Any], changes: list[tuple[str, Any]]) -> None:
        obj = mutated(base, changes)
        obj["metadata"] = {"name": f"fuzz-{tally.cases}", "namespace": ns}
        tally.cases += 1
        cli_ok, cli_says = plan_verdict(tmp, obj)
        server_ok, server_says = server_verdict(api, ns, obj)
        tally.accepted += server_ok
        tally.refused_by_server += not server_ok
        if cli_ok != server_ok:
            tally.disagreements.append(
                f"{changes!r}: plan {'accepts' if cli_ok else 'refuses'} ({cli_says.strip()[:300]}), "
                f"the server {'accepts' if server_ok else 'refuses'} ({server_says[:300]})"
            )
        if server_ok and len(tally.created) < CREATED_AT_MOST:
            api.create_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, obj)
            tally.created.append(obj["metadata"]["name"])

    case()

    items: dict[str, dict[str, Any]] = {}

    def statuses() -> dict[str, str] | None:
        items.clear()
        items.update({item["metadata"]["name"]: item for item in kube.get(PLURAL, "-n", ns)["items"]})
        phases = {name: (item.get("status") or {}).get("phase") for name, item in items.items()}
        return phases if all(phases.get(name) for name in tally.created) else None

    log = ""
    try:
        phases = wait_for(statuses, "a status on every created policy", timeout=120)
    finally:
        log = (tmp / "operator.log").read_text(errors="replace")
        for name in tally.created:
            if not (items.get(name, {}).get("status") or {}).get("phase"):
                print(f"no status on {name}: {json.dumps(items.get(name, {}).get('spec'))}\n{log[-3000:]}")
    summary = (
        f"fuzz: {tally.cases} generated policies, {tally.accepted} accepted and {tally.refused_by_server} refused by "
        f"kube-apiserver, {len(tally.disagreements)} disagreements with `kvoffload plan`, {len(tally.created)} "
        f"reconciled by the operator (phases: {sorted(set(phases.values()))})"
    )
    report(request.config, summary)
    assert not tally.disagreements, "\n".join(tally.disagreements)
    assert "reconcile failed" not in log, log[-5000:]
    assert "Traceback" not in log, log[-5000:]
    assert tally.accepted, summary  # the generator reaches both sides
    assert tally.refused_by_server, summary

"""``-o table|wide|json|yaml|name`` on every command that prints a document: yaml is the same content as json,
name is ``kvoffloadpolicy.kvoffload.io/NAME`` per policy as kubectl prints it, and wide is the table with the
columns a command has more to show (``list``: Ready, its reason, the generation acted on, the message).

``list`` and ``status`` read policies from the real kube-apiserver, their status as the operator wrote it in a
captured run (tests/data/status/)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND
from kvoffload.cli import watch
from kvoffload.cli.common import OUTPUTS, dump, resource_name
from kvoffload.cli.main import main
from tests.cli.test_analyze_table import SURE, analyze
from tests.cli.test_plan_cli import POLICY, plan
from tests.support.controlplane import Kube
from tests.support.status_fixtures import load


def test_a_policy_is_named_as_kubectl_names_it() -> None:
    assert resource_name("chat") == "kvoffloadpolicy.kvoffload.io/chat"


def test_yaml_is_the_same_document_as_json_non_ascii_kept() -> None:
    doc = {"ladder": "gpu-only ✓ → [cpu canary]", "levels": [{"index": 0, "cpuBytes": None}], "ratio": 1.5}
    assert yaml.safe_load(dump(doc, "yaml")) == json.loads(dump(doc, "json")) == doc
    assert "✓ →" in dump(doc, "yaml")
    assert "✓ →" in dump(doc, "json")
    with pytest.raises(ValueError, match="not a document format"):
        dump(doc, "wide")


@pytest.mark.parametrize("command", ["plan", "analyze", "status", "list", "get", "simulate"])
def test_every_command_with_json_offers_every_format(command: str) -> None:
    help_text = CliRunner().invoke(main, [command, "--help"]).output
    offered = re.search(r"-o, --output \[([a-z|]+)\]", help_text)
    assert offered is not None, help_text
    assert offered[1].split("|") == list(OUTPUTS)


def test_plan_as_yaml_is_plan_as_json(tmp_path: Path) -> None:
    as_json, as_yaml = plan(tmp_path, POLICY, "-o", "json"), plan(tmp_path, POLICY, "-o", "yaml")
    assert as_json.exit_code == as_yaml.exit_code == 0, as_json.output + as_yaml.output
    assert yaml.safe_load(as_yaml.output) == json.loads(as_json.output)
    assert not as_yaml.output.lstrip().startswith("{")


def test_plan_name_and_wide(tmp_path: Path) -> None:
    named = plan(tmp_path, POLICY, "-o", "name")
    assert (named.exit_code, named.output) == (0, "kvoffloadpolicy.kvoffload.io/qwen3-chat\n")
    assert plan(tmp_path, POLICY, "-o", "wide").output == plan(tmp_path, POLICY).output  # nothing more to show


def test_analyze_as_yaml_is_analyze_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code_json, as_json = analyze(tmp_path, monkeypatch, SURE, "-o", "json")
    code_yaml, as_yaml = analyze(tmp_path, monkeypatch, SURE, "-o", "yaml")
    assert code_json == code_yaml == 3  # Inconclusive: the exit code does not depend on the format
    assert yaml.safe_load(as_yaml) == json.loads(as_json)
    code, named = analyze(tmp_path, monkeypatch, SURE, "-o", "name")
    assert (code, named) == (3, "kvoffloadpolicy.kvoffload.io/chat\n")


def test_simulate_name_needs_a_policy_and_says_so_before_the_replay(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"hash_ids": [1, 2, 3]}\n')
    result = CliRunner().invoke(main, ["simulate", str(trace), "-o", "name"])
    assert result.exit_code == 2
    assert "-o name prints the policy simulated: give --policy FILE" in result.output


def test_a_watch_prints_each_change_in_the_format_asked() -> None:
    state = watch.progress(load("canary"))
    now = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
    assert watch.change(state, "table", now) == watch.change(state, "wide", now) == state.line(now)
    assert json.loads(watch.change(state, "json", now)) == state.document(now)
    as_yaml = watch.change(state, "yaml", now)
    assert as_yaml.startswith("---\n")
    assert yaml.safe_load(as_yaml) == state.document(now)
    assert watch.change(state, "name", now) == "kvoffloadpolicy.kvoffload.io/climb"


# --- on the real kube-apiserver -----------------------------------------------------------------------------


def create(kube: Kube, namespace: str, name: str, capture: str) -> None:
    """A policy with the status of a captured run, written through the status subresource as the operator does."""
    policy = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": load("stable")["spec"],
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
    patch = [{"op": "add", "path": "/status", "value": load(capture)["status"]}]
    kube.kubectl("patch", "kvop", name, "-n", namespace, "--subresource=status", "--type=json", "-p", json.dumps(patch))


def kvoffload(kube: Kube, *args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--kubeconfig", str(kube.kubeconfig)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def policies(kube_crd: Kube) -> str:
    namespace = kube_crd.namespace("formats")
    create(kube_crd, namespace, "chat", "stable")
    create(kube_crd, namespace, "search", "paused-inconclusive")
    return namespace


@pytest.mark.kube
def test_list_wide_adds_ready_reason_generation_and_message(kube_crd: Kube, policies: str) -> None:
    table = kvoffload(kube_crd, "list", "-n", policies)
    wide = kvoffload(kube_crd, "list", "-n", policies, "-o", "wide")
    rows = [re.split(r"\s{2,}", line.strip()) for line in wide.splitlines()]
    assert rows[0] == [
        "NAME", "PHASE", "LEVEL", "STEP", "TIERS", "CANARY/STABLE", "P99 TTFT", "AGE",
        "READY", "REASON", "GENERATION", "MESSAGE",
    ]  # fmt: skip
    assert [r[:2] + r[8:11] for r in rows[1:]] == [
        ["chat", "Stable", "True", "LadderComplete", "1/1"],
        ["search", "Paused", "False", "RolloutInProgress", "1/1"],
    ]
    assert rows[2][11] == load("paused-inconclusive")["status"]["message"]
    # The narrow table is the wide one without its last four columns.
    assert [re.split(r"\s{2,}", line.strip()) for line in table.splitlines()] == [r[:8] for r in rows]


@pytest.mark.kube
def test_list_as_name_and_as_yaml(kube_crd: Kube, policies: str) -> None:
    assert kvoffload(kube_crd, "list", "-n", policies, "-o", "name").splitlines() == [
        "kvoffloadpolicy.kvoffload.io/chat",
        "kvoffloadpolicy.kvoffload.io/search",
    ]
    as_yaml = yaml.safe_load(kvoffload(kube_crd, "list", "-n", policies, "-o", "yaml"))
    as_json = json.loads(kvoffload(kube_crd, "list", "-n", policies, "-o", "json"))
    assert [e["name"] for e in as_yaml] == ["chat", "search"]
    assert [{**e, "age": ""} for e in as_yaml] == [{**e, "age": ""} for e in as_json]  # read a moment apart
    assert (as_json[0]["ready"], as_json[0]["reason"]) == ("True", "LadderComplete")


@pytest.mark.kube
def test_status_as_yaml_name_and_wide(kube_crd: Kube, policies: str) -> None:
    as_json = json.loads(kvoffload(kube_crd, "status", "search", "-n", policies, "-o", "json"))
    assert yaml.safe_load(kvoffload(kube_crd, "status", "search", "-n", policies, "-o", "yaml")) == as_json
    assert as_json["status"]["phase"] == "Paused"
    named = kvoffload(kube_crd, "status", "search", "-n", policies, "-o", "name")
    assert named == "kvoffloadpolicy.kvoffload.io/search\n"
    wide = kvoffload(kube_crd, "status", "chat", "-n", policies, "-o", "wide")
    assert wide.splitlines()[0].startswith(f"{policies}/chat  phase Stable")

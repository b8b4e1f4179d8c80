"""The validating admission webhook, served by ``kvoffload run`` and called by the real kube-apiserver.

The operator runs as ``kvoffload run`` would in a cluster (a subprocess, with the admin
kubeconfig of the session's control plane), serving the webhook on 127.0.0.1 with a certificate
from a throwaway CA. The ValidatingWebhookConfiguration is :func:`validating_webhook_configuration`'s,
limited to the test's namespace (the control plane is shared). A policy that the schema lets
through but the catalogs and sizing do not is refused at ``kubectl apply`` with the message the
``Invalid`` condition carries; with the operator down it is accepted (failurePolicy Ignore), and the
operator, once back, marks it Invalid with that same message.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kvoffload.api.conventions import INVALID, PLURAL
from kvoffload.controller import admission
from kvoffload_lab.controlplane import free_port
from tests.policy.render_policies import RENDER_TENANCY
from tests.support import paths
from tests.support.certificates import Serving, serving_certificate
from tests.support.controlplane import Kube, wait_for
from tests.support.receiver import Receiver

pytestmark = pytest.mark.kube

EXAMPLE = paths.EXAMPLES / "qwen3-0.6b-cpu.yaml"
DENIED = f'admission webhook "{admission.WEBHOOK_NAME}" denied the request: '


def policy(ns: str, name: str, **spec_changes: Any) -> dict[str, Any]:
    """The small example, in ``ns`` under ``name``, with dotted-path changes to its spec."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"] = {"name": name, "namespace": ns}
    for dotted, value in spec_changes.items():
        node = obj["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return obj


def answers_tls(port: int, ca_pem: bytes) -> bool:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def operator(
    kube: Kube, ns: str, serving: Serving, port: int, log: Path, *extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``kvoffload run -n NS`` serving the webhook; stopped (SIGTERM, then SIGKILL) on exit."""
    command = [
        sys.executable,
        "-c",
        "from kvoffload.cli.main import main; main()",
        "run",
        "-n",
        ns,
        "--standalone",
        "--metrics-port=0",
        f"--webhook-port={port}",
        "--webhook-address=127.0.0.1",
        f"--webhook-cert={serving.certfile}",
        f"--webhook-key={serving.keyfile}",
        *extra,
    ]
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    with log.open("ab") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: answers_tls(port, serving.ca_pem) or (process.poll() is not None and pytest.fail(log.read_text())),
            "the operator's webhook to listen",
            timeout=60,
        )
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def setup(kube_crd: Kube, tmp_path: Path) -> Iterator[tuple[Kube, str, Serving, int]]:
    """A namespace, a certificate, a port, and the webhook registered for that namespace only."""
    kube = kube_crd
    ns = kube.namespace("webhook")
    serving = serving_certificate(tmp_path / "tls")
    port = free_port()
    configuration = admission.validating_webhook_configuration(
        url=f"https://127.0.0.1:{port}",
        ca_bundle=serving.ca_pem,
        name=f"kvoffload-{ns}",
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": ns}},
    )
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(configuration))
    try:
        yield kube, ns, serving, port
    finally:
        kube.run("delete", "validatingwebhookconfiguration", f"kvoffload-{ns}")


def apply(kube: Kube, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kube.run("apply", "-f", "-", stdin=json.dumps(obj))


def invalid_condition(kube: Kube, ns: str, name: str) -> str | None:
    status = kube.get(PLURAL, "-n", ns, name).get("status") or {}
    found = [c for c in status.get("conditions", []) if c["type"] == INVALID and c["status"] == "True"]
    return str(found[0]["message"]) if found else None


def test_refused_at_apply_with_the_invalid_message_and_accepted_while_the_webhook_is_down(
    setup: tuple[Kube, str, Serving, int], tmp_path: Path
) -> None:
    kube, ns, serving, port = setup
    log = tmp_path / "operator.log"
    unknown_gpu = policy(ns, "unknown-gpu", gpu__class="nvidia-h100")
    new_user = policy(ns, "new-user", gpu__class="nvidia-h100-80gb", offload__cpu="900Ti")

    with operator(kube, ns, serving, port, log):
        refused = apply(kube, unknown_gpu)
        print(f"\n{refused.stderr.strip()}")
        assert refused.returncode != 0
        assert DENIED in refused.stderr
        denial = refused.stderr.split(DENIED, 1)[1].strip()
        assert denial == admission.message(admission.problems(unknown_gpu))
        assert denial.startswith("spec.gpu.class: unknown GPU class 'nvidia-h100'; known: nvidia-h100-80gb")

        too_big = apply(kube, new_user)
        print(too_big.stderr.strip())
        assert too_big.returncode != 0
        assert f"{DENIED}spec.offload.cpu: the CPU tier (900.0 TiB pinned) is larger than a whole " in too_big.stderr

        good = apply(kube, policy(ns, "good"))
        assert good.returncode == 0, good.stderr
        broken = policy(ns, "good", offload__cpu="900Ti")
        edit = apply(kube, broken)
        assert edit.returncode != 0
        assert DENIED in edit.stderr
        assert kube.get(PLURAL, "-n", ns, "good")["spec"]["offload"]["cpu"] == "512Mi"

    # The webhook is down: failurePolicy Ignore lets the policy in.
    assert not answers_tls(port, serving.ca_pem)
    accepted = apply(kube, unknown_gpu)
    assert accepted.returncode == 0, accepted.stderr

    with operator(kube, ns, serving, port, log):
        # status Invalid is the backstop, with the message the webhook gave.
        message = wait_for(lambda: invalid_condition(kube, ns, "unknown-gpu"), "status Invalid", timeout=60)
        assert message == denial
        # A policy that got in can still be labelled and deleted: its spec does not change.
        labelled = kube.run("label", PLURAL, "-n", ns, "unknown-gpu", "team=inference")
        assert labelled.returncode == 0, labelled.stderr
        deleted = kube.run("delete", PLURAL, "-n", ns, "unknown-gpu", "--timeout=60s")
        assert deleted.returncode == 0, deleted.stderr
    print(f"operator log:\n{log.read_text()[-3000:]}")


def test_a_standby_replica_serves_the_webhook_and_reconciles_nothing_until_it_leads(
    setup: tuple[Kube, str, Serving, int], tmp_path: Path
) -> None:
    kube, ns, serving, port = setup
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    held = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "kvoffload-leader", "namespace": ns},
        "spec": {"holderIdentity": "the-leader", "leaseDurationSeconds": 300, "acquireTime": now, "renewTime": now},
    }
    assert apply(kube, held).returncode == 0
    election = ("--leader-elect", f"--lease={ns}/kvoffload-leader")
    with operator(kube, ns, serving, port, tmp_path / "operator.log", *election):
        refused = apply(kube, policy(ns, "unknown-gpu", gpu__class="nvidia-h100"))
        assert refused.returncode != 0
        assert DENIED in refused.stderr
        assert apply(kube, policy(ns, "good")).returncode == 0
        time.sleep(3)
        untouched = kube.get(PLURAL, "-n", ns, "good")
        assert untouched["status"] == {"observedGeneration": 0}, "a standby reconciled"  # the CRD's default
        assert not untouched["metadata"].get("finalizers")

        # The leader goes (its Lease handed back): the standby leads, and its webhook still answers.
        released = kube.run(
            "patch", "lease", "kvoffload-leader", "-n", ns, "--type=merge", "-p", '{"spec":{"holderIdentity":null}}'
        )
        assert released.returncode == 0, released.stderr
        wait_for(
            lambda: kube.get(PLURAL, "-n", ns, "good")["status"].get("phase"), "the new leader's status", timeout=30
        )
        wait_for(lambda: answers_tls(port, serving.ca_pem), "the leader's webhook", timeout=10)
        again = apply(kube, policy(ns, "unknown-gpu", gpu__class="nvidia-h100"))
        assert again.returncode != 0
        assert DENIED in again.stderr
        assert kube.get("lease", "-n", ns, "kvoffload-leader")["spec"]["holderIdentity"] != "the-leader"


def test_the_webhook_judges_what_the_operator_judges() -> None:
    """Offline: the handler's verdicts on the examples and on what only the catalogs and sizing see."""
    for example in sorted(paths.EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(example.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "KVOffloadPolicy":
                assert admission.problems(doc, RENDER_TENANCY) == [], example.name
    base = policy("llm", "p")
    cases = {
        "spec.gpu.class": {"gpu__class": "tpu-v5"},
        "spec.model.name": {"model__name": "acme/secret"},
        "spec.offload.cpu": {"gpu__class": "nvidia-l4", "offload__cpu": "1Pi"},
        "metadata.name": {},
    }
    for path, changes in cases.items():
        obj = policy("llm", "p", **changes) if changes else {**copy.deepcopy(base), "metadata": {"name": "9p"}}
        assert [e.path for e in admission.problems(obj)] == [path], path
    # A ConfigMap's model shape is the operator's to read: the webhook does not refuse for want of it.
    with_config_map = policy("llm", "p", model__name="acme/secret", model__configMap={"name": "acme"})
    assert admission.problems(with_config_map) == []


def test_the_configuration_points_at_the_handler_and_fails_open() -> None:
    made = admission.validating_webhook_configuration(url="https://127.0.0.1:9443/", ca_bundle=b"PEM")
    (hook,) = made["webhooks"]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/validate-policy", "caBundle": "UEVN"}
    assert hook["failurePolicy"] == "Ignore"
    assert hook["rules"][0]["resources"] == [PLURAL]
    with pytest.raises(ValueError, match="url or service"):
        admission.validating_webhook_configuration(ca_bundle=b"PEM")


def test_the_operator_refuses_a_webhook_port_without_a_certificate() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from kvoffload.cli.main import main; main()", "run", "-A", "--webhook-port=9443"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--webhook-port needs --webhook-cert and --webhook-key" in result.stderr


def test_the_charts_webhook_objects_are_accepted_by_the_real_server(kube_crd: Kube) -> None:
    """The chart's Secret, Service, ValidatingWebhookConfiguration and Deployment, server-side dry run."""
    ns = kube_crd.namespace("chart")
    with helm.Chart.load(paths.ROOT / "charts" / "kvoffload") as chart:
        rendered = chart.render({"webhook": {"enabled": True}}, name="kvo", namespace=ns)
    kinds = {"Secret", "Service", "ValidatingWebhookConfiguration", "Deployment"}
    objs = [
        obj
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj and obj["kind"] in kinds
    ]
    assert {obj["kind"] for obj in objs} == kinds
    result = kube_crd.run(
        "apply", "--dry-run=server", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    )
    assert result.returncode == 0, result.stderr
    assert (
        "validatingwebhookconfiguration.admissionregistration.k8s.io/kvo-kvoffload created (server dry run)"
        in result.stdout
    )


ABORT_SHARE = (
    'sum(rate(vllm:request_success_total{ {{ selector }}, finished_reason="abort"}[{{ window }}]))'
    " / sum(rate(vllm:request_success_total{ {{ selector }} }[{{ window }}]))"
)


def test_a_custom_metric_query_that_is_not_promql_is_refused_at_apply_and_the_policys_url_is_never_asked(
    setup: tuple[Kube, str, Serving, int], tmp_path: Path
) -> None:
    # Issue 33: admission once POSTed each query to {spec.prometheus.url}/api/v1/format_query, a URL the tenant
    # chose; `kubectl apply --dry-run=server` fired it and left nothing behind. Now the queries are parsed here.
    kube, ns, serving, port = setup
    metrics = [
        {"name": "abortShare", "query": ABORT_SHARE, "max": 0.01},
        {"name": "broken", "query": "sum(rate(vllm:num_requests_waiting{ {{ selector }} }))", "max": 5},
    ]
    with Receiver() as recorder:  # the tenant's "Prometheus": it records whatever reaches it
        url = recorder.url.removesuffix("/hook")
        fine = policy(ns, "fine", analysis__metrics=metrics[:1], prometheus__url=url)
        broken = policy(ns, "broken", analysis__metrics=metrics, prometheus__url=url)
        with operator(kube, ns, serving, port, tmp_path / "operator.log", "--prometheus-allow-private"):
            admitted = kube.run("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(fine))
            assert admitted.returncode == 0, admitted.stderr
            refused = kube.run("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(broken))
            assert refused.returncode != 0
            assert f"{DENIED}spec.analysis.metrics[1].query" in refused.stderr
            assert "not PromQL: expected type matrix in call to function 'rate', got vector" in refused.stderr
        assert recorder.requests == []


def post_review(port: int, ca_pem: bytes, body: bytes) -> tuple[int, str]:
    """POST to the operator's webhook directly, as the API server would (no API server in between)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}{admission.WEBHOOK_PATH}",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(errors="replace")


def test_the_operators_webhook_answers_a_review_it_cannot_read_with_a_4xx_never_a_500(
    setup: tuple[Kube, str, Serving, int], tmp_path: Path
) -> None:
    # Issue 33: kopf answered 500 to a review nested past the JSON parser's depth (RecursionError), which the API
    # server (up to 10,000 levels) sends on.
    kube, ns, serving, port = setup
    obj = policy(ns, "deep")
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "kvoffload.io", "version": "v1alpha1", "kind": "KVOffloadPolicy"},
            "resource": {"group": "kvoffload.io", "version": "v1alpha1", "resource": PLURAL},
            "operation": "CREATE",
            "userInfo": {"username": "tenant"},
            "object": obj,
        },
    }
    deep = '{"f:a": ' * 5000 + '"x"' + "}" * 5000  # written out: Python's own encoder stops at 1,000
    with operator(kube, ns, serving, port, tmp_path / "operator.log"):
        status, text = post_review(port, serving.ca_pem, json.dumps(review).encode())
        assert status == 200, text
        assert json.loads(text)["response"] == {"uid": "u-1", "allowed": True}  # the real handling, read whole
        obj["metadata"]["managedFields"] = [{"manager": "tenant", "fieldsV1": "DEEP"}]
        status, text = post_review(port, serving.ca_pem, json.dumps(review).replace('"DEEP"', deep).encode())
        assert status == 400, text
        assert "not a readable AdmissionReview" in text

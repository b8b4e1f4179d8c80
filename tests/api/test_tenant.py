"""A tenant who may write KVOffloadPolicies in its namespace, and nothing else, on the real API server.

The ServiceAccount ``tenant`` in ``team-a`` is bound to a Role that lets it create, get, update,
patch and list KVOffloadPolicies there; it talks to the session's kube-apiserver with a token of its
own (TokenRequest, ``kubectl create token``), so every request below is authenticated and authorised
as the tenant. The operator runs as ``kvoffload run`` would in a cluster, its admission webhook
registered for ``team-a``, with the admin's leave: the images ``docker.io/vllm/*``, hostPath tiers
under ``/mnt/nvme``, and its own Prometheus token (Secret ``kvoffload/prom-token``) sent only to the
allowed Prometheus, a stand-in on 127.0.0.1. Another recorder on 127.0.0.1 plays the attacker's
Prometheus: it records every request's headers.

Each abuse is refused at ``kubectl apply`` naming its field, by the CRD's schema and CEL rules or by
the webhook; with the webhook gone (failurePolicy Ignore) the CEL refusals stand and the rest get in,
but the operator marks them ``Invalid``, creates no Deployment, and sends nothing to the attacker.
``pytest -s`` prints the table of case and outcome.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.api.conventions import INVALID, LABEL_POLICY, PLURAL
from kvoffload.api.quantity import parse_duration
from kvoffload.controller import admission
from kvoffload.policy.tenancy import Tenancy
from kvoffload_lab.controlplane import free_port
from tests.controller.test_admission_webhook import operator
from tests.support import paths
from tests.support.certificates import serving_certificate
from tests.support.controlplane import Kube, wait_for

pytestmark = pytest.mark.kube

NS = "team-a"
TENANT = f"system:serviceaccount:{NS}:tenant"
ROOT = paths.ROOT
TOKEN_NS, TOKEN_SECRET = "kvoffload", "prom-token"
INTERVAL = "2s"
DENIED = f'admission webhook "{admission.WEBHOOK_NAME}" denied the request: '

CEL = "refused by CEL/schema"
WEBHOOK = "refused by webhook"
RBAC = "forbidden by RBAC"
ACCEPTED = "accepted"
INVALID_NO_DEPLOYMENT = "accepted, then Invalid, no Deployment"


# --- the attacker's Prometheus, and the allowed one ------------------------------------------


@dataclass
class Recorder:
    """An HTTP server on 127.0.0.1 that answers like an empty Prometheus and keeps every request's headers."""

    server: ThreadingHTTPServer
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def authorizations(self) -> list[str]:
        return [h["authorization"] for _, _, h in list(self.requests) if "authorization" in h]


@contextlib.contextmanager
def recorder() -> Iterator[Recorder]:
    seen: list[tuple[str, str, dict[str, str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            data: Any = {"resultType": "vector", "result": []} if "query" in self.path else []
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Recorder(server, seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- the tenant ------------------------------------------------------------------------------


@dataclass
class Setup:
    kube: Kube
    kubeconfig: Path
    attacker: Recorder
    allowed: Recorder
    token: str
    vwc: str
    log: Path
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)

    def as_tenant(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [self.kube.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60, check=False)

    def apply(self, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.as_tenant("apply", "-f", "-", stdin=json.dumps(obj))

    def record(self, case: str, outcome: str, message: str) -> None:
        short = " ".join(message.split())
        for prefix in (DENIED, '" is invalid: ', "is forbidden: "):
            short = short.split(prefix, 1)[-1]
        self.outcomes[case] = (outcome, short[:110])
        print(f"\n{case}: {outcome}: {message.strip()}")


def tenant_kubeconfig(kube: Kube, token: str, path: Path) -> Path:
    """The admin kubeconfig's cluster, with the tenant's token as its only credential."""
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "tenant", "user": {"token": token}}],
        "contexts": [{"name": "tenant", "context": {"cluster": cluster["name"], "user": "tenant", "namespace": NS}}],
        "current-context": "tenant",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def tenant_objects() -> list[dict[str, Any]]:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "policy-author", "namespace": NS},
        "rules": [
            {
                "apiGroups": ["kvoffload.io"],
                "resources": [PLURAL],
                "verbs": ["create", "get", "update", "patch", "list"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant-policy-author", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "policy-author"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": NS}],
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": NS}}
    return [account, role, binding]


@pytest.fixture(scope="module")
def setup(kube_crd: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    kube = kube_crd
    tmp = tmp_path_factory.mktemp("tenant")
    kube.ensure_namespace(NS)
    kube.ensure_namespace(TOKEN_NS)
    operator_token = f"operator-token-{secrets.token_hex(8)}"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET, "namespace": TOKEN_NS},
        "stringData": {"token": operator_token},
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    kube.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": tenant_objects()}))
    token = kube.kubectl("create", "token", "tenant", "-n", NS, "--duration=1h").strip()
    kubeconfig = tenant_kubeconfig(kube, token, tmp / "tenant.kubeconfig")

    serving = serving_certificate(tmp / "tls")
    port = free_port()
    vwc = f"kvoffload-{NS}"
    configuration = admission.validating_webhook_configuration(
        url=f"https://127.0.0.1:{port}",
        ca_bundle=serving.ca_pem,
        name=vwc,
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": NS}},
    )
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(configuration))
    log = tmp / "operator.log"
    with recorder() as attacker, recorder() as allowed:
        flags = (
            f"--prometheus-token-secret={TOKEN_NS}/{TOKEN_SECRET}",
            f"--prometheus-allowed-url={allowed.url}",
            "--allowed-image=docker.io/vllm/*",
            "--allowed-host-path=/mnt/nvme",
        )
        with operator(kube, NS, serving, port, log, *flags):
            state = Setup(kube, kubeconfig, attacker, allowed, operator_token, vwc, log)
            try:
                yield state
            finally:
                print_table(state.outcomes)
                # Deleted while the operator runs, so that its finalizer goes with them.
                kube.run("delete", PLURAL, "--all", "-n", NS, "--timeout=60s")
                kube.run("delete", "validatingwebhookconfiguration", vwc)
        print(f"operator log (tail):\n{log.read_text()[-2000:]}")
    kube.run("delete", "deployments", "--all", "-n", NS, "--wait=false")
    kube.run("delete", "secret", TOKEN_SECRET, "-n", TOKEN_NS)


def print_table(outcomes: dict[str, tuple[str, str]]) -> None:
    if not outcomes:
        return
    width = max(len(c) for c in outcomes)
    lines = [f"{'case':<{width}}  outcome", f"{'-' * width}  {'-' * 40}"]
    lines += [f"{case:<{width}}  {outcome}  | {message}" for case, (outcome, message) in outcomes.items()]
    print("\n\ntenant cases:\n" + "\n".join(lines))


# --- the policies -----------------------------------------------------------------------------


def harmless(name: str, prometheus: str, **changes: Any) -> dict[str, Any]:
    """An allowed image, a PVC tier, the allowed ``prometheus``, analysis every :data:`INTERVAL`; then
    ``changes`` (dotted paths, ``__`` for the dots)."""
    obj: dict[str, Any] = {
        "apiVersion": "kvoffload.io/v1alpha1",
        "kind": "KVOffloadPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
            "gpu": {"class": "nvidia-l4", "count": 1},
            "replicas": 2,
            "resources": {"baseMemory": "4Gi", "headroom": "1Gi", "cpu": "2"},
            "offload": {
                "backend": "native",
                "cpu": "2304Mi",
                "secondaryTiers": [
                    {
                        "name": "shared",
                        "size": "8Gi",
                        "path": "/mnt/kv-cache",
                        "volume": {"persistentVolumeClaim": {"claimName": "kv-shared"}},
                    }
                ],
            },
            "rollout": {"canaryReplicas": 1, "maxSurge": 0},
            "analysis": {"interval": INTERVAL},
            "prometheus": {"url": prometheus},
        },
    }
    for dotted, value in changes.items():
        node = obj["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return obj


def host_path(path: str) -> list[dict[str, Any]]:
    return [{"name": "nvme", "size": "8Gi", "path": "/mnt/kv-cache", "volume": {"hostPath": {"path": path}}}]


@dataclass(frozen=True)
class Case:
    id: str
    changes: dict[str, Any]
    path: str
    """The field path the refusal (and the Invalid condition) names."""
    by: str
    """CEL or WEBHOOK: which layer refuses it while the webhook is up."""


ATTACKER = "attacker"  # replaced by the recorder's URL
UNDER_ALLOWED = "allowed+"  # a value starting with it: the allowed Prometheus's URL, then the rest
LEAK = "sum(x{ {{ selector }} }) + 0x0e-kube_secret_info"
"""14 - kube_secret_info to Prometheus: a bare selector of every namespace, which the hand-written lexer read as
one number (issue 33)."""
CASES = (
    Case("1a-token-theft", {"prometheus__url": ATTACKER}, "spec.prometheus.url", WEBHOOK),
    Case("1b-metadata", {"prometheus__url": "http://169.254.169.254/"}, "spec.prometheus.url", WEBHOOK),
    Case("1c-metadata-decimal", {"prometheus__url": "http://2852039166/"}, "spec.prometheus.url", WEBHOOK),
    # Issue 33: the tenant chose the path (admission POSTed to it), or left the allowed prefix with a dot segment.
    Case(
        "1d-url-query",
        {"prometheus__url": UNDER_ALLOWED + "api/v1/admin/tsdb/delete_series?match[]=up#"},
        "spec.prometheus.url",
        CEL,
    ),
    Case("1e-url-dot-segment", {"prometheus__url": UNDER_ALLOWED + "team-a/../team-b"}, "spec.prometheus.url", CEL),
    Case("1f-ipv6-metadata", {"prometheus__url": "http://[fd00:ec2::254]/"}, "spec.prometheus.url", WEBHOOK),
    Case(
        "9a-promql-number-into-a-name",
        {"analysis__metrics": [{"name": "leak", "query": LEAK, "max": 1}]},
        "spec.analysis.metrics[0].query",
        WEBHOOK,
    ),
    Case(
        "9b-promql-another-namespace",
        {
            "analysis__metrics": [
                {"name": "leak", "query": 'sum(x{ {{ selector }}, namespace="kube-system" })', "max": 1}
            ]
        },
        "spec.analysis.metrics[0].query",
        WEBHOOK,
    ),
    Case(
        "2a-hostpath-root",
        {"offload__secondaryTiers": host_path("/")},
        "spec.offload.secondaryTiers[0].volume.hostPath.path",
        WEBHOOK,
    ),
    Case(
        "2b-hostpath-dotdot",
        {"offload__secondaryTiers": host_path("/mnt/nvme/../../etc")},
        "spec.offload.secondaryTiers[0].volume.hostPath.path",
        WEBHOOK,
    ),
    Case(
        "2c-hostpath-beside-root",
        {"offload__secondaryTiers": host_path("/mnt/nvme-other")},
        "spec.offload.secondaryTiers[0].volume.hostPath.path",
        WEBHOOK,
    ),
    Case("3-image", {"model__image": "evil.example.com/miner:latest"}, "spec.model.image", WEBHOOK),
    Case("4-ld-preload", {"model__env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}, "spec.model.env[0].name", CEL),
    Case(
        "5a-managed-spelt",
        {"model__extraArgs": ["--max_model_len=131072", "-tp", "8", "--kv_offloading_size=500"]},
        "spec.model.extraArgs",
        CEL,
    ),
    Case("5b-abbreviation", {"model__extraArgs": ["--max-model", "9"]}, "spec.model.extraArgs[0]", WEBHOOK),
    Case("5c-config-file", {"model__extraArgs": ["--config", "/x.yaml"]}, "spec.model.extraArgs", CEL),
    Case("5d-alias", {"model__extraArgs": ["--device-memory-utilization=0.99"]}, "spec.model.extraArgs", CEL),
    Case("5e-trust-remote-code", {"model__extraArgs": ["--trust-remote-code"]}, "spec.model.extraArgs[0]", WEBHOOK),
    Case("5f-kv-cache-bytes", {"model__extraArgs": ["--kv-cache-memory-bytes=80G"]}, "spec.model.extraArgs", CEL),
    Case("6a-huge-quantity", {"offload__cpu": "1e999999999"}, "spec.offload.cpu", CEL),
    Case("6c-quantity-over-1pi", {"offload__cpu": "1e99"}, "spec.offload.cpu", CEL),
    Case("6b-huge-duration", {"rollout__progressDeadline": "600000h"}, "spec.rollout.progressDeadline", CEL),
    # spec.podTemplate: what the overlay could reach for, were it not judged.
    Case(
        "8a-pod-hostpath",
        {"podTemplate": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
        "spec.podTemplate.volumes[0].hostPath.path",
        WEBHOOK,
    ),
    Case(
        "8b-service-account",
        {"podTemplate": {"serviceAccountName": "kvoffload"}},
        "spec.podTemplate.serviceAccountName",
        WEBHOOK,
    ),
    Case(
        "8c-priority-class",
        {"podTemplate": {"priorityClassName": "system-cluster-critical"}},
        "spec.podTemplate.priorityClassName",
        WEBHOOK,
    ),
    Case(
        "8d-selector-label",
        {"podTemplate": {"metadata": {"labels": {"kvoffload.io/policy": "someone-else"}}}},
        "spec.podTemplate.metadata.labels['kvoffload.io/policy']",
        WEBHOOK,
    ),
    Case(
        "8e-loader-prefix",
        {"podTemplate": {"envFrom": [{"prefix": "LD_", "secretRef": {"name": "x"}}]}},
        "spec.podTemplate.envFrom[0].prefix",
        CEL,
    ),
    Case(
        "8f-token-volume",
        {
            "podTemplate": {
                "volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]
            }
        },
        "spec.podTemplate.volumes[0].projected",
        CEL,
    ),
    Case(
        "8g-privileged",
        {"podTemplate": {"securityContext": {"privileged": True}}},
        "spec.podTemplate.securityContext",
        CEL,
    ),
    Case(
        "8h-shm-mount",
        {
            "podTemplate": {
                "volumes": [{"name": "mine", "emptyDir": {}}],
                "volumeMounts": [{"name": "mine", "mountPath": "/dev/shm"}],
            }
        },
        "spec.podTemplate.volumeMounts[0].mountPath",
        WEBHOOK,
    ),
    # Issue 33: another ServiceAccount's token Secret, every taint, other namespaces' pods, the security
    # profile container by container, leaving the mesh.
    Case(
        "8i-token-secret-volume",
        {"podTemplate": {"volumes": [{"name": "t", "secret": {"secretName": "builder-token-x7k2p"}}]}},
        "spec.podTemplate.volumes[0].secret.secretName",
        WEBHOOK,
    ),
    Case(
        "8j-keyless-toleration",
        {"podTemplate": {"tolerations": [{"operator": "Exists"}]}},
        "spec.podTemplate.tolerations[0].key",
        WEBHOOK,
    ),
    Case(
        "8k-other-namespace-affinity",
        {
            "podTemplate": {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"namespaces": ["team-b"], "topologyKey": "kubernetes.io/hostname"}
                        ]
                    }
                }
            }
        },
        "spec.podTemplate.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaces[0]",
        WEBHOOK,
    ),
    Case(
        "8l-every-namespace-affinity",
        {
            "podTemplate": {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}
                        ]
                    }
                }
            }
        },
        "spec.podTemplate.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector",
        CEL,
    ),
    Case(
        "8m-container-seccomp",
        {
            "podTemplate": {
                "metadata": {"annotations": {"container.seccomp.security.alpha.kubernetes.io/vllm": "unconfined"}}
            }
        },
        "spec.podTemplate.metadata.annotations",
        CEL,
    ),
    Case(
        "8n-mesh-opt-out",
        {"podTemplate": {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}}},
        "spec.podTemplate.metadata.annotations['sidecar.istio.io/inject']",
        WEBHOOK,
    ),
)


def policy_name(case: Case) -> str:
    return f"case-{case.id}"


def case_policy(case: Case, setup: Setup) -> dict[str, Any]:
    changes = {k: setup.attacker.url if v == ATTACKER else v for k, v in case.changes.items()}
    for key, value in changes.items():
        if isinstance(value, str) and value.startswith(UNDER_ALLOWED):
            changes[key] = setup.allowed.url + value.removeprefix(UNDER_ALLOWED)
    return harmless(policy_name(case), setup.allowed.url, **changes)


def tenancy(setup: Setup) -> Tenancy:
    """The operator's flags below, as the operator judges with them."""
    return Tenancy(
        host_path_roots=("/mnt/nvme",),
        image_patterns=("docker.io/vllm/*",),
        prometheus_url_prefixes=(setup.allowed.url,),
        operator_token=True,
    )


def layer(result: subprocess.CompletedProcess[str]) -> str:
    if result.returncode == 0:
        return ACCEPTED
    if DENIED in result.stderr:
        return WEBHOOK
    if f'User "{TENANT}" cannot' in result.stderr:
        return RBAC
    if 'The KVOffloadPolicy "' in result.stderr and '" is invalid: ' in result.stderr:
        return CEL
    if "strict decoding error: unknown field" in result.stderr:  # the schema has no such field
        return CEL
    return f"refused otherwise ({result.stderr.strip()})"


def phase_and_invalid(kube: Kube, name: str) -> tuple[str, str] | None:
    status = kube.get(PLURAL, "-n", NS, name).get("status") or {}
    found = [c for c in status.get("conditions", []) if c["type"] == INVALID and c["status"] == "True"]
    return (str(status.get("phase")), str(found[0]["message"])) if found else None


def deployments_of(kube: Kube, name: str) -> list[str]:
    listed = kube.get("deployments", "-n", NS, "-l", f"{LABEL_POLICY}={name}")
    return [d["metadata"]["name"] for d in listed["items"]]


# --- the tests ---------------------------------------------------------------------------------


def test_the_tenant_is_who_it_says(setup: Setup) -> None:
    """The token authenticates as the ServiceAccount, and the Role gives exactly the policy verbs."""
    who = setup.as_tenant("auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == TENANT
    for verb in ("create", "get", "update", "patch", "list"):
        assert setup.as_tenant("auth", "can-i", verb, f"{PLURAL}.kvoffload.io", "-n", NS).stdout.strip() == "yes"
    for verb, what, ns in (
        ("delete", f"{PLURAL}.kvoffload.io", NS),
        ("create", f"{PLURAL}.kvoffload.io", "default"),
        ("create", "pods", NS),
        ("create", "deployments.apps", NS),
        ("get", "secrets", TOKEN_NS),
    ):
        assert setup.as_tenant("auth", "can-i", verb, what, "-n", ns).stdout.strip() == "no", (verb, what, ns)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_abuse_is_refused_at_apply_naming_its_field(setup: Setup, case: Case) -> None:
    policy = case_policy(case, setup)
    if case.by == WEBHOOK:
        # The policy asks for this one thing too many and nothing else: the refusal is for it alone.
        assert [e.path for e in admission.problems(policy, tenancy(setup))] == [case.path]
    result = setup.apply(policy)
    outcome = layer(result)
    setup.record(case.id, outcome, result.stderr)
    assert result.returncode != 0, f"{case.id} was accepted: {result.stdout}"
    assert outcome == case.by, result.stderr
    assert case.path in result.stderr
    if case.by == WEBHOOK:
        assert result.stderr.split(DENIED, 1)[1].startswith(case.path), result.stderr
    assert "metadata.name" not in result.stderr
    assert setup.kube.run("get", PLURAL, "-n", NS, policy_name(case)).returncode != 0, "stored although refused"


def test_pods_and_deployments_are_not_the_tenants_to_make(setup: Setup) -> None:
    """The right to write a policy is not a right to run pods: the operator makes them, the tenant may not."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "miner", "namespace": NS},
        "spec": {"containers": [{"name": "miner", "image": "evil.example.com/miner:latest"}]},
    }
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "miner", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "miner"}},
            "template": {"metadata": {"labels": {"app": "miner"}}, "spec": pod["spec"]},
        },
    }
    for obj, resource in (
        (pod, 'resource "pods" in API group ""'),
        (deployment, 'resource "deployments" in API group "apps"'),
    ):
        result = setup.as_tenant("create", "-f", "-", stdin=json.dumps(obj))
        setup.record(f"7-{obj['kind'].lower()}", layer(result), result.stderr)
        assert result.returncode != 0
        assert layer(result) == RBAC, result.stderr
        assert f'User "{TENANT}" cannot create {resource} in the namespace "{NS}"' in result.stderr
    secret = setup.as_tenant("get", "secret", TOKEN_SECRET, "-n", TOKEN_NS)
    setup.record("7-read-operator-token", layer(secret), secret.stderr)
    assert layer(secret) == RBAC, secret.stderr
    elsewhere = setup.apply(
        {**harmless("elsewhere", setup.allowed.url), "metadata": {"name": "elsewhere", "namespace": "default"}}
    )
    setup.record("7-policy-in-default", layer(elsewhere), elsewhere.stderr)
    assert layer(elsewhere) == RBAC, elsewhere.stderr


def test_a_harmless_policy_is_accepted_and_its_prometheus_gets_the_operators_token(setup: Setup) -> None:
    """The refusals are not a webhook that refuses everything; and the operator does send its token to the
    allowed Prometheus, so the attacker's recorder would see it if it were sent there."""
    policy = harmless("harmless", setup.allowed.url)
    result = setup.apply(policy)
    assert result.returncode == 0, result.stderr
    assert "created" in result.stdout or "configured" in result.stdout
    made = wait_for(lambda: deployments_of(setup.kube, "harmless"), "the harmless policy's Deployment", timeout=60)
    wait_for(setup.allowed.authorizations, "a query at the allowed Prometheus", timeout=60)
    assert set(setup.allowed.authorizations()) == {f"Bearer {setup.token}"}
    assert setup.attacker.requests == []
    setup.record("9-harmless", f"{ACCEPTED}, Deployment {made}, token sent to the allowed Prometheus", result.stdout)


def test_a_gated_models_pod_template_is_accepted_and_reaches_the_engine_pods(setup: Setup) -> None:
    """The overlay a real model needs (HF_TOKEN from a Secret, a model cache on a PVC, pod labels) passes the
    webhook and the operator, and the API server stores the Deployment with them."""
    overlay = yaml.safe_load((ROOT / "examples" / "llama-3.1-8b-gated-pvc.yaml").read_text())["spec"]["podTemplate"]
    result = setup.apply(harmless("gated", setup.allowed.url, podTemplate=overlay))
    assert result.returncode == 0, result.stderr
    made = wait_for(lambda: deployments_of(setup.kube, "gated"), "the gated policy's Deployment", timeout=60)
    deployment = setup.kube.get("deployment", "-n", NS, made[0])
    pod = deployment["spec"]["template"]
    (engine,) = pod["spec"]["containers"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in engine["env"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache", "readOnly": True}} in pod[
        "spec"
    ]["volumes"]
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in engine["volumeMounts"]
    assert pod["metadata"]["labels"]["inference.networking.k8s.io/pool"] == "llama-8b"
    assert pod["spec"]["automountServiceAccountToken"] is False  # the hardening stays the operator's
    setup.record("9-gated-model", f"{ACCEPTED}, Deployment {made} with the Secret and the PVC", result.stdout)


def test_with_the_webhook_gone_cel_still_refuses_and_the_operator_marks_the_rest_invalid(setup: Setup) -> None:
    kube = setup.kube
    kube.kubectl("delete", "validatingwebhookconfiguration", setup.vwc)
    # The harmless policy's analyses are the operator's pulse: they show its cycles go on meanwhile.
    harmless_policy = harmless("harmless", setup.allowed.url)
    assert setup.apply(harmless_policy).returncode == 0

    let_in = []
    for case in CASES:
        result = setup.apply(case_policy(case, setup))
        if case.by == CEL:
            # The CRD's rules need no webhook.
            assert layer(result) == CEL, f"{case.id}: {result.stderr}"
            assert case.path in result.stderr
            setup.record(f"8-{case.id}-webhook-down", CEL, result.stderr)
            continue
        assert result.returncode == 0, f"{case.id}: {result.stderr}"  # failurePolicy Ignore: nothing judged
        let_in.append(case)
    assert let_in

    for case in let_in:
        phase, message = wait_for(
            functools.partial(phase_and_invalid, kube, policy_name(case)), f"{case.id} to be marked Invalid", timeout=60
        )
        assert phase == "Invalid"
        assert message.startswith(f"{case.path}: "), message
        # That one problem and no other: what the webhook would have said.
        assert message == admission.message(admission.problems(case_policy(case, setup), tenancy(setup)))
        assert deployments_of(kube, policy_name(case)) == []
        setup.record(f"8-{case.id}-webhook-down", INVALID_NO_DEPLOYMENT, f"phase {phase}: {message}")

    # A bounded observation window, not synchronisation: the token-theft policy is Invalid; give the operator
    # two more analysis intervals (and at least two more analyses of the harmless policy, so its loop did run)
    # to send anything to the attacker. It must have sent nothing at all, with or without a token.
    window = 2 * parse_duration(INTERVAL)
    start, analyses = time.monotonic(), len(setup.allowed.requests)
    wait_for(
        lambda: time.monotonic() - start >= window and len(setup.allowed.requests) >= analyses + 2,
        "two analysis intervals of the operator",
        timeout=60,
    )
    assert setup.attacker.requests == [], setup.attacker.requests
    assert setup.attacker.authorizations() == []
    for case in let_in:
        assert deployments_of(kube, policy_name(case)) == [], case.id
    assert deployments_of(kube, "harmless"), "the harmless policy lost its Deployment"

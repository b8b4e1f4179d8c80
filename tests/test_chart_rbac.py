"""The chart's RBAC, enforced by the real authorizer (kube-apiserver v1.37.2, ``Node,RBAC``).

The chart is installed into the session's real control plane with helm-python-sdk, and ``kvoffload run``
runs here as a subprocess, with the arguments the chart gives its container and the credentials of the
chart's ServiceAccount: a token from the TokenRequest API, never the admin's certificate. A scenario
drives policies through every call the operator makes (create: the finalizer an older operator left
taken away, children applied, status, Events; a model ConfigMap; bearer tokens from a policy's Secret and
from the operator's own; a manual promote that starts a canary and an abort that deletes it; a repeated
Event; deletion) and the operator's log must hold no 403. The same with peering on (its keep-alive written into
the ClusterKopfPeering the chart creates, and kopf's daemons holding a finalizer on each policy until deletion).

Then each verb of each rule the chart grants is taken away in turn (the role patched as the admin, the
authorizer asked until it agrees) and the same scenario must fail: a 403 for exactly that verb and
resource in the operator's log, or a step that never completes. So no rule is unused. The peering verbs
are taken away from an install with peering.

Secrets: the chart grants get on no Secret cluster-wide; a policy in a namespace the chart does not list
that names its own token Secret gets the PrometheusTokenUnreadable condition naming the Secret, and the
log says so once, not every cycle.
"""

from __future__ import annotations

import base64
import copy
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kvoffload.api.conventions import (
    ABORT,
    FINALIZER,
    PAUSE,
    PEERING_NAME,
    PROMETHEUS_TOKEN_UNREADABLE,
    PROMOTE,
    Reason,
)
from kvoffload_lab.controlplane import free_port
from tests.support import paths
from tests.support.controlplane import Kube, wait_for

pytestmark = pytest.mark.kube

CHART = paths.ROOT / "charts" / "kvoffload"
TEAM = "rbac-team"
"""The namespace the chart lists in prometheusAuth.policySecrets: its policies may name their own Secret."""
OTHER = "rbac-other"
"""A namespace the chart does not list: the operator reads no Secret there."""
OPERATOR_TOKEN, TEAM_TOKEN, LOCKED_TOKEN = "operator-s3cret", "team-s3cret", "locked-s3cret"
RECORDER_URL = f"http://127.0.0.1:{free_port()}"
"""The Prometheus stand-in's address: the only one the admin lets the operator's token go to."""
VALUES: dict[str, Any] = {
    "replicas": 0,  # the operator runs here, as a subprocess: there is no kubelet to run its pod
    "crds": {"install": False},  # kube_crd applied the CRD with kubectl: the session's releases leave it be
    "prometheusAuth": {
        "tokenSecret": {"name": "prometheus-token", "key": "token"},
        "policySecrets": [{"namespace": TEAM, "names": ["team-token"]}],
    },
    # The policy below is analysed every second, as in a one-machine lab: no floor.
    "tenancy": {"prometheusAllowedUrls": [RECORDER_URL], "minAnalysisInterval": "", "minAnalysisWindow": ""},
}


@dataclass(frozen=True)
class Install:
    """One helm install of the chart: the default (standalone), or with kopf peering."""

    name: str
    release: str
    namespace: str
    values: dict[str, Any]

    @property
    def account(self) -> str:
        """The chart's ServiceAccount (its fully qualified name)."""
        return f"{self.release}-kvoffload"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"

    @property
    def peering(self) -> bool:
        return bool(self.values.get("peering", {}).get("enabled"))


STANDALONE = Install("standalone", "kvo", "kvoffload-system", VALUES)
PEERING = Install("peering", "kvp", "kvoffload-peering", {**VALUES, "peering": {"enabled": True}})
FORBIDDEN = re.compile(r"forbidden|Not enough permissions", re.IGNORECASE)
"""A refusal in the operator's log: the API server's 403 ("... is forbidden: User ... cannot VERB resource
..."), or kopf's own words for one it works around (it then stops noticing CRD changes)."""
MODEL_CONFIG = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
POD_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "PodMonitor",
            "plural": "podmonitors",
            "singular": "podmonitor",
            "listKind": "PodMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}
"""The Prometheus Operator's PodMonitor kind, its schema left open: the operator applies one per policy."""


# --- a Prometheus stand-in that records the tokens it is sent -------------------------------------


class TokenRecorder:
    """An HTTP server that answers every query 503 and remembers each Authorization header."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.tokens.add(self.headers.get("Authorization", ""))
                self.send_response(503)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", int(RECORDER_URL.rsplit(":", 1)[1])), Handler)
        self.url = RECORDER_URL
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> TokenRecorder:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the installed chart and the operator's credentials --------------------------------------------


def render(install: Install) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(install.values, name=install.release, namespace=install.namespace)
    return [
        obj
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]


@dataclass
class Installed:
    kube: Kube
    install: Install
    objects: list[dict[str, Any]]
    kubeconfig: Path
    """The ServiceAccount's kubeconfig: the API server, its CA and a TokenRequest token. No admin rights."""
    args: list[str]
    """The operator container's arguments, as the chart renders them."""
    runs: list[int]
    """The number of scenarios run, shared by the installs so that policy names never repeat."""


def secret(name: str, namespace: str, value: str) -> dict[str, Any]:
    data = {"token": base64.b64encode(value.encode()).decode()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "data": data}


def service_account_kubeconfig(kube: Kube, install: Install, path: Path) -> Path:
    """A kubeconfig with a TokenRequest token for the chart's ServiceAccount, as the kubelet would project it."""
    token = kube.kubectl("create", "token", install.account, "-n", install.namespace, "--duration=2h").strip()
    ca = base64.b64encode(kube.plane.ca_file.read_bytes()).decode()
    cluster = {"server": kube.plane.server, "certificate-authority-data": ca}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": cluster}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "operator"}}],
        "current-context": "lab",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def install_chart(kube_crd: Kube, tmp_path_factory: pytest.TempPathFactory) -> Callable[[Install], Installed]:
    """Installs the chart (once per Install) with what the scenario needs around it."""
    kube = kube_crd
    kube.sweep_policies()  # the operator watches every namespace: only this module's policies may be there
    kube.sweep_workloads()
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(POD_MONITOR_CRD))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/podmonitors.monitoring.coreos.com")
    for namespace in (TEAM, OTHER):  # the chart's Roles go into namespaces that exist
        kube.ensure_namespace(namespace)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "model-config", "namespace": TEAM},
        "data": {"config.json": json.dumps(MODEL_CONFIG)},
    }
    for obj in (secret("team-token", TEAM, TEAM_TOKEN), secret("locked-token", OTHER, LOCKED_TOKEN), config_map):
        kube.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    done: dict[str, Installed] = {}
    runs = [0]

    def install_once(install: Install) -> Installed:
        if install.name not in done:
            with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=install.namespace) as config:
                config.install(str(CHART), install.release, install.values, create_namespace=True)
            token = secret("prometheus-token", install.namespace, OPERATOR_TOKEN)
            kube.kubectl("apply", "-f", "-", stdin=json.dumps(token))
            kubeconfig = service_account_kubeconfig(kube, install, tmp_path_factory.mktemp("operator") / "kubeconfig")
            objects = render(install)
            (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            done[install.name] = Installed(kube, install, objects, kubeconfig, list(container["args"]), runs)
        return done[install.name]

    return install_once


@pytest.fixture
def installed(install_chart: Callable[[Install], Installed]) -> Installed:
    return install_chart(STANDALONE)


def test_the_operator_runs_as_the_service_account_and_not_as_an_admin(installed: Installed) -> None:
    kube = installed.kube
    whoami = subprocess.run(
        [kube.kubectl_path, f"--kubeconfig={installed.kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    user = installed.install.user
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == user
    assert can(kube, user, "list", "kvoffloadpolicies.kvoffload.io", "-A")
    assert not can(kube, user, "create", "clusterroles.rbac.authorization.k8s.io")
    assert not can(kube, user, "get", "secrets", "-A"), "no Secret cluster-wide"


# --- the scenario ------------------------------------------------------------------------------------


class ScenarioFailed(Exception):
    """A step did not complete, or the operator was refused something."""


@dataclass
class Operator:
    """``kvoffload run`` with the chart's arguments, logging into a file."""

    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def forbidden(self) -> list[str]:
        return [line for line in self.text().splitlines() if FORBIDDEN.search(line)]


def start_operator(installed: Installed, log: Path) -> Operator:
    args = [re.sub(r"^--metrics-port=\d+$", f"--metrics-port={free_port()}", arg) for arg in installed.args]
    env = {**os.environ, "KUBECONFIG": str(installed.kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from kvoffload.cli.main import main; main()", "run", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return Operator(process, log)


def stop_operator(operator: Operator) -> None:
    if operator.process.poll() is None:
        operator.process.terminate()
        try:
            operator.process.wait(15)
        except subprocess.TimeoutExpired:
            operator.process.kill()
            operator.process.wait()


def policy(name: str, namespace: str, prometheus: dict[str, Any], *, config_map: bool = False) -> dict[str, Any]:
    """A vLLM policy; with ``config_map``, a TensorRT-LLM one whose model shape is read from a ConfigMap (its engine
    also reads its options from a file: a ConfigMap per level the operator writes)."""
    model: dict[str, Any] = {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096}
    engine = "vllm"
    if config_map:
        model = {**model, "name": "acme/private-llm", "configMap": {"name": "model-config"}}
        model["image"], engine = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0", "trtllm"
    return {
        "apiVersion": "kvoffload.io/v1alpha1",
        "kind": "KVOffloadPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "engine": engine,
            "model": model,
            "gpu": {"class": "nvidia-l4", "count": 1},
            "replicas": 2,
            "resources": {"baseMemory": "4Gi", "headroom": "1Gi", "cpu": "2"},
            "offload": {"cpu": "1Gi"},
            "rollout": {"canaryReplicas": 1, "maxSurge": 0, "baselineDuration": "1h", "progressDeadline": "10m"},
            "analysis": {"interval": "1s", "window": "10s", "minRequests": 5, "maxInconclusive": 10000},
            "prometheus": prometheus,
        },
    }


@dataclass
class Scenario:
    """One run: the operator, two policies, and what it did. ``step`` names the last step reached."""

    installed: Installed
    operator: Operator
    recorder: TokenRecorder
    timeout: float
    step: str = "start"
    done: list[str] = field(default_factory=list)

    @property
    def kube(self) -> Kube:
        return self.installed.kube

    def until(self, what: str, check: Callable[[], Any]) -> Any:
        """Poll ``check``; stop at once if the operator was refused anything or exited."""
        self.step = what
        deadline = time.monotonic() + self.timeout
        while True:
            refused = self.operator.forbidden()
            if refused:
                raise ScenarioFailed(f"{what}: the operator was refused: {refused[0]}")
            if self.operator.process.poll() is not None:
                raise ScenarioFailed(f"{what}: the operator exited {self.operator.process.returncode}")
            result = check()
            if result:
                self.done.append(what)
                return result
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"{what}: not done after {self.timeout:.0f} s")
            time.sleep(0.25)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.kube.run("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
        return json.loads(result.stdout) if result.returncode == 0 and result.stdout.strip() else None

    def status(self, name: str, namespace: str) -> dict[str, Any]:
        return (self.get("kvoffloadpolicy", name, namespace) or {}).get("status") or {}

    def annotate(self, name: str, namespace: str, key: str, value: str) -> None:
        self.kube.kubectl("annotate", "--overwrite", "kvoffloadpolicy", name, "-n", namespace, f"{key}={value}")

    def seen(self, name: str, namespace: str, key: str, value: str) -> bool:
        return self.status(name, namespace).get("annotationsSeen", {}).get(key) == value


def scenario(run: Scenario, tag: str) -> None:
    """Every call the operator makes, in the order a policy's life makes them."""
    chat, plain = f"chat-{tag}", f"plain-{tag}"
    own = {"url": run.recorder.url, "bearerTokenSecret": {"name": "team-token", "key": "token"}}
    daemons = run.installed.install.peering  # with peering, kopf daemons run the loops, and hold a finalizer
    first = policy(chat, TEAM, own, config_map=True)
    if not daemons:  # as an operator that ran kopf daemons left it: the upgraded one's kopf takes it away
        first["metadata"]["finalizers"] = [FINALIZER]
    run.kube.kubectl("apply", "-f", "-", stdin=json.dumps(first))
    other = policy(plain, OTHER, {"url": run.recorder.url})
    # Read (cluster-scoped) at every analysis. A name no other test creates: the session's API server is shared, and
    # a template that exists is judged by its metrics' names, not reported as template/<name>.
    other["spec"]["analysis"]["templates"] = [{"name": "rbac-gates"}]
    run.kube.kubectl("apply", "-f", "-", stdin=json.dumps(other))

    get = run.get
    run.until(
        "the finalizer" if daemons else "the old finalizer taken away",
        lambda: (
            (FINALIZER in ((get("kvoffloadpolicy", chat, TEAM) or {}).get("metadata") or {}).get("finalizers", []))
            is daemons
        ),
    )
    run.until("the status (the ConfigMap read)", lambda: run.status(chat, TEAM).get("phase") == "Baseline")
    run.until("the stable (gpu-only) Deployment", lambda: get("deployment", f"{chat}-gpu-only", TEAM))
    run.until("the stable's engine options file", lambda: get("configmap", f"{chat}-gpu-only", TEAM))
    run.until("the Service", lambda: get("service", chat, TEAM))
    run.until("the PodMonitor", lambda: get("podmonitor", chat, TEAM))
    run.until("the policy's own token sent to Prometheus", lambda: f"Bearer {TEAM_TOKEN}" in run.recorder.tokens)
    run.until(
        "the operator's token sent for the other policy", lambda: f"Bearer {OPERATOR_TOKEN}" in run.recorder.tokens
    )

    run.until(
        "the other policy's template looked for",
        lambda: any(
            m["name"] == "template/rbac-gates"
            for m in (run.status(plain, OTHER).get("lastAnalysis") or {}).get("metrics") or []
        ),
    )

    run.annotate(chat, TEAM, PROMOTE, "1")
    run.until("the canary (cpu) Deployment after a manual promote", lambda: get("deployment", f"{chat}-cpu", TEAM))
    run.annotate(chat, TEAM, ABORT, "1")
    run.until("the canary deleted after an abort", lambda: get("deployment", f"{chat}-cpu", TEAM) is None)
    run.until("the canary's options file deleted with it", lambda: get("configmap", f"{chat}-cpu", TEAM) is None)

    # RolledBack ignores a pause and says so in an Event: the same value twice is the same Event, counted.
    for value in ("a", "b", "a"):
        run.annotate(chat, TEAM, PAUSE, value)
        run.until(f"{PAUSE}={value} seen", lambda value=value: run.seen(chat, TEAM, PAUSE, value))

    def counted() -> bool:
        events = json.loads(run.kube.kubectl("get", "events", "-n", TEAM, "-o", "json"))["items"]
        return any(e["involvedObject"]["name"] == chat and (e.get("count") or 1) >= 2 for e in events)

    run.until("a repeated Event counted", counted)

    run.kube.kubectl("delete", "kvoffloadpolicy", chat, "-n", TEAM, "--wait=false")
    run.until("the policy gone", lambda: get("kvoffloadpolicy", chat, TEAM) is None)
    run.kube.kubectl("delete", "kvoffloadpolicy", plain, "-n", OTHER, "--wait=false")
    run.until("the other policy gone", lambda: get("kvoffloadpolicy", plain, OTHER) is None)


def cleanup(kube: Kube, tag: str) -> None:
    """What a failed run left: its policies, finalizer removed by the admin."""
    for name, namespace in ((f"chat-{tag}", TEAM), (f"plain-{tag}", OTHER), (f"locked-{tag}", OTHER)):
        if kube.run("get", "kvoffloadpolicy", name, "-n", namespace).returncode == 0:
            kube.run(
                "patch",
                "kvoffloadpolicy",
                name,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
            )
            kube.run("delete", "kvoffloadpolicy", name, "-n", namespace, "--wait=false", "--ignore-not-found")


def run_scenario(installed: Installed, tmp_path: Path, timeout: float) -> tuple[Scenario, ScenarioFailed | None]:
    installed.runs[0] += 1
    tag = str(installed.runs[0])
    peers_before = set(peers(installed.kube)) if installed.install.peering else set()
    # As on a fresh install: the leader creates its Lease (a Lease left by the last run would need no create).
    lease = next(arg for arg in installed.args if arg.startswith("--lease=")).removeprefix("--lease=")
    lease_namespace, _, lease_name = lease.partition("/")
    installed.kube.run("delete", "lease", lease_name, "-n", lease_namespace, "--ignore-not-found")
    operator = start_operator(installed, tmp_path / "operator.log")
    failure = None
    try:
        with TokenRecorder() as recorder:
            run = Scenario(installed, operator, recorder, timeout)
            try:
                if installed.install.peering:
                    run.until("the keep-alive in the peering object", lambda: set(peers(run.kube)) - peers_before)
                scenario(run, tag)
            except ScenarioFailed as exc:
                failure = exc
    finally:
        stop_operator(operator)
        cleanup(installed.kube, tag)
    return run, failure


@pytest.mark.parametrize("install", [STANDALONE, PEERING], ids=lambda install: install.name)
def test_the_operator_with_the_charts_service_account_runs_a_policy_through_every_call_with_no_403(
    install_chart: Callable[[Install], Installed], install: Install, tmp_path: Path
) -> None:
    installed = install_chart(install)
    started = time.monotonic()
    run, failure = run_scenario(installed, tmp_path, timeout=60)
    print(f"scenario: {len(run.done)} steps in {time.monotonic() - started:.1f} s")

    assert failure is None, f"{failure}\n--- operator log ---\n{run.operator.text()[-4000:]}"
    assert run.operator.forbidden() == []
    # The children went with the policy, through the real garbage collector.
    chat = f"chat-{installed.runs[0]}"
    children = (("deployment", f"{chat}-gpu-only"), ("configmap", f"{chat}-gpu-only"), ("service", chat))
    for kind, name in (*children, ("podmonitor", chat)):
        wait_for(lambda kind=kind, name=name: run.get(kind, name, TEAM) is None, f"{kind} {name} collected", 60)


# --- every verb of every rule is needed ---------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One verb of one rule of one of the chart's roles."""

    kind: str
    role: str
    namespace: str | None
    rule: int
    verb: str
    resources: tuple[str, ...]
    group: str
    names: tuple[str, ...]

    @property
    def id(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}:{where}{self.role}:{'+'.join(self.resources)}:{self.verb}"


def grants_of(objects: list[dict[str, Any]]) -> list[Grant]:
    found = []
    for role in (obj for obj in objects if obj["kind"] in ("ClusterRole", "Role")):
        for index, rule in enumerate(role["rules"]):
            for verb in rule["verbs"]:
                found.append(
                    Grant(
                        role["kind"],
                        role["metadata"]["name"],
                        role["metadata"].get("namespace"),
                        index,
                        verb,
                        tuple(rule["resources"]),
                        rule["apiGroups"][0],
                        tuple(rule.get("resourceNames", ())),
                    )
                )
    return found


GRANTS = [(STANDALONE, grant) for grant in grants_of(render(STANDALONE))] + [
    (PEERING, grant) for grant in grants_of(render(PEERING)) if grant.resources == ("clusterkopfpeerings",)
]
"""Every verb of the default install, and the peering verbs that an install with peering adds."""


def can(kube: Kube, user: str, verb: str, resource: str, *args: str) -> bool:
    """``kubectl auth can-i`` as ``user``, asked of the real authorizer."""
    result = kube.run("auth", "can-i", verb, resource, f"--as={user}", *args)
    return result.stdout.strip() == "yes"


def peers(kube: Kube) -> list[str]:
    """The kopf instances keeping alive in the cluster-wide peering object."""
    result = kube.run("get", "clusterkopfpeering", PEERING_NAME, "-o", "json", "--ignore-not-found")
    return list((json.loads(result.stdout).get("status") or {}) if result.stdout.strip() else {})


def can_grant(kube: Kube, user: str, grant: Grant) -> bool:
    resource = grant.resources[0] + (f".{grant.group}" if grant.group else "")
    if "/" in grant.resources[0]:  # a subresource: kubectl asks for it with --subresource
        plural, sub = grant.resources[0].split("/")
        resource = plural + (f".{grant.group}" if grant.group else "")
        extra = [f"--subresource={sub}"]
    else:
        extra = []
    if grant.names:
        resource += f"/{grant.names[0]}"
    scope = (
        ["-n", grant.namespace] if grant.namespace else (["-A"] if grant.verb in ("list", "watch") else ["-n", TEAM])
    )
    if grant.resources[0] in ("customresourcedefinitions", "clusterkopfpeerings"):  # cluster-scoped
        scope = []
    return can(kube, user, grant.verb, resource, *scope, *extra)


def role_without(role: dict[str, Any], grant: Grant) -> dict[str, Any]:
    changed = copy.deepcopy(role)
    rule = changed["rules"][grant.rule]
    rule["verbs"] = [verb for verb in rule["verbs"] if verb != grant.verb]
    if not rule["verbs"]:
        del changed["rules"][grant.rule]
    return changed


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"the authorizer never agreed: {what}"
        time.sleep(0.2)


@pytest.mark.parametrize(("install", "grant"), GRANTS, ids=[f"{i.name}:{grant.id}" for i, grant in GRANTS])
def test_taking_away_any_one_verb_of_the_charts_rbac_makes_the_scenario_fail(
    install_chart: Callable[[Install], Installed], install: Install, grant: Grant, tmp_path: Path
) -> None:
    installed = install_chart(install)
    kube, user = installed.kube, install.user
    where = ["-n", grant.namespace] if grant.namespace else []
    live = kube.get(grant.kind.lower(), grant.role, *where)
    for key in ("resourceVersion", "managedFields", "uid", "creationTimestamp"):
        live["metadata"].pop(key, None)
    assert can_grant(kube, user, grant), f"the installed chart does not grant {grant.id}"
    # PUT, not apply: the rules are the chart's (Helm's field manager), and this takes one verb out of them.
    kube.kubectl("replace", "-f", "-", stdin=json.dumps(role_without(live, grant)))
    try:
        wait_until(lambda: not can_grant(kube, user, grant), f"{grant.id} taken away")
        started = time.monotonic()
        run, failure = run_scenario(installed, tmp_path, timeout=20)
    finally:
        kube.kubectl("replace", "-f", "-", stdin=json.dumps(live))
        wait_until(lambda: can_grant(kube, user, grant), f"{grant.id} given back")
    print(f"without {grant.id}: failed at {failure} after {time.monotonic() - started:.1f} s")

    assert failure is not None, f"the scenario passed without {grant.id}: that verb is unused"
    refused = run.operator.forbidden()
    if refused:  # the refusal is of the verb taken away, on its resource
        resources = "|".join(map(re.escape, grant.resources))
        wanted = re.compile(
            rf'cannot {grant.verb} resource "({resources})"'
            + (r"|may not get Secret" if grant.resources == ("secrets",) else "")
            + (r"|Not enough permissions to watch for resources" if "customresourcedefinitions" in resources else "")
        )
        assert any(wanted.search(line) for line in refused), refused


# --- Secrets outside the listed namespaces ----------------------------------------------------------


def test_a_policy_naming_a_secret_the_operator_may_not_read_gets_a_condition_and_one_log_line(
    installed: Installed, tmp_path: Path
) -> None:
    kube = installed.kube
    user, home = installed.install.user, installed.install.namespace
    assert not can(kube, user, "get", "secrets/locked-token", "-n", OTHER)
    assert can(kube, user, "get", "secrets/team-token", "-n", TEAM)
    assert not can(kube, user, "get", "secrets/other", "-n", TEAM), "only the names the chart lists"
    assert can(kube, user, "get", "secrets/prometheus-token", "-n", home)
    assert not can(kube, user, "get", f"secrets/sh.helm.release.v1.{installed.install.release}.v1", "-n", home), (
        "nothing else in its own namespace"
    )

    installed.runs[0] += 1
    name = f"locked-{installed.runs[0]}"
    operator = start_operator(installed, tmp_path / "operator.log")
    try:
        with TokenRecorder() as recorder:
            run = Scenario(installed, operator, recorder, timeout=60)
            spec = {"url": recorder.url, "bearerTokenSecret": {"name": "locked-token", "key": "token"}}
            kube.kubectl("apply", "-f", "-", stdin=json.dumps(policy(name, OTHER, spec)))

            def condition() -> dict[str, Any] | None:
                found = [
                    c for c in run.status(name, OTHER).get("conditions", []) if c["type"] == PROMETHEUS_TOKEN_UNREADABLE
                ]
                return found[0] if found and found[0]["status"] == "True" else None

            deadline = time.monotonic() + 60
            while (found := condition()) is None:
                assert time.monotonic() < deadline, operator.text()[-3000:]
                time.sleep(0.25)
            # Ten more analysis cycles (one a second): the Secret is not asked for again, nor logged. Counted by their
            # times: no pod of the policy is Ready here, so its Inconclusive verdicts start no streak to count.
            cycles = {run.status(name, OTHER)["lastAnalysis"]["time"]}
            deadline = time.monotonic() + 60
            while len(cycles) < 11:
                assert time.monotonic() < deadline, operator.text()[-3000:]
                time.sleep(0.25)
                cycles.add(run.status(name, OTHER)["lastAnalysis"]["time"])
            events = json.loads(kube.kubectl("get", "events", "-n", OTHER, "-o", "json"))["items"]
            tokens = set(recorder.tokens)
    finally:
        stop_operator(operator)
        cleanup(kube, str(installed.runs[0]))

    assert found["reason"] == Reason.SECRET_FORBIDDEN
    assert f"Secret {OTHER}/locked-token" in found["message"]
    assert "spec.prometheus.bearerTokenSecret" in found["message"]
    assert "get on secrets" in found["message"]
    refused = operator.forbidden()
    assert len(refused) == 1, refused
    assert f"Secret {OTHER}/locked-token" in refused[0]
    warnings = [e for e in events if e["involvedObject"]["name"] == name and e["reason"] == Reason.SECRET_FORBIDDEN]
    assert len(warnings) == 1, warnings
    assert (warnings[0].get("count") or 1) == 1, "one Warning, not one a cycle"
    assert not tokens, "nothing is sent to Prometheus without the token the policy asks for"

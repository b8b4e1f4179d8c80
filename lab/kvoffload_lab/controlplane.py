"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

The binaries are built from pinned Go modules by ``scripts/build-kube.sh`` (see ``tools/kube``) into
``.kube-bin`` at the repository root, or wherever ``$KVOFFLOAD_KUBE_BIN`` points. :class:`ControlPlane`
starts them on 127.0.0.1, on free ports, with every file in one temporary directory, and secured as a
real cluster is: TLS everywhere with certificates from a CA generated for the run, client-certificate
authentication, a service-account signing key, ``--authorization-mode=Node,RBAC`` and the API server's
default admission plugins. The controller manager runs the controllers in :data:`CONTROLLERS`, each
with its own service-account credentials.

There is no kubelet and no kube-proxy: Pods are scheduled (bound to a Node) but never run, and
Service IPs lead nowhere. A Node object created by hand stands for a machine.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvoffload_lab.processes import end_process

HOST = "127.0.0.1"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
BIN_DIR_ENV = "KVOFFLOAD_KUBE_BIN"
"""Environment variable naming the folder with :data:`BINARIES`; default :func:`default_bin_dir`."""
SERVICE_CIDR = "10.96.0.0/16"
"""The Service IP range: addresses written into API objects only; nothing here routes to them. Large enough
for a Service per policy at 1,000 policies (bench/operator); a /24 ran out at 254."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
FRONT_PROXY_CLIENT = "front-proxy-client"
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    # Creates each namespace's "default" ServiceAccount, without which the ServiceAccount
    # admission plugin rejects every Pod.
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
)
"""The controllers kube-controller-manager runs. Not node-lifecycle: with no kubelet to report, it would
taint every Node unreachable."""

_STOP_GRACE_S = 10.0
_POLL_S = 0.2
_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """A component failed to start, or was not ready in time; the message ends with its log's last lines."""


def default_bin_dir() -> Path:
    """``$KVOFFLOAD_KUBE_BIN`` if set, else ``.kube-bin`` in the repository this module is part of."""
    configured = os.environ.get(BIN_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / ".kube-bin"


def missing_binaries(bin_dir: Path | None = None) -> list[str]:
    """The names in :data:`BINARIES` that are not executable files in ``bin_dir`` (default :func:`default_bin_dir`)."""
    folder = bin_dir if bin_dir is not None else default_bin_dir()
    return [name for name in BINARIES if not os.access(folder / name, os.X_OK) or not (folder / name).is_file()]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def build_script() -> Path:
    """``scripts/build-kube.sh`` of the source checkout this module is part of (a wheel has none)."""
    return Path(__file__).resolve().parents[2] / "scripts" / "build-kube.sh"


KUBE_BUILD_LIMIT_S = 45 * 60.0
"""A cold build took 11-15 minutes on 2 cores, 26 beside other work: one that runs three times that is stuck."""


async def _stop_build(build: asyncio.subprocess.Process) -> None:
    """SIGTERM the build's process group, SIGKILL it 10 s later, and wait at most 10 s more."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(build.pid, signum)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await build.wait()
                return


async def ensure_binaries(bin_dir: Path | None = None, *, progress: Callable[[str], None] = print) -> Path:
    """Build :data:`BINARIES` into ``bin_dir`` (default :func:`default_bin_dir`) with ``scripts/build-kube.sh``
    unless they are all there, telling ``progress`` each line the build prints (11-15 minutes cold on 2
    cores). Raises :class:`ControlPlaneError` when there is no script or the build fails; cancelled, it
    stops the build (its whole process group) before it returns."""
    folder = bin_dir if bin_dir is not None else default_bin_dir()
    missing = missing_binaries(folder)
    if not missing:
        return folder
    script = build_script()
    if not script.is_file():
        raise ControlPlaneError(
            f"missing in {folder}: {', '.join(missing)}; building them needs scripts/build-kube.sh from a source "
            f"checkout of kvoffload (or point ${BIN_DIR_ENV} at a folder that has them)"
        )
    progress(f"missing in {folder}: {', '.join(missing)}; building them with {script} (11-15 minutes cold)")
    began = time.monotonic()
    build = await asyncio.create_subprocess_exec(
        str(script),
        str(folder),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its go processes share its group, so they stop with it
    )
    assert build.stdout is not None
    try:
        async with asyncio.timeout(KUBE_BUILD_LIMIT_S):
            async for line in build.stdout:
                progress(line.decode(errors="replace").rstrip())
            code = await build.wait()
    except BaseException as exc:
        await _stop_build(build)
        if isinstance(exc, TimeoutError):
            raise ControlPlaneError(
                f"{script} did not finish in {KUBE_BUILD_LIMIT_S / 60:.0f} minutes; stopped"
            ) from exc
        raise
    if code != 0:
        raise ControlPlaneError(f"{script} exited with status {code} (its output is above)")
    still = missing_binaries(folder)
    if still:
        raise ControlPlaneError(f"{script} succeeded but {', '.join(still)} are still missing in {folder}")
    progress(f"built in {time.monotonic() - began:.0f} s")
    return folder


# --- certificates ---------------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclasses.dataclass(frozen=True)
class _KeyPair:
    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class _Pki:
    ca: Path
    front_proxy_ca: Path
    front_proxy_client: _KeyPair
    serving: _KeyPair
    admin: _KeyPair
    controller_manager: _KeyPair
    scheduler: _KeyPair
    service_account_key: Path
    service_account_pub: Path
    issuer: _Issuer


class _Issuer:
    """A throwaway CA: ECDSA P-256 (quick to generate), valid for a week from a few minutes ago."""

    def __init__(self, name: str) -> None:
        # Backdated so that a clock a little behind ours still accepts the certificates.
        self.not_before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        self.not_after = self.not_before + datetime.timedelta(days=7)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            self._builder(subject, self.key.public_key(), subject)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
        )

    def issue(
        self,
        folder: Path,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        sans: Sequence[x509.GeneralName] = (),
    ) -> _KeyPair:
        """A leaf certificate and key written to ``folder/stem.{crt,key}``: a server certificate when ``sans``
        is given, else a client one (Kubernetes reads the user from CN and the groups from O)."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if sans else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            self._builder(x509.Name(attributes), key.public_key(), self.cert.subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        pair = _KeyPair(folder / f"{stem}.crt", folder / f"{stem}.key")
        _write_private(pair.key, _pem_key(key))
        pair.cert.write_bytes(_pem_cert(builder.sign(self.key, hashes.SHA256())))
        return pair


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)


def _write_pki(folder: Path) -> _Pki:
    """The CA, one serving certificate for all three servers, a client certificate per user, and the
    service-account signing key pair; and, as kubeadm sets up, a second CA for the API server's
    front-proxy (aggregation) client, whose absence the controllers would keep logging as errors."""
    folder.mkdir(parents=True, exist_ok=True)
    issuer = _Issuer("kvoffload-lab-ca")
    ca = folder / "ca.crt"
    ca.write_bytes(_pem_cert(issuer.cert))
    front_proxy = _Issuer("kvoffload-lab-front-proxy-ca")
    front_proxy_ca = folder / "front-proxy-ca.crt"
    front_proxy_ca.write_bytes(_pem_cert(front_proxy.cert))
    service_ip = next(ipaddress.IPv4Network(SERVICE_CIDR).hosts())  # the "kubernetes" Service's ClusterIP
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.IPv4Address(HOST)),
        x509.IPAddress(service_ip),
        x509.DNSName("localhost"),
        *(x509.DNSName(name) for name in ("kubernetes", "kubernetes.default", "kubernetes.default.svc")),
    ]
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_key_path, sa_pub_path = folder / "sa.key", folder / "sa.pub"
    _write_private(sa_key_path, _pem_key(sa_key))
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return _Pki(
        ca=ca,
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=front_proxy.issue(folder, "front-proxy-client", FRONT_PROXY_CLIENT),
        serving=issuer.issue(folder, "serving", "kube-apiserver", sans=sans),
        admin=issuer.issue(folder, "admin", "kubernetes-admin", organization="system:masters"),
        # The user names that the RBAC bootstrap policy grants these components' permissions to.
        controller_manager=issuer.issue(folder, "controller-manager", "system:kube-controller-manager"),
        scheduler=issuer.issue(folder, "scheduler", "system:kube-scheduler"),
        service_account_key=sa_key_path,
        service_account_pub=sa_pub_path,
        issuer=issuer,
    )


def _write_kubeconfig(path: Path, server: str, ca: Path, user: str, pair: _KeyPair) -> Path:
    """A kubeconfig (JSON, which kubeconfig loaders read as YAML) with the certificates inline."""

    def b64(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [
            {"name": user, "user": {"client-certificate-data": b64(pair.cert), "client-key-data": b64(pair.key)}}
        ],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
        "current-context": "lab",
    }
    _write_private(path, json.dumps(config, indent=2).encode())
    return path


# --- processes ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def _probe(url: str, context: ssl.SSLContext | None) -> str | None:
    """The body of a 200 answer to GET ``url``; None for any other answer or none."""
    # Straight to loopback, whatever proxy the environment names.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode(errors="replace") if response.status == 200 else None
    except (OSError, ValueError):  # refused, reset, TLS not up yet, HTTP errors (URLError is an OSError)
        return None


def _answers_ok(url: str, context: ssl.SSLContext) -> Callable[[], bool]:
    """A check that ``url`` (a /readyz or /healthz endpoint) answers ``ok``."""
    return lambda: _probe(url, context) == "ok"


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler, started on 127.0.0.1.

    Use it as a context manager (or call :meth:`start` and :meth:`stop`): on exit every process it
    started has exited, and the temporary directory is gone unless ``workdir`` was given (the caller's
    to keep, with the components' logs in ``workdir/logs``). :meth:`start` returns once the API server
    answers ``/readyz`` and both controllers answer ``/healthz``, or raises :class:`ControlPlaneError`
    after stopping whatever it had started.
    """

    def __init__(self, bin_dir: Path | None = None, workdir: Path | None = None, *, timeout: float = 180.0) -> None:
        """``bin_dir`` holds :data:`BINARIES` (default :func:`default_bin_dir`); ``timeout`` bounds each
        component's start, in seconds."""
        self.bin_dir = bin_dir if bin_dir is not None else default_bin_dir()
        self._given_workdir = workdir
        self.timeout = timeout
        self.workdir: Path | None = None
        self.ready_s: dict[str, float] = {}
        """Seconds from each component's launch to its first healthy answer; ``total`` from start()."""
        self._processes: list[_Process] = []
        self._server: str | None = None
        self._kubeconfig: Path | None = None
        self._ca: Path | None = None
        self._admin: _KeyPair | None = None
        self._issuer: _Issuer | None = None

    # Public state, valid once start() has returned.

    @property
    def server(self) -> str:
        """The API server's URL, ``https://127.0.0.1:PORT``."""
        if self._server is None:
            raise ControlPlaneError("the control plane is not started")
        return self._server

    @property
    def kubeconfig(self) -> Path:
        """An admin kubeconfig (user ``kubernetes-admin`` in group ``system:masters``), written once the API
        server was ready."""
        if self._kubeconfig is None:
            raise ControlPlaneError("the control plane is not started")
        return self._kubeconfig

    @property
    def ca_file(self) -> Path:
        """The CA certificate that signed every serving and client certificate."""
        if self._ca is None:
            raise ControlPlaneError("the control plane is not started")
        return self._ca

    @property
    def client_cert(self) -> Path:
        """The admin's client certificate (PEM), the one the kubeconfig holds."""
        if self._admin is None:
            raise ControlPlaneError("the control plane is not started")
        return self._admin.cert

    @property
    def client_key(self) -> Path:
        """The admin's private key (PEM)."""
        if self._admin is None:
            raise ControlPlaneError("the control plane is not started")
        return self._admin.key

    def issue_loopback_certificate(self, folder: Path, stem: str) -> tuple[Path, Path]:
        """A server certificate for 127.0.0.1 and localhost, signed by the cluster's CA (which the API server
        trusts), written to ``folder/stem.{crt,key}``: for a webhook the API server calls on loopback."""
        if self._issuer is None:
            raise ControlPlaneError("the control plane is not started")
        folder.mkdir(parents=True, exist_ok=True)
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.IPv4Address(HOST)), x509.DNSName("localhost")]
        pair = self._issuer.issue(folder, stem, stem, sans=sans)
        return pair.cert, pair.key

    @property
    def pids(self) -> dict[str, int]:
        """The process id of each component started so far."""
        return {process.name: process.popen.pid for process in self._processes}

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start the four components in order, each once the one it needs is healthy; see the class."""
        if self._processes:
            raise ControlPlaneError("the control plane is already started")
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(f"missing in {self.bin_dir}: {', '.join(missing)} (run scripts/build-kube.sh)")
        began = time.monotonic()
        try:
            self._start(began)
        except BaseException:
            self.stop()
            raise
        self.ready_s["total"] = time.monotonic() - began
        return self

    def _start(self, began: float) -> None:
        if self._given_workdir is not None:
            self.workdir = self._given_workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="kvoffload-kube-"))
        work = self.workdir
        (work / "logs").mkdir(exist_ok=True)
        pki = _write_pki(work / "pki")
        self._ca = pki.ca
        self._admin = pki.admin
        self._issuer = pki.issuer
        self.ready_s["certificates"] = time.monotonic() - began
        tls = ssl.create_default_context(cafile=str(pki.ca))
        tls.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))

        etcd_url = f"http://{HOST}:{free_port()}"
        peer_url = f"http://{HOST}:{free_port()}"
        etcd = self._launch(
            "etcd",
            "--name=lab",
            f"--data-dir={work / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=lab={peer_url}",
            # Throwaway data: skipping fsync keeps a shared disk from setting the pace.
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        self._wait(etcd, lambda: '"health":"true"' in (_probe(f"{etcd_url}/health", None) or ""))

        server = f"https://{HOST}:{free_port()}"
        apiserver = self._launch(
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            # The endpoint reconciler refuses a loopback address for the "kubernetes" Service ("may not
            # be in the loopback range") and the server exits; nothing here reaches it through that Service.
            "--endpoint-reconciler-type=none",
            f"--secure-port={server.rsplit(':', 1)[1]}",
            f"--cert-dir={work / 'kube-apiserver'}",
            f"--tls-cert-file={pki.serving.cert}",
            f"--tls-private-key-file={pki.serving.key}",
            f"--client-ca-file={pki.ca}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--requestheader-client-ca-file={pki.front_proxy_ca}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
            f"--proxy-client-key-file={pki.front_proxy_client.key}",
        )
        self._wait(apiserver, _answers_ok(f"{server}/readyz", tls))
        self._server = server
        self._kubeconfig = _write_kubeconfig(work / "admin.kubeconfig", server, pki.ca, "kubernetes-admin", pki.admin)

        controller_manager_config = _write_kubeconfig(
            work / "controller-manager.kubeconfig",
            server,
            pki.ca,
            "system:kube-controller-manager",
            pki.controller_manager,
        )
        scheduler_config = _write_kubeconfig(
            work / "scheduler.kubeconfig", server, pki.ca, "system:kube-scheduler", pki.scheduler
        )
        probes: list[tuple[_Process, str]] = []
        for name, kubeconfig, extra in (
            (
                "kube-controller-manager",
                controller_manager_config,
                (
                    f"--controllers={','.join(CONTROLLERS)}",
                    "--use-service-account-credentials",
                    f"--root-ca-file={pki.ca}",
                    f"--service-account-private-key-file={pki.service_account_key}",
                ),
            ),
            ("kube-scheduler", scheduler_config, ()),
        ):
            port = free_port()
            process = self._launch(
                name,
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={HOST}",
                f"--secure-port={port}",
                f"--cert-dir={work / name}",
                f"--tls-cert-file={pki.serving.cert}",
                f"--tls-private-key-file={pki.serving.key}",
                "--leader-elect=false",  # the only instance
                *extra,
            )
            probes.append((process, f"https://{HOST}:{port}/healthz"))
        for process, url in probes:
            self._wait(process, _answers_ok(url, tls))

    def _launch(self, name: str, *args: str) -> _Process:
        assert self.workdir is not None
        log = self.workdir / "logs" / f"{name}.log"
        with log.open("wb") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                [str(self.bin_dir / name), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        process = _Process(name, popen, log, time.monotonic())
        self._processes.append(process)
        return process

    def _wait(self, process: _Process, healthy: Callable[[], bool]) -> None:
        deadline = process.started + self.timeout
        while not healthy():
            code = process.popen.poll()
            if code is not None:
                raise ControlPlaneError(
                    f"{process.name} exited with status {code} before it was healthy; "
                    f"the end of {process.log}:\n{_log_tail(process.log)}"
                )
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{process.name} not healthy after {self.timeout:.0f} s; "
                    f"the end of {process.log}:\n{_log_tail(process.log)}"
                )
            time.sleep(_POLL_S)
        self.ready_s[process.name] = time.monotonic() - process.started

    def stop(self) -> None:
        """Stop every component, last started first (SIGTERM, then SIGKILL after a grace period), wait for
        each to exit, and remove the temporary directory if this object made it. Safe to call twice."""
        for process in reversed(self._processes):
            if process.popen.poll() is None:
                end_process(process.popen, name=process.name, grace=_STOP_GRACE_S)
        self._processes.clear()
        self._server = None
        self._kubeconfig = None
        self._ca = None
        self._admin = None
        self._issuer = None
        if self.workdir is not None and self._given_workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

"""The webhook's serving certificate in the chart: stable across upgrades, from cert-manager, or provided.

Generated (the default): the chart makes a CA and a serving certificate once and keeps them in the
Secret (``ca.crt`` beside ``tls.crt`` and ``tls.key``); every later render finds the Secret with
Helm's ``lookup`` and renders the same data and caBundle. Offline (``Chart.render``, like ``helm
template`` and Argo CD) ``lookup`` finds nothing, so there each render generates anew: shown here
too, as the reason for the two other ways. Against the real kube-apiserver (marker ``kube``):
``Config.render`` (cluster-aware, ``lookup`` live) with a stand-in Secret, and a real ``helm
install`` then ``helm upgrade`` through helm-python-sdk, after which the Secret and the caBundle are
byte-identical and the caBundle verifies the serving certificate.

cert-manager: a Certificate for the Service's names writes the same Secret, the configuration names
it in ``cert-manager.io/inject-ca-from`` and carries no caBundle. Provided: the user's Secret and
caBundle, nothing generated, the same on every render. The built-in kinds of both pass
kubernetes-validate (strict); cert-manager's kinds pass a schema of the cert-manager.io/v1 fields
the chart renders.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from collections.abc import Iterable
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.support import paths
from tests.support.certificates import ca_and_certificate
from tests.support.controlplane import Kube

CHART = paths.ROOT / "charts" / "kvoffload"
RELEASE, NAMESPACE = "kvo", "kvoffload-system"
K8S_VERSION = "1.33"
FULLNAME = f"{RELEASE}-kvoffload"
SERVICE = f"{FULLNAME}-webhook"
SECRET = f"{FULLNAME}-webhook-tls"
DNS_NAMES_ANNOTATION = "kvoffload.io/webhook-dns-names"
EXPIRES_ANNOTATION = "kvoffload.io/webhook-expires"

Obj = dict[str, Any]


def service_names(service: str, namespace: str) -> list[str]:
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}", service]


# --- cert-manager.io/v1, the fields the chart renders (cert-manager's CRDs: certificates, issuers) ---

_META: Obj = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_ISSUER_REF: Obj = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}, "group": {"type": "string"}},
}
# fmt: off
USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
    "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
    "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
]
# fmt: on
_GO_DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
CERTIFICATE_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["secretName", "issuerRef"],
            "additionalProperties": False,
            "properties": {
                "secretName": {"type": "string"},
                "secretTemplate": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
                "commonName": {"type": "string", "maxLength": 64},
                "dnsNames": {"type": "array", "items": {"type": "string"}},
                "duration": {"type": "string", "pattern": _GO_DURATION},
                "isCA": {"type": "boolean"},
                "usages": {
                    "type": "array",
                    "items": {"enum": USAGES},
                },
                "privateKey": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "size": {"type": "integer"},
                        "encoding": {"enum": ["PKCS1", "PKCS8"]},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    },
                },
                "issuerRef": _ISSUER_REF,
            },
        },
    },
}
ISSUER_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Issuer"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "selfSigned": {"type": "object", "additionalProperties": False},
                "ca": {
                    "type": "object",
                    "required": ["secretName"],
                    "additionalProperties": False,
                    "properties": {"secretName": {"type": "string"}},
                },
            },
        },
    },
}


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterable[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def parse(rendered: dict[str, str]) -> list[Obj]:
    return [
        obj
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]


def render(chart: helm.Chart, values: Obj) -> list[Obj]:
    """Offline, as ``helm template`` and Argo CD render: ``lookup`` finds nothing."""
    return parse(chart.render(values, name=RELEASE, namespace=NAMESPACE))


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objs if obj["kind"] == kind]


def only(objs: list[Obj], kind: str) -> Obj:
    (match,) = of_kind(objs, kind)
    return match


def client_config(objs: list[Obj]) -> Obj:
    (hook,) = only(objs, "ValidatingWebhookConfiguration")["webhooks"]
    config: Obj = hook["clientConfig"]
    return config


def mounted_secret(objs: list[Obj]) -> str:
    """The Secret the operator's pod mounts at the path of --webhook-cert and --webhook-key."""
    pod = only(objs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert f"--webhook-cert={mount['mountPath']}/tls.crt" in container["args"]
    assert f"--webhook-key={mount['mountPath']}/tls.key" in container["args"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    name: str = volume["secret"]["secretName"]
    return name


def validate(objs: list[Obj]) -> None:
    """Built-in kinds through kubernetes-validate (strict), cert-manager's through their schemas."""
    for obj in objs:
        if obj["kind"] == "Certificate":
            jsonschema.validate(obj, CERTIFICATE_SCHEMA)
        elif obj["kind"] == "Issuer":
            jsonschema.validate(obj, ISSUER_SCHEMA)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def verify_serving(ca_bundle_b64: str, data: Obj, names: list[str]) -> None:
    """The caBundle signed tls.crt, tls.key is its key, and it names the Service as the API server calls it."""
    ca = x509.load_pem_x509_certificate(base64.b64decode(ca_bundle_b64))
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    key = serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), password=None)
    assert key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names) <= set(sans.get_values_for_type(x509.DNSName))
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=30)


def pem(obj: x509.Certificate) -> bytes:
    return obj.public_bytes(serialization.Encoding.PEM)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def make_ca_and_serving(names: list[str], days: int = 365) -> tuple[bytes, bytes, bytes]:
    """(ca.crt, tls.crt, tls.key) PEM: a CA, and a serving certificate for ``names`` signed by it."""
    return ca_and_certificate([x509.DNSName(n) for n in names], days, ca_name="test-webhook-ca")


WEBHOOK: Obj = {"webhook": {"enabled": True}}
CERT_MANAGER: Obj = {"webhook": {"enabled": True, "certManager": {"enabled": True}}}


# --- generated, offline ----------------------------------------------------------------------------


def test_the_generated_secret_keeps_its_ca_and_the_ca_bundle_is_read_from_it(chart: helm.Chart) -> None:
    objs = render(chart, WEBHOOK)
    validate(objs)
    secret = only(objs, "Secret")
    assert secret["metadata"]["name"] == SECRET == mounted_secret(objs)
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert client_config(objs)["caBundle"] == secret["data"]["ca.crt"]
    names = service_names(SERVICE, NAMESPACE)
    verify_serving(secret["data"]["ca.crt"], secret["data"], names)
    annotations = secret["metadata"]["annotations"]
    assert annotations[DNS_NAMES_ANNOTATION] == ",".join(names)
    expires = datetime.datetime.fromisoformat(annotations[EXPIRES_ANNOTATION])
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert abs(expires - cert.not_valid_after_utc) < datetime.timedelta(minutes=1)


def test_offline_renders_cannot_see_the_secret_and_generate_anew(chart: helm.Chart) -> None:
    """What `helm template` and Argo CD get in the generated way: why they need cert-manager or provided."""
    first, second = render(chart, WEBHOOK), render(chart, WEBHOOK)
    assert only(first, "Secret")["data"] != only(second, "Secret")["data"]
    assert client_config(first)["caBundle"] != client_config(second)["caBundle"]


# --- cert-manager ----------------------------------------------------------------------------------


def test_cert_manager_with_its_own_self_signed_chain(chart: helm.Chart) -> None:
    objs = render(chart, CERT_MANAGER)
    validate(objs)
    assert not of_kind(objs, "Secret")
    assert "caBundle" not in client_config(objs)
    issuers = {obj["metadata"]["name"]: obj["spec"] for obj in of_kind(objs, "Issuer")}
    certificates = {obj["metadata"]["name"]: obj["spec"] for obj in of_kind(objs, "Certificate")}
    assert issuers == {
        f"{FULLNAME}-webhook-selfsigned": {"selfSigned": {}},
        f"{FULLNAME}-webhook-ca": {"ca": {"secretName": f"{FULLNAME}-webhook-ca"}},
    }
    ca = certificates.pop(f"{FULLNAME}-webhook-ca")
    assert ca["isCA"] is True
    assert ca["secretName"] == f"{FULLNAME}-webhook-ca"
    assert ca["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": f"{FULLNAME}-webhook-selfsigned"}
    ((name, serving),) = certificates.items()
    assert serving["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": f"{FULLNAME}-webhook-ca"}
    assert serving["secretName"] == SECRET == mounted_secret(objs)
    assert serving["dnsNames"] == service_names(SERVICE, NAMESPACE)
    assert "server auth" in serving["usages"]
    annotations = only(objs, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotations == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{name}"}
    # Nothing random: every render is the same.
    assert render(chart, CERT_MANAGER) == objs


def test_cert_manager_with_a_given_issuer_makes_only_the_certificate(chart: helm.Chart) -> None:
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer"}
    values = {"webhook": {"enabled": True, "certManager": {"enabled": True, "issuerRef": issuer}}}
    objs = render(chart, values)
    validate(objs)
    assert not of_kind(objs, "Issuer")
    assert not of_kind(objs, "Secret")
    certificate = only(objs, "Certificate")
    assert certificate["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp-ca"}
    assert certificate["spec"]["secretName"] == mounted_secret(objs)
    annotations = only(objs, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{certificate['metadata']['name']}"
    assert "caBundle" not in client_config(objs)


# --- provided ---------------------------------------------------------------------------------------


def test_a_provided_certificate_renders_nothing_generated_and_the_same_every_time(chart: helm.Chart) -> None:
    ca_pem, _, _ = make_ca_and_serving(service_names(SERVICE, NAMESPACE))
    provided = {"existingSecret": "my-webhook-tls", "caBundle": b64(ca_pem)}
    values = {"webhook": {"enabled": True, "certificate": provided}}
    objs = render(chart, values)
    validate(objs)
    assert not [obj for obj in objs if obj["kind"] in ("Secret", "Certificate", "Issuer")]
    assert mounted_secret(objs) == "my-webhook-tls"
    assert client_config(objs)["caBundle"] == b64(ca_pem)
    assert "annotations" not in only(objs, "ValidatingWebhookConfiguration")["metadata"]
    assert render(chart, values) == objs


@pytest.mark.parametrize(
    ("webhook", "complaint"),
    [
        (
            {"certManager": {"enabled": True}, "certificate": {"existingSecret": "s", "caBundle": "QUJD"}},
            "/webhook/certificate/existingSecret",
        ),
        ({"certificate": {"existingSecret": "s"}}, "/webhook/certificate/caBundle"),
        ({"certificate": {"caBundle": "QUJD"}}, "/webhook/certificate/existingSecret"),
        ({"certificate": {"existingSecret": "s", "caBundle": "not base64!"}}, "/webhook/certificate/caBundle"),
        ({"certificate": {"existingSecret": "Not_A_Name", "caBundle": "QUJD"}}, "/webhook/certificate/existingSecret"),
        ({"certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer"}}}, "/webhook/certManager/issuerRef"),
        ({"certManager": {"enabled": True, "issuer": "corp-ca"}}, "'issuer' not allowed"),
        ({"certificate": {"secret": "s"}}, "'secret' not allowed"),
    ],
)
def test_bad_certificate_values_are_refused_naming_the_key(chart: helm.Chart, webhook: Obj, complaint: str) -> None:
    values = {"webhook": {"enabled": True, **webhook}}
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(values)


def test_a_ca_bundle_that_is_not_pem_is_refused_at_render(chart: helm.Chart) -> None:
    values = {"webhook": {"enabled": True, "certificate": {"existingSecret": "s", "caBundle": b64(b"just text")}}}
    with pytest.raises(helm.HelmError, match="base64-encoded PEM"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    "values",
    [WEBHOOK, CERT_MANAGER, {"webhook": {"enabled": True, "certificate": {"existingSecret": "s", "caBundle": "QUJD"}}}],
    ids=["generated", "cert-manager", "provided"],
)
def test_each_way_lints_without_warnings(values: Obj) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# --- generated, against the real kube-apiserver -----------------------------------------------------


def stand_in(namespace: str, *, names: list[str], keys: Iterable[str], expires: datetime.datetime) -> Obj:
    """A Secret as an earlier install left it (or an older chart, or one about to expire)."""
    ca_pem, cert_pem, key_pem = make_ca_and_serving(names)
    data = {"tls.crt": b64(cert_pem), "tls.key": b64(key_pem), "ca.crt": b64(ca_pem)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": SECRET,
            "namespace": namespace,
            "annotations": {
                DNS_NAMES_ANNOTATION: ",".join(names),
                EXPIRES_ANNOTATION: expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        },
        "type": "kubernetes.io/tls",
        "data": {k: v for k, v in data.items() if k in keys},
    }


def live_render(kube: Kube, chart: helm.Chart, namespace: str) -> list[Obj]:
    """Cluster-aware, as `helm install`/`helm upgrade` render: ``lookup`` asks the API server."""
    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=namespace) as config:
        return parse(config.render(chart, WEBHOOK, name=RELEASE, namespace=namespace, is_upgrade=True))


LATER = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)
ALL_KEYS = ("tls.crt", "tls.key", "ca.crt")


@pytest.mark.kube
def test_renders_that_find_the_secret_render_it_again_and_its_ca_bundle(control_plane: Kube, chart: helm.Chart) -> None:
    namespace = control_plane.namespace("whcert")
    secret = stand_in(namespace, names=service_names(SERVICE, namespace), keys=ALL_KEYS, expires=LATER)
    control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    renders = [live_render(control_plane, chart, namespace) for _ in range(2)]
    for objs in renders:
        assert only(objs, "Secret")["data"] == secret["data"]
        assert only(objs, "Secret")["metadata"]["annotations"] == secret["metadata"]["annotations"]
        assert client_config(objs)["caBundle"] == secret["data"]["ca.crt"]
    assert renders[0] == renders[1]


@pytest.mark.kube
@pytest.mark.parametrize(
    ("why", "names", "keys", "expires"),
    [
        ("no ca.crt (an older chart's Secret)", None, ("tls.crt", "tls.key"), LATER),
        ("other DNS names", ["other.example.svc"], ALL_KEYS, LATER),
        ("expiring within 30 days", None, ALL_KEYS, datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=10)),
    ],
    ids=["missing-ca", "other-names", "expiring"],
)
def test_a_secret_that_will_not_do_is_made_anew(
    control_plane: Kube,
    chart: helm.Chart,
    why: str,
    names: list[str] | None,
    keys: tuple[str, ...],
    expires: datetime.datetime,
) -> None:
    namespace = control_plane.namespace("whcert")
    wanted = service_names(SERVICE, namespace)
    secret = stand_in(namespace, names=names or wanted, keys=keys, expires=expires)
    control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    objs = live_render(control_plane, chart, namespace)
    data = only(objs, "Secret")["data"]
    assert data["tls.crt"] != secret["data"]["tls.crt"], why
    assert set(data) == set(ALL_KEYS)
    verify_serving(client_config(objs)["caBundle"], data, wanted)


@pytest.mark.kube
def test_helm_upgrade_keeps_the_secret_and_the_ca_bundle_byte_for_byte(control_plane: Kube) -> None:
    release, namespace = "kvw", "kvw-webhook"
    # The session's plane may hold the CRD from kube_crd's kubectl apply, which no release may then take.
    values: Obj = {"replicas": 0, "webhook": {"enabled": True}, "crds": {"install": False}}
    fullname = f"{release}-kvoffload"

    def live() -> tuple[Obj, str]:
        secret = control_plane.get("secret", f"{fullname}-webhook-tls", "-n", namespace)
        configuration = control_plane.get("validatingwebhookconfiguration", fullname)
        (hook,) = configuration["webhooks"]
        return secret, hook["clientConfig"]["caBundle"]

    with helm.Config(kubeconfig_path=str(control_plane.kubeconfig), namespace=namespace) as config:
        try:
            config.install(str(CHART), release, values, create_namespace=True)
            secret, ca_bundle = live()
            assert secret["type"] == "kubernetes.io/tls"
            verify_serving(ca_bundle, secret["data"], service_names(f"{fullname}-webhook", namespace))
            # An upgrade that changes something else, and one that changes nothing.
            for upgrade_values in ({**values, "verbose": True}, values):
                config.upgrade(str(CHART), release, upgrade_values)
                again, again_bundle = live()
                assert again["data"] == secret["data"]
                assert again["metadata"]["annotations"] == secret["metadata"]["annotations"]
                assert again_bundle == ca_bundle
            assert [r["revision"] for r in config.history(release)] == [1, 2, 3]
        finally:
            config.uninstall(release, ignore_not_found=True)
            control_plane.run("delete", "namespace", namespace, "--wait=false")

"""A throwaway CA and a serving certificate signed by it, for the webhook servers that tests start."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclasses.dataclass(frozen=True)
class Serving:
    ca_pem: bytes
    certfile: Path
    keyfile: Path


def ca_and_certificate(
    names: list[x509.GeneralName], days: int = 1, ca_name: str = "kvoffload-test-webhook-ca"
) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, its key), PEM: a throwaway CA, and a certificate for the subject
    alternative ``names`` signed by it, valid for ``days``."""
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(issuer)
        .issuer_name(issuer)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(names[0].value))]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem


def serving_certificate(folder: Path, host: str = "127.0.0.1") -> Serving:
    """A CA and a certificate for ``host`` (an IP address) signed by it, written into ``folder``."""
    ca_pem, cert_pem, key_pem = ca_and_certificate([x509.IPAddress(ipaddress.ip_address(host))])
    folder.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = folder / "tls.crt", folder / "tls.key"
    certfile.write_bytes(cert_pem)
    keyfile.write_bytes(key_pem)
    return Serving(ca_pem, certfile, keyfile)

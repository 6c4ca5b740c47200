"""Test PKI for a local control plane.

The API server runs with client-certificate authentication and RBAC, so every process
a test starts gets its own identity (CN = user, O = groups) and exactly the rights the
chart grants it. Keys are ECDSA P-256: fast to generate, accepted by kube-apiserver for
TLS, client auth and service-account token signing.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.oid import NameOID

_VALIDITY = datetime.timedelta(days=7)
_SKEW = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its PEM private key, both on disk."""

    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, ca: bool
) -> x509.CertificateBuilder:
    """A certificate for `key`, valid from an hour ago for a week: a CA's (signs certificates and CRLs) or a
    leaf's (signs and enciphers keys)."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SKEW)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


class CertAuthority:
    """A self-signed CA that issues serving and client certificates into `directory`."""

    def __init__(self, directory: Path, common_name: str = "gpushare-test-ca") -> None:
        self.directory = Path(directory)
        self._key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self._cert = (
            _builder(name, name, self._key, ca=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = _write(
            self.directory / "ca.crt",
            self._cert.public_bytes(serialization.Encoding.PEM),
        )
        self.key_path = _write(self.directory / "ca.key", _key_pem(self._key), private=True)

    def _issue(
        self,
        file_stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> CertPair:
        key = _new_key()
        builder = (
            _builder(subject, self._cert.subject, key, ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return CertPair(
            cert=_write(
                self.directory / f"{file_stem}.crt",
                cert.public_bytes(serialization.Encoding.PEM),
            ),
            key=_write(self.directory / f"{file_stem}.key", _key_pem(key), private=True),
        )

    def issue_server(
        self,
        file_stem: str,
        common_name: str,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> CertPair:
        """A TLS serving certificate valid for the given DNS names and IPs."""
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        return self._issue(file_stem, subject, ExtendedKeyUsageOID.SERVER_AUTH, dns_names, ip_addresses)

    def issue_client(self, file_stem: str, user: str, groups: Iterable[str] = ()) -> CertPair:
        """A client certificate the API server maps to `user` in `groups` (CN and O)."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(file_stem, x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH)


def apiserver_sans(extra_ips: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """DNS names and IPs an in-cluster or loopback client may use for the API server."""
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster",
        "kubernetes.default.svc.cluster.local",
    ]
    return dns, ["127.0.0.1", "10.0.0.1", *extra_ips]


def write_service_account_keys(directory: Path) -> CertPair:
    """The key pair kube-apiserver signs and verifies service-account tokens with.

    `cert` holds the PEM public key (not a certificate): the API server accepts either.
    """
    key = _new_key()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    directory = Path(directory)
    return CertPair(
        cert=_write(directory / "sa.pub", public),
        key=_write(directory / "sa.key", _key_pem(key), private=True),
    )

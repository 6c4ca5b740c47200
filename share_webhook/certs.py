"""The webhook's serving certificate without cert-manager: a CA and a serving certificate kept in one
Secret, made by whichever replica starts first, rotated before they expire, and the CA written into the
webhook configurations' caBundle.

Why this way (docs/operations.md, "Admission webhook"): helm's `genCA` in a template makes a new CA on
every `helm upgrade` (the running pods' certificate no longer matches until they restart) and puts the key
in the release manifest; a pre-install Job (kube-webhook-certgen) needs an image of its own and runs only
at install. Here the key exists only in the Secret, which survives `helm upgrade` untouched (the chart does
not template it), and rotation needs no one: every replica re-reads the Secret and reloads its
certificate. With cert-manager (`webhook.certManager.enabled`), cert-manager owns the Secret and the
caBundle and this module is not used (the server reloads the mounted files instead).

Races: replicas create the Secret with create-if-absent and replace it with the resourceVersion they read;
the loser of a race re-reads and serves the winner's certificate. A new CA is added to the caBundle beside
the old one until the old one's serving certificates are gone, so rotation never breaks a call in flight.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.oid import NameOID

CA_DAYS = 3650
SERVING_DAYS = 365
# Renew a certificate once less than this share of its life is left (a year's serving cert: ~4 months).
RENEW_FRACTION = 1 / 3
KEY_CA, KEY_CERT, KEY_KEY, KEY_PREVIOUS_CA = "ca.crt", "tls.crt", "tls.key", "ca-previous.crt"


@dataclass(frozen=True, slots=True)
class Bundle:
    """PEM text of the CA, the serving certificate and its key, and a retired CA still trusted (or "")."""

    ca: str
    cert: str
    key: str
    ca_key: str = ""
    previous_ca: str = ""

    def ca_bundle(self) -> str:
        """What the webhook configurations trust: the CA, and the previous one during a rotation."""
        return self.ca + self.previous_ca


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def service_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for the Service (it dials `<svc>.<ns>.svc`)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def make_ca(now: dt.datetime | None = None, days: int = CA_DAYS) -> tuple[str, str]:
    """(CA certificate PEM, its key PEM)."""
    now = now or _now()
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpushare-webhook-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .sign(key, hashes.SHA256())
    )
    return _pem_cert(cert), _pem_key(key)


def make_serving(
    ca_pem: str, ca_key_pem: str, names: Sequence[str], now: dt.datetime | None = None, days: int = SERVING_DAYS
) -> tuple[str, str]:
    """(serving certificate PEM, its key PEM) for `names` (DNS names or IP addresses), signed by the CA."""
    now = now or _now()
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    key = _key()
    alt: list[x509.GeneralName] = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return _pem_cert(cert), _pem_key(key)


def needs_renewal(cert_pem: str, now: dt.datetime | None = None, fraction: float = RENEW_FRACTION) -> bool:
    """True when less than `fraction` of the certificate's life is left (or it does not parse)."""
    now = now or _now()
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= end - (end - start) * fraction


def covers(cert_pem: str, names: Sequence[str]) -> bool:
    """Whether the certificate names every one of `names` (a Service renamed by a new release needs a new one)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    return all(n in have for n in names)


def signed_by(cert_pem: str, ca_pem: str) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, x509.InvalidSignature):  # type: ignore[attr-defined]
        return False
    except Exception:
        return False
    return True


def next_bundle(current: Bundle | None, names: Sequence[str], now: dt.datetime | None = None) -> Bundle | None:
    """The bundle to store, or None when `current` is good as it is.

    A CA near its end is replaced and kept as `previous_ca` (trusted) while the new serving certificate,
    signed by the new CA, takes over; a serving certificate near its end, or not naming the Service, or
    not signed by the CA, is reissued by the current CA."""
    now = now or _now()
    if current is None or not current.ca or not current.ca_key or needs_renewal(current.ca, now):
        ca, ca_key = make_ca(now)
        previous = current.ca if current is not None and current.ca and not expired(current.ca, now) else ""
        cert, key = make_serving(ca, ca_key, names, now)
        return Bundle(ca, cert, key, ca_key, previous)
    if needs_renewal(current.cert, now) or not covers(current.cert, names) or not signed_by(current.cert, current.ca):
        cert, key = make_serving(current.ca, current.ca_key, names, now)
        previous = current.previous_ca if current.previous_ca and not expired(current.previous_ca, now) else ""
        return Bundle(current.ca, cert, key, current.ca_key, previous)
    return None


def expired(cert_pem: str, now: dt.datetime) -> bool:
    try:
        return now >= x509.load_pem_x509_certificate(cert_pem.encode()).not_valid_after_utc
    except ValueError:
        return True


def to_secret_data(bundle: Bundle) -> dict[str, str]:
    data = {KEY_CA: bundle.ca, KEY_CERT: bundle.cert, KEY_KEY: bundle.key, "ca.key": bundle.ca_key}
    if bundle.previous_ca:
        data[KEY_PREVIOUS_CA] = bundle.previous_ca
    return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


def from_secret_data(data: dict[str, str] | None) -> Bundle | None:
    if not data:
        return None
    try:
        text = {k: base64.b64decode(v).decode() for k, v in data.items()}
    except (ValueError, UnicodeDecodeError):
        return None
    return Bundle(
        text.get(KEY_CA, ""),
        text.get(KEY_CERT, ""),
        text.get(KEY_KEY, ""),
        text.get("ca.key", ""),
        text.get(KEY_PREVIOUS_CA, ""),
    )

"""Test certificates: a CA and the certificates it signs, as PEM files (cryptography).

Owns: making keys and X.509 certificates for the TLS tests. Must never: be imported by
``coordinator/`` (not shipped) or make a certificate valid for more than a day.
"""

from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# A test's certificates outlive its run, never a day: a leaked one is worthless tomorrow.
CERT_VALIDITY = datetime.timedelta(days=1)
# Clocks of the test machine and a freshly made certificate may differ a little.
CERT_BACKDATE = datetime.timedelta(minutes=5)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_cert(subject: str, key, issuer: x509.Certificate | None = None, issuer_key=None, *,
              ca: bool = False, ips=(), dns=()) -> x509.Certificate:
    """A certificate for ``key`` named ``subject`` (CN), signed by ``issuer``/``issuer_key`` or
    self-signed, with the given IP and DNS subject alternative names."""
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CERT_BACKDATE)
        .not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(d) for d in dns]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def write_file(path: str, data: bytes) -> None:
    """Replace ``path`` whole (write a sibling, then rename), as an operator's tooling should:
    a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)

"""The gRPC API's TLS material: read and checked from its files, at start and on every SIGHUP.

Owns: reading ``tls_cert_file``, ``tls_key_file`` and ``tls_client_ca_file`` once per call,
checking they belong together (the key is the certificate's, the certificate is in date, the
CA bundle holds certificates), and ``ApiCertificates``, which hands a checked replacement to
gRPC's certificate fetcher so new connections use it while running ones keep theirs.
Must never: import grpc at module level (config.py checks files before grpc is loaded), touch
the Raft layer's secrets (app.py reloads those on SIGHUP), or give gRPC material it
has not checked -- a bad replacement keeps the current certificate and is logged in one line.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from coordinator.client import pemfile

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """A TLS file is unusable; the message names the setting and says why."""


@dataclasses.dataclass(frozen=True)
class TlsMaterial:
    """One checked set of the API's TLS files, as PEM bytes."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None  # None: clients need no certificate
    serial: int  # of the leaf certificate, for the log line that says which one serves
    subject: str


def read(cert_file: str, key_file: str, client_ca_file: str) -> TlsMaterial:
    """Read the three files once and check them; CertificateError names the bad setting."""
    cert_pem = pemfile.read(cert_file, "tls_cert_file", CertificateError)
    key_pem = pemfile.read(key_file, "tls_key_file", CertificateError)
    ca_pem = pemfile.read(client_ca_file, "tls_client_ca_file", CertificateError) if client_ca_file else None
    leaf = _certificates(cert_pem, "tls_cert_file", cert_file)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: encrypted, which a server cannot unlock
        raise CertificateError(f"tls_key_file: {key_file} is not an unencrypted PEM private key: {exc}") from None
    if _public_der(key.public_key()) != _public_der(leaf.public_key()):
        raise CertificateError(f"tls_key_file: {key_file} is not the private key of the certificate in {cert_file}")
    now = datetime.datetime.now(datetime.timezone.utc)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise CertificateError(
            f"tls_cert_file: {cert_file} is valid from {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} to"
            f" {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now"
        )
    if ca_pem is not None:
        _certificates(ca_pem, "tls_client_ca_file", client_ca_file)
    return TlsMaterial(cert_pem, key_pem, ca_pem, leaf.serial_number, leaf.subject.rfc4514_string())


def _certificates(pem: bytes, setting: str, path: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertificateError(f"{setting}: {path} holds no readable certificate: {exc}") from None


def _public_der(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class ApiCertificates:
    """The API's current TLS material and the replacement a SIGHUP read, not yet given to gRPC.

    gRPC calls ``fetch`` at each new TLS handshake; it returns a replacement once (gRPC then
    keeps it for every later handshake) and None otherwise, so a reload costs one read of the
    files per SIGHUP, never one per connection."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str) -> None:
        self._files = (cert_file, key_file, client_ca_file)  # the settings at start; a SIGHUP re-reads these paths
        self.current = read(*self._files)  # at start config.py has checked them already
        self._pending: TlsMaterial | None = None
        self._lock = threading.Lock()  # fetch runs on gRPC's threads, reload on the main thread

    @property
    def requires_client_certificate(self) -> bool:
        """Fixed at start: gRPC's server credentials cannot switch mutual TLS on or off."""
        return self.current.client_ca is not None

    def reload(self) -> bool:
        """Read the files again; True if new connections will use them, False (and one log line
        naming the setting) if they are unusable and the current certificate stays."""
        try:
            material = read(*self._files)
        except CertificateError as exc:
            log.error("SIGHUP: kept the current API certificate (serial %x): %s", self.current.serial, exc)
            return False
        with self._lock:
            self._pending = material
            self.current = material
        log.info("SIGHUP: API certificate reloaded: serial %x, subject %s; new connections use it",
                 material.serial, material.subject)
        return True

    def take_pending(self) -> TlsMaterial | None:
        """The replacement not yet handed to gRPC (once), or None."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

"""Signed token proofs (DESIGN §6): a member's signed statement "token T was issued for resource R".

A guard at an external resource (a SQL table, an object store: ``coordinator.client.guard``) keeps
its own durable high-water mark. Without a proof it has to trust whatever number a caller
sends, and one never-issued huge token (``2**63``) would lock every real holder out for
good. With the cluster's public key it can refuse any token the coordinator never issued
for that resource, without calling the coordinator.

Owns: the proof format, signing with the cluster's Ed25519 key (``token_signing_key_file``),
verifying against one or more public keys (so keys can be rotated), and key generation
(``fencingd keygen``).
Must never: decide whether a token is *current*. A proof stays valid forever, like the fact
it states; the guard's hwm is what refuses an old token. Nor touch the network or the clock.

Format, version 1 (bytes)::

    msgpack array [1, key_id, resource, token, signature]
    key_id     8 bytes: the first 8 bytes of sha256(raw 32-byte public key)
    signature  64 bytes: Ed25519 over PROOF_DOMAIN + msgpack([1, key_id, resource, token])

Text form (CLI, JSON, HTTP headers): ``"fp1." + base64url(bytes)`` without padding.

Use one key per cluster: a proof from a cluster that shares its key with another would be
accepted by the other cluster's guards.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
from collections.abc import Iterable

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from coordinator.client import pemfile

# InvalidProof lives in the client's one exception tree; imported here, where it is raised,
# and still importable from here as before.
from coordinator.client.exceptions import InvalidProof
from coordinator.core.limits import RESOURCE_NAME_BYTES_MAX, TOKEN_MAX

PROOF_VERSION = 1
PROOF_DOMAIN = b"fencing.v1 token proof\x00"  # signatures made for anything else never verify here
PROOF_TEXT_PREFIX = "fp1."
KEY_ID_BYTES = 8
SIGNATURE_BYTES = 64
PROOF_BYTES_MAX = 512  # room for the longest resource name plus the fixed fields (~95 bytes)


class ProofError(ValueError):
    """A key file that cannot serve: unreadable, not PEM, or not an Ed25519 key."""


@dataclasses.dataclass(frozen=True)
class TokenProof:
    """What a valid proof states: ``token`` was issued for ``resource``, signed by ``key_id``."""

    resource: str
    token: int
    key_id: bytes


def key_id_of(public_key: Ed25519PublicKey) -> bytes:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()[:KEY_ID_BYTES]


def _signed_part(key_id: bytes, resource: str, token: int) -> bytes:
    return PROOF_DOMAIN + msgpack.packb([PROOF_VERSION, key_id, resource, token], use_bin_type=True)


def to_text(proof: bytes) -> str:
    """The proof as ASCII, for a header, a JSON field or a command line."""
    return PROOF_TEXT_PREFIX + base64.urlsafe_b64encode(proof).rstrip(b"=").decode("ascii")


def from_text(text: str) -> bytes:
    if not isinstance(text, str) or not text.startswith(PROOF_TEXT_PREFIX):
        raise InvalidProof("malformed", f"a token proof in text form starts with {PROOF_TEXT_PREFIX!r}")
    body = text[len(PROOF_TEXT_PREFIX):]
    if len(body) > 2 * PROOF_BYTES_MAX:
        raise InvalidProof("malformed", f"token proof longer than {PROOF_BYTES_MAX} bytes")
    try:
        # validate=True: a stray character is an error, not something silently skipped.
        return base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidProof("malformed", f"token proof is not base64url: {exc}") from None


# -- keys ---------------------------------------------------------------------------------


def load_private_key(path: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file ``path`` (``fencingd keygen`` or
    ``openssl genpkey -algorithm ed25519``)."""
    try:
        key = serialization.load_pem_private_key(pemfile.read(path, "private key", ProofError), password=None)
    except (ValueError, TypeError) as exc:
        raise ProofError(f"private key {path} cannot be loaded: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ProofError(f"private key {path} is not an Ed25519 key ({type(key).__name__})")
    return key


def load_public_key(path: str) -> Ed25519PublicKey:
    """The Ed25519 public key in PEM file ``path``; a private key file is refused, so a guard
    never ends up holding what could sign."""
    data = pemfile.read(path, "public key", ProofError)
    if b"PRIVATE KEY" in data:
        raise ProofError(f"public key {path} holds a private key; give the guard the public half only")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ProofError(f"public key {path} cannot be loaded: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ProofError(f"public key {path} is not an Ed25519 key ({type(key).__name__})")
    return key


def generate_key_pair() -> tuple[bytes, bytes]:
    """A fresh (private PEM, public PEM) pair: PKCS#8 and SubjectPublicKeyInfo."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


# -- signing and verifying ----------------------------------------------------------------


class ProofSigner:
    """Signs proofs on a member (~40 µs each, measured: only granted acquires pay it)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.key_id = key_id_of(private_key.public_key())

    @classmethod
    def from_file(cls, path: str) -> ProofSigner:
        return cls(load_private_key(path))

    def sign(self, resource: str, token: int) -> bytes:
        # No proof for a name the coordinator never issues a token for.
        if not isinstance(resource, str) or len(resource.encode("utf-8")) > RESOURCE_NAME_BYTES_MAX:
            raise ValueError(f"a proof needs a resource name of at most {RESOURCE_NAME_BYTES_MAX} bytes")
        if type(token) is not int or not 0 < token <= TOKEN_MAX:  # a bool is no token
            raise ValueError("a proof needs a token in 1..2**64-1")
        signature = self._key.sign(_signed_part(self.key_id, resource, token))
        return msgpack.packb([PROOF_VERSION, self.key_id, resource, token, signature], use_bin_type=True)


class ProofVerifier:
    """Checks proofs against the cluster's public key(s). Give the old and the new key while
    rotating; drop the old one once no holder can still carry a proof it signed."""

    def __init__(self, public_keys: Iterable[Ed25519PublicKey]) -> None:
        self._keys: dict[bytes, Ed25519PublicKey] = {}
        for key in public_keys:
            if not isinstance(key, Ed25519PublicKey):
                raise ProofError(f"not an Ed25519 public key: {type(key).__name__}")
            self._keys[key_id_of(key)] = key
        if not self._keys:
            raise ProofError("a verifier needs at least one public key")

    @classmethod
    def from_files(cls, *paths: str) -> ProofVerifier:
        return cls(load_public_key(p) for p in paths)

    @property
    def key_ids(self) -> tuple[bytes, ...]:
        return tuple(self._keys)

    def verify(self, proof: bytes | str, *, resource: str | None = None) -> TokenProof:
        """What ``proof`` states, or InvalidProof. With ``resource``, a proof for any other
        resource is refused (``wrong_resource``): tokens are issued per resource."""
        raw = from_text(proof) if isinstance(proof, str) else proof
        if not isinstance(raw, (bytes, bytearray)):
            raise InvalidProof("malformed", f"a token proof is bytes or text, not {type(proof).__name__}")
        if len(raw) > PROOF_BYTES_MAX:
            raise InvalidProof("malformed", f"token proof longer than {PROOF_BYTES_MAX} bytes")
        try:
            fields = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=True, max_bin_len=PROOF_BYTES_MAX)
        except (ValueError, msgpack.UnpackException, TypeError) as exc:
            raise InvalidProof("malformed", f"token proof is not msgpack: {exc}") from None
        if not (isinstance(fields, list) and len(fields) == 5 and type(fields[0]) is int
                and fields[0] == PROOF_VERSION):
            raise InvalidProof("malformed", f"not a version-{PROOF_VERSION} token proof")
        _, key_id, proof_resource, token, signature = fields
        if not (
            isinstance(key_id, bytes) and len(key_id) == KEY_ID_BYTES
            and isinstance(proof_resource, str)
            and type(token) is int and 0 < token <= TOKEN_MAX
            and isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES
        ):
            raise InvalidProof("malformed", "token proof fields have the wrong types or sizes")
        key = self._keys.get(key_id)
        # One statement, one byte string: a proof must be exactly what sign() makes of its
        # fields, so nothing that keys on proof bytes (a replay cache) sees two forms of one.
        if msgpack.packb(fields, use_bin_type=True) != bytes(raw):
            raise InvalidProof("malformed", "token proof is not in canonical msgpack form")
        if key is None:
            raise InvalidProof(
                "unknown_key", f"token proof signed by key {key_id.hex()}, which this guard does not trust"
            )
        try:
            key.verify(signature, _signed_part(key_id, proof_resource, token))
        except InvalidSignature:
            raise InvalidProof("bad_signature", "token proof signature does not verify") from None
        if resource is not None and proof_resource != resource:
            raise InvalidProof(
                "wrong_resource", f"token {token} was issued for {proof_resource!r}, not {resource!r}"
            )
        return TokenProof(resource=proof_resource, token=token, key_id=key_id)

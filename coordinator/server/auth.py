"""Who is calling, and may they touch this resource (DESIGN I10: a token is not a credential).

Owns: the principals file (``principals_file``), bearer-token authentication against it, and
the resource-prefix and admin checks. Must never: look at fencing tokens or epochs (the state
machine does), or keep a bearer token in memory unhashed longer than one check.

Principals file (TOML)::

    [[principal]]
    name = "orders-service"
    token_sha256 = "<64 hex digits>"   # sha256 of the bearer token: printf %s "$TOKEN" | sha256sum
    prefixes = ["orders/"]             # resources it may acquire, keep alive, release,
                                       # describe, write, delete and read
    admin = false                      # may it call Admin (force-release, snapshot, ...)
    resources_max = 10000              # quotas (optional; these are the defaults of a
    leases_max = 10000                 #   non-admin principal, coordinator/core/limits.py):
    stored_bytes_max = 16777216        #   live resources, live leases, keys + values bytes,
    streams_max = 8                    #   open KeepAliveStreams on one member,
    dedup_entries_max = 10000          #   op_ids whose first outcome is kept (>= 1)

Without a principals file the data plane is open and Admin is guarded by ``admin_token``
alone (the behaviour of a dev cluster). With one, every fencing RPC needs
``authorization: Bearer TOKEN`` of a principal (else UNAUTHENTICATED); Lease and FencedStore
calls on a resource outside the principal's prefixes, and Admin calls by a non-admin, are
PERMISSION_DENIED and change nothing. ``admin_token``, if also set, is one more principal:
admin, every resource. Health stays open; server reflection needs a principal's token or the
admin token (stream_admission.py).

Quotas: a non-admin principal gets the defaults for any quota it does not set; an admin
principal (and ``admin_token``) has none unless its entry sets them, so an operator is never
locked out of a cluster its tenants filled; without a principals file there is no principal to
charge and only the cluster-wide limits hold. The resources, leases and stored-bytes quotas
travel inside each ACQUIRE and WRITE and are checked by the state machine (deterministic on
every replica); ``dedup_entries_max`` travels inside every command with an op_id and bounds the
principal's own entries in the dedup table (past it, its own oldest goes: core/dedup.py); the
streams quota is a count of open RPCs on one member, checked by the service.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any, Iterable

from coordinator.core import limits
from coordinator.server import tomlfile

_HEX64 = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[A-Za-z0-9._/:-]*", re.ASCII)  # resource-name characters; "" = all
PRINCIPALS_MAX = 1000  # a file, read at start: a bound keeps a typo'd generator from hurting
# Each quota's field in a principals-file entry -> its default for a non-admin principal.
QUOTA_DEFAULTS: dict[str, int] = {
    "resources_max": limits.PRINCIPAL_RESOURCES_MAX,
    "leases_max": limits.PRINCIPAL_LEASES_MAX,
    "stored_bytes_max": limits.PRINCIPAL_STORED_BYTES_MAX,
    "streams_max": limits.PRINCIPAL_STREAMS_MAX,
    "dedup_entries_max": limits.PRINCIPAL_DEDUP_ENTRIES_MAX,
}
# Quotas that must be at least this (others may be 0): a dedup budget of 0 would keep no op_id,
# so every retry could apply again.
_QUOTA_LEAST = {"dedup_entries_max": 1}


class PrincipalsError(ValueError):
    """The principals file is unusable; the message names the entry and the field."""


@dataclasses.dataclass(frozen=True)
class Quota:
    """A principal's quotas; None is no maximum of its own (the cluster-wide limits hold)."""

    resources_max: int | None = None
    leases_max: int | None = None
    stored_bytes_max: int | None = None
    streams_max: int | None = None
    dedup_entries_max: int | None = None

    def replicated(self) -> dict[str, int]:
        """The quotas the state machine checks, as a command carries them (``ops.charge_fields``)."""
        values = {
            "resources": self.resources_max,
            "leases": self.leases_max,
            "stored_bytes": self.stored_bytes_max,
            "dedup_entries": self.dedup_entries_max,
        }
        return {name: value for name, value in values.items() if value is not None}


@dataclasses.dataclass(frozen=True)
class Principal:
    name: str
    prefixes: tuple[str, ...]
    admin: bool
    quota: Quota = Quota()  # no quota of its own (admin_token; tests)

    def may_use(self, resource: str) -> bool:
        return any(resource.startswith(prefix) for prefix in self.prefixes)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_principals(path: str) -> list[tuple[str, Principal]]:
    """[(token sha256, principal)] from ``path``; raises PrincipalsError naming what is wrong."""
    raw = tomlfile.load(path, "principals file", PrincipalsError)
    unknown = sorted(set(raw) - {"principal"})
    if unknown:
        raise PrincipalsError(f"{path}: unknown key(s) {', '.join(unknown)} (only [[principal]] tables)")
    entries = raw.get("principal", [])
    if not isinstance(entries, list) or not entries:
        raise PrincipalsError(f"{path}: no [[principal]] entries")
    if len(entries) > PRINCIPALS_MAX:
        raise PrincipalsError(f"{path}: {len(entries)} principals, more than {PRINCIPALS_MAX}")
    out: list[tuple[str, Principal]] = []
    names: set[str] = set()
    digests: set[str] = set()
    for n, entry in enumerate(entries, 1):
        out.append(_principal(path, n, entry, names, digests))
    return out


def _principal(path: str, n: int, entry: Any, names: set, digests: set) -> tuple[str, Principal]:
    where = f"{path}: principal #{n}"
    if not isinstance(entry, dict):
        raise PrincipalsError(f"{where}: must be a table")
    unknown = sorted(set(entry) - {"name", "token_sha256", "prefixes", "admin", *QUOTA_DEFAULTS})
    if unknown:
        raise PrincipalsError(f"{where}: unknown field(s) {', '.join(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PrincipalsError(f"{where}: name must be a non-empty string")
    where = f"{path}: principal {name!r}"
    if len(name.encode()) > limits.PRINCIPAL_NAME_BYTES_MAX:
        raise PrincipalsError(f"{where}: name is longer than {limits.PRINCIPAL_NAME_BYTES_MAX} bytes")
    if name in names:
        raise PrincipalsError(f"{where}: the name is used twice")
    digest = entry.get("token_sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise PrincipalsError(f"{where}: token_sha256 must be 64 lowercase hex digits")
    if digest in digests:
        raise PrincipalsError(f"{where}: token_sha256 is used by another principal")
    prefixes = entry.get("prefixes", [])
    if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
        raise PrincipalsError(f"{where}: prefixes must be a list of strings")
    for prefix in prefixes:
        if not _PREFIX.fullmatch(prefix) or len(prefix.encode()) > limits.RESOURCE_NAME_BYTES_MAX:
            raise PrincipalsError(
                f"{where}: prefix {prefix!r} is not made of resource-name characters [A-Za-z0-9._/:-]"
                f" (at most {limits.RESOURCE_NAME_BYTES_MAX} bytes; \"\" means every resource)"
            )
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise PrincipalsError(f"{where}: admin must be true or false")
    if not prefixes and not admin:
        raise PrincipalsError(f"{where}: no prefixes and not admin: it could do nothing")
    quota: dict[str, int | None] = {}
    for field, default in QUOTA_DEFAULTS.items():
        value = entry.get(field, None if admin else default)
        least = _QUOTA_LEAST.get(field, 0)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not least <= value <= limits.QUOTA_VALUE_MAX
        ):
            raise PrincipalsError(f"{where}: {field} must be an integer in [{least}, {limits.QUOTA_VALUE_MAX}]")
        quota[field] = value
    names.add(name)
    digests.add(digest)
    return digest, Principal(name=name, prefixes=tuple(prefixes), admin=admin, quota=Quota(**quota))


ADMIN_TOKEN_PRINCIPAL = Principal(name="admin-token", prefixes=("",), admin=True)


class Authenticator:
    """Bearer token -> Principal. Looked up by the token's sha256, so neither the file nor
    the lookup's timing says anything about a token."""

    def __init__(self, principals: Iterable[tuple[str, Principal]], *, admin_token: str = "") -> None:
        self._by_digest = dict(principals)
        if admin_token:
            self._by_digest.setdefault(token_digest(admin_token), ADMIN_TOKEN_PRINCIPAL)

    def principal(self, metadata: Iterable[tuple[str, Any]]) -> Principal | None:
        """The principal presenting ``authorization: Bearer TOKEN`` in ``metadata``, or None."""
        token = bearer_token(metadata)
        if token is None:
            return None
        return self._by_digest.get(token_digest(token))


def bearer_token(metadata: Iterable[tuple[str, Any]]) -> str | None:
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None

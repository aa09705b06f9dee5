"""Field rules shared by the state machine, the gRPC layer and the client: one check per
field name.

Owns: the charset, length and range rules of every command and request field (DESIGN §2,
limits.py), as pure functions that return the checked value or raise ``InvalidField`` naming
the field. Which op carries which field is ``ops``'s; which RPC's request does, ``requests``'s.
Must never: import grpc, the Raft library or anything with I/O; know about ops or state. The
state machine stops at an entry whose field fails (it was proposed by another build); the
service layer turns ``InvalidField`` into ``INVALID_ARGUMENT`` before proposing anything, and
the client into ``InvalidArgument`` before sending, so all refuse exactly the same inputs.
"""

from __future__ import annotations

import re
from typing import TypeGuard

from coordinator.core import limits

__all__ = [
    "InvalidField",
    "QUOTA_NAMES",
    "check_after",
    "check_backup_data",
    "check_backup_size",
    "check_chunk",
    "check_digest",
    "check_epoch_floor",
    "check_expected_version",
    "check_fence_all",
    "check_floor",
    "check_holder",
    "check_key",
    "check_level",
    "check_list_limit",
    "check_op_id",
    "check_page_token",
    "check_prefix",
    "check_prefixes",
    "check_principal",
    "check_quota",
    "check_resource",
    "check_restore_id",
    "check_seq",
    "check_snapshot_data",
    "check_token",
    "check_ttl_ms",
    "check_value",
    "check_waiter_id",
    "is_int",
    "page_token",
]


class InvalidField(Exception):
    """A field failed validation. ``field`` names it; the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field


def is_int(value: object) -> TypeGuard[int]:
    """True for ints, false for bools (``True`` is an ``int`` in Python, never a number here)."""
    return isinstance(value, int) and not isinstance(value, bool)


_NAME_RE = re.compile(r"[A-Za-z0-9._/:-]+", re.ASCII)


def _check_name(field: str, value: object, bytes_max: int) -> str:
    if not isinstance(value, str):
        raise InvalidField(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidField(field, "must not be empty")
    if _NAME_RE.fullmatch(value) is None:
        raise InvalidField(field, "may contain only [A-Za-z0-9._/:-]")
    if len(value) > bytes_max:  # the charset is ASCII, so characters are bytes
        raise InvalidField(field, f"is {len(value)} bytes, more than {bytes_max}")
    return str(value)


def _check_int(field: str, value: object, low: int, high: int) -> int:
    if not is_int(value):
        raise InvalidField(field, f"must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidField(field, f"{value} is outside [{low}, {high}]")
    return int(value)


def check_resource(value: object) -> str:
    return _check_name("resource", value, limits.RESOURCE_NAME_BYTES_MAX)


def check_key(value: object) -> str:
    return _check_name("key", value, limits.KEY_BYTES_MAX)


_PREFIX_RE = re.compile(r"[A-Za-z0-9._/:-]*", re.ASCII)


def _check_prefix(field: str, value: object) -> str:
    """A resource-name prefix: the name charset, at most a name's length; "" is every name."""
    if not isinstance(value, str):
        raise InvalidField(field, f"must be a string, got {type(value).__name__}")
    if _PREFIX_RE.fullmatch(value) is None:
        raise InvalidField(field, "may contain only [A-Za-z0-9._/:-]")
    if len(value) > limits.RESOURCE_NAME_BYTES_MAX:
        raise InvalidField(field, f"is {len(value)} bytes, more than {limits.RESOURCE_NAME_BYTES_MAX}")
    return str(value)


def check_prefix(value: object) -> str:
    """List's prefix: the resources whose names start with it ("" or unset: all of them)."""
    return _check_prefix("prefix", value)


def check_prefixes(value: object) -> tuple[str, ...]:
    """A listing READ_BARRIER's prefixes: 1 to LIST_PREFIXES_MAX of them, none inside another
    (the server narrows the request's prefix to the caller's grants, core/listing.py)."""
    if not isinstance(value, (list, tuple)):
        raise InvalidField("prefixes", f"must be a list, got {type(value).__name__}")
    if not 1 <= len(value) <= limits.LIST_PREFIXES_MAX:
        raise InvalidField("prefixes", f"has {len(value)} prefixes, not in [1, {limits.LIST_PREFIXES_MAX}]")
    checked = tuple(_check_prefix("prefixes", p) for p in value)
    for p in checked:
        if any(q != p and q.startswith(p) for q in checked) or checked.count(p) > 1:
            raise InvalidField("prefixes", f"{p!r} covers another of them")
    return checked


def check_after(value: object) -> str:
    """Where a listing page starts: strictly after this resource name."""
    return _check_name("after", value, limits.RESOURCE_NAME_BYTES_MAX)


def check_list_limit(value: object) -> int:
    """Resources in one List page: 1 to LIST_LIMIT_MAX (unset: LIST_LIMIT_DEFAULT)."""
    return _check_int("limit", value, 1, limits.LIST_LIMIT_MAX)


# A page token: "v1." and the hex of "PREFIX\nLAST" -- the prefix the
# listing was asked for and the last name of the page before. Opaque to callers: only this
# module reads it, and a newline never occurs in a name.
_PAGE_TOKEN_HEAD = "v1."


def page_token(prefix: str, last: str) -> str:
    """The token that continues a listing of ``prefix`` after the resource ``last``."""
    raw = f"{prefix}\n{last}".encode("ascii")
    return _PAGE_TOKEN_HEAD + raw.hex()


def check_page_token(value: object) -> tuple[str, str]:
    """(prefix, last name) of a token ``page_token`` made; anything else is refused."""
    if not isinstance(value, str):
        raise InvalidField("page_token", f"must be a string, got {type(value).__name__}")
    bad = InvalidField("page_token", "is not a token a List reply gave (pass next_page_token unchanged)")
    if len(value) > limits.LIST_PAGE_TOKEN_BYTES_MAX or not value.startswith(_PAGE_TOKEN_HEAD):
        raise bad
    body = value[len(_PAGE_TOKEN_HEAD):]
    try:
        raw = bytes.fromhex(body).decode("ascii")
    except ValueError:  # not hex, or not ASCII (UnicodeDecodeError is a ValueError)
        raise bad from None
    prefix, newline, last = raw.partition("\n")
    if not newline:
        raise bad
    try:
        prefix = _check_prefix("page_token", prefix)
        last = _check_name("page_token", last, limits.RESOURCE_NAME_BYTES_MAX)
    except InvalidField:
        raise bad from None
    if not last.startswith(prefix):
        raise bad
    return prefix, last


def check_holder(value: object) -> str:
    return _check_label("holder", value, limits.HOLDER_BYTES_MAX)


def _check_label(field: str, value: object, bytes_max: int) -> str:
    """A free-form UTF-8 label of 1..bytes_max bytes (a holder, a principal's name)."""
    if not isinstance(value, str):
        raise InvalidField(field, f"must be a string, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidField(field, "is not valid UTF-8") from None
    if not 1 <= size <= bytes_max:
        raise InvalidField(field, f"is {size} bytes, not in [1, {bytes_max}]")
    return str(value)


def check_principal(value: object) -> str:
    """The name of the principal a command is charged to (its principals-file name)."""
    return _check_label("principal", value, limits.PRINCIPAL_NAME_BYTES_MAX)


# The quotas a command carries into the state machine: the counts that depend on replicated
# state. The stream quota is a count of open RPCs on one member and never enters the log.
QUOTA_NAMES = ("resources", "leases", "stored_bytes", "dedup_entries")


def check_quota(value: object) -> dict[str, int]:
    """A map from some of ``QUOTA_NAMES`` to a maximum in [0, QUOTA_VALUE_MAX]; a name that is
    absent has no maximum."""
    if not isinstance(value, dict):
        raise InvalidField("quota", f"must be a map, got {type(value).__name__}")
    checked: dict[str, int] = {}
    for name, maximum in value.items():
        if name not in QUOTA_NAMES:
            raise InvalidField("quota", f"{name!r} is not a quota (known: {', '.join(QUOTA_NAMES)})")
        if not is_int(maximum) or not 0 <= maximum <= limits.QUOTA_VALUE_MAX:
            raise InvalidField("quota", f"{name} must be an integer in [0, {limits.QUOTA_VALUE_MAX}]")
        checked[name] = int(maximum)
    return checked


def check_waiter_id(value: object) -> bytes:
    """The id of one queued lock waiter (client-chosen random bytes, sized like an op_id)."""
    return _check_id_bytes("waiter_id", value, limits.WAITER_ID_BYTES_MIN, limits.WAITER_ID_BYTES_MAX,
                           "random bytes, chosen once per lock wait and sent on each of its Lock calls")


def check_level(value: object) -> int:
    """A cluster entry level this build can apply: 1 to ``limits.ENTRY_LEVEL``."""
    if not is_int(value):
        raise InvalidField("level", f"must be an integer, got {type(value).__name__}")
    if not 1 <= value <= limits.ENTRY_LEVEL:
        raise InvalidField("level", f"{value} is outside [1, {limits.ENTRY_LEVEL}] (the levels this build applies)")
    return value


def check_value(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidField("value", f"must be bytes, got {type(value).__name__}")
    if len(value) > limits.VALUE_BYTES_MAX:
        raise InvalidField("value", f"is {len(value)} bytes, more than {limits.VALUE_BYTES_MAX}")
    return bytes(value)


def _check_id_bytes(field: str, value: object, low: int, high: int, what_to_send: str) -> bytes:
    """Client-chosen random id bytes (an op_id, a waiter_id) of ``low``..``high`` bytes. The
    message says what to send: a caller outside Python meets this field in the proto with no
    client to fill it in, and proto3 sends an unset one as 0 bytes."""
    if not isinstance(value, bytes):
        raise InvalidField(field, f"must be bytes, got {type(value).__name__}")
    if not low <= len(value) <= high:
        raise InvalidField(field, f"is {len(value)} bytes, not in [{low}, {high}]: "
                                  f"send {low}-{high} {what_to_send}")
    return bytes(value)


# Required on every mutation that has one (DESIGN I5): with it a retry after a lost answer or an
# OUTCOME_UNKNOWN applies at most once; an absent one is refused rather than taken as "no dedup".
OP_ID_TO_SEND = ("random bytes, new for each operation and reused only to retry it "
                 "(a retry with the same op_id applies once: DESIGN I5)")


def check_op_id(value: object) -> bytes:
    return _check_id_bytes("op_id", value, limits.OP_ID_BYTES_MIN, limits.OP_ID_BYTES_MAX, OP_ID_TO_SEND)


def check_ttl_ms(value: object) -> int:
    return _check_int("ttl_ms", value, limits.LEASE_TTL_MS_MIN, limits.LEASE_TTL_MS_MAX)


def check_token(value: object) -> int:
    return _check_int("token", value, 1, limits.TOKEN_MAX)


def check_expected_version(value: object) -> int:
    if not is_int(value):
        raise InvalidField("expected_version", f"must be an integer, got {type(value).__name__}")
    if value < 0:
        raise InvalidField("expected_version", f"{value} is negative")
    return int(value)


def check_floor(value: object) -> int:
    return _check_int("floor", value, 1, limits.TOKEN_MAX)


def check_epoch_floor(value: object) -> int:
    return _check_int("epoch_floor", value, 1, limits.TOKEN_MAX)


def check_fence_all(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidField("fence_all", f"must be a boolean, got {type(value).__name__}")
    return value


def check_snapshot_data(value: object) -> bytes:
    """The bytes of a backup for RESTORE: non-empty, at most RESTORE_SNAPSHOT_BYTES_MAX.

    Only the size is checked here; the state machine parses the content when it applies.
    """
    if not isinstance(value, bytes):
        raise InvalidField("data", f"must be bytes, got {type(value).__name__}")
    if not value:
        raise InvalidField("data", "must not be empty")
    if len(value) > limits.RESTORE_SNAPSHOT_BYTES_MAX:
        raise InvalidField(
            "data", f"is {len(value)} bytes, more than {limits.RESTORE_SNAPSHOT_BYTES_MAX}"
        )
    return bytes(value)


def check_restore_id(value: object) -> bytes:
    if not isinstance(value, bytes) or len(value) != limits.RESTORE_ID_BYTES:
        raise InvalidField("restore_id", f"must be {limits.RESTORE_ID_BYTES} bytes")
    return value


def check_backup_size(value: object) -> int:
    return _check_int("size", value, 1, limits.BACKUP_BYTES_MAX)


def check_digest(value: object) -> bytes:
    """A sha256 digest: 32 bytes."""
    if not isinstance(value, bytes) or len(value) != 32:
        raise InvalidField("digest", "must be the 32 bytes of a sha256 digest")
    return value


def check_seq(value: object) -> int:
    return _check_int("seq", value, 0, limits.RESTORE_CHUNKS_MAX - 1)


def check_chunk(value: object) -> bytes:
    """One chunk of a backup: 1 to BACKUP_CHUNK_BYTES bytes."""
    if not isinstance(value, bytes):
        raise InvalidField("chunk", f"must be bytes, got {type(value).__name__}")
    if not 1 <= len(value) <= limits.BACKUP_CHUNK_BYTES:
        raise InvalidField("chunk", f"is {len(value)} bytes, not in [1, {limits.BACKUP_CHUNK_BYTES}]")
    return value


def check_backup_data(value: object) -> bytes:
    """A whole backup for a streamed restore: non-empty, at most BACKUP_BYTES_MAX."""
    if not isinstance(value, bytes):
        raise InvalidField("data", f"must be bytes, got {type(value).__name__}")
    if not value:
        raise InvalidField("data", "must not be empty")
    if len(value) > limits.BACKUP_BYTES_MAX:
        raise InvalidField("data", f"is {len(value)} bytes, more than {limits.BACKUP_BYTES_MAX}")
    return value

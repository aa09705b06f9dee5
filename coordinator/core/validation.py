"""Field rules shared by the state machine and the gRPC layer: one check per field name.

Owns: the charset, length and range rules of every command field (DESIGN §2, limits.py),
as pure functions that return the checked value or raise ``InvalidField`` naming the field.
Must never: import grpc, pysyncobj or anything with I/O; know about ops or state. The state
machine turns ``InvalidField`` into ``Rejected(MALFORMED)``; the service layer turns it into
``INVALID_ARGUMENT`` before proposing anything, so both refuse exactly the same inputs.
"""

from __future__ import annotations

import re

from coordinator.core import limits

__all__ = [
    "InvalidField",
    "check_epoch_floor",
    "check_expected_version",
    "check_fence_all",
    "check_floor",
    "check_holder",
    "check_key",
    "check_op_id",
    "check_resource",
    "check_snapshot_data",
    "check_token",
    "check_ttl_ms",
    "check_value",
    "is_int",
]


class InvalidField(Exception):
    """A field failed validation. ``field`` names it; the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field


def is_int(value: object) -> bool:
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


def check_holder(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidField("holder", f"must be a string, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidField("holder", "is not valid UTF-8") from None
    if not 1 <= size <= limits.HOLDER_BYTES_MAX:
        raise InvalidField("holder", f"is {size} bytes, not in [1, {limits.HOLDER_BYTES_MAX}]")
    return str(value)


def check_value(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidField("value", f"must be bytes, got {type(value).__name__}")
    if len(value) > limits.VALUE_BYTES_MAX:
        raise InvalidField("value", f"is {len(value)} bytes, more than {limits.VALUE_BYTES_MAX}")
    return bytes(value)


def check_op_id(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidField("op_id", f"must be bytes, got {type(value).__name__}")
    if not limits.OP_ID_BYTES_MIN <= len(value) <= limits.OP_ID_BYTES_MAX:
        raise InvalidField(
            "op_id",
            f"is {len(value)} bytes, not in [{limits.OP_ID_BYTES_MIN}, {limits.OP_ID_BYTES_MAX}]",
        )
    return bytes(value)


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

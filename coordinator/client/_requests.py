"""Building a request: the field checks a client runs before anything is sent.

Owns: turning a public method's arguments into a fencing.proto request checked by its RPC's
row of ``requests.REQUESTS`` (the server's own table and rules, in the same order), the
checks outside that table (Acquire's ``wait_ms``, a batch's shared ``ttl_ms``), fresh op_ids,
the default holder name, and the messages of a streamed restore.
Must never: send anything, or let a bad field reach the wire: a bad field is
InvalidArgument naming it, raised before the first attempt.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client.exceptions import InvalidArgument
from coordinator.core import limits, requests, validation
from coordinator.core.names import ErrorMeta, ErrorReason


def new_op_id() -> bytes:
    """A fresh op_id: 16 random bytes (limits.OP_ID_BYTES_MIN), one per logical mutation."""
    return os.urandom(limits.OP_ID_BYTES_MIN)


def _invalid(exc: validation.InvalidField, request: dict[str, Any]) -> InvalidArgument:
    return InvalidArgument(
        str(exc), reason=ErrorReason.INVALID_FIELD, metadata={ErrorMeta.FIELD: exc.field},
        request=request,
    )


def check_field(check: Callable[[Any], Any], value: Any, request: dict[str, Any]) -> Any:
    """Run one field check that is not a row of requests.REQUESTS (Acquire's wait_ms, a
    batch's shared ttl_ms); a bad field is InvalidArgument, raised before anything is sent."""
    try:
        return check(value)
    except validation.InvalidField as exc:
        raise _invalid(exc, request) from None


def request_of(message: Any, request: dict[str, Any], **fields: Any) -> Any:
    """``message`` (a fencing.proto request type) holding ``fields``, checked by its RPC's row
    of requests.REQUESTS: the table and rules the server checks with, in the same order,
    so the first bad field is InvalidArgument naming it, raised before anything is sent.

    None leaves an optional field unset, except a bool: the wire cannot carry an unset one
    (the server reads it as False), so a None there is refused rather than sent as False.
    """
    rpc = message.DESCRIPTOR.name.removesuffix("Request")
    try:
        checked = requests.check_request(rpc, fields)
        wire = message.DESCRIPTOR.fields_by_name
        for name, value in checked.items():
            if value is None and wire[name].type == wire[name].TYPE_BOOL:
                requests.REQUESTS[rpc][name].check(value)
    except validation.InvalidField as exc:
        raise _invalid(exc, request) from None
    return message(**checked)


def check_wait_ms(value: object) -> int:
    if not validation.is_int(value) or not 0 <= value <= limits.ACQUIRE_WAIT_MS_MAX:
        raise validation.InvalidField(
            "wait_ms", f"must be an integer in [0, {limits.ACQUIRE_WAIT_MS_MAX}], got {value!r}"
        )
    return int(value)


def as_bytes(value: object) -> object:
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


def default_holder() -> str:
    try:
        host = os.uname().nodename or "host"
    except AttributeError:  # pragma: no cover - not on Linux
        host = "host"
    return f"{host[:100]}/{os.getpid()}"


def restore_messages(data: bytes, epoch_floor: int) -> Iterable[pb.RestoreStreamRequest]:
    """A RestoreStream's messages: chunks of ``data``, the first carrying the floor."""
    view = memoryview(data)
    for offset in range(0, len(data), limits.BACKUP_CHUNK_BYTES):
        piece = bytes(view[offset : offset + limits.BACKUP_CHUNK_BYTES])
        yield pb.RestoreStreamRequest(epoch_floor=epoch_floor if offset == 0 else 0, data=piece)

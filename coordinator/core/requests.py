"""Which fields each RPC's request carries, taken from the op bodies.

Owns: ``REQUESTS``, RPC name (fencing.proto) -> its request's fields in the order they are
checked, each with its rule, whether it is required and whether the client fills it in;
``BODY_OF``, the RPCs whose request is one op's body (all but its charge fields); and
``check_request``, which applies one row. A row of an RPC in ``BODY_OF`` is read off that op's
class in ``ops``, so an op's fields and their rules are declared once; the other RPCs read
state or stream a backup, and name their few fields of their own here. The server checks a
request by its row (or builds the op's body, which checks the same fields by the same rules),
the client checks by it before sending, and fencingctl takes from it which flags a command
takes. ``tests/test_request_fields.py`` holds every row against the proto.
Must never: import grpc or do I/O; hold a rule of its own (rules are ``validation``'s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from coordinator.core import ops, validation
from coordinator.core.validation import InvalidField

__all__ = ["BODY_OF", "REQUESTS", "Field", "check_request"]


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of an RPC's request: its check, whether the request must carry it, and
    whether the client fills it in when its caller gives none (an op_id: a fresh one; the
    holder: ``host/pid``), so that a caller, fencingctl's user included, may leave it out."""

    check: Callable[[object], Any]
    required: bool = True
    filled_by_client: bool = False


# The RPCs that propose one op's body built from their request (Restore proposes the chunked
# RESTORE_BEGIN, CHUNK..., COMMIT, whose fields are not the request's; Read, Describe and List
# read state).
BODY_OF: dict[str, type[ops.Body]] = {
    "Acquire": ops.Acquire,
    "KeepAlive": ops.KeepAlive,
    "Release": ops.Release,
    "Write": ops.Write,
    "Delete": ops.Delete,
    "ForceRelease": ops.ForceRelease,
    "SetEpochFloor": ops.SetEpochFloor,
    "Lock": ops.Enqueue,  # the wait itself (wait_ms) is the server's, not the entry's
    "CancelLock": ops.Dequeue,
}


def _row(
    cls: type[ops.Body], *, filled: tuple[str, ...] = (), only: tuple[str, ...] | None = None,
    required: tuple[str, ...] = (),
) -> dict[str, Field]:
    """The request fields of ``cls``'s body: every field but the charges (or ``only`` these),
    ``required`` ones required even where the op has them optional, ``filled`` ones filled in
    by the client."""
    return {
        name: Field(check, required=needed or name in required, filled_by_client=name in filled)
        for name, check, needed in cls.plan()
        if name not in ops.CHARGE_FIELDS and (only is None or name in only)
    }


_OP_ID_FILLED = ("op_id",)

# RPC name -> its request's fields, in the order they are checked: the first bad one is the
# one reported, by the client before sending and by the server alike. Acquire's and Lock's
# wait_ms are not here: they only bound the server's wait, which clamps them. KeepAlive's
# lease_id is not here either: it must equal the token, a rule between fields.
REQUESTS: dict[str, dict[str, Field]] = {
    "Acquire": _row(ops.Acquire, filled=("holder", *_OP_ID_FILLED)),
    "KeepAlive": _row(ops.KeepAlive),  # ttl_ms absent: keep the lease's TTL
    "Release": _row(ops.Release),  # op_id absent: a release nobody can retry by its op_id
    "Describe": _row(ops.ReadBarrier, only=("resource",), required=("resource",)),
    # List: a page of resources by name. limit unset: LIST_LIMIT_DEFAULT; the token is the
    # reply's next_page_token, for the same prefix (the server narrows the prefix to the
    # caller's grants and builds the READ_BARRIER's prefixes and after from both).
    "List": {
        "prefix": Field(validation.check_prefix, required=False),
        "limit": Field(validation.check_list_limit, required=False),
        "page_token": Field(validation.check_page_token, required=False),
    },
    "Write": _row(ops.Write, filled=_OP_ID_FILLED),  # expected_version absent: any
    # expected_version absent: any; entry level 2 (the server refuses it below that level)
    "Delete": _row(ops.Delete, filled=_OP_ID_FILLED),
    "Read": _row(ops.ReadBarrier, only=("resource", "key"), required=("resource", "key")),
    "ForceRelease": _row(ops.ForceRelease, filled=_OP_ID_FILLED),
    "SetEpochFloor": _row(ops.SetEpochFloor),  # fence_all absent: fence every resource
    "Restore": {
        "data": Field(validation.check_snapshot_data),
        "epoch_floor": Field(validation.check_epoch_floor),
    },
    # Lock: queue for the lease (FIFO) and wait for its grant. The waiter_id is the client's,
    # kept across calls.
    "Lock": _row(ops.Enqueue, filled=("holder", "waiter_id")),
    "CancelLock": _row(ops.Dequeue),
    # RestoreStream: its first message's floor (the data is the stream's chunks, checked whole).
    "RestoreStream": {"epoch_floor": Field(validation.check_epoch_floor)},
}


def check_request(rpc: str, fields: Mapping[str, object]) -> dict[str, Any]:
    """Every field of ``rpc``'s request, checked, in ``REQUESTS`` order; raises InvalidField
    for the first bad one. An optional field that is None (or missing) is absent and stays
    None; a required one is checked whatever it is, so None fails its check. ``fields``
    may hold only the RPC's fields."""
    spec = REQUESTS[rpc]
    unknown = sorted(set(fields) - set(spec))
    if unknown:
        raise InvalidField(unknown[0], f"is not a field of {rpc}")
    checked: dict[str, Any] = {}
    for name, field in spec.items():
        value = fields.get(name)
        checked[name] = None if value is None and not field.required else field.check(value)
    return checked

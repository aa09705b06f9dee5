"""Commands of the fencing state machine: numbered op codes and their versioned wire format.

Owns: the op codes (their numbers never change), the msgpack envelope
``[FORMAT_VERSION, op, stamp_ms, body]`` of one Raft entry, its bounded decoder, and one
keyword-only constructor per op.
Must never: validate body fields (the state machine does that, so that tests can build bad
commands), read a clock, draw randomness or do I/O.

Wire format of one command (DESIGN §5)::

    [FORMAT_VERSION: int, op: int, stamp_ms: int, body: map[str, value]]

``stamp_ms`` is the proposing node's log-clock stamp (DESIGN I6). In ``body``, resource,
key and holder are msgpack str; value and op_id are msgpack bin; numbers are ints.

Quotas (DESIGN §8) ride in optional body fields, so entries and snapshots written before them
decode and apply as they always did, and FORMAT_VERSION stays 1: an ACQUIRE may carry
``principal`` (str, who owns the resource afterwards) and ``quota`` (map of ``resources``,
``leases``, ``stored_bytes``, ``dedup_entries`` to a maximum); a WRITE its ``stored_bytes``.
Every command with an op_id (ACQUIRE, WRITE, DELETE, FORCE_RELEASE, a RELEASE that has one)
may carry both: its dedup entry is charged to ``principal`` under ``dedup_entries``
(core/dedup.py). ``charged`` adds them; a command without them is charged to nobody (the
anonymous principal).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import msgpack

from coordinator.core import limits
from coordinator.core.validation import is_int

# Version of the envelope above. An entry with another version cannot be applied here: the
# member stops (state_machine.UnappliableEntry), it never refuses it (DESIGN §8).
FORMAT_VERSION = 1


class Op(enum.IntEnum):
    """Op codes. The numbers are part of the replicated log format: never renumber or reuse."""

    ACQUIRE = 1
    KEEP_ALIVE = 2
    RELEASE = 3
    WRITE = 4
    DELETE = 5
    READ_BARRIER = 6
    FORCE_RELEASE = 7
    SET_EPOCH_FLOOR = 8
    TICK = 9
    # 10 is not an op: no released build ever wrote one, so an entry with it is refused as
    # unknown, like any other number missing here.
    # A backup restored in chunks (DESIGN I11): BEGIN declares it, CHUNKs stage it in order,
    # COMMIT checks and swaps it in; ABORT drops what is staged.
    RESTORE_BEGIN = 11
    RESTORE_CHUNK = 12
    RESTORE_COMMIT = 13
    RESTORE_ABORT = 14
    # The lock wait queue: ENQUEUE adds (or renews) a FIFO waiter for a resource's lease, and
    # grants it at once when the lease is free and nobody is ahead; DEQUEUE takes it out (and
    # releases the lease if it was granted meanwhile). RELEASE, FORCE_RELEASE and TICK grant
    # the head waiter in the same entry that ends a lease.
    ENQUEUE = 15
    DEQUEUE = 16
    # Entry level 2 (ENTRY_LEVEL below): the cluster's entry level is raised to ``level``. The
    # leader proposes it once every member announces that level (server/level_poller.py).
    SET_CLUSTER_LEVEL = 17


# Entry levels (DESIGN §8 "Rolling upgrades"): what a build can apply, as one number that only
# grows. Level 1 is every op and field above up to DEQUEUE: what the release before levels
# applies (it announces nothing, and counts as 1). Level 2 adds SET_CLUSTER_LEVEL and a DELETE
# carrying ``expected_version`` (a conditional delete). Level 3 adds a READ_BARRIER carrying
# ``prefixes`` (with ``limit`` and ``after``: a List page); the read-index path answers one
# without an entry at any level. The replicated cluster level is the
# highest level every member runs; nothing that needs a higher level is ever proposed, so no
# member meets an entry it cannot apply. A new op or field gets the next level, here and in
# ``level_needed``.
ENTRY_LEVEL = limits.ENTRY_LEVEL
LEVEL_BEFORE_LEVELS = 1
_OP_LEVEL = {Op.SET_CLUSTER_LEVEL: 2}
_FIELD_LEVEL = {(Op.DELETE, "expected_version"): 2, (Op.READ_BARRIER, "prefixes"): 3}


def level_needed(command: Command) -> int:
    """The entry level a member needs to apply ``command``."""
    needed = _OP_LEVEL.get(command.op, LEVEL_BEFORE_LEVELS)
    for (op, field), level in _FIELD_LEVEL.items():
        if op is command.op and command.body.get(field) is not None:
            needed = max(needed, level)
    return needed


class MalformedCommand(ValueError):
    """The bytes are not one well-formed command envelope (body fields are not checked)."""


# The decoder never builds anything bigger than a whole command could hold. A RESTORE_CHUNK
# (admin, DESIGN I11) carries a piece of a backup and may reach RESTORE_CHUNK_COMMAND_BYTES_MAX;
# every other command stays within COMMAND_BYTES_MAX.
_UNPACK_LIMITS: dict[str, Any] = {
    "max_str_len": limits.RESTORE_CHUNK_COMMAND_BYTES_MAX,
    "max_bin_len": limits.RESTORE_CHUNK_COMMAND_BYTES_MAX,
    "max_array_len": limits.COMMAND_ITEMS_MAX,
    "max_map_len": limits.COMMAND_ITEMS_MAX,
    "max_ext_len": 0,  # no extension types (timestamps etc.) are part of the format
}


@dataclasses.dataclass(frozen=True)
class Command:
    """One state-machine command: what to do, when the proposer stamped it, and its fields."""

    op: Op
    stamp_ms: int
    body: dict[str, Any]

    @property
    def resource(self) -> str | None:
        """The resource this command acts on (None for cluster-wide ones). Proposers use it
        as the Raft batch key: commands on different resources may share an entry, and per
        resource every command keeps an index of its own (the chaos checker orders by it)."""
        return self.body.get("resource")

    def encode(self) -> bytes:
        """The msgpack bytes of this command, as proposed to the Raft log."""
        return msgpack.packb(
            [FORMAT_VERSION, int(self.op), self.stamp_ms, self.body], use_bin_type=True
        )


def validate_envelope(op: object, stamp_ms: object, body: object) -> Op:
    """Check the envelope fields of a command and return its ``Op``.

    Raises ``MalformedCommand`` naming the bad field. Body fields are not checked here.
    """
    if not is_int(op):
        raise MalformedCommand(f"op must be an integer, got {type(op).__name__}")
    try:
        checked_op = Op(op)
    except ValueError:
        raise MalformedCommand(f"unknown op {op}") from None
    if not is_int(stamp_ms):
        raise MalformedCommand(f"stamp_ms must be an integer, got {type(stamp_ms).__name__}")
    if not 0 <= stamp_ms <= limits.STAMP_MS_MAX:
        raise MalformedCommand(f"stamp_ms {stamp_ms} is outside [0, {limits.STAMP_MS_MAX}]")
    if not isinstance(body, dict):
        raise MalformedCommand(f"body must be a map, got {type(body).__name__}")
    for name in body:
        if not isinstance(name, str):
            raise MalformedCommand(f"body keys must be strings, got {type(name).__name__}")
    return checked_op


# How a RESTORE_CHUNK command starts: a fixarray of 4, FORMAT_VERSION, the op (positive
# fixints); it may be larger than any other command.
_LARGE_PREFIXES = {
    bytes([0x94, FORMAT_VERSION, Op.RESTORE_CHUNK]): limits.RESTORE_CHUNK_COMMAND_BYTES_MAX,
}


def _bytes_max(data: bytes) -> int:
    """The size cap for ``data``: larger for a RESTORE_CHUNK, known from its first three
    bytes."""
    return _LARGE_PREFIXES.get(data[:3], limits.COMMAND_BYTES_MAX)


def decode(data: bytes) -> Command:
    """Decode one command from a Raft entry, refusing anything malformed.

    Raises ``MalformedCommand`` if ``data`` is not bytes, is longer than
    ``limits.COMMAND_BYTES_MAX`` (more for a RESTORE_CHUNK: ``_bytes_max``), is not
    msgpack, has the wrong shape, an unknown format version, an unknown op or a bad stamp.
    The body's fields are not validated.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedCommand(f"command must be bytes, got {type(data).__name__}")
    if type(data) is not bytes:
        data = bytes(data)
    bytes_max = _bytes_max(data)
    if len(data) > bytes_max:
        raise MalformedCommand(f"command is {len(data)} bytes, more than {bytes_max}")
    try:
        envelope = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, **_UNPACK_LIMITS
        )
    # The input is untrusted bytes and msgpack documents that "other exceptions can be
    # raised during unpacking": every failure of the parser is a malformed command.
    except Exception as exc:  # any type (the comment above): a malformed command
        raise MalformedCommand(
            f"command is not valid msgpack: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(envelope, list) or len(envelope) != 4:
        raise MalformedCommand(
            "command must be a msgpack array [format_version, op, stamp_ms, body]"
        )
    version, op, stamp_ms, body = envelope
    if not is_int(version) or version != FORMAT_VERSION:
        raise MalformedCommand(
            f"unknown command format version {version!r} (this replica reads {FORMAT_VERSION})"
        )
    checked_op = validate_envelope(op, stamp_ms, body)
    return Command(op=checked_op, stamp_ms=stamp_ms, body=body)


# Constructors: one per op, keyword-only. They do not validate; optional fields that are
# None are left out of the body (the state machine treats absent and nil alike).


def acquire(*, resource: str, holder: str, ttl_ms: int, op_id: bytes, stamp_ms: int) -> Command:
    """Take the lease on ``resource`` for ``ttl_ms``; the entry issues a new token (I2)."""
    body = {"resource": resource, "holder": holder, "ttl_ms": ttl_ms, "op_id": op_id}
    return Command(Op.ACQUIRE, stamp_ms, body)


# Body fields the server fills from the authenticated caller, never from a request.
CHARGE_FIELDS = frozenset({"principal", "quota"})


def charged(command: Command, *, principal: str, quota: dict[str, int]) -> Command:
    """``command`` charged to ``principal`` under ``quota`` (empty: no maximum), for the ops
    whose effect a quota counts: an ACQUIRE or ENQUEUE (what it owns), a WRITE (its bytes count
    against the resource's owner) and every command with an op_id (its dedup entry). Any other
    command is returned unchanged."""
    if command.op not in (Op.ACQUIRE, Op.ENQUEUE) and command.body.get("op_id") is None:
        return command
    extra: dict[str, Any] = {"principal": principal}
    read = _QUOTAS_READ.get(command.op)
    carried = {name: value for name, value in quota.items() if read is None or name in read}
    if carried:
        extra["quota"] = carried
    return dataclasses.replace(command, body={**command.body, **extra})


# The quotas each op's checks read (absent: all of them); the others stay out of its entry,
# which every replica decodes and checks (a Write is the hot path).
_QUOTAS_READ: dict[Op, frozenset[str]] = {
    Op.WRITE: frozenset({"stored_bytes", "dedup_entries"}),
    Op.DELETE: frozenset({"dedup_entries"}),
    Op.RELEASE: frozenset({"dedup_entries"}),
    Op.FORCE_RELEASE: frozenset({"dedup_entries"}),
}


def keep_alive(*, resource: str, token: int, stamp_ms: int, ttl_ms: int | None = None) -> Command:
    """Extend the live lease holding ``token``; ``ttl_ms`` replaces its TTL when given."""
    body: dict[str, Any] = {"resource": resource, "token": token}
    if ttl_ms is not None:
        body["ttl_ms"] = ttl_ms
    return Command(Op.KEEP_ALIVE, stamp_ms, body)


def release(*, resource: str, token: int, stamp_ms: int, op_id: bytes | None = None) -> Command:
    """End the lease holding ``token``; the hwm stays."""
    body: dict[str, Any] = {"resource": resource, "token": token}
    if op_id is not None:
        body["op_id"] = op_id
    return Command(Op.RELEASE, stamp_ms, body)


def write(
    *,
    resource: str,
    key: str,
    value: bytes,
    token: int,
    op_id: bytes,
    stamp_ms: int,
    expected_version: int | None = None,
) -> Command:
    """Fenced write of ``key`` under ``resource`` (I3)."""
    body: dict[str, Any] = {
        "resource": resource,
        "key": key,
        "value": value,
        "token": token,
        "op_id": op_id,
    }
    if expected_version is not None:
        body["expected_version"] = expected_version
    return Command(Op.WRITE, stamp_ms, body)


def delete(
    *, resource: str, key: str, token: int, op_id: bytes, stamp_ms: int, expected_version: int | None = None
) -> Command:
    """Fenced delete of ``key`` under ``resource``, checked like a write (I7); with
    ``expected_version`` (entry level 2) only while the key is at that version."""
    body: dict[str, Any] = {"resource": resource, "key": key, "token": token, "op_id": op_id}
    if expected_version is not None:
        body["expected_version"] = expected_version
    return Command(Op.DELETE, stamp_ms, body)


def read_barrier(*, stamp_ms: int, resource: str | None = None, key: str | None = None) -> Command:
    """A read through the log (I9): reports state as of this entry and changes only the clock."""
    body: dict[str, Any] = {}
    if resource is not None:
        body["resource"] = resource
    if key is not None:
        body["key"] = key
    return Command(Op.READ_BARRIER, stamp_ms, body)


def list_page(*, prefixes: tuple[str, ...], limit: int, stamp_ms: int, after: str | None = None) -> Command:
    """A READ_BARRIER that answers a page of the resources under ``prefixes`` (List), the
    first ``limit`` after ``after`` by name (core/listing.py)."""
    body: dict[str, Any] = {"prefixes": list(prefixes), "limit": limit}
    if after is not None:
        body["after"] = after
    return Command(Op.READ_BARRIER, stamp_ms, body)


def force_release(*, resource: str, op_id: bytes, stamp_ms: int) -> Command:
    """Admin: clear the lease by issuing a new epoch for ``resource`` (I7)."""
    return Command(Op.FORCE_RELEASE, stamp_ms, {"resource": resource, "op_id": op_id})


def set_epoch_floor(*, floor: int, stamp_ms: int, fence_all: bool = True) -> Command:
    """Admin, after restore (I11): raise the epoch to ``floor``; optionally fence everything."""
    return Command(Op.SET_EPOCH_FLOOR, stamp_ms, {"floor": floor, "fence_all": fence_all})


def tick(*, stamp_ms: int) -> Command:
    """Advance the log clock and drop expired leases."""
    return Command(Op.TICK, stamp_ms, {})


def restore_begin(
    *, restore_id: bytes, size: int, digest: bytes, epoch_floor: int, stamp_ms: int
) -> Command:
    """Admin (I11): start staging a backup of ``size`` bytes whose sha256 is ``digest``; its
    COMMIT fences at an epoch above ``epoch_floor``. Replaces a stale staged restore."""
    body = {"restore_id": restore_id, "size": size, "digest": digest, "epoch_floor": epoch_floor}
    return Command(Op.RESTORE_BEGIN, stamp_ms, body)


def restore_chunk(*, restore_id: bytes, seq: int, chunk: bytes, stamp_ms: int) -> Command:
    """Admin: stage the ``seq``-th chunk (from 0, in order) of restore ``restore_id``."""
    return Command(Op.RESTORE_CHUNK, stamp_ms, {"restore_id": restore_id, "seq": seq, "chunk": chunk})


def restore_commit(*, restore_id: bytes, stamp_ms: int) -> Command:
    """Admin: check the staged backup's size and digest, re-check its content, swap it in."""
    return Command(Op.RESTORE_COMMIT, stamp_ms, {"restore_id": restore_id})


def restore_abort(*, restore_id: bytes, stamp_ms: int) -> Command:
    """Admin: drop the staged backup of restore ``restore_id`` (nothing else changes)."""
    return Command(Op.RESTORE_ABORT, stamp_ms, {"restore_id": restore_id})


def enqueue(*, resource: str, holder: str, ttl_ms: int, waiter_id: bytes, stamp_ms: int) -> Command:
    """Queue ``waiter_id`` for the lease on ``resource`` (a lease of ``ttl_ms`` once granted),
    or renew its place if it is queued already."""
    body = {"resource": resource, "holder": holder, "ttl_ms": ttl_ms, "waiter_id": waiter_id}
    return Command(Op.ENQUEUE, stamp_ms, body)


def dequeue(*, resource: str, waiter_id: bytes, stamp_ms: int) -> Command:
    """Take ``waiter_id`` out of ``resource``'s queue; release its lease if it was granted."""
    return Command(Op.DEQUEUE, stamp_ms, {"resource": resource, "waiter_id": waiter_id})


def set_cluster_level(*, level: int, stamp_ms: int) -> Command:
    """Raise the cluster's entry level to ``level`` (entry level 2; never lowers it)."""
    return Command(Op.SET_CLUSTER_LEVEL, stamp_ms, {"level": level})

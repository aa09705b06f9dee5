"""Commands of the fencing state machine: numbered op codes and their versioned envelope.

Owns: the op codes (their numbers never change), the entry levels, the msgpack envelope
``[FORMAT_VERSION, op, stamp_ms, body]`` of one Raft entry and its bounded decoder
(``unpack_envelope``), and ``Command``: an *unchecked* envelope, for the tests and tools that
must build what the server never would (a bad field, an unknown op) and feed it to the state
machine. What each op's body holds, and every check of it, is ``ops``'s: one typed class per
op, which the server builds, the proposer encodes and every replica decodes.
Must never: check body fields (``ops`` does), read a clock, draw randomness or do I/O.

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
(core/dedup.py). ``ops.charge_fields`` adds them; a command without them is charged to nobody
(the anonymous principal).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
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
# without an entry at any level. Level 4 adds no field: from it, a RESTORE_COMMIT keeps the
# dedup table (``LEVEL_RESTORE_KEEPS_DEDUP``, admin_handlers._swap_in), an apply rule read from
# the replicated cluster level, so every replica applies a COMMIT alike whatever its build
# (no member of a build below 4 can apply an entry once the level is 4: it stops at the
# SET_CLUSTER_LEVEL, or at a snapshot that records it). The replicated cluster level is the
# highest level every member runs; nothing that needs a higher level is ever proposed, so no
# member meets an entry it cannot apply. A new op or field gets the next level, here and in
# ``level_needed``.
ENTRY_LEVEL = limits.ENTRY_LEVEL
LEVEL_BEFORE_LEVELS = 1
LEVEL_RESTORE_KEEPS_DEDUP = 4
_OP_LEVEL = {Op.SET_CLUSTER_LEVEL: 2}
_FIELD_LEVEL = {(Op.DELETE, "expected_version"): 2, (Op.READ_BARRIER, "prefixes"): 3}


def level_needed(op: Op, field_set: Callable[[str], bool]) -> int:
    """The entry level a member needs to apply a command of ``op`` whose fields
    ``field_set(name)`` says are present."""
    needed = _OP_LEVEL.get(op, LEVEL_BEFORE_LEVELS)
    for (field_op, field), level in _FIELD_LEVEL.items():
        if field_op is op and field_set(field):
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
    """An unchecked command envelope: what to do, its stamp, and its body as a map. The
    state machine's ``execute`` checks it as ``apply`` checks an entry (tests, tools); the
    server never builds one (it builds ``ops`` bodies)."""

    op: Op
    stamp_ms: int
    body: dict[str, Any]

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


def unpack_envelope(data: bytes) -> tuple[Op, int, dict[str, Any]]:
    """``(op, stamp_ms, body map)`` of one Raft entry, refusing anything malformed.

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
    return validate_envelope(op, stamp_ms, body), stamp_ms, body


def decode(data: bytes) -> Command:
    """The unchecked ``Command`` of one entry (tools and tests that read entries back; the
    state machine decodes straight to a typed body, ``ops.decode``)."""
    return Command(*unpack_envelope(data))


# Unchecked constructors, one per op, for tests and tools: keyword fields as given (None is
# left out), no check and no field list of their own -- what each op carries is ``ops``'s.


def _unchecked(op: Op) -> Callable[..., Command]:
    def build(*, stamp_ms: int, **fields: Any) -> Command:
        return Command(op, stamp_ms, {name: value for name, value in fields.items() if value is not None})

    build.__name__ = op.name.lower()
    build.__doc__ = f"An unchecked {op.name} command with these body fields (None: left out)."
    return build


acquire = _unchecked(Op.ACQUIRE)
keep_alive = _unchecked(Op.KEEP_ALIVE)
release = _unchecked(Op.RELEASE)
write = _unchecked(Op.WRITE)
delete = _unchecked(Op.DELETE)
read_barrier = _unchecked(Op.READ_BARRIER)
list_page = _unchecked(Op.READ_BARRIER)
force_release = _unchecked(Op.FORCE_RELEASE)
set_epoch_floor = _unchecked(Op.SET_EPOCH_FLOOR)
tick = _unchecked(Op.TICK)
restore_begin = _unchecked(Op.RESTORE_BEGIN)
restore_chunk = _unchecked(Op.RESTORE_CHUNK)
restore_commit = _unchecked(Op.RESTORE_COMMIT)
restore_abort = _unchecked(Op.RESTORE_ABORT)
enqueue = _unchecked(Op.ENQUEUE)
dequeue = _unchecked(Op.DEQUEUE)
set_cluster_level = _unchecked(Op.SET_CLUSTER_LEVEL)

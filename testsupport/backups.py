"""Backups for tests, built directly as snapshot documents: the fullest state the limits allow,
and a state of a given size; and restoring one through the log as the server does, in chunks.

Owns: building those documents (msgpack, the state machine's snapshot layout) quickly, without
applying hundreds of thousands of commands, and the entries of a chunked restore. Must never:
be shipped (testsupport/ is outside the wheel), or build a document the state machine would
not accept as a backup: every builder's result goes through ``FencingStateMachine.restore``
and ``check_backup`` in the tests.
"""

from __future__ import annotations

import hashlib

import msgpack

from coordinator.core import commands, limits
from coordinator.core.commands import Op
from coordinator.core.outcomes import Applied, Outcome, Rejected, outcome_to_wire
from coordinator.core.results import AcquireResult
from coordinator.core.snapshot_format import SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC

# Version 2 added the staged restore (nil in a backup); version 1 had none. Written per the
# build's version, so the same builders run against a build before chunked restores too.
_STAGED = [None] if SNAPSHOT_FORMAT_VERSION >= 2 else []

# Integers at or above 2^32 take msgpack's largest integer form (9 bytes): the fullest state
# uses them for every epoch, revision, version, stamp and index.
BIG = 2**40


def _name(prefix: str, i: int, length: int) -> str:
    head = f"{prefix}{i:07d}"
    return head + "x" * (length - len(head))


def fullest_backup() -> bytes:
    """A backup at every limit at once: RESOURCES_MAX resources with the longest names,
    holders and owners, each leased; STATE_KEYS_MAX keys of the longest names holding
    STATE_STORED_BYTES_MAX bytes of keys and values together; DEDUP_ENTRIES_MAX dedup entries
    with the longest op_ids, resource names and principals; every number in its largest encoding."""
    epoch = clock = BIG
    ttl = limits.LEASE_TTL_MS_MAX
    keys_per = -(-limits.STATE_KEYS_MAX // limits.RESOURCES_MAX)
    # Keys as long as the stored-bytes limit lets every one of them be (KEY_BYTES_MAX, or less
    # when STATE_KEYS_MAX keys of that length would exceed it); values take the rest. Keys and
    # values count alike, so the split does not change the backup's size.
    key_len = min(limits.KEY_BYTES_MAX, limits.STATE_STORED_BYTES_MAX // limits.STATE_KEYS_MAX)
    value_bytes = limits.STATE_STORED_BYTES_MAX - limits.STATE_KEYS_MAX * key_len
    value_each, value_extra = divmod(value_bytes, limits.STATE_KEYS_MAX)
    resources = []
    keys_left = limits.STATE_KEYS_MAX
    for i in range(limits.RESOURCES_MAX):
        data = []
        for k in range(min(keys_per, keys_left)):
            size = value_each + (1 if keys_left <= value_extra else 0)
            data.append([_name("k", k, key_len), b"v" * size, BIG + k])
            keys_left -= 1
        resources.append([
            _name("r", i, limits.RESOURCE_NAME_BYTES_MAX), epoch, BIG + keys_per,
            ["h" * limits.HOLDER_BYTES_MAX, epoch, ttl, clock + ttl], data,
            "p" * limits.PRINCIPAL_NAME_BYTES_MAX,
        ])
    dedup = []
    wire = outcome_to_wire(Applied(op=Op.ACQUIRE, result=AcquireResult(token=BIG, expires_at_ms=BIG, hwm=BIG)))
    for i in range(limits.DEDUP_ENTRIES_MAX):
        op_id = i.to_bytes(8, "big") * (limits.OP_ID_BYTES_MAX // 8)
        dedup.append([
            op_id, int(Op.ACQUIRE), resources[i % len(resources)][0], wire, clock, BIG + i,
            "p" * limits.PRINCIPAL_NAME_BYTES_MAX,
        ])
    doc = [SNAPSHOT_MAGIC, SNAPSHOT_FORMAT_VERSION, epoch, clock, resources, dedup, *_STAGED]
    return msgpack.packb(doc, use_bin_type=True)


def backup_of_size(total_bytes: int, *, value_bytes: int = limits.VALUE_BYTES_MAX) -> bytes:
    """A backup of about ``total_bytes`` (a little over): resources of up to 64 keys, each
    holding ``value_bytes`` of distinct bytes, no leases, no dedup entries."""
    resources = []
    keys = -(-total_bytes // value_bytes)
    for i in range(-(-keys // 64)):
        data = []
        for k in range(min(64, keys - 64 * i)):
            seed = (64 * i + k).to_bytes(4, "big")
            data.append([f"k{k:03d}", (seed * (value_bytes // 4 + 1))[:value_bytes], k + 1])
        resources.append([f"big/{i:06d}", 7, 64, None, data])
    doc = [SNAPSHOT_MAGIC, SNAPSHOT_FORMAT_VERSION, 7, 1_000, resources, [], *_STAGED]
    return msgpack.packb(doc, use_bin_type=True)


RESTORE_ID = b"t" * limits.RESTORE_ID_BYTES


def restore_commands(data: bytes, *, epoch_floor: int, stamp_ms: int) -> list[commands.Command]:
    """RESTORE_BEGIN, a RESTORE_CHUNK per BACKUP_CHUNK_BYTES of ``data``, RESTORE_COMMIT: the
    entries the server proposes to restore ``data``. Only the COMMIT carries ``stamp_ms``; the
    others are stamped 0 so that they leave the log clock where it was, and a refused restore
    that is then aborted leaves the whole state (digest included) as it was."""
    step = limits.BACKUP_CHUNK_BYTES
    begin = commands.restore_begin(restore_id=RESTORE_ID, size=len(data), digest=hashlib.sha256(data).digest(),
                                   epoch_floor=epoch_floor, stamp_ms=0)
    chunks = [commands.restore_chunk(restore_id=RESTORE_ID, seq=n, chunk=data[at:at + step], stamp_ms=0)
              for n, at in enumerate(range(0, len(data), step))]
    return [begin, *chunks, commands.restore_commit(restore_id=RESTORE_ID, stamp_ms=stamp_ms)]


def restore_in_chunks(machine, data: bytes, *, epoch_floor: int, stamp_ms: int) -> Outcome:
    """Apply ``restore_commands`` to ``machine`` (a ``FencingStateMachine``) through the log;
    at the first refusal, ABORT (as the server's proposer does) and return that refusal, else
    the COMMIT's outcome. A command no member would propose (``checked``) is
    refused without reaching the log, as on a member."""
    outcome: Outcome | None = None
    for command in restore_commands(data, epoch_floor=epoch_floor, stamp_ms=stamp_ms):
        checked = machine.checked(command)
        outcome = checked if isinstance(checked, Rejected) else machine.apply(command.encode())
        if isinstance(outcome, Rejected):
            machine.apply(commands.restore_abort(restore_id=RESTORE_ID, stamp_ms=0).encode())
            return outcome
    assert outcome is not None
    return outcome

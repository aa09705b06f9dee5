"""Reading the state machine's snapshot: every field checked before it becomes state.

Owns: the snapshot's layout version and magic, and ``parse_snapshot``, which turns snapshot
bytes into the parts of a state or raises ValueError naming what is wrong. Every field is held
to the bounds live state keeps (the same field rules as commands, the ranges the handlers can
reach), so nothing restored can later make a handler, a snapshot or a reply fail. Counts are
held to the configured limits only for a backup restored through the log (``Counts``); a
member's own snapshot, written under other limits, must still load.
Must never: build state any other way than from a fully checked document, or do I/O (bytes
in, parts out; the state machine writes snapshots and the Raft layer stores them).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import msgpack

from coordinator.core import limits
from coordinator.core import validation
from coordinator.core.commands import Op
from coordinator.core.outcomes import Applied, is_flat_map, is_int, outcome_from_wire, outcome_to_wire
from coordinator.core.state import DedupEntry, Lease, ResourceState, StagedRestore, entry_bytes
from coordinator.core.validation import InvalidField

# Version of the snapshot layout written by snapshot(); 2 added the staged restore (a 7th item).
# Version 1 (6 items, nothing staged) is still read; any other is refused.
SNAPSHOT_FORMAT_VERSION = 2
SNAPSHOT_FORMAT_VERSIONS_READ = (1, 2)
SNAPSHOT_MAGIC = "fencing-coordinator/state"


# Every field is held to the bounds live state keeps (the same field rules
# as commands, the ranges the handlers can reach), so nothing restored can later make a
# handler, a snapshot or a reply fail. Counts are held to the configured limits only for a
# backup restored through the log (``Counts``); a member's own snapshot, written under
# other limits, must still load.


@dataclasses.dataclass(frozen=True)
class Counts:
    """How many resources, keys per resource and dedup entries a restored backup may hold."""

    resources_max: int
    keys_per_resource_max: int
    dedup_entries_max: int
    keys_max: int = limits.STATE_KEYS_MAX
    stored_bytes_max: int = limits.STATE_STORED_BYTES_MAX


@dataclasses.dataclass
class Parts:
    """What a snapshot holds, checked."""

    epoch: int
    log_clock_ms: int
    resources: dict[str, ResourceState]
    dedup: collections.OrderedDict[bytes, DedupEntry]
    staged: StagedRestore | None


def parse_snapshot(data: object, counts: Counts | None) -> Parts:
    """The parts of a ``snapshot()``; raises ValueError on anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"snapshot must be bytes, got {type(data).__name__}")
    try:
        doc = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, use_list=True)
    # Any parser failure means the file is not one of our snapshots.
    except Exception as exc:
        raise ValueError(f"snapshot is not valid msgpack: {type(exc).__name__}: {exc}") from exc
    return read_snapshot(doc, counts)


# The checks below run for every key and dedup entry of a snapshot (restore stalls the Raft
# thread): their messages are formatted only when a check fails.


def _need(condition: bool, message: str, *args: object) -> None:
    if not condition:
        raise ValueError("bad snapshot: " + (message % args if args else message))


def _need_int(value: object, low: int, high: int, what: str, *args: object) -> int:
    """``value``, if an int in [low, high]; ``what % args`` names it."""
    if not (is_int(value) and low <= value <= high):
        name = what % args if args else what
        _need(is_int(value), "%s must be an integer", name)
        _need(False, "%s %s is outside [%s, %s]", name, value, low, high)
    return value


def _need_field(check: Callable[[object], Any], value: object, what: str, *args: object) -> Any:
    """``check(value)`` (a field rule of validation.py); its refusal names ``what % args``."""
    try:
        return check(value)
    except InvalidField as exc:
        raise ValueError(f"bad snapshot: {what % args if args else what}: {exc}") from None


def _need_count(items: list, high: int | None, what: str, *args: object) -> None:
    if high is not None and len(items) > high:
        _need(False, "%s: %d, more than %d", what % args if args else what, len(items), high)


def read_snapshot(doc: object, counts: Counts | None) -> Parts:
    _need(isinstance(doc, list) and len(doc) in (6, 7), "top level must be a 6- or 7-item array")
    magic, version, epoch, log_clock_ms, raw_resources, raw_dedup, *rest = doc
    _need(magic == SNAPSHOT_MAGIC, "not a fencing-coordinator state snapshot")
    _need(
        is_int(version) and version in SNAPSHOT_FORMAT_VERSIONS_READ,
        "unknown snapshot format version %r (this build reads %s)", version, SNAPSHOT_FORMAT_VERSIONS_READ,
    )
    _need(len(doc) == (6 if version == 1 else 7), "a version %d snapshot has %d items", version, 6 + (version > 1))
    epoch = _need_int(epoch, 0, limits.TOKEN_MAX, "epoch")
    # The log clock is the greatest stamp applied, and stamps are at most STAMP_MS_MAX.
    log_clock_ms = _need_int(log_clock_ms, 0, limits.STAMP_MS_MAX, "log_clock_ms")

    _need(isinstance(raw_resources, list), "resources must be an array")
    _need_count(raw_resources, counts and counts.resources_max, "resources")
    resources: dict[str, ResourceState] = {}
    previous_name: str | None = None
    keys_total = stored_bytes_total = 0
    for item in raw_resources:
        # 5 items: no owner (written before quotas, or never acquired by a principal).
        _need(isinstance(item, list) and len(item) in (5, 6), "a resource must be 5 or 6 items")
        name, hwm, revision, raw_lease, raw_data, owner = item if len(item) == 6 else (*item, "")
        name = _need_field(validation.check_resource, name, "resource name")
        _need(previous_name is None or name > previous_name, "resources must be sorted, unique")
        previous_name = name
        hwm = _need_int(hwm, 1, epoch, "hwm of %r", name)
        revision = _need_int(revision, 0, limits.REVISION_MAX, "revision of %r", name)
        lease = None
        if raw_lease is not None:
            _need(isinstance(raw_lease, list) and len(raw_lease) == 4, "lease must be 4 items")
            holder, token, ttl_ms, expires_at_ms = raw_lease
            holder = _need_field(validation.check_holder, holder, "lease holder of %r", name)
            _need(token == hwm and is_int(token), "lease token of %r must equal its hwm", name)
            ttl_ms = _need_field(validation.check_ttl_ms, ttl_ms, "lease ttl_ms of %r", name)
            lease = Lease(
                holder=holder,
                token=token,
                ttl_ms=ttl_ms,
                # Set to now + ttl_ms at a now no later than the log clock.
                expires_at_ms=_need_int(
                    expires_at_ms, ttl_ms, log_clock_ms + ttl_ms, "lease expiry of %r", name
                ),
            )
        _need(isinstance(raw_data, list), "data of %r must be an array", name)
        _need_count(raw_data, counts and counts.keys_per_resource_max, "keys of %r", name)
        data: dict[str, tuple[bytes, int]] = {}
        previous_key: str | None = None
        versions: set[int] = set()
        for entry in raw_data:
            _need(isinstance(entry, list) and len(entry) == 3, "a key entry must be 3 items")
            key, value, key_version = entry
            key = _need_field(validation.check_key, key, "a key of %r", name)
            _need(previous_key is None or key > previous_key, "keys of %r must be sorted", name)
            previous_key = key
            value = _need_field(validation.check_value, value, "value of %r/%r", name, key)
            key_version = _need_int(key_version, 1, revision, "version of %r/%r", name, key)
            _need(key_version not in versions, "two keys of %r share a version", name)
            versions.add(key_version)
            data[key] = (value, key_version)
        if len(item) == 6:
            try:
                validation.check_principal(owner)
            except InvalidField as exc:
                raise ValueError(f"bad snapshot: owner of {name!r}: {exc}") from None
        stored_bytes = sum(entry_bytes(key, value) for key, (value, _) in data.items())
        keys_total += len(data)
        stored_bytes_total += stored_bytes
        resources[name] = ResourceState(
            high_water_mark=hwm,
            lease=lease,
            revision=revision,
            data=data,
            owner=owner,
            stored_bytes=stored_bytes,
        )
    if counts is not None:
        # The cluster-wide bounds a live write is held to (state_machine._write).
        _need(keys_total <= counts.keys_max, "keys: %d, more than %d", keys_total, counts.keys_max)
        _need(
            stored_bytes_total <= counts.stored_bytes_max,
            "stored bytes (keys + values): %d, more than %d", stored_bytes_total, counts.stored_bytes_max,
        )

    _need(isinstance(raw_dedup, list), "dedup must be an array")
    _need_count(raw_dedup, counts and counts.dedup_entries_max, "dedup entries")
    dedup: collections.OrderedDict[bytes, DedupEntry] = collections.OrderedDict()
    checked_names = set(resources)
    previous_at = 0
    for item in raw_dedup:
        # 5 items: written before first-applied indexes were kept (index unknown: 0).
        _need(isinstance(item, list) and len(item) in (5, 6), "a dedup entry must be 5 or 6 items")
        op_id, op, resource, wire, applied_at_ms, first_index = item if len(item) == 6 else (*item, 0)
        op_id = _need_field(validation.check_op_id, op_id, "a dedup op_id")
        _need(op_id not in dedup, "dedup op_ids must be unique")
        _need(is_int(op) and op in Op._value2member_map_, "unknown dedup op %r", op)
        # Every op that carries an op_id acts on one resource. Most name a resource already
        # checked above (or in an earlier entry): checked once, as restore stalls the Raft thread.
        if not (isinstance(resource, str) and resource in checked_names):
            resource = _need_field(validation.check_resource, resource, "dedup resource")
            checked_names.add(resource)
        try:
            outcome = outcome_from_wire(wire)
        except ValueError as exc:
            raise ValueError(f"bad snapshot: dedup outcome: {exc}") from exc
        _need(isinstance(outcome, Applied) and outcome.op == op, "dedup outcome must be Applied")
        result = wire[2]
        # A result is a flat map (the handlers make no nested ones): packable as stored.
        _need(is_flat_map(result), "dedup result must be a flat map")
        if list(result) != sorted(result):
            wire = None  # not canonical (a hand-made backup): re-encoded from the outcome
        applied_at_ms = _need_int(applied_at_ms, previous_at, log_clock_ms, "dedup applied_at_ms")
        previous_at = applied_at_ms
        dedup[op_id] = DedupEntry(
            op_id,
            outcome.op,
            resource,
            # Canonical as read: not converted again (restore time is a stall too).
            outcome_to_wire(outcome) if wire is None else wire,
            applied_at_ms,
            _need_int(first_index, 0, limits.RAFT_INDEX_MAX, "dedup index"),
        )
    staged = _read_staged(rest[0] if rest else None, log_clock_ms)
    return Parts(epoch, log_clock_ms, resources, dedup, staged)


def _read_staged(raw: object, log_clock_ms: int) -> StagedRestore | None:
    """A staged restore as RESTORE_BEGIN and RESTORE_CHUNK leave it (nil: none)."""
    if raw is None:
        return None
    _need(isinstance(raw, list) and len(raw) == 6, "a staged restore must be 6 items")
    restore_id, size, digest, epoch_floor, touched_at_ms, chunks = raw
    staged = StagedRestore(
        restore_id=_need_field(validation.check_restore_id, restore_id, "staged restore id"),
        size=_need_field(validation.check_backup_size, size, "staged restore size"),
        digest=_need_field(validation.check_digest, digest, "staged restore digest"),
        epoch_floor=_need_field(validation.check_epoch_floor, epoch_floor, "staged restore floor"),
        touched_at_ms=_need_int(touched_at_ms, 0, log_clock_ms, "staged restore touched_at_ms"),
    )
    _need(isinstance(chunks, list), "staged chunks must be an array")
    _need_count(chunks, limits.RESTORE_CHUNKS_MAX, "staged chunks")
    for chunk in chunks:
        staged.chunks.append(_need_field(validation.check_chunk, chunk, "a staged chunk"))
        staged.staged_bytes += len(chunk)
    _need(staged.staged_bytes <= staged.size, "staged chunks hold more than the declared size")
    return staged

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
from collections.abc import Callable, Generator
from typing import Any

import msgpack

from coordinator.core import limits, validation
from coordinator.core.commands import Op
from coordinator.core.outcomes import check_stored_wire, outcome_from_wire, outcome_to_wire
from coordinator.core.state import (
    NO_WAITERS,
    DedupEntry,
    KeyData,
    Lease,
    ResourceState,
    ResourceTable,
    StagedRestore,
    Waiter,
    entry_bytes,
    shared,
)
from coordinator.core.validation import InvalidField, is_int

# Version of the snapshot layout written by snapshot(); 2 added the staged restore (a 7th item);
# 3 the lock queue (a resource's 7th item, its waiters; a lease's 5th, the waiter it was granted
# to), which a version-2 reader would refuse rather than misread; 4 a lease slot of false (no
# lease, and the hwm only fenced the resource: DESIGN I3), which a version-3 reader refuses.
# Versions 1 to 3 are still read; any other is refused. A dedup entry names its principal (a 7th item, so that
# its per-principal budget survives a snapshot: core/dedup.py) in every version: entries of 5 or
# 6 items, written before, are refused (0.1.0 was never released; no such snapshot is kept).
# 5 (entry level 2) adds the cluster's entry level as an 8th item; it is written only once the
# cluster level is above 1, so a member of the release before levels (which reads 1 to 4 and
# refuses 5: it stops, exit 70) is sent only snapshots it reads, until every member runs a
# build that reads 5 (DESIGN §8 "Rolling upgrades").
SNAPSHOT_FORMAT_VERSION = 4
SNAPSHOT_FORMAT_VERSION_LEVELS = 5
SNAPSHOT_FORMAT_VERSIONS_READ = (1, 2, 3, 4, 5)
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
    cluster_level: int = 1  # the cluster's entry level (format 5; 1 before it)


def parse_snapshot(data: object, counts: Counts | None) -> Parts:
    """The parts of a ``snapshot()``; raises ValueError on anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"snapshot must be bytes, got {type(data).__name__}")
    reader = SnapshotReader(len(data))
    view = memoryview(data)
    # Fed a chunk at a time, so the reader's buffer holds at most a chunk and an item.
    for offset in range(0, len(view), limits.BACKUP_CHUNK_BYTES):
        reader.feed(view[offset : offset + limits.BACKUP_CHUNK_BYTES])
    return reader.finish(counts)


_OPS: dict[Any, Op] = Op._value2member_map_  # type: ignore[assignment]  # number -> Op, no Enum call
_OP_ID_BYTES_MIN, _OP_ID_BYTES_MAX = limits.OP_ID_BYTES_MIN, limits.OP_ID_BYTES_MAX

# The checks below run for every key and dedup entry of a snapshot (restore stalls the Raft
# thread): their messages are formatted only when a check fails.


def _need(condition: bool, message: str, *args: object) -> None:
    if not condition:
        raise ValueError("bad snapshot: " + (message % args if args else message))


def _need_int(value: object, low: int, high: int, what: str, *args: object) -> int:
    """``value``, if an int in [low, high]; ``what % args`` names it."""
    if is_int(value) and low <= value <= high:
        return value
    name = what % args if args else what
    _need(is_int(value), "%s must be an integer", name)
    raise ValueError("bad snapshot: " + "%s %s is outside [%s, %s]" % (name, value, low, high))


def _need_field(check: Callable[[object], Any], value: object, what: str, *args: object) -> Any:
    """``check(value)`` (a field rule of validation.py); its refusal names ``what % args``."""
    try:
        return check(value)
    except InvalidField as exc:
        raise ValueError(f"bad snapshot: {what % args if args else what}: {exc}") from None


def _need_count(count: int, high: int | None, what: str, *args: object) -> None:
    if high is not None and count > high:
        _need(False, "%s: %d, more than %d", what % args if args else what, count, high)


# What the reading steps ask the reader for next: an array's head (its length), a whole item,
# or a list of the whole items there are, at least one and at most as many as asked for.
_HEAD, _ITEM, _ITEMS = "head", "item", "items"


def _not_msgpack(exc: Exception) -> ValueError:
    return ValueError(f"snapshot is not valid msgpack: {type(exc).__name__}: {exc}")


class SnapshotReader:
    """A snapshot document read as its bytes arrive: each item is checked as soon as it is
    whole, so reading a backup staged in chunks costs each chunk its share, and nothing is
    left for the commit but ``finish`` (a chunk's share of the largest backup: ~20 ms, where
    reading it whole stalled the Raft thread ~5 s). The same bytes give the same parts or the
    same refusal however they are split, which is what lets every replica, and a member that
    re-reads a staged restore's chunks from a snapshot, reach the same verdict.

    ``feed`` never raises: the first refusal is kept and raised by ``finish``. Counts against
    the configured limits are checked by ``finish`` (a staging read from a member's snapshot
    is re-read under this member's limits). ``keep_dedup=False`` checks dedup entries without
    keeping them (a restore through the log drops them).
    """

    def __init__(self, size: int, *, keep_dedup: bool = True) -> None:
        # As unpackb(data) bounds strings, arrays and maps by len(data): the declared size.
        self._unpacker: msgpack.Unpacker | None = msgpack.Unpacker(
            raw=False, strict_map_key=True, use_list=True, max_buffer_size=max(1, size)
        )
        self._fed = 0
        self._tallies: dict[str, Any] = {}
        self._steps = _read_steps(self._tallies, keep_dedup)
        self._wanted: tuple[str, Any] | None = next(self._steps)
        self._parts: Parts | None = None
        self.error: ValueError | None = None

    def feed(self, data: bytes | memoryview) -> None:
        """Take the next bytes and check every item they complete."""
        if self.error is not None:
            return  # refused already: nothing more is buffered
        self._fed += len(data)
        unpacker = self._unpacker
        assert unpacker is not None  # dropped only by _fail, which sets the error tested above
        try:
            unpacker.feed(data)
        # Past the bound given at construction, or any other failure msgpack may raise (it
        # documents that "other exceptions can be raised"): not a snapshot.
        except Exception as exc:  # noqa: BLE001 - see above
            self._fail(_not_msgpack(exc))
            return
        while self._wanted is not None:
            kind, need = self._wanted
            parse_error: Exception | None = None
            if kind is _ITEMS:
                # As many whole items as are here (up to ``need``), checked in one send: one
                # generator round trip per item was a fifth of a full dedup table's restore.
                value: Any = []
                try:
                    for _ in range(need):
                        value.append(unpacker.unpack())
                except msgpack.OutOfData:
                    if not value:
                        return
                # Any parser failure means the bytes are not one of our snapshots; the items
                # before it are checked first, as they would be one at a time.
                except Exception as exc:  # noqa: BLE001 - msgpack may raise any type
                    parse_error = exc
            else:
                try:
                    value = unpacker.read_array_header() if kind is _HEAD else unpacker.unpack()
                except msgpack.OutOfData:
                    return
                except Exception as exc:  # noqa: BLE001 - msgpack may raise any type
                    if kind is _HEAD:
                        self._fail(ValueError(f"bad snapshot: {need}"))
                    else:
                        self._fail(_not_msgpack(exc))
                    return
            if parse_error is None or value:
                try:
                    self._wanted = self._steps.send(value)
                except StopIteration as done:
                    self._parts, self._wanted = done.value, None
                except ValueError as exc:
                    self._fail(exc)
                    return
                # Unreachable past the checks above; should an item still make one fail, it is
                # a refusal like any other: a staged chunk must never make apply, or a member
                # loading a snapshot taken mid-restore (which reads the chunks again), raise.
                except Exception as exc:  # noqa: BLE001 - so any type
                    self._fail(ValueError(f"bad snapshot: reading it failed ({type(exc).__name__}: {exc})"))
                    return
            if parse_error is not None:
                self._fail(_not_msgpack(parse_error))
                return

    def _fail(self, error: ValueError) -> None:
        self.error = error
        self._wanted = None
        self._steps.close()
        self._unpacker = None  # its buffer and half-read item: memory back

    def finish(self, counts: Counts | None) -> Parts:
        """The parts, once every byte is in; ValueError for anything else."""
        if self.error is not None:
            raise self.error
        if self._parts is None:
            raise ValueError("snapshot is not valid msgpack: the document is incomplete")
        assert self._unpacker is not None  # dropped only by _fail, which sets the error tested above
        if self._unpacker.tell() != self._fed:
            raise ValueError("snapshot is not valid msgpack: extra data after the document")
        if counts is not None:
            tally = self._tallies
            _need_count(tally["resources"], counts.resources_max, "resources")
            for name, keys in tally["keys_records"]:
                _need_count(keys, counts.keys_per_resource_max, "keys of %r", name)
            # The cluster-wide bounds a live write is held to (write_handlers._write).
            _need(tally["keys"] <= counts.keys_max, "keys: %d, more than %d", tally["keys"], counts.keys_max)
            _need(
                tally["stored_bytes"] <= counts.stored_bytes_max,
                "stored bytes (keys + values): %d, more than %d", tally["stored_bytes"], counts.stored_bytes_max,
            )
            _need_count(tally["dedup"], counts.dedup_entries_max, "dedup entries")
        return self._parts


def _read_steps(tallies: dict[str, Any], keep_dedup: bool) -> Generator[tuple[str, Any], Any, Parts]:
    """The document, item by item: yields what it needs next, is sent it, returns the Parts.
    ``tallies`` gets the counts ``SnapshotReader.finish`` holds to the configured limits."""
    length = yield _HEAD, "top level must be a 6- to 8-item array"
    _need(length in (6, 7, 8), "top level must be a 6- to 8-item array")
    magic = yield _ITEM, ""
    _need(magic == SNAPSHOT_MAGIC, "not a fencing-coordinator state snapshot")
    version = yield _ITEM, ""
    _need(
        is_int(version) and version in SNAPSHOT_FORMAT_VERSIONS_READ,
        "unknown snapshot format version %r (this build reads %s)", version, SNAPSHOT_FORMAT_VERSIONS_READ,
    )
    items = 6 if version == 1 else 8 if version >= SNAPSHOT_FORMAT_VERSION_LEVELS else 7
    _need(length == items, "a version %d snapshot has %d items", version, items)
    epoch = _need_int((yield _ITEM, ""), 0, limits.TOKEN_MAX, "epoch")
    # The log clock is the greatest stamp applied, and stamps are at most STAMP_MS_MAX.
    log_clock_ms = _need_int((yield _ITEM, ""), 0, limits.STAMP_MS_MAX, "log_clock_ms")

    count = yield _HEAD, "resources must be an array"
    tallies["resources"] = count
    # The resources whose key count beats every earlier one's: the first of them over a limit
    # is the first resource over it, whatever the limit (finish checks them in order).
    keys_records: list[tuple[str, int]] = []
    tallies["keys_records"] = keys_records
    resources = ResourceTable()
    previous_name: str | None = None
    keys_total = stored_bytes_total = 0
    labels: dict[str, str] = {}  # holders and keys checked already, each as shared() stores it
    for _ in range(count):
        res, name = _read_resource((yield _ITEM, ""), previous_name, epoch, log_clock_ms, version, labels)
        previous_name = name
        if not keys_records or len(res.data) > keys_records[-1][1]:
            keys_records.append((name, len(res.data)))
        keys_total += len(res.data)
        stored_bytes_total += res.stored_bytes
        resources[name] = res
    tallies["keys"], tallies["stored_bytes"] = keys_total, stored_bytes_total

    count = yield _HEAD, "dedup must be an array"
    tallies["dedup"] = count
    dedup: collections.OrderedDict[bytes, DedupEntry] = collections.OrderedDict()
    seen_op_ids: set[bytes] = set()
    checked_names = set(resources)
    principals: dict[str, str] = {}
    previous_at = 0
    left = count
    while left:
        items = yield _ITEMS, left
        left -= len(items)
        for item in items:
            entry = _read_dedup(item, seen_op_ids, checked_names, previous_at, log_clock_ms, keep_dedup, principals)
            previous_at = entry[4]
            if keep_dedup:
                dedup[entry[0]] = DedupEntry(*entry)
    staged = _read_staged((yield _ITEM, "") if length >= 7 else None, log_clock_ms)
    cluster_level = 1
    if length == 8:
        # Written only above level 1 (snapshot_pack), and never above what this build applies.
        cluster_level = _need_int((yield _ITEM, ""), 2, limits.ENTRY_LEVEL, "cluster_level")
    return Parts(epoch, log_clock_ms, resources, dedup, staged, cluster_level)


def _read_resource(item: Any, previous_name: str | None, epoch: int, log_clock_ms: int, version: int = 3,
                   labels: dict[str, str] | None = None) -> tuple[ResourceState, str]:
    """(the resource, its name) of one resources item, every field checked. ``labels`` holds
    the holders and keys checked by earlier items of the same snapshot (a million resources
    mostly repeat a few), so each distinct one is checked and interned once."""
    if labels is None:
        labels = {}
    # 5 items: no owner (written before quotas, or never acquired by a principal); 7: waiters
    # queued (format 3 on).
    lengths = (5, 6, 7) if version >= 3 else (5, 6)
    _need(
        isinstance(item, list) and len(item) in lengths, "a resource must be %s items", " or ".join(map(str, lengths))
    )
    name, hwm, revision, raw_lease, raw_data, owner, raw_waiters = (*item, "", None)[:7] if len(item) == 5 else (
        (*item, None) if len(item) == 6 else item
    )
    name = _need_field(validation.check_resource, name, "resource name")
    _need(previous_name is None or name > previous_name, "resources must be sorted, unique")
    # Each number is checked inline first (``type(x) is int`` is an int and not a bool) and by
    # _need_int only when that fails, to raise its error: a restore reads every field of every
    # resource, and a function call per field was a third of the time at a million resources.
    if not (type(hwm) is int and 1 <= hwm <= epoch):
        _need_int(hwm, 1, epoch, "hwm of %r", name)
    if not (type(revision) is int and 0 <= revision <= limits.REVISION_MAX):
        _need_int(revision, 0, limits.REVISION_MAX, "revision of %r", name)
    lease = None
    # Format 4: a lease slot of false is no lease, with an hwm that only fenced the resource.
    fenced = raw_lease is False and version >= 4
    if fenced:
        raw_lease = None
    if raw_lease is not None:
        lease = _read_lease(raw_lease, name, hwm, log_clock_ms, version, labels)
    _need(isinstance(raw_data, list), "data of %r must be an array", name)
    data = KeyData()
    previous_key: str | None = None
    versions: set[int] = set()
    stored_bytes = 0
    for entry in raw_data:
        _need(isinstance(entry, list) and len(entry) == 3, "a key entry must be 3 items")
        key, value, key_version = entry
        known = labels.get(key) if type(key) is str else None
        if known is None:
            known = labels[key] = shared(_need_field(validation.check_key, key, "a key of %r", name))
        key = known
        _need(previous_key is None or key > previous_key, "keys of %r must be sorted", name)
        previous_key = key
        if not (type(value) is bytes and len(value) <= limits.VALUE_BYTES_MAX):
            _need_field(validation.check_value, value, "value of %r/%r", name, key)
        if not (type(key_version) is int and 1 <= key_version <= revision):
            _need_int(key_version, 1, revision, "version of %r/%r", name, key)
        _need(key_version not in versions, "two keys of %r share a version", name)
        versions.add(key_version)
        data[key] = (value, key_version)
        stored_bytes += entry_bytes(key, value)
    if len(item) == 6 or (len(item) == 7 and owner != ""):
        try:
            validation.check_principal(owner)
        except InvalidField as exc:
            raise ValueError(f"bad snapshot: owner of {name!r}: {exc}") from None
    waiters = NO_WAITERS if raw_waiters is None else _read_waiters(raw_waiters, name, log_clock_ms)
    res = ResourceState(
        high_water_mark=hwm, lease=lease, revision=revision, data=data, owner=shared(owner), stored_bytes=stored_bytes,
        waiters=waiters, fenced=fenced,
    )
    return res, name


def _read_lease(raw_lease: Any, name: str, hwm: int, log_clock_ms: int, version: int, labels: dict[str, str]) -> Lease:
    """The lease of resource ``name`` (its hwm ``hwm``), every field checked; holders interned
    in ``labels`` as ``_read_resource`` does."""
    lease_lengths = (4, 5) if version >= 3 else (4,)
    _need(
        isinstance(raw_lease, list) and len(raw_lease) in lease_lengths,
        "lease must be 4 items (5: granted to a waiter)",
    )
    holder, token, ttl_ms, expires_at_ms, waiter_id = raw_lease if len(raw_lease) == 5 else (*raw_lease, b"")
    if len(raw_lease) == 5:
        waiter_id = _need_field(validation.check_waiter_id, waiter_id, "lease waiter_id of %r", name)
    known = labels.get(holder) if type(holder) is str else None
    if known is None:
        known = labels[holder] = shared(_need_field(validation.check_holder, holder, "lease holder of %r", name))
    holder = known
    _need(token == hwm and is_int(token), "lease token of %r must equal its hwm", name)
    if not (type(ttl_ms) is int and limits.LEASE_TTL_MS_MIN <= ttl_ms <= limits.LEASE_TTL_MS_MAX):
        _need_field(validation.check_ttl_ms, ttl_ms, "lease ttl_ms of %r", name)
    # Set to now + ttl_ms at a now no later than the log clock.
    if not (type(expires_at_ms) is int and ttl_ms <= expires_at_ms <= log_clock_ms + ttl_ms):
        _need_int(expires_at_ms, ttl_ms, log_clock_ms + ttl_ms, "lease expiry of %r", name)
    return Lease(holder=holder, token=token, ttl_ms=ttl_ms, expires_at_ms=expires_at_ms, waiter_id=waiter_id)


def _read_waiters(raw: Any, name: str, log_clock_ms: int) -> dict[bytes, Waiter]:
    """A resource's queue, in FIFO order: non-empty (an empty one is written as no item), at
    most LOCK_WAITERS_PER_RESOURCE_MAX, ids unique, each slot ending no later than a renewal
    at the log clock would set it."""
    _need(isinstance(raw, list) and len(raw) > 0, "waiters of %r must be a non-empty array", name)
    _need_count(len(raw), limits.LOCK_WAITERS_PER_RESOURCE_MAX, "waiters of %r", name)
    waiters: dict[bytes, Waiter] = {}
    for entry in raw:
        _need(isinstance(entry, list) and len(entry) == 6, "a waiter of %r must be 6 items", name)
        waiter_id, holder, ttl_ms, expires_at_ms, principal, quota = entry
        waiter_id = _need_field(validation.check_waiter_id, waiter_id, "a waiter id of %r", name)
        _need(waiter_id not in waiters, "waiter ids of %r must be unique", name)
        if principal != "":
            principal = _need_field(validation.check_principal, principal, "a waiter principal of %r", name)
        waiters[waiter_id] = Waiter(
            waiter_id=waiter_id,
            holder=_need_field(validation.check_holder, holder, "a waiter holder of %r", name),
            ttl_ms=_need_field(validation.check_ttl_ms, ttl_ms, "a waiter ttl_ms of %r", name),
            expires_at_ms=_need_int(
                expires_at_ms, 0, log_clock_ms + limits.LOCK_WAITER_TTL_MS, "a waiter expiry of %r", name
            ),
            principal=principal,
            quota=_need_field(validation.check_quota, quota, "a waiter quota of %r", name),
        )
    return waiters


def _read_dedup(
    item: Any, seen_op_ids: set[bytes], checked_names: set[str], previous_at: int, log_clock_ms: int,
    keep: bool, principals: dict[str, str],
) -> tuple[Any, ...]:
    """DedupEntry's arguments for one dedup item, every field checked (``seen_op_ids`` and
    ``checked_names`` are updated). With ``keep`` False the stored outcome is not rebuilt.
    ``principals`` holds the principal names checked by earlier entries (a table of 100,000
    entries names a few dozen), each as ``shared()`` stores it.

    This runs for every entry of a full table on the Raft thread: at a member's start, at a
    snapshot from the leader, and for every backup restored through the log (whose entries
    are checked, then dropped). So each field is first held to the exact type msgpack gives
    and its bounds, inline; only a field that fails that takes the general check, which then
    refuses it or accepts it the same way (the verdict is the general check's)."""
    if type(item) is not list or len(item) != 7:
        _need(isinstance(item, list) and len(item) == 7, "a dedup entry must be 7 items")
    op_id, op, resource, wire, applied_at_ms, first_index, principal = item
    if type(op_id) is not bytes or not _OP_ID_BYTES_MIN <= len(op_id) <= _OP_ID_BYTES_MAX:
        op_id = _need_field(validation.check_op_id, op_id, "a dedup op_id")
    _need(op_id not in seen_op_ids, "dedup op_ids must be unique")
    seen_op_ids.add(op_id)
    known_op = _OPS.get(op) if is_int(op) else None
    if known_op is None:
        raise ValueError(f"bad snapshot: unknown dedup op {op!r}")
    # Every op that carries an op_id acts on one resource. Most name a resource already
    # checked above (or in an earlier entry): checked once, as restore stalls the Raft thread.
    if not (isinstance(resource, str) and resource in checked_names):
        resource = _need_field(validation.check_resource, resource, "dedup resource")
        checked_names.add(resource)
    try:
        # Checked without building the outcome: an entry is rebuilt only when a retry asks for
        # it (DedupEntry.outcome).
        check_stored_wire(wire, known_op)
    except ValueError as exc:
        raise ValueError(f"bad snapshot: dedup outcome: {exc}") from exc
    if keep:
        result = wire[2]
        if list(result) != sorted(result):
            # Not canonical (a hand-made document): re-encoded, so equal states pack equal bytes.
            wire = outcome_to_wire(outcome_from_wire(wire))
        # (Canonical as read otherwise: not converted again, as restore time is a stall too.)
    if type(applied_at_ms) is not int or not previous_at <= applied_at_ms <= log_clock_ms:
        applied_at_ms = _need_int(applied_at_ms, previous_at, log_clock_ms, "dedup applied_at_ms")
    if type(first_index) is not int or not 0 <= first_index <= limits.RAFT_INDEX_MAX:
        first_index = _need_int(first_index, 0, limits.RAFT_INDEX_MAX, "dedup index")
    known = principals.get(principal) if type(principal) is str else None
    if known is None:
        # "": the anonymous principal (a command charged to nobody).
        known = "" if principal == "" else _need_field(validation.check_principal, principal, "dedup principal")
        principals[principal] = known = shared(known)
    return op_id, known_op, resource, wire, applied_at_ms, first_index, known


def _read_staged(raw: Any, log_clock_ms: int) -> StagedRestore | None:
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
    _need_count(len(chunks), limits.RESTORE_CHUNKS_MAX, "staged chunks")
    for chunk in chunks:
        staged.stage(_need_field(validation.check_chunk, chunk, "a staged chunk"))
    _need(staged.staged_bytes <= staged.size, "staged chunks hold more than the declared size")
    return staged

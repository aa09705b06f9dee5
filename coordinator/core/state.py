"""The state the fencing state machine keeps, as data: leases, resources, the per-principal
usage derived from them, and dedup entries.

Owns: the shapes of that state and the bookkeeping that keeps derived figures (stored bytes,
per-principal usage) equal to what the resources hold. Must never: decide a rule (the state
machine does: who may acquire, what a write needs), read a clock, or do I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, MutableMapping
from sys import intern
from typing import Any, cast

import msgpack

from coordinator.core.commands import Op
from coordinator.core.name_index import SortedNames
from coordinator.core.outcomes import Applied, outcome_from_wire


# The waiters of a resource nobody waits on: one shared, read-only empty mapping rather than an
# empty dict per resource (80 B each with its GC header: 80 MB of every member at a million
# resources). LockQueue gives a resource a dict of its own when a first waiter queues and puts
# this back when the last one leaves; writing to it raises, so a missed swap cannot leak a waiter
# into every resource.
class _NoWaiters(Mapping[bytes, Any]):
    __slots__ = ()

    def __getitem__(self, waiter_id: bytes) -> Any:
        raise KeyError(waiter_id)

    def __iter__(self) -> Iterator[bytes]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "NO_WAITERS"


# Typed as the dict it stands in for (ResourceState.waiters): reading it is reading an empty dict,
# and the one difference, that writing raises, is the point.
NO_WAITERS = cast("dict[bytes, Waiter]", _NoWaiters())


# ``shared(text)``: ``text`` as the one copy every resource that stores it shares. Holders, keys
# and owners repeat across resources (a service's hosts, a schema's key names, a tenant), yet
# each command decodes its own copy, ~50-60 B a resource each. Interned strings are freed once
# no resource holds them, and interning changes no value: replicas stay equal. sys.intern
# itself, not a wrapper: a restore calls it for every resource.
shared = intern


class KeyData(MutableMapping[str, tuple[bytes, int]]):
    """A resource's keys: key -> ``(value, version)``, a mapping like a dict.

    Most resources hold one key, and a dict of one costs ~200 B (its smallest table has eight
    slots) plus a 72 B tuple for the pair: 270 MB at a million resources. The first key lives
    in three slots of this object instead (64 B in all), and a dict holds only the keys after
    it. Iteration order is not insertion order once the first key is deleted; nothing relies on
    it (snapshots sort the keys).
    """

    __slots__ = ("_key", "_value", "_version", "_more")

    def __init__(self, items: Mapping[str, tuple[bytes, int]] | None = None) -> None:
        self._key: str | None = None
        self._value: bytes = b""
        self._version = 0
        self._more: dict[str, tuple[bytes, int]] | None = None
        for key, pair in (items or {}).items():
            self[key] = pair

    def get(self, key: str, default: Any = None) -> Any:  # the write path's lookup: no exception
        if key == self._key:
            return self._value, self._version
        more = self._more
        return default if more is None else more.get(key, default)

    def __getitem__(self, key: str) -> tuple[bytes, int]:
        pair: tuple[bytes, int] | None = self.get(key)
        if pair is None:
            raise KeyError(key)
        return pair

    def __contains__(self, key: object) -> bool:
        return key == self._key or (self._more is not None and key in self._more)

    def __setitem__(self, key: str, pair: tuple[bytes, int]) -> None:
        value, version = pair
        if key == self._key or (self._key is None and not (self._more and key in self._more)):
            self._key, self._value, self._version = key, value, version
        else:
            if self._more is None:
                self._more = {}
            self._more[key] = (value, version)

    def __delitem__(self, key: str) -> None:
        if key == self._key:
            self._key, self._value, self._version = None, b"", 0
        elif self._more is not None and key in self._more:
            del self._more[key]
            if not self._more:
                self._more = None
        else:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        if self._key is not None:
            yield self._key
        if self._more is not None:
            yield from self._more

    def __len__(self) -> int:
        return (self._key is not None) + (0 if self._more is None else len(self._more))

    def __repr__(self) -> str:
        return f"KeyData({dict(self.items())!r})"

    def copy(self) -> KeyData:
        twin = KeyData()
        twin._key, twin._value, twin._version = self._key, self._value, self._version
        twin._more = None if self._more is None else dict(self._more)
        return twin


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    token: int
    ttl_ms: int
    expires_at_ms: int
    # The queued waiter this lease was granted to (b"": an ACQUIRE's): how that waiter's
    # Lock call learns of its grant, and what its DEQUEUE releases.
    waiter_id: bytes = b""


@dataclasses.dataclass(slots=True)
class Waiter:
    """One queued lock waiter: the lease it asks for, and until when its slot lives (renewed
    by each ENQUEUE of the same id). ``principal`` and ``quota`` are its ENQUEUE's: the grant
    is charged to that principal, as an ACQUIRE would be."""

    waiter_id: bytes
    holder: str
    ttl_ms: int
    expires_at_ms: int
    principal: str = ""
    quota: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_wire(self) -> list[Any]:
        return [self.waiter_id, self.holder, self.ttl_ms, self.expires_at_ms, self.principal,
                dict(sorted(self.quota.items()))]


@dataclasses.dataclass(slots=True)
class ResourceState:
    high_water_mark: int = 0
    lease: Lease | None = None
    # Incremented by every applied write and delete; a key's version is the revision
    # of its last write, so versions never repeat for a key, even across deletes.
    revision: int = 0
    data: KeyData = dataclasses.field(default_factory=KeyData)
    # The principal of the last ACQUIRE ("" when it carried none: no principals file, or an
    # entry written before quotas); its lease and stored bytes count against this name.
    owner: str = ""
    # Keys + values of ``data``: derived (never in a snapshot), kept so a quota check is O(1).
    stored_bytes: int = 0
    # The lock wait queue, in arrival order (FIFO): waiter_id -> Waiter. NO_WAITERS (read-only)
    # while nobody waits; only LockQueue and whole-state replacements assign it.
    waiters: dict[bytes, Waiter] = dataclasses.field(default_factory=lambda: NO_WAITERS)
    # The hwm is an epoch that only fenced this resource (force-release, an epoch floor with
    # fence_all, a restore): no holder was ever issued it, so a write carrying it is
    # UNKNOWN_TOKEN (DESIGN I3), not a write "in the same epoch". The next grant clears it.
    fenced: bool = False


    def copy(self) -> ResourceState:
        """A copy the original's later changes do not reach: the lease and waiters are
        immutable values (replaced, never changed), the key map and the queue are copied."""
        return ResourceState(
            high_water_mark=self.high_water_mark, lease=self.lease, revision=self.revision,
            data=self.data.copy(), owner=self.owner, stored_bytes=self.stored_bytes,
            waiters=self.waiters if self.waiters is NO_WAITERS else dict(self.waiters), fenced=self.fenced,
        )


class ResourceTable(dict[str, ResourceState]):
    """The resources by name: a dict that keeps, while a snapshot is read (``capture``), the
    state each resource had when the snapshot started, so the state machine need not stop
    applying for the read (copy-on-write).

    The state machine changes a resource only after taking it from this table with ``get``,
    ``[]``, ``pop``, ``del`` or ``[] =`` in the same entry; while a capture runs, each of them
    first keeps a copy of the resource as it was (or None: absent) unless one is kept already.
    A change of every resource (fencing all) calls ``preserve_all`` first. Iterating, ``in``
    and ``len`` keep nothing: the snapshot's names are listed when it starts, and a read-only
    pass needs no copy. What the state machine reads for a client (``peek``) keeps nothing.
    tests/test_state_capture.py applies random commands between a capture's pieces and holds
    the pieces to the snapshot taken when it started.
    """

    __slots__ = ("capture", "names")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # name -> the resource as the running snapshot started with it (None: absent then)
        self.capture: dict[str, ResourceState | None] | None = None
        # The keys in sorted order, kept by the changes below: a List page (core/listing.py).
        self.names = SortedNames(dict.keys(self))

    def _keep(self, name: str) -> None:
        kept = self.capture
        if kept is not None and name not in kept:
            res = dict.get(self, name)
            kept[name] = None if res is None else res.copy()

    def get(self, name: str, default: Any = None) -> Any:
        if self.capture is not None:
            self._keep(name)
        return dict.get(self, name, default)

    def __getitem__(self, name: str) -> ResourceState:
        if self.capture is not None:
            self._keep(name)
        res: ResourceState = dict.__getitem__(self, name)
        return res

    def __setitem__(self, name: str, res: ResourceState) -> None:
        if self.capture is not None:
            self._keep(name)
        if not dict.__contains__(self, name):
            self.names.add(name)
        dict.__setitem__(self, name, res)

    def __delitem__(self, name: str) -> None:
        if self.capture is not None:
            self._keep(name)
        dict.__delitem__(self, name)
        self.names.discard(name)

    def pop(self, name: str, *default: Any) -> Any:
        if self.capture is not None:
            self._keep(name)
        self.names.discard(name)
        return dict.pop(self, name, *default)

    def peek(self, name: str) -> ResourceState | None:
        """The resource, for reading only: nothing kept."""
        return dict.get(self, name)

    def preserve_all(self) -> None:
        """Keep every resource as it is now (a change of all of them follows)."""
        if self.capture is not None:
            for name in dict.keys(self):
                self._keep(name)

    def as_captured(self, name: str) -> ResourceState | None:
        """The resource as the running capture started with it."""
        kept = self.capture
        if kept is not None and name in kept:
            return kept[name]
        return dict.get(self, name)

    def setdefault(self, *args: Any) -> Any:  # not used by the state machine: a change unseen
        raise NotImplementedError("ResourceTable: use get and [] =")

    def popitem(self) -> Any:
        raise NotImplementedError("ResourceTable: use pop")

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("ResourceTable: use [] =")

    def clear(self) -> None:
        raise NotImplementedError("ResourceTable: replace the table")


def entry_bytes(key: str, value: bytes) -> int:
    """What one key counts against a stored-bytes quota (keys are ASCII: chars are bytes)."""
    return len(key) + len(value)


def _remove_from(table: dict[str, set[str]], owner: str, name: str) -> None:
    names = table.get(owner)
    if names is not None:
        names.discard(name)
        if not names:
            del table[owner]


class Usage:
    """What each principal owns: resources, resources with a stored lease, stored bytes, and
    the lock waiters it has queued (``waiting``: each may become a lease and a resource, so
    quotas count it as both until it is granted or leaves).

    Derived from the resources alone (``of``), so it is the same on every replica and after
    any restore. Callers ``remove`` a resource before changing its owner, lease or data and
    ``add`` it back after, which keeps every count exact without recounting. Resources
    without an owner are not counted (nothing limits them but the cluster-wide limits),
    except in ``leases``: stored leases of every resource, owned or not (the metrics'
    live-leases gauge; an expired lease counts until the TICK that ends it).
    """

    def __init__(self) -> None:
        self.owned: dict[str, set[str]] = {}
        self.leased: dict[str, set[str]] = {}
        self.stored_bytes: dict[str, int] = {}
        self.waiting: dict[str, int] = {}
        self.leases = 0

    @classmethod
    def of(cls, resources: dict[str, ResourceState]) -> Usage:
        usage = cls()
        for name, res in resources.items():
            usage.add(name, res)
        return usage

    def add(self, name: str, res: ResourceState) -> None:
        for waiter in res.waiters.values():
            self.wait(waiter.principal, 1)
        self.leases += res.lease is not None
        if not res.owner:
            return
        self.owned.setdefault(res.owner, set()).add(name)
        if res.lease is not None:
            self.leased.setdefault(res.owner, set()).add(name)
        if res.stored_bytes:
            self.stored_bytes[res.owner] = self.stored_bytes.get(res.owner, 0) + res.stored_bytes

    def wait(self, principal: str, delta: int) -> None:
        """``principal`` queued (+1) or stopped waiting (-1) once."""
        if not principal:
            return
        left = self.waiting.get(principal, 0) + delta
        if left:
            self.waiting[principal] = left
        else:
            del self.waiting[principal]

    def remove(self, name: str, res: ResourceState) -> None:
        for waiter in res.waiters.values():
            self.wait(waiter.principal, -1)
        self.leases -= res.lease is not None
        if not res.owner:
            return
        _remove_from(self.owned, res.owner, name)
        _remove_from(self.leased, res.owner, name)
        if res.stored_bytes:
            left = self.stored_bytes[res.owner] - res.stored_bytes
            if left:
                self.stored_bytes[res.owner] = left
            else:
                del self.stored_bytes[res.owner]


@dataclasses.dataclass
class StagedRestore:
    """A backup being restored in chunks (RESTORE_BEGIN, then RESTORE_CHUNKs in order): what
    its BEGIN declared and the chunks staged so far. Part of the snapshot, so a member that
    restarts or installs a snapshot mid-restore stages the same bytes as the others.

    ``reader`` and ``hasher`` are derived from the chunks (never in a snapshot): the backup read
    and hashed as its chunks are staged, so the COMMIT need not do either; the state machine
    sets them at BEGIN, or when it loads a snapshot, by feeding the chunks staged so far.
    """

    restore_id: bytes
    size: int  # the backup's bytes, as declared
    digest: bytes  # sha256 of the backup, as declared
    epoch_floor: int  # the COMMIT fences above it
    touched_at_ms: int  # log clock of its BEGIN or last CHUNK: stale RESTORE_STAGING_IDLE_MS after
    chunks: list[bytes] = dataclasses.field(default_factory=list)
    staged_bytes: int = 0
    reader: Any = dataclasses.field(default=None, compare=False, repr=False)
    hasher: Any = dataclasses.field(default=None, compare=False, repr=False)

    def start_reading(self, reader: Any) -> None:
        """Read and hash the chunks with ``reader`` (a snapshot_format.SnapshotReader), from
        the first chunk staged so far on."""
        self.reader, self.hasher = reader, hashlib.sha256()
        for chunk in self.chunks:
            self._read(chunk)

    def stage(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.staged_bytes += len(chunk)
        if self.reader is not None:
            self._read(chunk)

    def _read(self, chunk: bytes) -> None:
        self.hasher.update(chunk)
        self.reader.feed(chunk)

    def to_wire(self) -> list[Any]:
        return [self.restore_id, self.size, self.digest, self.epoch_floor, self.touched_at_ms, self.chunks]


class DedupEntry:
    """The first outcome of one op_id, kept as the bytes it has in a snapshot's dedup array.

    Every applied command with an op_id makes one, on every replica, so it holds only what
    eviction and a retry's check need; the outcome itself is read back from ``packed`` when a
    retry asks for it. Packing once when stored also keeps snapshots cheap: they run on the
    Raft tick thread, and packing up to DEDUP_ENTRIES_MAX entries each time stalled it ~100 ms.
    Kept in a ``dedup.DedupTable``.
    """

    __slots__ = ("op", "resource", "applied_at_ms", "index", "principal", "packed")

    def __init__(
        self, op_id: bytes, op: Op, resource: str, wire: list[Any], applied_at_ms: int, index: int, principal: str
    ) -> None:
        self.op = op
        self.resource = resource
        # Who it is charged to ("": nobody, the anonymous principal): its budget counts it,
        # and only that principal's retries are answered from it (core/dedup.py).
        self.principal = principal
        # The log clock after the entry applied. Non-decreasing in apply order, which is what
        # lets eviction by age look only at the oldest entries.
        self.applied_at_ms = applied_at_ms
        # The Raft log index of the entry that first applied this op_id (0 if unknown).
        self.index = index
        # ``wire`` is outcome_to_wire(outcome): canonical, so equal states pack equal bytes.
        self.packed = msgpack.packb(
            [op_id, int(op), resource, wire, applied_at_ms, index, principal], use_bin_type=True
        )

    def outcome(self) -> Applied:
        """A fresh copy of the stored outcome (callers may edit it)."""
        outcome = outcome_from_wire(msgpack.unpackb(self.packed, raw=False)[3])
        assert isinstance(outcome, Applied), "only applied outcomes are stored"
        return outcome

"""Writing the state machine's canonical snapshot, whole or in pieces.

Owns: ``SnapshotPacking``, the part of the state machine that packs all of its state as one
canonical msgpack document: ``snapshot`` (what a member's snapshot and ``digest`` hold),
``backup`` (what Admin snapshots hand out) and ``snapshot_pieces`` (the same bytes in bounded
pieces, for a snapshot built off the Raft thread). Reading the document back is
``snapshot_format``'s.
Must never: change state (only the copy-on-write capture of ``ResourceTable`` while pieces are
read), or pack anything that depends on more than the state: equal states give equal bytes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any

import msgpack

from coordinator.core.machine_base import MachineBase
from coordinator.core.snapshot_format import SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_LEVELS, SNAPSHOT_MAGIC
from coordinator.core.state import ResourceState, StagedRestore

# Resources packed per piece of a snapshot built off the Raft thread: about 100 KiB and a
# millisecond or two of work, short enough that the Raft thread waits little for the GIL.
SNAPSHOT_RESOURCES_PER_PIECE = 1000
# Names sorted per run before the runs are merged: one sorted() call holds the GIL
# throughout (21 ms for 100,000 names, measured), a run of this many about 0.5 ms.
_SORT_RUN_NAMES = 5000
# Names copied per piece when a snapshot starts (a list() of them holds the GIL): ~3 ms.
_NAMES_COPIED_PER_PIECE = 100_000


class SnapshotPacking(MachineBase):
    """Packs the state; mixed into ``FencingStateMachine``."""

    def snapshot(self) -> bytes:
        """All state as canonical msgpack: resources and keys sorted, dedup in apply order,
        then the staged restore (what a member's snapshot and ``digest`` hold).

        Layout: ``[magic, SNAPSHOT_FORMAT_VERSION, epoch, log_clock_ms, resources, dedup, staged]``,
        or, once the cluster's entry level is above 1, ``[magic, 5, ..., staged, cluster_level]``
        (a member of the release before levels refuses format 5 and stops rather than misread it);
        resources ``[[name, hwm, revision, lease|nil, [[key, value, version], ...], owner?, waiters?], ...]``
        (``owner`` only when the resource has one or has waiters, so states without principals
        keep the bytes they had before quotas; ``waiters`` only when some are queued, in FIFO
        order, each ``[waiter_id, holder, ttl_ms, expires_at_ms, principal, quota]``),
        lease ``[holder, token, ttl_ms, expires_at_ms, waiter_id?]``, dedup
        ``[[op_id, op, resource, outcome_wire, applied_at_ms, first_index, principal], ...]``, staged
        nil or ``[restore_id, size, digest, epoch_floor, touched_at_ms, [chunk, ...]]``.
        """
        return self._document(self._staging.staged, with_queue=True, with_level=True)

    def backup(self) -> bytes:
        """``snapshot()`` without the staged restore (nil) and without the lock queue: what
        Admin snapshots hand out, so a backup is never larger than limits.BACKUP_BYTES_MAX,
        restore in progress or not (a restore drops waiters and leases anyway). Without the
        cluster level too: it says which builds run the cluster, not what the state holds, so
        a backup restores into a cluster of any level (which keeps its own)."""
        return self._document(None, with_queue=False)

    def snapshot_pieces(self) -> Iterator[bytes]:
        """``snapshot()`` in pieces whose concatenation is ``snapshot()``, each a bounded amount
        of work (``SNAPSHOT_RESOURCES_PER_PIECE`` resources), for a caller that builds a snapshot
        off the Raft thread and lets other threads in between pieces. The first non-empty piece
        fixes the state they hold (empty ones before it copy the names a slice at a time): the
        caller applies nothing until it has it. After it, entries may be
        applied between pieces (never during one: the caller holds the apply lock for each), and
        the pieces still describe the state as it was at the first (copy-on-write: the resources
        changed meanwhile are kept as they were, ResourceTable). Abandoning the iterator early
        (``close()``, under the apply lock) ends the capture."""
        return self._document_pieces(self._staging.staged, with_queue=True, copy_on_write=True, with_level=True)

    def _document(self, staged: StagedRestore | None, *, with_queue: bool, with_level: bool = False) -> bytes:
        return b"".join(self._document_pieces(staged, with_queue=with_queue, with_level=with_level))

    def _document_pieces(
        self, staged: StagedRestore | None, *, with_queue: bool, copy_on_write: bool = False, with_level: bool = False
    ) -> Iterator[bytes]:
        # msgpack is concatenative: an array is its header then its packed items, so the
        # document is packed item by item, and the dedup entries' stored bytes are joined as
        # they are (the same bytes as packing the whole document at once; a test holds both
        # forms equal).
        packer = msgpack.Packer(use_bin_type=True)
        table = self._resources
        # Fixed at the first piece: the numbers, the names, the dedup entries (each one's bytes
        # never change; the table only gains and evicts entries), the staged chunks (a list
        # that grows: copied) and, with copy_on_write, the resources (ResourceTable.capture).
        epoch, log_clock_ms = self._epoch, self._log_clock_ms
        level = self._cluster_level if with_level and self._cluster_level > 1 else None
        # The names are copied a slice per piece, an empty piece between slices: one list() of a
        # million names held the GIL ~30 ms, and the caller applies nothing before the first
        # non-empty piece, so the table does not change while it is walked.
        names: list[str] = []
        walk = iter(table)
        while True:
            copied = len(names)
            names.extend(itertools.islice(walk, _NAMES_COPIED_PER_PIECE))
            if len(names) - copied < _NAMES_COPIED_PER_PIECE:
                break
            yield b""
        dedup = [entry.packed for entry in self._dedup.values()]
        staged_wire = None if staged is None else staged.to_wire()
        if staged_wire is not None:
            staged_wire[-1] = list(staged_wire[-1])
        if copy_on_write:
            if table.capture is not None:
                raise RuntimeError("a snapshot is being read already")
            table.capture = {}
        try:
            yield b"".join(
                [
                    packer.pack_array_header(7 if level is None else 8),
                    packer.pack(SNAPSHOT_MAGIC),
                    packer.pack(SNAPSHOT_FORMAT_VERSION if level is None else SNAPSHOT_FORMAT_VERSION_LEVELS),
                    packer.pack(epoch),
                    packer.pack(log_clock_ms),
                    packer.pack_array_header(len(names)),
                ]
            )
            # Sorted in short runs, merged lazily: one sorted() call holds the GIL throughout
            # (21 ms for 100,000 names), a run a few ms; an empty piece after each lets the
            # caller release the apply lock.
            runs = []
            for i in range(0, len(names), _SORT_RUN_NAMES):
                runs.append(sorted(names[i : i + _SORT_RUN_NAMES]))
                yield b""
            del names
            piece: list[bytes] = []
            resource_of = table.as_captured if copy_on_write else table.peek
            for name in heapq.merge(*runs) if len(runs) > 1 else iter(runs[0] if runs else ()):
                res = resource_of(name)
                assert res is not None  # the names were read from the table being packed
                piece.append(packer.pack(self._resource_item(name, res, with_queue)))
                if len(piece) >= SNAPSHOT_RESOURCES_PER_PIECE:
                    yield b"".join(piece)
                    piece = []
            yield b"".join(piece)
        finally:
            if copy_on_write:
                table.capture = None
        yield packer.pack_array_header(len(dedup))
        for i in range(0, len(dedup), SNAPSHOT_RESOURCES_PER_PIECE):
            yield b"".join(dedup[i : i + SNAPSHOT_RESOURCES_PER_PIECE])
        yield packer.pack(staged_wire)
        if level is not None:
            yield packer.pack(level)

    @staticmethod
    def _resource_item(name: str, res: ResourceState, with_queue: bool) -> list[Any]:
        lease = res.lease
        item = [
            name,
            res.high_water_mark,
            res.revision,
            # No lease: None, or False when the hwm only fenced the resource (format 4).
            (False if res.fenced else None)
            if lease is None
            else [lease.holder, lease.token, lease.ttl_ms, lease.expires_at_ms]
            # A lease granted to a queued waiter names it (format 3), so its Lock call
            # finds its grant on any member, after a restart or a snapshot install too.
            + ([lease.waiter_id] if with_queue and lease.waiter_id else []),
            [[key, *res.data[key]] for key in sorted(res.data)],
        ]
        if res.owner or (with_queue and res.waiters):
            item.append(res.owner)
        if with_queue and res.waiters:
            item.append([waiter.to_wire() for waiter in res.waiters.values()])  # FIFO order
        return item

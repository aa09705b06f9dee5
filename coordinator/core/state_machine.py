"""The replicated state machine of the fencing coordinator: pure and deterministic.

Owns: ``FencingStateMachine`` -- the epoch counter, every resource's high-water mark, lease
and fenced key/value data, the dedup table of op_ids and the log clock -- and the dispatch of
one log entry at a time: decode it into its op's typed body (``ops``, every field checked), answer a retried op_id from
the dedup table (DESIGN §3 I5), run the op's handler, then advance the log clock and record
the op_id. The handlers are mixed in by family: leases and the lock queue
(``lease_handlers``), fenced data (``write_handlers``), admin and restore (``admin_handlers``),
with the state and the rules they share in ``machine_base``; snapshots are packed by
``snapshot_pack``. The state's shapes are in ``state``, outcomes in ``outcomes``, snapshot
reading in ``snapshot_format``, the lease expiry index in ``expiry``, the lock queue's
bookkeeping in ``lock_queue``, the staging of a backup restored in chunks in
``restore_staging`` and which dedup entry leaves when (per principal) in ``dedup``.
Must never: read a clock, draw randomness, touch files, sockets or threads, or import grpc or
the Raft library (time arrives inside each command); raise on bad input (refusals are ``Rejected``
values); change anything, not even the log clock, when it refuses; or turn an entry it cannot
apply (an unknown format, op or field, a handler that raised) into a refusal: that raises
``UnappliableEntry`` and stops the member (DESIGN §8), since another build may apply it. The
same entries in the same order give the same state and the same outcomes on every replica.

Quotas (DESIGN §8) are checked in the state machine (``machine_base``, ``write_handlers``), not
in the gRPC layer, because what they count -- resources, leases, stored bytes -- is replicated
state that a member's own view may lag: an ACQUIRE or WRITE carries the caller's principal and
quota in its body (``ops.charge_fields``), so every replica checks the same numbers against the
same state at the same log index, and a principals file edited on one member first cannot make
replicas disagree. A resource is owned by the principal of its last ACQUIRE; its lease and its
keys + values count against that owner (``state.Usage``, derived from the resources on restore,
so it needs no snapshot field of its own beyond the owner's name). A resource with no lease
(released, force-released or expired) and no data is forgotten: it holds nothing worth a slot,
and the global epoch already fences every token it ever had (a re-acquire issues a token above
all of them; a write carrying one finds hwm 0 and is UNKNOWN_TOKEN).

Every command with an op_id carries its principal too (``ops.charge_fields``; none: the anonymous
principal), and its dedup entry counts against that principal's ``dedup_entries`` budget: a
flood of one principal's fresh op_ids evicts its own oldest entries, never those of a principal
holding fewer (``dedup``, issue 26).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

from coordinator.core import limits, ops
from coordinator.core.admin_handlers import AdminHandlers
from coordinator.core.commands import ENTRY_LEVEL, Command, MalformedCommand, Op, validate_envelope
from coordinator.core.dedup import DedupTable
from coordinator.core.expiry import ExpiryIndex
from coordinator.core.lease_handlers import LeaseHandlers
from coordinator.core.lock_queue import LockQueue
from coordinator.core.outcomes import Applied, Outcome, Reason, Rejected, outcome_from_wire, outcome_to_wire
from coordinator.core.restore_staging import RestoreStaging
from coordinator.core.snapshot_format import SNAPSHOT_FORMAT_VERSION, Counts, parse_snapshot
from coordinator.core.snapshot_pack import SnapshotPacking
from coordinator.core.state import DedupEntry, ResourceTable, Usage, shared
from coordinator.core.validation import InvalidField, is_int
from coordinator.core.write_handlers import WriteHandlers

__all__ = [
    "SNAPSHOT_FORMAT_VERSION",
    "Applied",
    "FencingStateMachine",
    "Outcome",
    "Reason",
    "Rejected",
    "UnappliableEntry",
    "outcome_from_wire",
    "outcome_to_wire",
]


class UnappliableEntry(Exception):
    """A committed entry this member cannot apply: an unknown format or op, a body this build
    does not read, or a handler that raised (DESIGN §8). Never a refusal: another member, of
    another build, may apply it, and a refusal only some replicas make splits their states
    unnoticed. It escapes ``apply``, and the Raft layer stops the member with one line, exit
    70 (coordinator/raft/fatal.py), before anything after the entry is applied. Every entry
    this build proposes was built by the same checks (``ops``), so it means a
    build of a higher entry level wrote it, or a bug."""


def _positive_config(name: str, value: int | None, default: int) -> int:
    chosen = default if value is None else value
    if not is_int(chosen) or chosen < 1:
        raise ValueError(f"{name} must be a positive integer, got {chosen!r}")
    return chosen


class FencingStateMachine(LeaseHandlers, WriteHandlers, AdminHandlers, SnapshotPacking):
    """Epochs, leases, fenced data and dedup, changed only by ``apply``/``execute``.

    The keyword arguments bound state size. They are configuration, not state: they are not in
    the snapshot, and every replica of one cluster must use the same values.
    """

    def __init__(
        self,
        *,
        dedup_entries_max: int | None = None,
        dedup_retention_ms: int | None = None,
        resources_max: int | None = None,
        keys_per_resource_max: int | None = None,
        state_keys_max: int | None = None,
        state_stored_bytes_max: int | None = None,
    ) -> None:
        self._dedup_entries_max = _positive_config(
            "dedup_entries_max", dedup_entries_max, limits.DEDUP_ENTRIES_MAX
        )
        self._dedup_retention_ms = _positive_config(
            "dedup_retention_ms", dedup_retention_ms, limits.DEDUP_RETENTION_MS
        )
        self._resources_max = _positive_config("resources_max", resources_max, limits.RESOURCES_MAX)
        self._keys_per_resource_max = _positive_config(
            "keys_per_resource_max", keys_per_resource_max, limits.KEYS_PER_RESOURCE_MAX
        )
        self._state_keys_max = _positive_config("state_keys_max", state_keys_max, limits.STATE_KEYS_MAX)
        self._state_stored_bytes_max = _positive_config(
            "state_stored_bytes_max", state_stored_bytes_max, limits.STATE_STORED_BYTES_MAX
        )
        # What a backup restored through the log may hold: no more than live state may.
        self._bounds = Counts(
            resources_max=self._resources_max,
            keys_per_resource_max=self._keys_per_resource_max,
            dedup_entries_max=self._dedup_entries_max,
            keys_max=self._state_keys_max,
            stored_bytes_max=self._state_stored_bytes_max,
        )
        self._epoch = 0
        self._log_clock_ms = 0
        self._resources = ResourceTable()
        self._expiry = ExpiryIndex()  # derived from _resources: what a TICK expires, found fast
        self._queue = LockQueue()  # derived too: how many waiters, and which a TICK drops
        self._usage = Usage()
        self._dedup = DedupTable(self._dedup_entries_max, self._dedup_retention_ms)
        # Keys and their bytes across all resources (derived, like usage), against the
        # cluster-wide bounds; and the backup being restored in chunks, if any.
        self._keys_total = 0
        self._stored_bytes_total = 0
        self._staging = RestoreStaging()
        self._cluster_level = 1  # raised by SET_CLUSTER_LEVEL only (commands.py "Entry levels")
        self._changes = []  # what the entry being applied changed (changes.py)
        self._handlers: dict[Op, Callable[[int, Any], Outcome]] = {
            Op.ACQUIRE: self._acquire,
            Op.KEEP_ALIVE: self._keep_alive,
            Op.RELEASE: self._release,
            Op.WRITE: self._write,
            Op.DELETE: self._delete,
            Op.READ_BARRIER: self._read_barrier,
            Op.FORCE_RELEASE: self._force_release,
            Op.SET_EPOCH_FLOOR: self._set_epoch_floor,
            Op.TICK: self._tick,
            Op.RESTORE_BEGIN: self._restore_begin,
            Op.RESTORE_CHUNK: self._restore_chunk,
            Op.RESTORE_COMMIT: self._restore_commit,
            Op.RESTORE_ABORT: self._restore_abort,
            Op.ENQUEUE: self._enqueue,
            Op.DEQUEUE: self._dequeue,
            Op.SET_CLUSTER_LEVEL: self._set_cluster_level,
        }
        assert set(self._handlers) == set(Op), "every op needs a handler"

    # -- read accessors (no mutation) ---------------------------------------------------

    @property
    def epoch(self) -> int:
        """The last token issued (0 before the first)."""
        return self._epoch

    @property
    def cluster_level(self) -> int:
        """The entry level every member runs, as replicated (1 until a SET_CLUSTER_LEVEL)."""
        return self._cluster_level

    @property
    def log_clock_ms(self) -> int:
        """The greatest stamp of any applied command; never goes backwards."""
        return self._log_clock_ms

    @property
    def dedup_size(self) -> int:
        """How many op_ids the dedup table holds now."""
        return len(self._dedup)

    def dedup_count(self, principal: str) -> int:
        """How many op_ids of ``principal`` ("": the anonymous one) the dedup table holds now."""
        return self._dedup.count(principal)

    @property
    def stored_bytes(self) -> int:
        """Keys + values of every resource (what STATE_STORED_BYTES_MAX counts)."""
        return self._stored_bytes_total

    @property
    def keys_count(self) -> int:
        """Keys of every resource (what STATE_KEYS_MAX counts)."""
        return self._keys_total

    @property
    def staged_restore_bytes(self) -> int | None:
        """Bytes staged by the restore in progress, or None when none is."""
        staged = self._staging.staged
        return None if staged is None else staged.staged_bytes

    @property
    def snapshot_deferred(self) -> bool:
        """True while a restore is staged: a snapshot would hold every staged chunk, the very
        bytes of the log entries it replaces, so it frees nothing and rewrites them all (at
        64 MiB journal growth: ~64, then ~128 MiB more of the largest backup, each on the
        Raft thread). Read by the Raft layer (coordinator/raft/interface.py); ends with the
        COMMIT, an ABORT, or a TICK after RESTORE_STAGING_IDLE_MS."""
        return self._staging.staged is not None

    @property
    def resources_count(self) -> int:
        """How many resources the state holds now (what the resources limit counts)."""
        return len(self._resources)

    @property
    def leases_count(self) -> int:
        """Leases stored now, across all resources (one expired by the log clock counts until
        the TICK that ends it)."""
        return self._usage.leases

    @property
    def lock_waiters_count(self) -> int:
        """Lock waiters queued now, across all resources."""
        return self._queue.total

    def usage(self, principal: str) -> dict[str, int]:
        """What ``principal`` owns now: resources and leases as stored (a lease may have
        expired by the log clock; an acquire at a quota counts only live ones), and the
        bytes of their keys and values."""
        return {
            "resources": len(self._usage.owned.get(principal, ())),
            "leases": len(self._usage.leased.get(principal, ())),
            "stored_bytes": self._usage.stored_bytes.get(principal, 0),
        }

    def describe(self, resource: str) -> dict[str, Any] | None:
        """The stored state of ``resource``, or None if it was never acquired or fenced.

        ``lease`` is reported as stored: it may have expired by the log clock but not yet
        been removed by a TICK (compare ``expires_at_ms`` with ``log_clock_ms``).
        """
        res = self._resources.peek(resource)
        if res is None:
            return None
        lease = res.lease
        return {
            "hwm": res.high_water_mark,
            "lease": None
            if lease is None
            else {
                "holder": lease.holder,
                "token": lease.token,
                "ttl_ms": lease.ttl_ms,
                "expires_at_ms": lease.expires_at_ms,
            },
            "revision": res.revision,
            "keys": len(res.data),
        }

    # -- applying commands ----------------------------------------------------------------

    def apply(self, entry: bytes, index: int = 0) -> Outcome:
        """Decode and execute one log entry (at Raft ``index``). Raises UnappliableEntry for
        an entry this build cannot read or a handler that raised; every other outcome,
        refusals included, is a value."""
        try:
            stamp_ms, body = ops.decode(entry)
        except (MalformedCommand, InvalidField) as exc:
            raise UnappliableEntry(
                f"log entry {index} cannot be applied by this build (entry level {ENTRY_LEVEL},"
                f" cluster level {self._cluster_level}): {exc}"
            ) from exc
        return self._run(stamp_ms, body, index)

    def execute(self, cmd: Command, index: int = 0) -> Outcome:
        """Execute one unchecked command that did not come from the log (tests, tools): a bad
        envelope or field is refused (MALFORMED) and changes nothing. A handler that raises
        raises UnappliableEntry, as in ``apply``."""
        checked = self.checked(cmd)
        if isinstance(checked, Rejected):
            return checked
        return self._run(cmd.stamp_ms, checked, index)

    @staticmethod
    def checked(cmd: Command) -> ops.Body | Rejected:
        """The typed body of an unchecked ``cmd`` (tests, tools), or why no member of this
        build would propose it: the MALFORMED refusal naming its bad envelope or field. Such
        an entry in the log would stop every member of this build (``apply``)."""
        try:
            op = validate_envelope(cmd.op, cmd.stamp_ms, cmd.body)
        except MalformedCommand as exc:
            known_op = cmd.op if isinstance(cmd.op, Op) else None
            return Rejected(op=known_op, reason=Reason.MALFORMED, message=str(exc))
        try:
            return ops.SCHEMAS[op].from_map(cmd.body)
        except InvalidField as exc:
            return Rejected(op=op, reason=Reason.MALFORMED, message=str(exc), details={"field": exc.field})

    def read_now(self, body: ops.ReadBarrier) -> Outcome:
        """What ``body``, a READ_BARRIER, would answer if it applied now, with nothing changed.

        The read-index path (coordinator/raft/read_index.py) answers a read without a log
        entry, once this member applied every entry acknowledged before the read arrived;
        it calls the barrier's own handler at the log clock, where an applied READ_BARRIER
        (stamp 0) reads it too, so both paths answer alike.
        """
        return self._read_barrier(self._log_clock_ms, body)

    def _run(self, stamp_ms: int, body: ops.Body, index: int) -> Outcome:
        """``body``, checked, stamped ``stamp_ms``: dedup, then its handler."""
        op = body.OP
        op_id: bytes | None = getattr(body, "op_id", None)
        resource = body.resource
        if op_id is not None:
            entry = self._dedup.get(op_id)
            if entry is not None:
                if entry.op is op and entry.resource == resource:
                    # A retry: nothing changes (I5); report where it first applied.
                    return dataclasses.replace(entry.outcome(), first_applied_index=entry.index)
                return Rejected(
                    op=op,
                    reason=Reason.OP_ID_CONFLICT,
                    message=(f"op_id was already used by {entry.op.name} on {entry.resource!r}"),
                    details={"op": int(entry.op), "resource": entry.resource},
                )

        now = max(self._log_clock_ms, stamp_ms)
        self._changes.clear()
        try:
            # A handler either refuses without touching state or applies and returns Applied.
            outcome = self._handlers[op](now, body)
            if isinstance(outcome, Applied):
                # Packed before the log clock or the dedup table change, so a result that
                # cannot be stored leaves both as they were. The item: (op_id, its entry).
                principal: str | None = getattr(body, "principal", None)
                dedup_item = (
                    None
                    if op_id is None or resource is None
                    else (op_id, DedupEntry(
                        op_id, op, resource, outcome_to_wire(outcome), now, index, shared(principal or ""),
                    ))
                )
                self._log_clock_ms = now
                self._dedup.evict_aged(now)
                if dedup_item is not None:
                    quota: dict[str, int] | None = getattr(body, "quota", None)
                    self._dedup.add(*dedup_item, None if quota is None else quota.get("dedup_entries"))
                if self._changes:
                    outcome = dataclasses.replace(outcome, changes=tuple(self._changes))
        # DESIGN §8: a handler that raised is a bug, never a refusal. It may have changed state
        # before it failed, and a build without the bug (or with another one) would not fail
        # here: serving on would answer from a state no other replica may hold. The Raft layer
        # stops the member (exit 70, which deploy/'s unit does not restart, so no crash loop).
        except Exception as exc:  # any type: what the handler raised is the bug
            raise UnappliableEntry(
                f"applying log entry {index} ({op.name}) raised {type(exc).__name__}: {exc}"
            ) from exc
        return outcome

    def check_backup(self, data: object) -> None:
        """Raise ValueError unless ``data`` is a backup the restore handlers would read: their
        checks of the backup itself (not of the epoch floor, which depends on state), for
        the gRPC layer to run before it proposes anything. Reads only configuration, so it
        needs no lock."""
        parse_snapshot(data, self._bounds)

    def restore(self, data: bytes) -> None:
        """Replace all state with a ``snapshot()``. Raises ValueError on bad data, leaving
        the current state untouched. Counts are not held to this machine's configured
        limits: a member's own snapshot, written under other limits, must still load."""
        self._install(parse_snapshot(data, None))

    def digest(self) -> str:
        """sha256 hex of ``snapshot()``: equal digests mean equal state."""
        return hashlib.sha256(self.snapshot()).hexdigest()

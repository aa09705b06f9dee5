"""The replicated state machine of the fencing coordinator: pure and deterministic.

Owns: the epoch counter, every resource's high-water mark, lease and fenced key/value data,
the dedup table of op_ids, the log clock, and the rules that change them one log entry at a
time (DESIGN §3 I2-I7, I11); plus writing the canonical snapshot of all of it. The state's
shapes are in ``state``, outcomes in ``outcomes``, snapshot reading in ``snapshot_format``, the
lease expiry index in ``expiry``, the lock queue's bookkeeping in ``lock_queue``, the staging
of a backup restored in chunks in ``restore_staging`` and which dedup entry leaves when (per
principal) in ``dedup``; the rules that use them stay here.
Must never: read a clock, draw randomness, touch files, sockets or threads, or import grpc or
the Raft library (time arrives inside each command); raise on bad input (refusals are ``Rejected``
values); change anything, not even the log clock, when it refuses. The same entries in the
same order give the same state and the same outcomes on every replica.

Quotas (DESIGN §8) are checked here, not in the gRPC layer, because what they count --
resources, leases, stored bytes -- is replicated state that a member's own view may lag: an
ACQUIRE or WRITE carries the caller's principal and quota in its body (``commands.charged``),
so every replica checks the same numbers against the same state at the same log index, and a
principals file edited on one member first cannot make replicas disagree. A resource is owned
by the principal of its last ACQUIRE; its lease and its keys + values count against that owner
(``state.Usage``, derived from the resources on restore, so it needs no snapshot field of its own
beyond the owner's name). A resource with no lease (released, force-released or expired) and
no data is forgotten: it holds nothing worth a slot, and the global epoch already fences every
token it ever had (a re-acquire issues a token above all of them; a write carrying one finds
hwm 0 and is UNKNOWN_TOKEN).

Every command with an op_id carries its principal too (``commands.charged``; none: the anonymous
principal), and its dedup entry counts against that principal's ``dedup_entries`` budget: a
flood of one principal's fresh op_ids evicts its own oldest entries, never those of a principal
holding fewer (``dedup``, issue 26).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from coordinator.core import limits
from coordinator.core import validation
from coordinator.core.dedup import DedupTable
from coordinator.core.expiry import ExpiryIndex
from coordinator.core.lock_queue import LockQueue, lock_state
from coordinator.core.outcomes import (
    Applied,
    Outcome,
    Reason,
    Rejected,
    is_int,
    outcome_from_wire,
    outcome_to_wire,
)
from coordinator.core.snapshot_format import (
    SNAPSHOT_FORMAT_VERSION,
    SNAPSHOT_MAGIC,
    Counts,
    Parts,
    parse_snapshot,
)
from coordinator.core.restore_staging import RestoreStaging
from coordinator.core.state import (
    NO_WAITERS,
    DedupEntry,
    Lease,
    ResourceState,
    ResourceTable,
    StagedRestore,
    Usage,
    entry_bytes,
    shared,
)
from coordinator.core.validation import InvalidField
from coordinator.core.commands import (
    Command,
    MalformedCommand,
    Op,
    decode,
    validate_envelope,
)

__all__ = [
    "SNAPSHOT_FORMAT_VERSION",
    "Applied",
    "FencingStateMachine",
    "Outcome",
    "Reason",
    "Rejected",
    "outcome_from_wire",
    "outcome_to_wire",
]



# ---------------------------------------------------------------------------------------
# Body validation. Each body field name has one meaning and one check across all ops.


# The rules themselves live in coordinator/core/validation.py, shared with the gRPC layer so that
# both refuse exactly the same inputs.


# Checked in this order, so the message for a body with several bad fields is deterministic.
_FIELD_CHECKS: dict[str, Callable[[object], Any]] = {
    "resource": validation.check_resource,
    "key": validation.check_key,
    "holder": validation.check_holder,
    "token": validation.check_token,
    "ttl_ms": validation.check_ttl_ms,
    "value": validation.check_value,
    "expected_version": validation.check_expected_version,
    "op_id": validation.check_op_id,
    "floor": validation.check_floor,
    "fence_all": validation.check_fence_all,
    "data": validation.check_snapshot_data,
    "epoch_floor": validation.check_epoch_floor,
    "principal": validation.check_principal,
    "quota": validation.check_quota,
    "restore_id": validation.check_restore_id,
    "size": validation.check_backup_size,
    "digest": validation.check_digest,
    "seq": validation.check_seq,
    "chunk": validation.check_chunk,
    "waiter_id": validation.check_waiter_id,
}

# op -> (required fields, optional fields). An optional field that is nil counts as absent.
_SCHEMAS: dict[Op, tuple[frozenset[str], frozenset[str]]] = {
    Op.ACQUIRE: (
        frozenset({"resource", "holder", "ttl_ms", "op_id"}),
        frozenset({"principal", "quota"}),
    ),
    Op.KEEP_ALIVE: (frozenset({"resource", "token"}), frozenset({"ttl_ms"})),
    # principal and quota: whom an op_id's dedup entry is charged to, under which budget.
    Op.RELEASE: (frozenset({"resource", "token"}), frozenset({"op_id", "principal", "quota"})),
    Op.WRITE: (
        frozenset({"resource", "key", "value", "token", "op_id"}),
        frozenset({"expected_version", "principal", "quota"}),
    ),
    Op.DELETE: (frozenset({"resource", "key", "token", "op_id"}), frozenset({"principal", "quota"})),
    Op.READ_BARRIER: (frozenset(), frozenset({"resource", "key"})),
    Op.FORCE_RELEASE: (frozenset({"resource", "op_id"}), frozenset({"principal", "quota"})),
    Op.SET_EPOCH_FLOOR: (frozenset({"floor"}), frozenset({"fence_all"})),
    Op.TICK: (frozenset(), frozenset()),
    Op.RESTORE: (frozenset({"data", "epoch_floor"}), frozenset()),
    Op.RESTORE_BEGIN: (frozenset({"restore_id", "size", "digest", "epoch_floor"}), frozenset()),
    Op.RESTORE_CHUNK: (frozenset({"restore_id", "seq", "chunk"}), frozenset()),
    Op.RESTORE_COMMIT: (frozenset({"restore_id"}), frozenset()),
    Op.RESTORE_ABORT: (frozenset({"restore_id"}), frozenset()),
    Op.ENQUEUE: (
        frozenset({"resource", "holder", "ttl_ms", "waiter_id"}),
        frozenset({"principal", "quota"}),
    ),
    Op.DEQUEUE: (frozenset({"resource", "waiter_id"}), frozenset()),
}
assert set(_SCHEMAS) == set(Op), "every op needs a schema"
assert all(f in _FIELD_CHECKS for req, opt in _SCHEMAS.values() for f in req | opt)


# op -> (every field it may carry, its fields in _FIELD_CHECKS order with their check and
# whether they are required): worked out once, as every replica applies every command.
_PLANS: dict[Op, tuple[frozenset[str], tuple[tuple[str, Callable[[object], Any], bool], ...]]] = {
    op: (
        required | optional,
        tuple(
            (name, check, name in required)
            for name, check in _FIELD_CHECKS.items()
            if name in required or name in optional
        ),
    )
    for op, (required, optional) in _SCHEMAS.items()
}


def _parse_body(op: Op, body: dict[str, Any]) -> dict[str, Any]:
    """The checked fields of ``body`` for ``op``; absent optional fields map to None."""
    allowed, plan = _PLANS[op]
    if not body.keys() <= allowed:
        unknown = sorted(name for name in body if name not in allowed)
        raise InvalidField(unknown[0], f"is not a field of {op.name}")
    args: dict[str, Any] = {}
    for name, check, required in plan:
        if required:
            if name not in body:
                raise InvalidField(name, f"is required by {op.name}")
            args[name] = check(body[name])
        else:
            value = body.get(name)
            args[name] = None if value is None else check(value)
    if op is Op.READ_BARRIER and args["key"] is not None and args["resource"] is None:
        raise InvalidField("key", "needs a resource")
    if op in (Op.ACQUIRE, Op.ENQUEUE) and args["quota"] is not None and args["principal"] is None:
        raise InvalidField("quota", "needs a principal")
    return args


def _revision_refusal(op: Op, resource: str, res: ResourceState) -> Rejected | None:
    """Why ``res`` cannot take one more write or delete, or None. Only a restored backup can
    bring a revision this high; refusing here keeps live state within the bounds its own
    snapshot is read back with (``snapshot_format.parse_snapshot``)."""
    if res.revision < limits.REVISION_MAX:
        return None
    return Rejected(
        op=op,
        reason=Reason.LIMIT_EXCEEDED,
        message=f"{resource!r} is at revision {limits.REVISION_MAX}, the highest a version may have",
        details={"limit": "revision", "max": limits.REVISION_MAX},
    )


# Resources packed per piece of a snapshot built off the Raft thread: about 100 KiB and a
# millisecond or two of work, short enough that the Raft thread waits little for the GIL.
SNAPSHOT_RESOURCES_PER_PIECE = 1000
# Names sorted per run before the runs are merged: one sorted() call holds the GIL
# throughout (21 ms for 100,000 names, measured), a run of this many about 0.5 ms.
_SORT_RUN_NAMES = 5000
# Names copied per piece when a snapshot starts (a list() of them holds the GIL): ~3 ms.
_NAMES_COPIED_PER_PIECE = 100_000


def _positive_config(name: str, value: int | None, default: int) -> int:
    chosen = default if value is None else value
    if not is_int(chosen) or chosen < 1:
        raise ValueError(f"{name} must be a positive integer, got {chosen!r}")
    return chosen


class FencingStateMachine:
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
        self._handlers: dict[Op, Callable[[int, dict[str, Any]], Outcome]] = {
            Op.ACQUIRE: self._acquire,
            Op.KEEP_ALIVE: self._keep_alive,
            Op.RELEASE: self._release,
            Op.WRITE: self._write,
            Op.DELETE: self._delete,
            Op.READ_BARRIER: self._read_barrier,
            Op.FORCE_RELEASE: self._force_release,
            Op.SET_EPOCH_FLOOR: self._set_epoch_floor,
            Op.TICK: self._tick,
            Op.RESTORE: self._restore,
            Op.RESTORE_BEGIN: self._restore_begin,
            Op.RESTORE_CHUNK: self._restore_chunk,
            Op.RESTORE_COMMIT: self._restore_commit,
            Op.RESTORE_ABORT: self._restore_abort,
            Op.ENQUEUE: self._enqueue,
            Op.DEQUEUE: self._dequeue,
        }
        assert set(self._handlers) == set(Op), "every op needs a handler"

    # -- read accessors (no mutation) ---------------------------------------------------

    @property
    def epoch(self) -> int:
        """The last token issued (0 before the first)."""
        return self._epoch

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

    def read(self, resource: str, key: str) -> tuple[bytes | None, int]:
        """``(value, version)`` of ``key``; ``(None, 0)`` if absent."""
        res = self._resources.peek(resource)
        if res is None or key not in res.data:
            return None, 0
        return res.data[key]

    # -- applying commands ----------------------------------------------------------------

    def apply(self, entry: bytes, index: int = 0) -> Outcome:
        """Decode and execute one log entry (at Raft ``index``). Never raises for any input."""
        try:
            cmd = decode(entry)
        except MalformedCommand as exc:
            return Rejected(op=None, reason=Reason.MALFORMED, message=str(exc))
        return self._execute(cmd.op, cmd, index)  # decode checked the envelope

    def execute(self, cmd: Command, index: int = 0) -> Outcome:
        """Execute one decoded command. Never raises for bad fields; refusals change nothing."""
        try:
            op = validate_envelope(cmd.op, cmd.stamp_ms, cmd.body)
        except MalformedCommand as exc:
            known_op = cmd.op if isinstance(cmd.op, Op) else None
            return Rejected(op=known_op, reason=Reason.MALFORMED, message=str(exc))
        return self._execute(op, cmd, index)

    def read_now(self, cmd: Command) -> Outcome:
        """What ``cmd``, a READ_BARRIER, would answer if it applied now, with nothing changed.

        The read-index path (coordinator/raft/read_index.py) answers a read without a log
        entry, once this member applied every entry acknowledged before the read arrived;
        it calls the barrier's own handler at the log clock, where an applied READ_BARRIER
        (stamp 0) reads it too, so both paths answer alike.
        """
        try:
            op = validate_envelope(cmd.op, cmd.stamp_ms, cmd.body)
            args = _parse_body(op, cmd.body)
        except (MalformedCommand, InvalidField) as exc:
            return Rejected(op=None, reason=Reason.MALFORMED, message=str(exc))
        if op is not Op.READ_BARRIER:
            return Rejected(op=op, reason=Reason.MALFORMED, message="only a READ_BARRIER reads without the log")
        return self._read_barrier(max(self._log_clock_ms, cmd.stamp_ms), args)

    def _execute(self, op: Op, cmd: Command, index: int) -> Outcome:
        """``cmd`` with its envelope checked (``op`` is its Op): check the body, then run."""
        try:
            args = _parse_body(op, cmd.body)
        except InvalidField as exc:
            return Rejected(
                op=op, reason=Reason.MALFORMED, message=str(exc), details={"field": exc.field}
            )

        op_id: bytes | None = args.get("op_id")
        if op_id is not None:
            entry = self._dedup.get(op_id)
            if entry is not None:
                if entry.op is op and entry.resource == args["resource"]:
                    # A retry: nothing changes (I5); report where it first applied.
                    return dataclasses.replace(entry.outcome(), first_applied_index=entry.index)
                return Rejected(
                    op=op,
                    reason=Reason.OP_ID_CONFLICT,
                    message=(f"op_id was already used by {entry.op.name} on {entry.resource!r}"),
                    details={"op": int(entry.op), "resource": entry.resource},
                )

        now = max(self._log_clock_ms, cmd.stamp_ms)
        try:
            # A handler either refuses without touching state or applies and returns Applied.
            outcome = self._handlers[op](now, args)
            if isinstance(outcome, Applied):
                # Packed before the log clock or the dedup table change, so a result that
                # cannot be stored leaves both as they were.
                dedup_entry = (
                    None
                    if op_id is None
                    else DedupEntry(
                        op_id, op, args["resource"], outcome_to_wire(outcome), now, index,
                        shared(args.get("principal") or ""),
                    )
                )
                self._log_clock_ms = now
                self._dedup.evict_aged(now)
                if dedup_entry is not None:
                    quota = args.get("quota")
                    self._dedup.add(op_id, dedup_entry, None if quota is None else quota.get("dedup_entries"))
        # DESIGN §8: apply never raises. The field and snapshot checks make this unreachable.
        # Should some input still get past them, the handler may have changed state before it
        # failed, but every replica fails the same way at the same entry (apply is
        # deterministic), so they stay equal; and the member keeps serving instead of exiting
        # on an entry it would meet again after every restart (a crash loop).
        except Exception as exc:  # noqa: BLE001 - any failure becomes a refusal
            return Rejected(
                op=op,
                reason=Reason.MALFORMED,
                message=f"refused: applying it failed ({type(exc).__name__}: {exc})",
            )
        return outcome

    # -- fencing helpers --------------------------------------------------------------------

    def _fence(self, op: Op, resource: str, token: int) -> Rejected | None:
        """DESIGN I3: None iff ``token`` equals hwm(resource); else the refusal."""
        res = self._resources.get(resource)
        hwm = 0 if res is None else res.high_water_mark
        if token > hwm:
            return Rejected(
                op=op,
                reason=Reason.UNKNOWN_TOKEN,
                message=f"token {token} was never issued for {resource!r}",
                details={"hwm": hwm},
            )
        if token < hwm:
            return Rejected(
                op=op,
                reason=Reason.STALE_TOKEN,
                message=f"token {token} is stale: {resource!r} has hwm {hwm}",
                details={"hwm": hwm},
            )
        return None

    def _settle(self, name: str, res: ResourceState) -> None:
        """After ``res`` changed (its usage removed first): forget it if it holds nothing --
        no lease, no data -- else count it for its owner again."""
        if res.lease is None and not res.data and not res.waiters:
            del self._resources[name]
        else:
            self._usage.add(name, res)

    def _live_owned(self, principal: str, now: int, besides: str) -> tuple[int, int, list[str]]:
        """(live resources, live leases, idle resources) owned by ``principal``, ``besides``
        not counted. Live: a lease not yet expired at ``now``, or stored data. Idle: neither."""
        # A queued waiter may become a lease on a resource at any TICK: counted as both.
        live_resources = live_leases = self._usage.waiting.get(principal, 0)
        idle: list[str] = []
        for name in self._usage.owned.get(principal, ()):
            if name == besides:
                continue
            res = self._resources[name]
            leased = res.lease is not None and res.lease.expires_at_ms > now
            live_leases += leased
            if leased or res.data:
                live_resources += 1
            else:
                idle.append(name)
        return live_resources, live_leases, sorted(idle)

    def _quota_refusal(
        self, resource: str, res: ResourceState | None, now: int, principal: str, quota: dict[str, int]
    ) -> tuple[Rejected | None, list[str]]:
        """Whether ``principal`` may own ``resource`` and its lease under ``quota``:
        (the refusal or None, the principal's idle resources to forget if it applies).

        The stored counts decide at once while they are below the quota; at the quota, the
        principal's resources are counted live (expired leases of crashed holders do not
        count), and the idle ones found are forgotten by this acquire -- so a principal pays
        for that scan only when it is at its quota, and each idle resource is scanned once.
        """
        owned = self._usage.owned.get(principal, ())
        leased = self._usage.leased.get(principal, ())
        resources_max = quota.get("resources")
        leases_max = quota.get("leases")
        stored_bytes_max = quota.get("stored_bytes")
        idle: list[str] = []
        waiting = self._usage.waiting.get(principal, 0)
        at_quota = (
            resources_max is not None and len(owned) - (resource in owned) + waiting >= resources_max
        ) or (leases_max is not None and len(leased) - (resource in leased) + waiting >= leases_max)
        if at_quota:
            live_resources, live_leases, idle = self._live_owned(principal, now, resource)
            for name, live, maximum in (
                ("resources", live_resources, resources_max),
                ("leases", live_leases, leases_max),
            ):
                if maximum is not None and live >= maximum:
                    return self._quota_rejected(Op.ACQUIRE, principal, name, maximum, live), []
        if stored_bytes_max is not None and res is not None and res.owner != principal:
            # Taking a resource over takes its data too.
            total = self._usage.stored_bytes.get(principal, 0) + res.stored_bytes
            if res.stored_bytes and total > stored_bytes_max:
                return self._quota_rejected(
                    Op.ACQUIRE, principal, "stored_bytes", stored_bytes_max, total
                ), []
        return None, idle

    @staticmethod
    def _quota_rejected(op: Op, principal: str, quota: str, maximum: int, used: int) -> Rejected:
        return Rejected(
            op=op,
            reason=Reason.QUOTA_EXCEEDED,
            message=(
                f"principal {principal!r} is at its {quota} quota"
                f" ({used} {'would be ' if quota == 'stored_bytes' else ''}used, max {maximum})"
            ),
            details={"quota": quota, "max": maximum, "principal": principal},
        )

    def _state_size_refusal(self, resource: str, new_key: bool, grows_by: int) -> Rejected | None:
        """Why a write adding ``grows_by`` bytes (and a key, if ``new_key``) would take the
        cluster past STATE_KEYS_MAX or STATE_STORED_BYTES_MAX, or None. These bound the
        largest state, and so the largest snapshot (limits.BACKUP_BYTES_MAX)."""
        if new_key and self._keys_total >= self._state_keys_max:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.LIMIT_EXCEEDED,
                message=f"the cluster already stores {self._state_keys_max} keys; {resource!r} cannot add one",
                details={"limit": "state_keys", "max": self._state_keys_max},
            )
        if grows_by > 0 and self._stored_bytes_total + grows_by > self._state_stored_bytes_max:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.LIMIT_EXCEEDED,
                message=(
                    f"the cluster stores {self._stored_bytes_total} bytes of keys and values; this"
                    f" write would take it past {self._state_stored_bytes_max}"
                ),
                details={"limit": "state_stored_bytes", "max": self._state_stored_bytes_max},
            )
        return None

    def _new_epoch_refusal(self, op: Op, resource: str, freed: int = 0) -> Rejected | None:
        """Why a new epoch for ``resource`` cannot be issued now, or None (``freed``: how
        many resources this command forgets first)."""
        if self._epoch >= limits.TOKEN_MAX:
            return Rejected(
                op=op,
                reason=Reason.EPOCH_EXHAUSTED,
                message=f"every token up to {limits.TOKEN_MAX} has been issued",
            )
        if resource not in self._resources and len(self._resources) - freed >= self._resources_max:
            return Rejected(
                op=op,
                reason=Reason.LIMIT_EXCEEDED,
                message=f"the cluster already tracks {self._resources_max} resources",
                details={"limit": "resources", "max": self._resources_max},
            )
        return None

    # -- handlers: check everything first, then mutate ---------------------------------------

    def _acquire(self, now: int, args: dict[str, Any]) -> Outcome:
        resource = args["resource"]
        res = self._resources.get(resource)
        lease = None if res is None else res.lease
        if res is not None and res.waiters:
            # The queue goes first (FIFO): an ACQUIRE never jumps it, not even in the moment
            # between a lease's expiry and the TICK that grants the head waiter.
            head = next(iter(res.waiters.values()))
            return Rejected(
                op=Op.ACQUIRE,
                reason=Reason.LEASE_HELD,
                message=f"{resource!r} has {len(res.waiters)} lock waiter(s) queued; {head.holder!r} is next",
                details={
                    "holder": head.holder if lease is None else lease.holder,
                    "expires_at_ms": 0 if lease is None else lease.expires_at_ms,
                    "token": 0 if lease is None else lease.token,
                },
            )
        if lease is not None and lease.expires_at_ms > now:
            return Rejected(
                op=Op.ACQUIRE,
                reason=Reason.LEASE_HELD,
                message=(f"{resource!r} is leased to {lease.holder!r} until {lease.expires_at_ms}"),
                details={
                    "holder": lease.holder,
                    "expires_at_ms": lease.expires_at_ms,
                    "token": lease.token,
                },
            )
        principal = args["principal"]
        idle: list[str] = []
        if principal is not None and args["quota"]:
            refusal, idle = self._quota_refusal(resource, res, now, principal, args["quota"])
            if refusal is not None:
                return refusal
        refusal = self._new_epoch_refusal(Op.ACQUIRE, resource, freed=len(idle))
        if refusal is not None:
            return refusal
        for name in idle:
            self._usage.remove(name, self._resources.pop(name))
        if res is None:
            res = self._resources[resource] = ResourceState()
        else:
            self._usage.remove(resource, res)
        self._issue(resource, res, now, args["holder"], args["ttl_ms"], principal or "")
        self._usage.add(resource, res)
        return Applied(
            op=Op.ACQUIRE,
            result={
                "token": self._epoch,
                "expires_at_ms": res.lease.expires_at_ms,
                "hwm": res.high_water_mark,
            },
        )

    def _issue(self, name: str, res: ResourceState, now: int, holder: str, ttl_ms: int, principal: str,
               waiter_id: bytes = b"") -> None:
        """Grant ``name``'s lease with a new token (the caller checked the epoch and removed
        ``res`` from the usage; it adds it back)."""
        res.owner = shared(principal)
        self._epoch += 1
        res.high_water_mark = self._epoch  # fence on acquire (I2)
        res.lease = Lease(
            holder=shared(holder), token=self._epoch, ttl_ms=ttl_ms, expires_at_ms=now + ttl_ms, waiter_id=waiter_id
        )
        self._expiry.add(res.lease.expires_at_ms, name)

    def _advance(self, name: str, res: ResourceState, now: int) -> None:
        """While ``name``'s lease is free (none, or expired by ``now``), grant it to the head
        waiter, in this same entry: one entry per grant, none per waiting client. A head
        waiter whose slot expired, or whose principal's quota no longer allows the lease, is
        dropped and the next one tried. With every token issued (TOKEN_MAX) nobody is granted.
        The caller removed ``res`` from the usage and adds it back (``_settle``)."""
        while (waiter := self._queue.live_head(res, now)) is not None:
            if self._epoch >= limits.TOKEN_MAX:
                return
            if waiter.principal and waiter.quota:
                refusal, _idle = self._quota_refusal(name, res, now, waiter.principal, waiter.quota)
                if refusal is not None:
                    self._queue.drop(res, waiter.waiter_id)
                    continue
            self._queue.drop(res, waiter.waiter_id)
            self._issue(name, res, now, waiter.holder, waiter.ttl_ms, waiter.principal, waiter.waiter_id)
            return

    def lock_state(self, resource: str, waiter_id: bytes, *, now_ms: int | None = None) -> dict[str, Any]:
        """Where ``waiter_id`` stands on ``resource`` at ``now_ms`` (default: the log clock;
        a local read, for a Lock call waiting for its grant): granted (with token and
        expiry), queued (with its 0-based position), or neither (never queued, cancelled,
        dropped, or its lease has ended since)."""
        now_ms = self._log_clock_ms if now_ms is None else now_ms
        return lock_state(self._resources.get(resource), waiter_id, now_ms)

    def _enqueue(self, now: int, args: dict[str, Any]) -> Outcome:
        resource, waiter_id = args["resource"], args["waiter_id"]
        res = self._resources.get(resource)
        if res is not None and res.lease is not None and res.lease.waiter_id == waiter_id:
            # Granted already (a renewal that crossed its grant, or a retry): nothing to queue.
            return Applied(op=Op.ENQUEUE, result=self.lock_state(resource, waiter_id, now_ms=now))
        existing = None if res is None else res.waiters.get(waiter_id)
        principal = args["principal"]
        if existing is None:
            waiting = 0 if principal is None else self._usage.waiting.get(principal, 0)
            refusal = self._queue.cap_refusal(resource, res, principal, waiting)
            if refusal is not None:
                return refusal
            if principal is not None and args["quota"]:
                refusal, _idle = self._quota_refusal(resource, res, now, principal, args["quota"])
                if refusal is not None:
                    return dataclasses.replace(refusal, op=Op.ENQUEUE)
            refusal = self._new_epoch_refusal(Op.ENQUEUE, resource)
            if refusal is not None:
                return refusal
        if res is None:
            res = self._resources[resource] = ResourceState()
        else:
            self._usage.remove(resource, res)
        self._queue.queue(
            resource, res, now, waiter_id, args["holder"], args["ttl_ms"], principal or "", dict(args["quota"] or {})
        )
        self._advance(resource, res, now)
        self._settle(resource, res)
        return Applied(op=Op.ENQUEUE, result=self.lock_state(resource, waiter_id, now_ms=now))

    def _dequeue(self, now: int, args: dict[str, Any]) -> Outcome:
        resource, waiter_id = args["resource"], args["waiter_id"]
        res = self._resources.get(resource)
        cancelled = released = False
        if res is not None and waiter_id in res.waiters:
            self._usage.remove(resource, res)
            self._queue.drop(res, waiter_id)
            cancelled = True
        elif res is not None and res.lease is not None and res.lease.waiter_id == waiter_id:
            # Granted while its client gave up: the client never learnt the token, so the
            # lease is ended here rather than left to block the queue for its ttl.
            self._usage.remove(resource, res)
            released = res.lease.expires_at_ms > now
            res.lease = None
        else:
            return Applied(op=Op.DEQUEUE, result={"cancelled": False, "released": False})
        self._advance(resource, res, now)
        self._settle(resource, res)
        return Applied(op=Op.DEQUEUE, result={"cancelled": cancelled, "released": released})

    def _keep_alive(self, now: int, args: dict[str, Any]) -> Outcome:
        resource, token = args["resource"], args["token"]
        refusal = self._fence(Op.KEEP_ALIVE, resource, token)
        if refusal is not None:
            return refusal
        res = self._resources[resource]
        lease = res.lease
        if lease is None or lease.token != token or lease.expires_at_ms <= now:
            return Rejected(
                op=Op.KEEP_ALIVE,
                reason=Reason.LEASE_EXPIRED,
                message=f"the lease with token {token} on {resource!r} has ended",
            )
        ttl_ms = lease.ttl_ms if args["ttl_ms"] is None else args["ttl_ms"]
        res.lease = dataclasses.replace(lease, ttl_ms=ttl_ms, expires_at_ms=now + ttl_ms)
        self._expiry.add(now + ttl_ms, resource)
        return Applied(op=Op.KEEP_ALIVE, result={"token": token, "expires_at_ms": now + ttl_ms})

    def _release(self, now: int, args: dict[str, Any]) -> Outcome:
        resource, token = args["resource"], args["token"]
        refusal = self._fence(Op.RELEASE, resource, token)
        if refusal is not None:
            return refusal
        res = self._resources[resource]
        lease = res.lease
        released = False
        self._usage.remove(resource, res)
        if lease is not None and lease.token == token:
            released = lease.expires_at_ms > now  # an expired lease had already ended
            res.lease = None
        self._advance(resource, res, now)  # the next waiter gets it in this entry
        self._settle(resource, res)  # no data: forgotten; the epoch fences its tokens
        return Applied(op=Op.RELEASE, result={"hwm": res.high_water_mark, "released": released})

    def _write(self, now: int, args: dict[str, Any]) -> Outcome:
        resource, key = args["resource"], args["key"]
        refusal = self._fence(Op.WRITE, resource, args["token"])
        if refusal is not None:
            return refusal
        res = self._resources[resource]
        current = res.data.get(key)
        current_version = 0 if current is None else current[1]
        expected = args["expected_version"]
        if expected is not None and expected != current_version:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.VERSION_MISMATCH,
                message=f"{key!r} is at version {current_version}, not {expected}",
                details={"version": current_version},
            )
        refusal = _revision_refusal(Op.WRITE, resource, res)
        if refusal is not None:
            return refusal
        if current is None and len(res.data) >= self._keys_per_resource_max:
            return Rejected(
                op=Op.WRITE,
                reason=Reason.LIMIT_EXCEEDED,
                message=f"{resource!r} already holds {self._keys_per_resource_max} keys",
                details={"limit": "keys_per_resource", "max": self._keys_per_resource_max},
            )
        value = args["value"]
        grows_by = entry_bytes(key, value) - (0 if current is None else entry_bytes(key, current[0]))
        refusal = self._state_size_refusal(resource, current is None, grows_by)
        if refusal is not None:
            return refusal
        stored_bytes_max = None if args["quota"] is None else args["quota"].get("stored_bytes")
        if stored_bytes_max is not None and res.owner and grows_by > 0:
            # The bytes are the owner's (the principal of the last acquire): a writer is
            # normally that owner, as only the last acquire's token writes.
            total = self._usage.stored_bytes.get(res.owner, 0) + grows_by
            if total > stored_bytes_max:
                return self._quota_rejected(Op.WRITE, res.owner, "stored_bytes", stored_bytes_max, total)
        self._usage.remove(resource, res)
        res.revision += 1
        res.data[shared(key)] = (value, res.revision)
        res.stored_bytes += grows_by
        self._keys_total += current is None
        self._stored_bytes_total += grows_by
        self._usage.add(resource, res)
        return Applied(op=Op.WRITE, result={"version": res.revision, "hwm": res.high_water_mark})

    def _delete(self, now: int, args: dict[str, Any]) -> Outcome:
        resource, key = args["resource"], args["key"]
        refusal = self._fence(Op.DELETE, resource, args["token"])
        if refusal is not None:
            return refusal
        res = self._resources[resource]
        if key not in res.data:
            return Applied(op=Op.DELETE, result={"version": 0, "deleted": False})
        refusal = _revision_refusal(Op.DELETE, resource, res)
        if refusal is not None:
            return refusal
        self._usage.remove(resource, res)
        res.revision += 1
        freed = entry_bytes(key, res.data.pop(key)[0])
        res.stored_bytes -= freed
        self._keys_total -= 1
        self._stored_bytes_total -= freed
        self._settle(resource, res)  # the last key of a released resource: forgotten
        return Applied(op=Op.DELETE, result={"version": res.revision, "deleted": True})

    def _read_barrier(self, now: int, args: dict[str, Any]) -> Outcome:
        result: dict[str, Any] = {"epoch": self._epoch, "log_clock_ms": now}
        resource = args["resource"]
        if resource is not None:
            res = self._resources.get(resource)
            lease = None if res is None else res.lease
            result["hwm"] = 0 if res is None else res.high_water_mark
            if res is not None and res.waiters:
                result["waiters"] = len(res.waiters)  # absent when none: older results unchanged
            result["lease"] = (
                None
                if lease is None or lease.expires_at_ms <= now
                else {
                    "holder": lease.holder,
                    "token": lease.token,
                    "expires_at_ms": lease.expires_at_ms,
                }
            )
            key = args["key"]
            if key is not None:
                value, version = self.read(resource, key)
                result["value"] = value
                result["version"] = version
        return Applied(op=Op.READ_BARRIER, result=result)

    def _force_release(self, now: int, args: dict[str, Any]) -> Outcome:
        resource = args["resource"]
        refusal = self._new_epoch_refusal(Op.FORCE_RELEASE, resource)
        if refusal is not None:
            return refusal
        res = self._resources.get(resource)
        if res is None:
            res = self._resources[resource] = ResourceState()
        self._usage.remove(resource, res)
        self._epoch += 1
        res.high_water_mark = self._epoch  # the old holder's token is now stale (I7)
        res.lease = None
        self._advance(resource, res, now)  # the next waiter gets it, above the fence
        # Kept even when empty: an admin's fence stays visible, and its owner's quota scan
        # forgets it once that owner needs the slot.
        self._usage.add(resource, res)
        return Applied(op=Op.FORCE_RELEASE, result={"hwm": res.high_water_mark})

    def _set_epoch_floor(self, now: int, args: dict[str, Any]) -> Outcome:
        fence_all = True if args["fence_all"] is None else args["fence_all"]
        new_epoch = max(self._epoch, args["floor"])
        if fence_all:
            if new_epoch < limits.TOKEN_MAX:
                new_epoch += 1
            if new_epoch <= self._epoch:
                # The last token issued is TOKEN_MAX: no higher hwm can fence its holder.
                return Rejected(
                    op=Op.SET_EPOCH_FLOOR,
                    reason=Reason.EPOCH_EXHAUSTED,
                    message=f"cannot fence above the last token {limits.TOKEN_MAX}",
                )
        self._epoch = new_epoch
        if fence_all:
            self._resources.preserve_all()  # a snapshot being read keeps them as they were
            for res in self._resources.values():
                res.high_water_mark = new_epoch  # every token issued before is stale (I11)
                res.lease = None
            # Queued waiters go too: fencing everything is a stop for every holder, and a
            # waiter granted now would hold a lease the admin meant to clear.
            self._queue.clear(self._resources.values())
            self._usage = Usage.of(self._resources)  # no leases left
        return Applied(op=Op.SET_EPOCH_FLOOR, result={"epoch": new_epoch})

    def _tick(self, now: int, args: dict[str, Any]) -> Outcome:
        # The index, not a scan: the leader TICKs every second, and a pass over 100,000
        # resources held the Raft thread for ~100 ms each time.
        for name, waiter_id in self._queue.expired(self._resources, now):
            res = self._resources[name]  # a queued waiter keeps its resource (_settle)
            self._usage.remove(name, res)
            self._queue.drop(res, waiter_id)  # its client stopped renewing its slot
            self._advance(name, res, now)
            self._settle(name, res)
        expired = self._expiry.expired(self._resources, now)
        for name in expired:
            res = self._resources.get(name)
            if res is None or res.lease is None or res.lease.expires_at_ms > now:
                continue  # granted anew to a waiter above
            self._usage.remove(name, res)
            res.lease = None
            self._advance(name, res, now)  # the head waiter, in this TICK
            self._settle(name, res)  # an expired lease on no data: forgotten
        self._staging.drop_if_stale(now)  # an abandoned restore's chunks: memory back
        return Applied(op=Op.TICK, result={"expired": len(expired)})

    def _restore(self, now: int, args: dict[str, Any]) -> Outcome:
        """Admin restore from a backup in one entry (written by older members; the API now
        proposes the chunked ops below). See ``_swap_in``."""
        data = args["data"]
        return self._swap_in(Op.RESTORE, args["epoch_floor"], lambda: parse_snapshot(data, self._bounds))

    def _floor_refusal(self, op: Op, floor: int) -> Rejected | None:
        if floor > self._epoch:
            return None
        return Rejected(
            op=op,
            reason=Reason.EPOCH_FLOOR_TOO_LOW,
            message=f"epoch_floor {floor} must exceed the current epoch {self._epoch}",
            details={"epoch": self._epoch},
        )

    def _swap_in(self, op: Op, floor: int, read: Callable[[], Parts]) -> Outcome:
        """Replace the state by the backup ``read`` returns (or refuses with ValueError),
        fenced above every token (I11).

        The floor must exceed the current epoch, so no token issued before the restore, by
        this cluster or the backup's, is ever issued again. Every restored resource gets
        hwm = the new epoch and no lease; resources absent from the backup are gone (their
        old tokens are then refused as UNKNOWN_TOKEN). The dedup table is emptied: its
        outcomes describe a history the restore replaced, and every token in them is now
        fenced. The log clock keeps going forward. A staged restore is dropped with the rest.
        The backup is held to the bounds live state keeps; anything else is a refusal.
        """
        refusal = self._floor_refusal(op, floor)
        if refusal is not None:
            return refusal
        try:
            parts = read()
        except ValueError as exc:
            return Rejected(
                op=op, reason=Reason.MALFORMED, message=f"field 'data': {exc}", details={"field": "data"}
            )
        new_epoch = max(floor, parts.epoch + 1)
        if new_epoch > limits.TOKEN_MAX:
            return Rejected(
                op=op,
                reason=Reason.EPOCH_EXHAUSTED,
                message=f"the backup's epoch {parts.epoch} leaves no token to fence it with",
            )
        for res in parts.resources.values():
            res.high_water_mark = new_epoch  # every token issued before is stale (I11)
            res.lease = None
            res.waiters = NO_WAITERS  # waiters belong to clients of the state being replaced
        parts.epoch, parts.log_clock_ms = new_epoch, self._log_clock_ms
        parts.dedup, parts.staged = collections.OrderedDict(), None
        self._install(parts)
        return Applied(op=op, result={"epoch": new_epoch, "resources": len(parts.resources)})

    def _install(self, parts: Parts) -> None:
        """Make ``parts`` the whole state, with everything derived from it recounted."""
        self._epoch = parts.epoch
        self._log_clock_ms = parts.log_clock_ms
        # A ResourceTable from snapshot_format; the table it replaces is no longer changed, so
        # a snapshot still reading it reads it as it started.
        self._resources = parts.resources if isinstance(parts.resources, ResourceTable) else ResourceTable(parts.resources)
        self._queue.recount(parts.resources)
        self._usage = Usage.of(parts.resources)
        self._dedup.load(parts.dedup)
        self._staging.load(parts.staged)  # mid-restore: its chunks are read again
        self._keys_total = sum(len(res.data) for res in parts.resources.values())
        self._stored_bytes_total = sum(res.stored_bytes for res in parts.resources.values())

    # -- a backup restored in chunks ---------------------------------------------------------
    # BEGIN, CHUNK..., COMMIT are separate entries, each within the Raft entry bounds; the
    # staging itself is ``restore_staging``'s. Only one restore is staged at a time; a refusal
    # at any step changes nothing (the proposer then ABORTs). Every check depends on the
    # entries alone, so every replica stages and decides alike.

    def _restore_begin(self, now: int, args: dict[str, Any]) -> Outcome:
        refusal = self._staging.busy_refusal(now) or self._floor_refusal(Op.RESTORE_BEGIN, args["epoch_floor"])
        if refusal is not None:
            return refusal
        self._staging.begin(now, args["restore_id"], args["size"], args["digest"], args["epoch_floor"])
        return Applied(op=Op.RESTORE_BEGIN, result={"size": args["size"]})

    def _restore_chunk(self, now: int, args: dict[str, Any]) -> Outcome:
        return self._staging.chunk(now, args["restore_id"], args["seq"], args["chunk"])

    def _restore_commit(self, now: int, args: dict[str, Any]) -> Outcome:
        staged = self._staging.complete(args["restore_id"])
        if isinstance(staged, Rejected):
            return staged
        # The backup was read as its chunks were staged: what is left is the verdict, the
        # counts against this machine's limits, the fencing and the swap.
        return self._swap_in(
            Op.RESTORE_COMMIT, staged.epoch_floor, lambda: staged.reader.finish(self._bounds)
        )  # drops the staging

    def _restore_abort(self, now: int, args: dict[str, Any]) -> Outcome:
        return Applied(op=Op.RESTORE_ABORT, result={"aborted": self._staging.abort(args["restore_id"])})

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """All state as canonical msgpack: resources and keys sorted, dedup in apply order,
        then the staged restore (what a member's snapshot and ``digest`` hold).

        Layout: ``[magic, SNAPSHOT_FORMAT_VERSION, epoch, log_clock_ms, resources, dedup, staged]``;
        resources ``[[name, hwm, revision, lease|nil, [[key, value, version], ...], owner?, waiters?], ...]``
        (``owner`` only when the resource has one or has waiters, so states without principals
        keep the bytes they had before quotas; ``waiters`` only when some are queued, in FIFO
        order, each ``[waiter_id, holder, ttl_ms, expires_at_ms, principal, quota]``),
        lease ``[holder, token, ttl_ms, expires_at_ms, waiter_id?]``, dedup
        ``[[op_id, op, resource, outcome_wire, applied_at_ms, first_index, principal], ...]``, staged
        nil or ``[restore_id, size, digest, epoch_floor, touched_at_ms, [chunk, ...]]``.
        """
        return self._document(self._staging.staged, with_queue=True)

    def backup(self) -> bytes:
        """``snapshot()`` without the staged restore (nil) and without the lock queue: what
        Admin snapshots hand out, so a backup is never larger than limits.BACKUP_BYTES_MAX,
        restore in progress or not (a restore drops waiters and leases anyway)."""
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
        return self._document_pieces(self._staging.staged, with_queue=True, copy_on_write=True)

    def _document(self, staged: StagedRestore | None, *, with_queue: bool) -> bytes:
        return b"".join(self._document_pieces(staged, with_queue=with_queue))

    def _document_pieces(
        self, staged: StagedRestore | None, *, with_queue: bool, copy_on_write: bool = False
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
                    packer.pack_array_header(7),
                    packer.pack(SNAPSHOT_MAGIC),
                    packer.pack(SNAPSHOT_FORMAT_VERSION),
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
                piece.append(packer.pack(self._resource_item(name, resource_of(name), with_queue)))
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

    @staticmethod
    def _resource_item(name: str, res: ResourceState, with_queue: bool) -> list[Any]:
        lease = res.lease
        item = [
            name,
            res.high_water_mark,
            res.revision,
            None
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

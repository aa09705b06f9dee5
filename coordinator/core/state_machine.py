"""The replicated state machine of the fencing coordinator: pure and deterministic.

Owns: the epoch counter, every resource's high-water mark, lease and fenced key/value data,
the dedup table of op_ids, the log clock, and the rules that change them one log entry at a
time (DESIGN §3 I2-I7, I11); plus the canonical snapshot of all of it.
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
(``_Usage``, derived from the resources on restore, so it needs no snapshot field of its own
beyond the owner's name). A resource with no lease (released, force-released or expired) and
no data is forgotten: it holds nothing worth a slot, and the global epoch already fences every
token it ever had (a re-acquire issues a token above all of them; a write carrying one finds
hwm 0 and is UNKNOWN_TOKEN).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
from collections.abc import Callable
from typing import Any

import msgpack

from coordinator.core import limits
from coordinator.core import validation
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

# Version of the snapshot layout written by snapshot(); restore() refuses any other.
SNAPSHOT_FORMAT_VERSION = 1
_SNAPSHOT_MAGIC = "fencing-coordinator/state"


class Reason(enum.IntEnum):
    """Why a command was refused. The numbers are stored in snapshots: never renumber."""

    MALFORMED = 1
    STALE_TOKEN = 2
    UNKNOWN_TOKEN = 3
    LEASE_HELD = 4
    LEASE_EXPIRED = 5
    VERSION_MISMATCH = 6
    LIMIT_EXCEEDED = 7
    EPOCH_EXHAUSTED = 8
    OP_ID_CONFLICT = 9
    EPOCH_FLOOR_TOO_LOW = 10
    QUOTA_EXCEEDED = 11


@dataclasses.dataclass(frozen=True)
class Applied:
    """The command took effect; ``result`` holds what the caller is told."""

    op: Op
    result: dict[str, Any]
    # On a retry answered from the dedup table: the log index at which the op_id first
    # applied (0 otherwise). Replies must report that index, not the retry's own entry,
    # or a history would order the effect after writes it preceded.
    first_applied_index: int = dataclasses.field(default=0, compare=False)


@dataclasses.dataclass(frozen=True)
class Rejected:
    """The command was refused and changed nothing. ``op`` is None if it could not be decoded."""

    op: Op | None
    reason: Reason
    message: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


Outcome = Applied | Rejected

_WIRE_APPLIED = 1
_WIRE_REJECTED = 2


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_CONTAINERS = (dict, list, tuple)


def _flat(mapping: dict) -> bool:
    return not any(isinstance(v, _CONTAINERS) for v in mapping.values())


def _sorted_map(value: Any) -> Any:
    """``value`` with every dict's keys in sorted order, so its msgpack bytes are canonical."""
    if isinstance(value, dict):
        if _flat(value):  # results and details are flat maps: one sort, no recursion
            return dict(sorted(value.items()))
        return {k: _sorted_map(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted_map(v) for v in value]
    return value


def outcome_to_wire(outcome: Outcome) -> list:
    """A msgpack-encodable, canonical list for ``outcome`` (dedup table, snapshots, replies)."""
    if isinstance(outcome, Applied):
        return [_WIRE_APPLIED, int(outcome.op), _sorted_map(outcome.result)]
    if isinstance(outcome, Rejected):
        op = None if outcome.op is None else int(outcome.op)
        return [
            _WIRE_REJECTED,
            op,
            int(outcome.reason),
            outcome.message,
            _sorted_map(outcome.details),
        ]
    raise TypeError(f"not an outcome: {type(outcome).__name__}")


def outcome_from_wire(wire: list) -> Outcome:
    """Inverse of ``outcome_to_wire``; raises ValueError on anything else."""
    if not isinstance(wire, (list, tuple)) or not wire:
        raise ValueError("outcome must be a non-empty list")
    tag = wire[0]
    if tag == _WIRE_APPLIED and _is_int(tag):
        if len(wire) != 3:
            raise ValueError("applied outcome must be [1, op, result]")
        _, op, result = wire
        if not isinstance(result, dict) or not all(isinstance(k, str) for k in result):
            raise ValueError("applied outcome result must be a map with string keys")
        return Applied(op=_op_from_wire(op), result=dict(result))
    if tag == _WIRE_REJECTED and _is_int(tag):
        if len(wire) != 5:
            raise ValueError("rejected outcome must be [2, op, reason, message, details]")
        _, op, reason, message, details = wire
        if not _is_int(reason) or reason not in Reason._value2member_map_:
            raise ValueError(f"unknown rejection reason {reason!r}")
        if not isinstance(message, str):
            raise ValueError("rejected outcome message must be a string")
        if not isinstance(details, dict) or not all(isinstance(k, str) for k in details):
            raise ValueError("rejected outcome details must be a map with string keys")
        return Rejected(
            op=None if op is None else _op_from_wire(op),
            reason=Reason(reason),
            message=message,
            details=dict(details),
        )
    raise ValueError(f"unknown outcome tag {tag!r}")


def _op_from_wire(op: object) -> Op:
    if not _is_int(op) or op not in Op._value2member_map_:
        raise ValueError(f"unknown op {op!r}")
    return Op(op)


# ---------------------------------------------------------------------------------------
# Body validation. Each body field name has one meaning and one check across all ops.


# The rules themselves live in coordinator/core/validation.py, shared with the gRPC layer so that
# both refuse exactly the same inputs.
_InvalidField = validation.InvalidField


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
}

# op -> (required fields, optional fields). An optional field that is nil counts as absent.
_SCHEMAS: dict[Op, tuple[frozenset[str], frozenset[str]]] = {
    Op.ACQUIRE: (
        frozenset({"resource", "holder", "ttl_ms", "op_id"}),
        frozenset({"principal", "quota"}),
    ),
    Op.KEEP_ALIVE: (frozenset({"resource", "token"}), frozenset({"ttl_ms"})),
    Op.RELEASE: (frozenset({"resource", "token"}), frozenset({"op_id"})),
    Op.WRITE: (
        frozenset({"resource", "key", "value", "token", "op_id"}),
        frozenset({"expected_version", "quota"}),
    ),
    Op.DELETE: (frozenset({"resource", "key", "token", "op_id"}), frozenset()),
    Op.READ_BARRIER: (frozenset(), frozenset({"resource", "key"})),
    Op.FORCE_RELEASE: (frozenset({"resource", "op_id"}), frozenset()),
    Op.SET_EPOCH_FLOOR: (frozenset({"floor"}), frozenset({"fence_all"})),
    Op.TICK: (frozenset(), frozenset()),
    Op.RESTORE: (frozenset({"data", "epoch_floor"}), frozenset()),
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
        raise _InvalidField(unknown[0], f"is not a field of {op.name}")
    args: dict[str, Any] = {}
    for name, check, required in plan:
        if required:
            if name not in body:
                raise _InvalidField(name, f"is required by {op.name}")
            args[name] = check(body[name])
        else:
            value = body.get(name)
            args[name] = None if value is None else check(value)
    if op is Op.READ_BARRIER and args["key"] is not None and args["resource"] is None:
        raise _InvalidField("key", "needs a resource")
    if op is Op.ACQUIRE and args["quota"] is not None and args["principal"] is None:
        raise _InvalidField("quota", "needs a principal")
    return args


# ---------------------------------------------------------------------------------------
# State.


@dataclasses.dataclass(frozen=True)
class _Lease:
    holder: str
    token: int
    ttl_ms: int
    expires_at_ms: int


@dataclasses.dataclass
class _Resource:
    high_water_mark: int = 0
    lease: _Lease | None = None
    # Incremented by every applied write and delete; a key's version is the revision
    # of its last write, so versions never repeat for a key, even across deletes.
    revision: int = 0
    data: dict[str, tuple[bytes, int]] = dataclasses.field(default_factory=dict)
    # The principal of the last ACQUIRE ("" when it carried none: no principals file, or an
    # entry written before quotas); its lease and stored bytes count against this name.
    owner: str = ""
    # Keys + values of ``data``: derived (never in a snapshot), kept so a quota check is O(1).
    stored_bytes: int = 0


def _entry_bytes(key: str, value: bytes) -> int:
    """What one key counts against a stored-bytes quota (keys are ASCII: chars are bytes)."""
    return len(key) + len(value)


def _remove_from(table: dict[str, set[str]], owner: str, name: str) -> None:
    names = table.get(owner)
    if names is not None:
        names.discard(name)
        if not names:
            del table[owner]


class _Usage:
    """What each principal owns: resources, resources with a stored lease, stored bytes.

    Derived from the resources alone (``of``), so it is the same on every replica and after
    any restore. Callers ``remove`` a resource before changing its owner, lease or data and
    ``add`` it back after, which keeps every count exact without recounting. Resources
    without an owner are not counted (nothing limits them but the cluster-wide limits).
    """

    def __init__(self) -> None:
        self.owned: dict[str, set[str]] = {}
        self.leased: dict[str, set[str]] = {}
        self.stored_bytes: dict[str, int] = {}

    @classmethod
    def of(cls, resources: dict[str, _Resource]) -> _Usage:
        usage = cls()
        for name, res in resources.items():
            usage.add(name, res)
        return usage

    def add(self, name: str, res: _Resource) -> None:
        if not res.owner:
            return
        self.owned.setdefault(res.owner, set()).add(name)
        if res.lease is not None:
            self.leased.setdefault(res.owner, set()).add(name)
        if res.stored_bytes:
            self.stored_bytes[res.owner] = self.stored_bytes.get(res.owner, 0) + res.stored_bytes

    def remove(self, name: str, res: _Resource) -> None:
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


def _revision_refusal(op: Op, resource: str, res: _Resource) -> Rejected | None:
    """Why ``res`` cannot take one more write or delete, or None. Only a restored backup can
    bring a revision this high; refusing here keeps live state within the bounds its own
    snapshot is read back with (``_read_snapshot``)."""
    if res.revision < limits.REVISION_MAX:
        return None
    return Rejected(
        op=op,
        reason=Reason.LIMIT_EXCEEDED,
        message=f"{resource!r} is at revision {limits.REVISION_MAX}, the highest a version may have",
        details={"limit": "revision", "max": limits.REVISION_MAX},
    )


class _DedupEntry:
    """The first outcome of one op_id, kept as the bytes it has in a snapshot's dedup array.

    Every applied command with an op_id makes one, on every replica, so it holds only what
    eviction and a retry's check need; the outcome itself is read back from ``packed`` when a
    retry asks for it. Packing once when stored also keeps snapshots cheap: they run on the
    Raft tick thread, and packing up to DEDUP_ENTRIES_MAX entries each time stalled it ~100 ms.
    """

    __slots__ = ("op", "resource", "applied_at_ms", "index", "packed")

    def __init__(
        self, op_id: bytes, op: Op, resource: str, wire: list, applied_at_ms: int, index: int
    ) -> None:
        self.op = op
        self.resource = resource
        # The log clock after the entry applied. Non-decreasing in apply order, which is what
        # lets eviction by age look only at the oldest entries.
        self.applied_at_ms = applied_at_ms
        # The Raft log index of the entry that first applied this op_id (0 if unknown).
        self.index = index
        # ``wire`` is outcome_to_wire(outcome): canonical, so equal states pack equal bytes.
        self.packed = msgpack.packb(
            [op_id, int(op), resource, wire, applied_at_ms, index], use_bin_type=True
        )

    def outcome(self) -> Applied:
        """A fresh copy of the stored outcome (callers may edit it)."""
        outcome = outcome_from_wire(msgpack.unpackb(self.packed, raw=False)[3])
        assert isinstance(outcome, Applied), "only applied outcomes are stored"
        return outcome


def _positive_config(name: str, value: int | None, default: int) -> int:
    chosen = default if value is None else value
    if not _is_int(chosen) or chosen < 1:
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
        # What a backup restored through the log may hold: no more than live state may.
        self._bounds = _Counts(
            resources_max=self._resources_max,
            keys_per_resource_max=self._keys_per_resource_max,
            dedup_entries_max=self._dedup_entries_max,
        )
        self._epoch = 0
        self._log_clock_ms = 0
        self._resources: dict[str, _Resource] = {}
        self._usage = _Usage()
        self._dedup: collections.OrderedDict[bytes, _DedupEntry] = collections.OrderedDict()
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
        res = self._resources.get(resource)
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
        res = self._resources.get(resource)
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

    def _execute(self, op: Op, cmd: Command, index: int) -> Outcome:
        """``cmd`` with its envelope checked (``op`` is its Op): check the body, then run."""
        try:
            args = _parse_body(op, cmd.body)
        except _InvalidField as exc:
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
                    else _DedupEntry(op_id, op, args["resource"], outcome_to_wire(outcome), now, index)
                )
                self._log_clock_ms = now
                if dedup_entry is not None:
                    self._dedup[op_id] = dedup_entry
                self._evict_dedup()
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

    def _evict_dedup(self) -> None:
        horizon_ms = self._log_clock_ms - self._dedup_retention_ms
        while self._dedup:
            oldest = next(iter(self._dedup.values()))
            if oldest.applied_at_ms <= horizon_ms or len(self._dedup) > self._dedup_entries_max:
                self._dedup.popitem(last=False)
            else:
                break

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

    def _settle(self, name: str, res: _Resource) -> None:
        """After ``res`` changed (its usage removed first): forget it if it holds nothing --
        no lease, no data -- else count it for its owner again."""
        if res.lease is None and not res.data:
            del self._resources[name]
        else:
            self._usage.add(name, res)

    def _live_owned(self, principal: str, now: int, besides: str) -> tuple[int, int, list[str]]:
        """(live resources, live leases, idle resources) owned by ``principal``, ``besides``
        not counted. Live: a lease not yet expired at ``now``, or stored data. Idle: neither."""
        live_resources = live_leases = 0
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
        self, resource: str, res: _Resource | None, now: int, principal: str, quota: dict[str, int]
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
        at_quota = (
            resources_max is not None and len(owned) - (resource in owned) >= resources_max
        ) or (leases_max is not None and len(leased) - (resource in leased) >= leases_max)
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
            res = self._resources[resource] = _Resource()
        else:
            self._usage.remove(resource, res)
        res.owner = principal or ""
        self._epoch += 1
        res.high_water_mark = self._epoch  # fence on acquire (I2)
        res.lease = _Lease(
            holder=args["holder"],
            token=self._epoch,
            ttl_ms=args["ttl_ms"],
            expires_at_ms=now + args["ttl_ms"],
        )
        self._usage.add(resource, res)
        return Applied(
            op=Op.ACQUIRE,
            result={
                "token": self._epoch,
                "expires_at_ms": res.lease.expires_at_ms,
                "hwm": res.high_water_mark,
            },
        )

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
        grows_by = _entry_bytes(key, value) - (0 if current is None else _entry_bytes(key, current[0]))
        stored_bytes_max = None if args["quota"] is None else args["quota"].get("stored_bytes")
        if stored_bytes_max is not None and res.owner and grows_by > 0:
            # The bytes are the owner's (the principal of the last acquire): a writer is
            # normally that owner, as only the last acquire's token writes.
            total = self._usage.stored_bytes.get(res.owner, 0) + grows_by
            if total > stored_bytes_max:
                return self._quota_rejected(Op.WRITE, res.owner, "stored_bytes", stored_bytes_max, total)
        self._usage.remove(resource, res)
        res.revision += 1
        res.data[key] = (value, res.revision)
        res.stored_bytes += grows_by
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
        res.stored_bytes -= _entry_bytes(key, res.data.pop(key)[0])
        self._settle(resource, res)  # the last key of a released resource: forgotten
        return Applied(op=Op.DELETE, result={"version": res.revision, "deleted": True})

    def _read_barrier(self, now: int, args: dict[str, Any]) -> Outcome:
        result: dict[str, Any] = {"epoch": self._epoch, "log_clock_ms": now}
        resource = args["resource"]
        if resource is not None:
            res = self._resources.get(resource)
            lease = None if res is None else res.lease
            result["hwm"] = 0 if res is None else res.high_water_mark
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
            res = self._resources[resource] = _Resource()
        self._usage.remove(resource, res)
        self._epoch += 1
        res.high_water_mark = self._epoch  # the old holder's token is now stale (I7)
        res.lease = None
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
            for res in self._resources.values():
                res.high_water_mark = new_epoch  # every token issued before is stale (I11)
                res.lease = None
            self._usage = _Usage.of(self._resources)  # no leases left
        return Applied(op=Op.SET_EPOCH_FLOOR, result={"epoch": new_epoch})

    def _tick(self, now: int, args: dict[str, Any]) -> Outcome:
        expired = 0
        for name, res in list(self._resources.items()):
            if res.lease is not None and res.lease.expires_at_ms <= now:
                self._usage.remove(name, res)
                res.lease = None
                self._settle(name, res)  # an expired lease on no data: forgotten
                expired += 1
        return Applied(op=Op.TICK, result={"expired": expired})

    def _restore(self, now: int, args: dict[str, Any]) -> Outcome:
        """Admin restore from a backup (I11): the backup's data, fenced above every token.

        The floor must exceed the current epoch, so no token issued before the restore, by
        this cluster or the backup's, is ever issued again. Every restored resource gets
        hwm = the new epoch and no lease; resources absent from the backup are gone (their
        old tokens are then refused as UNKNOWN_TOKEN). The dedup table is emptied: its
        outcomes describe a history the restore replaced, and every token in them is now
        fenced. The log clock keeps going forward from ``now``.
        """
        floor = args["epoch_floor"]
        if floor <= self._epoch:
            return Rejected(
                op=Op.RESTORE,
                reason=Reason.EPOCH_FLOOR_TOO_LOW,
                message=f"epoch_floor {floor} must exceed the current epoch {self._epoch}",
                details={"epoch": self._epoch},
            )
        try:
            backup_epoch, _clock, resources, _dedup = _parse_snapshot(args["data"], self._bounds)
        except ValueError as exc:
            return Rejected(
                op=Op.RESTORE,
                reason=Reason.MALFORMED,
                message=f"field 'data': {exc}",
                details={"field": "data"},
            )
        new_epoch = max(floor, backup_epoch + 1)
        if new_epoch > limits.TOKEN_MAX:
            return Rejected(
                op=Op.RESTORE,
                reason=Reason.EPOCH_EXHAUSTED,
                message=f"the backup's epoch {backup_epoch} leaves no token to fence it with",
            )
        for res in resources.values():
            res.high_water_mark = new_epoch  # every token issued before is stale (I11)
            res.lease = None
        self._epoch = new_epoch
        self._resources = resources
        self._usage = _Usage.of(resources)
        self._dedup = collections.OrderedDict()
        return Applied(op=Op.RESTORE, result={"epoch": new_epoch, "resources": len(resources)})

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """All state as canonical msgpack: resources and keys sorted, dedup in apply order.

        Layout: ``[magic, SNAPSHOT_FORMAT_VERSION, epoch, log_clock_ms, resources, dedup]``;
        resources ``[[name, hwm, revision, lease|nil, [[key, value, version], ...], owner?], ...]``
        (``owner`` only when the resource has one, so states without principals keep the
        bytes they had before quotas),
        lease ``[holder, token, ttl_ms, expires_at_ms]``, dedup
        ``[[op_id, op, resource, outcome_wire, applied_at_ms, first_index], ...]``.
        """
        resources = []
        for name in sorted(self._resources):
            res = self._resources[name]
            lease = res.lease
            item = [
                name,
                res.high_water_mark,
                res.revision,
                None
                if lease is None
                else [lease.holder, lease.token, lease.ttl_ms, lease.expires_at_ms],
                [[key, *res.data[key]] for key in sorted(res.data)],
            ]
            if res.owner:
                item.append(res.owner)
            resources.append(item)
        # msgpack is concatenative: an array is its header then its packed items, so the
        # dedup entries' stored bytes are joined as they are (the same bytes as packing
        # the whole document at once; a test holds both forms equal).
        packer = msgpack.Packer(use_bin_type=True)
        head = [_SNAPSHOT_MAGIC, SNAPSHOT_FORMAT_VERSION, self._epoch, self._log_clock_ms, resources]
        return b"".join(
            [
                packer.pack_array_header(len(head) + 1),
                *(packer.pack(part) for part in head),
                packer.pack_array_header(len(self._dedup)),
                *(e.packed for e in self._dedup.values()),
            ]
        )

    def check_backup(self, data: object) -> None:
        """Raise ValueError unless ``data`` is a backup the RESTORE handler would read: its
        checks of the backup itself (not of the epoch floor, which depends on state), for
        the gRPC layer to run before it proposes anything. Reads only configuration, so it
        needs no lock."""
        _parse_snapshot(data, self._bounds)

    def restore(self, data: bytes) -> None:
        """Replace all state with a ``snapshot()``. Raises ValueError on bad data, leaving
        the current state untouched. Counts are not held to this machine's configured
        limits: a member's own snapshot, written under other limits, must still load."""
        epoch, log_clock_ms, resources, dedup = _parse_snapshot(data, None)
        self._epoch = epoch
        self._log_clock_ms = log_clock_ms
        self._resources = resources
        self._usage = _Usage.of(resources)
        self._dedup = dedup

    def digest(self) -> str:
        """sha256 hex of ``snapshot()``: equal digests mean equal state."""
        return hashlib.sha256(self.snapshot()).hexdigest()


# ---------------------------------------------------------------------------------------
# Snapshot reading. Every field is held to the bounds live state keeps (the same field rules
# as commands, the ranges the handlers can reach), so nothing restored can later make a
# handler, a snapshot or a reply fail. Counts are held to the configured limits only for a
# backup restored through the log (``_Counts``); a member's own snapshot, written under
# other limits, must still load.


@dataclasses.dataclass(frozen=True)
class _Counts:
    """How many resources, keys per resource and dedup entries a restored backup may hold."""

    resources_max: int
    keys_per_resource_max: int
    dedup_entries_max: int


def _parse_snapshot(
    data: object, counts: _Counts | None
) -> tuple[int, int, dict[str, _Resource], collections.OrderedDict[bytes, _DedupEntry]]:
    """The parts of a ``snapshot()``; raises ValueError on anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"snapshot must be bytes, got {type(data).__name__}")
    try:
        doc = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, use_list=True)
    # Any parser failure means the file is not one of our snapshots.
    except Exception as exc:
        raise ValueError(f"snapshot is not valid msgpack: {type(exc).__name__}: {exc}") from exc
    return _read_snapshot(doc, counts)


# The checks below run for every key and dedup entry of a snapshot (restore stalls the Raft
# thread): their messages are formatted only when a check fails.


def _need(condition: bool, message: str, *args: object) -> None:
    if not condition:
        raise ValueError("bad snapshot: " + (message % args if args else message))


def _need_int(value: object, low: int, high: int, what: str, *args: object) -> int:
    """``value``, if an int in [low, high]; ``what % args`` names it."""
    if not (_is_int(value) and low <= value <= high):
        name = what % args if args else what
        _need(_is_int(value), "%s must be an integer", name)
        _need(False, "%s %s is outside [%s, %s]", name, value, low, high)
    return value


def _need_field(check: Callable[[object], Any], value: object, what: str, *args: object) -> Any:
    """``check(value)`` (a field rule of validation.py); its refusal names ``what % args``."""
    try:
        return check(value)
    except _InvalidField as exc:
        raise ValueError(f"bad snapshot: {what % args if args else what}: {exc}") from None


def _need_count(items: list, high: int | None, what: str, *args: object) -> None:
    if high is not None and len(items) > high:
        _need(False, "%s: %d, more than %d", what % args if args else what, len(items), high)


def _read_snapshot(
    doc: object, counts: _Counts | None
) -> tuple[int, int, dict[str, _Resource], collections.OrderedDict[bytes, _DedupEntry]]:
    _need(isinstance(doc, list) and len(doc) == 6, "top level must be a 6-item array")
    magic, version, epoch, log_clock_ms, raw_resources, raw_dedup = doc
    _need(magic == _SNAPSHOT_MAGIC, "not a fencing-coordinator state snapshot")
    _need(
        _is_int(version) and version == SNAPSHOT_FORMAT_VERSION,
        "unknown snapshot format version %r (this build reads %d)", version, SNAPSHOT_FORMAT_VERSION,
    )
    epoch = _need_int(epoch, 0, limits.TOKEN_MAX, "epoch")
    # The log clock is the greatest stamp applied, and stamps are at most STAMP_MS_MAX.
    log_clock_ms = _need_int(log_clock_ms, 0, limits.STAMP_MS_MAX, "log_clock_ms")

    _need(isinstance(raw_resources, list), "resources must be an array")
    _need_count(raw_resources, counts and counts.resources_max, "resources")
    resources: dict[str, _Resource] = {}
    previous_name: str | None = None
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
            _need(token == hwm and _is_int(token), "lease token of %r must equal its hwm", name)
            ttl_ms = _need_field(validation.check_ttl_ms, ttl_ms, "lease ttl_ms of %r", name)
            lease = _Lease(
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
            except _InvalidField as exc:
                raise ValueError(f"bad snapshot: owner of {name!r}: {exc}") from None
        resources[name] = _Resource(
            high_water_mark=hwm,
            lease=lease,
            revision=revision,
            data=data,
            owner=owner,
            stored_bytes=sum(_entry_bytes(key, value) for key, (value, _) in data.items()),
        )

    _need(isinstance(raw_dedup, list), "dedup must be an array")
    _need_count(raw_dedup, counts and counts.dedup_entries_max, "dedup entries")
    dedup: collections.OrderedDict[bytes, _DedupEntry] = collections.OrderedDict()
    checked_names = set(resources)
    previous_at = 0
    for item in raw_dedup:
        # 5 items: written before first-applied indexes were kept (index unknown: 0).
        _need(isinstance(item, list) and len(item) in (5, 6), "a dedup entry must be 5 or 6 items")
        op_id, op, resource, wire, applied_at_ms, first_index = item if len(item) == 6 else (*item, 0)
        op_id = _need_field(validation.check_op_id, op_id, "a dedup op_id")
        _need(op_id not in dedup, "dedup op_ids must be unique")
        _need(_is_int(op) and op in Op._value2member_map_, "unknown dedup op %r", op)
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
        _need(_flat(result), "dedup result must be a flat map")
        if list(result) != sorted(result):
            wire = None  # not canonical (a hand-made backup): re-encoded from the outcome
        applied_at_ms = _need_int(applied_at_ms, previous_at, log_clock_ms, "dedup applied_at_ms")
        previous_at = applied_at_ms
        dedup[op_id] = _DedupEntry(
            op_id,
            outcome.op,
            resource,
            # Canonical as read: not converted again (restore time is a stall too).
            outcome_to_wire(outcome) if wire is None else wire,
            applied_at_ms,
            _need_int(first_index, 0, limits.RAFT_INDEX_MAX, "dedup index"),
        )
    return epoch, log_clock_ms, resources, dedup

"""What every family of handlers shares: the state attributes and the rules on more than one path.

Owns: ``MachineBase``, the base of the state machine's handler mixins (``lease_handlers``,
``write_handlers``, ``admin_handlers``, ``snapshot_pack``). It names the attributes they read
and change (``state_machine.FencingStateMachine.__init__`` sets them) and holds the rules more
than one family applies: fencing a token against the hwm (DESIGN I3), forgetting a resource
that holds nothing, whether a new epoch may be issued, granting a lease (on acquire, to the
head waiter after a release, a force-release or an expiry) and the quota checks (DESIGN §8)
that an acquire, an enqueue, a grant to a waiter and a write make.
Must never: read a clock, draw randomness or do I/O (time arrives as ``now``), raise on bad
input, or change state in a check: every ``*_refusal`` only reads.
"""

from __future__ import annotations

from typing import Any

from coordinator.core import limits
from coordinator.core.changes import Change, ChangeKind
from coordinator.core.commands import Op
from coordinator.core.dedup import DedupTable
from coordinator.core.expiry import ExpiryIndex
from coordinator.core.lock_queue import LockQueue
from coordinator.core.outcomes import Reason, Rejected
from coordinator.core.restore_staging import RestoreStaging
from coordinator.core.snapshot_format import Counts
from coordinator.core.state import Lease, ResourceState, ResourceTable, Usage, shared


class MachineBase:
    """The state and the shared rules; a handler family adds its ops on top of it."""

    # Configuration: bounds on state size, the same on every replica (not in the snapshot).
    _resources_max: int
    _keys_per_resource_max: int
    _state_keys_max: int
    _state_stored_bytes_max: int
    _bounds: Counts  # what a backup restored through the log may hold
    # The state proper: what a snapshot holds.
    _epoch: int
    _log_clock_ms: int
    _resources: ResourceTable
    _dedup: DedupTable
    _staging: RestoreStaging
    _cluster_level: int  # the entry level every member runs (commands.py "Entry levels")
    # Derived from _resources (recounted on restore): indexes and totals kept so that no
    # command scans every resource.
    _expiry: ExpiryIndex
    _queue: LockQueue
    _usage: Usage
    _keys_total: int
    _stored_bytes_total: int
    # What the entry being applied changed so far (changes.py): emptied before each entry.
    _changes: list[Change]

    def _note(self, kind: ChangeKind, resource: str, **fields: Any) -> None:
        self._changes.append(Change(kind, resource, **fields))

    def _note_lease_end(self, kind: ChangeKind, resource: str, lease: Lease) -> None:
        self._changes.append(Change(kind, resource, lease.holder, lease.token, lease.expires_at_ms))

    # -- fencing and forgetting ---------------------------------------------------------------

    def _fenced(self, op: Op, resource: str, token: int) -> ResourceState | Rejected:
        """DESIGN I3: the resource ``token`` may act on, iff it equals hwm(resource) and that
        epoch was issued to a holder; else the refusal (a token above the hwm, or an epoch that
        only fenced the resource, was never issued; one below it is stale)."""
        res: ResourceState | None = self._resources.get(resource)
        hwm = 0 if res is None else res.high_water_mark
        if token == hwm and res is not None and res.fenced:
            return Rejected(
                op=op,
                reason=Reason.UNKNOWN_TOKEN,
                message=f"token {token} was never issued for {resource!r}: that epoch only fenced it",
                details={"hwm": hwm},
            )
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
        assert res is not None  # tokens start at 1, so hwm == token names a resource held
        return res

    def _settle(self, name: str, res: ResourceState) -> None:
        """After ``res`` changed (its usage removed first): forget it if it holds nothing --
        no lease, no data -- else count it for its owner again."""
        if res.lease is None and not res.data and not res.waiters:
            del self._resources[name]
        else:
            self._usage.add(name, res)

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

    # -- granting a lease ----------------------------------------------------------------

    def _issue(self, name: str, res: ResourceState, now: int, holder: str, ttl_ms: int, principal: str,
               waiter_id: bytes = b"") -> None:
        """Grant ``name``'s lease with a new token (the caller checked the epoch and removed
        ``res`` from the usage; it adds it back)."""
        if res.lease is not None:  # only a lease expired by ``now`` is ever replaced
            self._note_lease_end(ChangeKind.EXPIRED, name, res.lease)
        res.owner = shared(principal)
        self._epoch += 1
        res.high_water_mark = self._epoch  # fence on acquire (I2)
        res.fenced = False  # this epoch is a holder's
        res.lease = Lease(
            holder=shared(holder), token=self._epoch, ttl_ms=ttl_ms, expires_at_ms=now + ttl_ms, waiter_id=waiter_id
        )
        self._expiry.add(res.lease.expires_at_ms, name)
        self._note(ChangeKind.ACQUIRED, name, holder=res.lease.holder, token=res.lease.token,
                   expires_at_ms=res.lease.expires_at_ms)

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

    # -- quotas (DESIGN §8) ---------------------------------------------------------------

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

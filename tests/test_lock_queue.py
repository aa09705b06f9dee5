"""The lock wait queue in the pure state machine: FIFO grants in the entry that ends a lease,
cancel, waiter expiry, caps, quotas, snapshots (round trip and the older formats)."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import commands as c
from coordinator.core import limits, ops
from coordinator.core.results import LockState
from coordinator.core.state_machine import Applied, FencingStateMachine, Reason, Rejected

R = "orders/7"
TTL = 1_000


def wid(i: int) -> bytes:
    return bytes([i]) * 16


def enqueue(sm, i, stamp, resource=R, **extra):
    return sm.execute(ops.charged(c.enqueue(resource=resource, holder=f"h{i}", ttl_ms=TTL, waiter_id=wid(i),
                                          stamp_ms=stamp), principal="p", quota=extra) if extra else
                      c.enqueue(resource=resource, holder=f"h{i}", ttl_ms=TTL, waiter_id=wid(i), stamp_ms=stamp))


def holder(sm, resource=R):
    lease = (sm.describe(resource) or {}).get("lease")
    return None if lease is None else lease["holder"]


def test_a_free_lease_is_granted_by_the_enqueue_itself():
    sm = FencingStateMachine()
    out = enqueue(sm, 1, 10)
    assert out == Applied(op=c.Op.ENQUEUE, result=LockState(granted=True, token=1, expires_at_ms=10 + TTL, hwm=1))
    assert out.result.to_map() == {"granted": True, "token": 1, "expires_at_ms": 10 + TTL, "hwm": 1}


def test_waiters_are_granted_in_arrival_order_one_per_release_in_the_same_entry():
    sm = FencingStateMachine()
    enqueue(sm, 1, 10)
    for i in (2, 3, 4):
        assert enqueue(sm, i, 20).result.to_map() == {"granted": False, "queued": True, "position": i - 2}
    tokens = [1]
    for expected in ("h2", "h3", "h4"):
        sm.execute(c.release(resource=R, token=tokens[-1], stamp_ms=30))
        assert holder(sm) == expected  # no other entry: the RELEASE granted it
        tokens.append(sm.describe(R)["lease"]["token"])
    assert tokens == [1, 2, 3, 4]


def test_expiry_grants_the_head_at_the_tick_and_force_release_grants_above_the_fence():
    sm = FencingStateMachine()
    enqueue(sm, 1, 0)
    enqueue(sm, 2, 0)
    enqueue(sm, 3, 0)
    sm.execute(c.tick(stamp_ms=TTL))  # h1's lease expired: h2 granted in this TICK
    assert holder(sm) == "h2" and sm.describe(R)["lease"]["token"] == 2
    out = sm.execute(c.force_release(resource=R, op_id=b"f" * 16, stamp_ms=TTL + 1))
    assert out.result.to_map() == {"hwm": 4}  # fenced at 3, then granted to h3 at 4
    assert holder(sm) == "h3" and sm.describe(R)["lease"]["token"] == 4


def test_an_acquire_never_jumps_the_queue():
    sm = FencingStateMachine()
    enqueue(sm, 1, 0)
    enqueue(sm, 2, 0)
    out = sm.execute(c.acquire(resource=R, holder="x", ttl_ms=TTL, op_id=b"a" * 16, stamp_ms=TTL + 5))
    assert isinstance(out, Rejected) and out.reason is Reason.LEASE_HELD  # h1 expired, h2 is next
    sm.execute(c.tick(stamp_ms=TTL + 5))
    assert holder(sm) == "h2"


def test_cancel_leaves_the_queue_and_cancel_after_a_grant_releases_to_the_next():
    sm = FencingStateMachine()
    enqueue(sm, 1, 0)
    enqueue(sm, 2, 0)
    enqueue(sm, 3, 0)
    assert sm.execute(c.dequeue(resource=R, waiter_id=wid(2), stamp_ms=1)).result.to_map() == {
        "cancelled": True,
        "released": False,
    }
    sm.execute(c.release(resource=R, token=1, stamp_ms=2))
    assert holder(sm) == "h3"
    out = sm.execute(c.dequeue(resource=R, waiter_id=wid(3), stamp_ms=3))
    assert out.result.to_map() == {"cancelled": False, "released": True}
    assert sm.describe(R) is None  # nothing left: forgotten


def test_a_waiter_that_stops_renewing_is_dropped_and_a_renewal_keeps_its_place():
    sm = FencingStateMachine()
    sm.execute(c.acquire(resource=R, holder="x", ttl_ms=limits.LEASE_TTL_MS_MAX, op_id=b"a" * 16, stamp_ms=0))
    enqueue(sm, 2, 0)
    enqueue(sm, 3, 0)
    enqueue(sm, 2, limits.LOCK_WAITER_TTL_MS - 1)  # renewed: still first
    sm.execute(c.tick(stamp_ms=limits.LOCK_WAITER_TTL_MS))  # 3 never renewed: gone
    assert sm.lock_state(R, wid(3)).to_map() == {"granted": False, "queued": False}
    assert sm.lock_state(R, wid(2)).to_map() == {"granted": False, "queued": True, "position": 0}


def test_caps_refuse_and_change_nothing():
    sm = FencingStateMachine()
    for i in range(limits.LOCK_WAITERS_PER_RESOURCE_MAX + 1):  # the holder, then a full queue
        enqueue(sm, i, 0)
    before = sm.digest()
    extra = sm.execute(c.enqueue(resource=R, holder="late", ttl_ms=TTL, waiter_id=b"L" * 16, stamp_ms=1))
    assert isinstance(extra, Rejected) and extra.details["limit"] == "lock_waiters_per_resource"
    assert sm.digest() == before


def test_waiters_count_in_the_principals_lease_quota():
    sm = FencingStateMachine()
    assert enqueue(sm, 1, 0, leases=2).result.granted
    assert enqueue(sm, 2, 0, leases=2).result.queued  # 1 lease + 1 waiter = 2
    out = enqueue(sm, 3, 0, resource="other", leases=2)
    assert isinstance(out, Rejected) and out.reason is Reason.QUOTA_EXCEEDED


def test_snapshot_round_trips_the_queue_and_a_lease_granted_to_a_waiter():
    sm = FencingStateMachine()
    enqueue(sm, 1, 0)
    enqueue(sm, 2, 0)
    enqueue(sm, 3, 0)
    sm.execute(c.release(resource=R, token=1, stamp_ms=1))
    copy = FencingStateMachine()
    copy.restore(sm.snapshot())
    assert copy.digest() == sm.digest()
    assert copy.lock_state(R, wid(2)).granted and copy.lock_state(R, wid(3)).position == 0
    # The queue goes on where it was: h3 is granted on the copy as on the original.
    for m in (sm, copy):
        m.execute(c.release(resource=R, token=2, stamp_ms=2))
    assert copy.digest() == sm.digest() and holder(copy) == "h3"
    # A backup holds no queue: waiters belong to clients of the state a restore replaces.
    assert wid(3) not in sm.backup()


def test_older_snapshot_formats_still_load():
    sm = FencingStateMachine()
    sm.execute(c.acquire(resource=R, holder="x", ttl_ms=TTL, op_id=b"a" * 16, stamp_ms=0))
    doc = msgpack.unpackb(sm.snapshot(), raw=False)
    assert doc[1] == 4  # format 4 (no fenced resource here: written as format 2 would be)
    doc[1] = 2
    old = FencingStateMachine()
    old.restore(msgpack.packb(doc, use_bin_type=True))
    assert old.describe(R) == sm.describe(R)


# Weighted by repetition: enqueues fill the queue and releases and expiries empty it about as
# often, so most runs grant several waiters in a row (uniform choices left runs where one grant,
# or none, happened, and a grant to the wrong waiter went unseen). "expire" moves the log clock
# past the holder's TTL and TICKs; "step" moves it 100 ms with no entry.
ACTIONS = ["enqueue"] * 3 + ["release"] * 3 + ["expire"] * 2 + ["tick", "cancel", "step"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7)), min_size=1, max_size=60))
def test_grants_follow_arrival_order_whatever_happens(steps):
    """Whatever the interleaving of enqueues, cancels, releases, expiries and ticks: every new
    lease goes to the first waiter still in line (arrival order, skipping those that left or
    whose slot expired), and after any entry that ends or frees a lease -- RELEASE, TICK,
    ENQUEUE -- the lease is never free while someone waits (one entry per grant, no lag).
    The model is a plain list; the state machine's own queue positions are not consulted."""
    sm = FencingStateMachine()
    now = 0
    line: list[tuple[int, int]] = []  # (waiter, its ENQUEUE's stamp), arrival order
    seen: set[int] = set()  # each waiter arrives once (a renewal would keep its turn)
    token = 0  # the newest token seen on R

    def live_lease():
        lease = (sm.describe(R) or {}).get("lease")
        return lease if lease is not None and lease["expires_at_ms"] > now else None

    for action, i in steps:
        now += 100
        advanced = False  # whether an entry that grants a free lease to the head ran
        if action == "enqueue" and i not in seen:
            seen.add(i)
            line.append((i, now))
            enqueue(sm, i, now)
            advanced = True
        elif action == "cancel":
            line = [(w, at) for w, at in line if w != i]
            sm.execute(c.dequeue(resource=R, waiter_id=wid(i), stamp_ms=now))
        elif action == "release":
            lease = (sm.describe(R) or {}).get("lease")
            if lease is not None:
                sm.execute(c.release(resource=R, token=lease["token"], stamp_ms=now))
                advanced = True
        elif action == "expire":
            lease = (sm.describe(R) or {}).get("lease")
            now = max(now, lease["expires_at_ms"]) if lease is not None else now
            sm.execute(c.tick(stamp_ms=now))
            advanced = True
        elif action == "tick":
            sm.execute(c.tick(stamp_ms=now))
            advanced = True
        # A waiter whose slot expired is never granted (LOCK_WAITER_TTL_MS after its ENQUEUE:
        # nobody renews here); the state machine drops it at the next TICK or skips it.
        line = [(w, at) for w, at in line if at + limits.LOCK_WAITER_TTL_MS > now]
        lease = live_lease()
        if lease is not None and lease["token"] != token:
            token = lease["token"]
            assert line, f"{lease['holder']} granted with nobody in line (steps {steps})"
            head, _ = line.pop(0)
            assert lease["holder"] == f"h{head}", (f"granted {lease['holder']}, h{head} was first", steps)
        if advanced and line:
            assert lease is not None, (f"{[f'h{w}' for w, _ in line]} wait on a free lease after {action}", steps)

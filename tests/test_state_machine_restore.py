"""RESTORE (DESIGN I11) in the pure state machine, and the shared field rules."""

from __future__ import annotations

import msgpack
import pytest

from coordinator.core import commands as c
from coordinator.core import limits
from coordinator.core import validation
from coordinator.core.commands import MalformedCommand, Op
from coordinator.core.state_machine import Applied, FencingStateMachine, Reason, Rejected

R, R2 = "orders/7", "orders/8"


def applied(outcome) -> dict:
    assert isinstance(outcome, Applied), outcome
    return outcome.result


def refused(outcome, reason: Reason) -> Rejected:
    assert isinstance(outcome, Rejected) and outcome.reason is reason, outcome
    return outcome


def op(n: int) -> bytes:
    return b"%016d" % n


def backed_up() -> tuple[FencingStateMachine, bytes]:
    """A machine with a backup taken at epoch 1, then more history: epoch 3, R2 exists."""
    sm = FencingStateMachine()
    applied(sm.execute(c.acquire(resource=R, holder="A", ttl_ms=10_000, op_id=op(1), stamp_ms=100)))
    applied(sm.execute(c.write(resource=R, key="k", value=b"backup", token=1, op_id=op(2), stamp_ms=101)))
    backup = sm.snapshot()
    applied(sm.execute(c.write(resource=R, key="k", value=b"later", token=1, op_id=op(3), stamp_ms=102)))
    applied(sm.execute(c.force_release(resource=R, op_id=op(4), stamp_ms=103)))
    applied(sm.execute(c.acquire(resource=R2, holder="B", ttl_ms=10_000, op_id=op(5), stamp_ms=104)))
    assert sm.epoch == 3
    return sm, backup


def through_the_log(sm: FencingStateMachine, command: c.Command):
    return sm.apply(command.encode())


def test_restore_brings_back_the_data_fenced_above_every_token():
    sm, backup = backed_up()
    result = applied(through_the_log(sm, c.restore(data=backup, epoch_floor=10, stamp_ms=200)))
    assert result == {"epoch": 10, "resources": 1}
    assert sm.epoch == 10 and sm.log_clock_ms == 200
    assert sm.read(R, "k") == (b"backup", 1)
    assert sm.describe(R)["hwm"] == 10 and sm.describe(R)["lease"] is None
    assert sm.describe(R2) is None
    # Every token issued before is refused: stale at R, never issued at R2 (gone).
    refused(sm.execute(c.write(resource=R, key="k", value=b"x", token=1, op_id=op(6), stamp_ms=201)),
            Reason.STALE_TOKEN)
    refused(sm.execute(c.write(resource=R2, key="k", value=b"x", token=3, op_id=op(7), stamp_ms=201)),
            Reason.UNKNOWN_TOKEN)
    # The next token is above the floor, and dedup was emptied: an old op_id applies anew.
    assert applied(sm.execute(c.acquire(resource=R2, holder="C", ttl_ms=1_000, op_id=op(5), stamp_ms=202)))[
        "token"] == 11


def test_restore_refuses_a_floor_not_above_the_epoch_and_changes_nothing():
    sm, backup = backed_up()
    before = sm.digest()
    for floor in (1, 3):
        r = refused(sm.execute(c.restore(data=backup, epoch_floor=floor, stamp_ms=200)), Reason.EPOCH_FLOOR_TOO_LOW)
        assert r.details == {"epoch": 3}
    assert sm.digest() == before


@pytest.mark.parametrize("data", [b"", b"junk", msgpack.packb(["fencing-coordinator/state", 99, 0, 0, [], []])])
def test_restore_refuses_bad_backups_and_changes_nothing(data):
    sm, _ = backed_up()
    before = sm.digest()
    r = refused(sm.execute(c.restore(data=data, epoch_floor=10, stamp_ms=200)), Reason.MALFORMED)
    assert r.details == {"field": "data"}
    assert sm.digest() == before


def test_restore_fences_above_a_backup_from_a_later_epoch():
    donor = FencingStateMachine()
    for n in range(5):
        applied(donor.execute(c.force_release(resource=R, op_id=op(n), stamp_ms=n)))
    sm = FencingStateMachine()
    result = applied(sm.execute(c.restore(data=donor.snapshot(), epoch_floor=2, stamp_ms=10)))
    assert result["epoch"] == 6 and sm.describe(R)["hwm"] == 6


def test_restore_commands_may_be_larger_than_other_commands():
    big = b"x" * (limits.COMMAND_BYTES_MAX + 10)
    entry = c.restore(data=big, epoch_floor=5, stamp_ms=1).encode()
    assert c.decode(entry).op is Op.RESTORE
    with pytest.raises(MalformedCommand, match="more than"):
        c.decode(c.write(resource=R, key="k", value=big, token=1, op_id=op(1), stamp_ms=1).encode())
    too_big = c.restore(data=b"x" * limits.RESTORE_COMMAND_BYTES_MAX, epoch_floor=5, stamp_ms=1).encode()
    with pytest.raises(MalformedCommand, match="more than"):
        c.decode(too_big)
    # Decodable, but the snapshot field itself is over its limit: refused as MALFORMED.
    sm = FencingStateMachine()
    over = c.restore(data=b"x" * (limits.RESTORE_SNAPSHOT_BYTES_MAX + 1), epoch_floor=5, stamp_ms=1)
    assert refused(sm.apply(over.encode()), Reason.MALFORMED).details == {"field": "data"}


def test_the_state_machine_uses_the_shared_field_rules():
    sm = FencingStateMachine()
    for command, field in (
        (c.acquire(resource="a b", holder="h", ttl_ms=1_000, op_id=op(1), stamp_ms=1), "resource"),
        (c.acquire(resource=R, holder="h", ttl_ms=1, op_id=op(1), stamp_ms=1), "ttl_ms"),
        (c.write(resource=R, key="k", value=b"v", token=0, op_id=op(1), stamp_ms=1), "token"),
        (c.write(resource=R, key="k", value=b"v", token=1, op_id=b"short", stamp_ms=1), "op_id"),
    ):
        outcome = refused(sm.execute(command), Reason.MALFORMED)
        assert outcome.details == {"field": field}
        with pytest.raises(validation.InvalidField) as caught:
            getattr(validation, f"check_{field}")(command.body[field])
        assert str(caught.value) in outcome.message


def test_a_snapshot_with_unsorted_dedup_results_restores_to_the_canonical_form():
    """restore() keeps a dedup outcome's wire form as read when it is canonical (restore
    time is a stall on the Raft thread); a hand-made one is re-encoded, so replicas that
    restored it and replicas that applied the history still write identical snapshots."""
    sm, _ = backed_up()
    canonical = sm.snapshot()
    doc = msgpack.unpackb(canonical, raw=False)
    for entry in doc[5]:
        result = entry[3][2]
        entry[3][2] = dict(reversed(list(result.items())))
    shuffled = msgpack.packb(doc, use_bin_type=True)
    assert shuffled != canonical
    again = FencingStateMachine()
    again.restore(shuffled)
    assert again.snapshot() == canonical and again.digest() == sm.digest()


@pytest.mark.parametrize("entries", [0, 3, 20, 70_000])  # every msgpack array-header size
def test_a_snapshot_is_the_canonical_msgpack_of_its_document(entries):
    """snapshot() joins pre-packed dedup entries; the bytes must be exactly what packing the
    whole document at once gives (re-packing what was read changes nothing), or replicas
    and restored backups would disagree in digest."""
    sm = FencingStateMachine()
    applied(sm.execute(c.acquire(resource=R, holder="A", ttl_ms=10_000, op_id=op(0), stamp_ms=100)))
    for n in range(1, entries):
        applied(sm.execute(c.write(resource=R, key=f"k{n % 7}", value=b"v", token=1, op_id=op(n), stamp_ms=100)))
    data = sm.snapshot()
    document = msgpack.unpackb(data, raw=False)
    assert len(document[5]) == max(entries, 1)
    assert msgpack.packb(document, use_bin_type=True) == data
    restored = FencingStateMachine()
    restored.restore(data)
    assert restored.snapshot() == data and restored.digest() == sm.digest()

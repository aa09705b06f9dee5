"""The checker on the hazards the deeper workload exercises: epoch floors, restores with a
floor, force-release epochs carried by writers, and hostile ops. Each violation kind is shown
caught on a hand-made history, and the matching legal history is shown passing, so a check
that stopped looking (or started crying wolf) fails here."""

from __future__ import annotations

from chaos import check as chk
from tests.test_chaos_checker import acquire, assert_only, check, final_state, op


def floor(invoke, complete, epoch, *, floor_asked, index, f="set_epoch_floor", **args):
    record = op(f, invoke, complete, process="operator", resource="*", epoch=epoch, applied_index=index)
    record["args"] = {"floor": floor_asked, **args}
    return record


def read(invoke, complete, value, *, key="k", hwm=1):
    record = op("read", invoke, complete, key=key)
    record["result"] = {"found": value is not None, "value": value, "hwm": hwm}
    return record


def restore(invoke, complete, epoch, *, floor_asked, index, backup, outcome="ok"):
    record = op("restore", invoke, complete, process="operator", resource="*", outcome=outcome)
    record["result"] = {"epoch": epoch, "applied_index": index} if outcome == "ok" else {}
    record["args"] = {"floor": floor_asked, "backup": backup}
    return record


BACKUP_OF_A = {"r1": {"k": {"value": "a", "version": 1}}}


def written_a_then_b():
    """c1 holds r1 (token 1) and writes k = "a" (version 1), then "b" (version 2)."""
    return [
        acquire(0, 10, 1, index=1),
        op("write", 12, 14, value="a", token=1, version=1, hwm=1, applied_index=2),
        op("write", 16, 18, value="b", token=1, version=2, hwm=1, applied_index=3),
    ]


def test_a_floor_and_the_holders_it_fences_pass():
    records = [
        acquire(0, 10, 1, index=1),
        floor(20, 30, 101, floor_asked=100, index=2),
        op("write", 40, 50, value="x", token=1, outcome="refused", reason="STALE_TOKEN"),
        acquire(60, 70, 102, index=3, process="c2"),
        op("write", 80, 90, value="y", token=102, process="c2", version=1, hwm=102, applied_index=4),
        final_state("r1", 102, k=("y", 1)),
    ]
    report = check(records)
    assert report.ok, [v.to_dict() for v in report.violations]
    hazards = report.summary["hazards"]
    assert hazards["admin"] == {"set_epoch_floor": {"ok": 1}}
    assert hazards["holders_fenced_by_floor_or_restore"] == 1


def test_a_token_issued_at_or_below_a_floor_after_it_answered_is_caught():
    records = [
        acquire(0, 10, 1, index=1),
        floor(20, 30, 101, floor_asked=100, index=2),
        acquire(60, 70, 101, index=3, process="c2"),
    ]
    report = assert_only(records, chk.EPOCH_FLOOR_BROKEN)
    assert "issued again" in report.violations[0].detail


def test_a_floor_answered_below_an_earlier_token_is_caught():
    records = [acquire(0, 10, 7, index=1), floor(20, 30, 5, floor_asked=3, index=2)]
    report = assert_only(records, chk.EPOCH_FLOOR_BROKEN)
    assert "went back" in report.violations[0].detail


def test_a_floor_answered_below_its_floor_is_caught():
    assert_only([floor(20, 30, 50, floor_asked=100, index=2)], chk.EPOCH_FLOOR_BROKEN)


def test_a_holder_from_before_a_floor_accepted_after_it_is_caught():
    records = [
        acquire(0, 10, 1, index=1),
        floor(20, 30, 101, floor_asked=100, index=2),
        op("write", 40, 50, value="x", token=1, version=1, hwm=1, applied_index=3),
    ]
    assert_only(records, chk.STALE_WRITE_ACCEPTED)


def test_a_holder_from_before_a_restore_accepted_after_it_is_caught_even_with_a_low_index():
    # The real-time rule: whatever index a deposed leader reports, the restore had answered.
    backup = BACKUP_OF_A
    records = [
        acquire(0, 10, 1, index=1),
        op("write", 12, 14, value="a", token=1, version=1, hwm=1, applied_index=2),
        restore(20, 30, 200, floor_asked=200, index=9, backup=backup),
        op("write", 40, 50, value="x", token=1, version=2, hwm=1, applied_index=3),
    ]
    assert chk.STALE_WRITE_ACCEPTED in check(records).kinds()


def test_a_write_carrying_a_force_release_epoch_is_unissued():
    records = [
        acquire(0, 10, 1, index=1),
        op("force_release", 20, 30, process="admin", hwm=2, applied_index=2),
        op("write", 40, 50, value="x", token=2, version=1, hwm=2, applied_index=3),
    ]
    assert_only(records, chk.UNISSUED_TOKEN_ACCEPTED)


def test_a_restore_rewrites_keys_to_the_backup_and_that_passes():
    backup = BACKUP_OF_A
    records = [
        *written_a_then_b(),
        op("write", 16, 18, value="z", key="gone", token=1, version=3, hwm=1, applied_index=4),
        restore(20, 30, 200, floor_asked=200, index=5, backup=backup),
        read(40, 50, "a", hwm=200),
        read(40, 50, None, key="gone", hwm=200),
        final_state("r1", 200, k=("a", 1)),
    ]
    report = check(records)
    assert report.ok, [v.to_dict() for v in report.violations]


def test_a_read_of_a_pre_restore_value_after_the_restore_is_caught():
    backup = BACKUP_OF_A
    records = [
        *written_a_then_b(),
        restore(20, 30, 200, floor_asked=200, index=5, backup=backup),
        read(40, 50, "b", hwm=200),
        final_state("r1", 200, k=("a", 1)),
    ]
    assert_only(records, chk.NOT_LINEARIZABLE)


def test_a_final_state_that_missed_the_restore_is_a_lost_write():
    backup = BACKUP_OF_A
    records = [
        *written_a_then_b(),
        restore(20, 30, 200, floor_asked=200, index=5, backup=backup),
        final_state("r1", 200, k=("b", 2)),
    ]
    assert_only(records, chk.LOST_WRITE)


def test_an_unknown_restore_may_or_may_not_have_happened():
    backup = BACKUP_OF_A
    for final_value in (("a", 1), ("b", 2)):
        records = [
            *written_a_then_b(),
            restore(20, 30, 0, floor_asked=200, index=0, backup=backup, outcome="unknown"),
            final_state("r1", 200, k=final_value),
        ]
        report = check(records)
        assert report.ok, (final_value, [v.to_dict() for v in report.violations])


def test_a_hostile_op_accepted_is_caught_and_refused_ones_are_counted():
    refused = op("write", 20, 30, value="h1", token=2**63, outcome="refused", reason="UNKNOWN_TOKEN")
    refused["hazard"] = "hostile_huge_token"
    accepted = op("write", 40, 50, value="h2", token=1, version=2, hwm=1, applied_index=3)
    accepted["hazard"] = "hostile_malformed_op_id"
    records = [acquire(0, 10, 1, index=1), refused]
    report = check(records)
    assert report.ok and report.summary["hazards"]["by_hazard"] == {"hostile_huge_token": {"refused": 1}}
    assert_only(records + [accepted], chk.HOSTILE_ACCEPTED)


def test_a_refused_hostile_write_seen_by_a_read_is_caught():
    refused = op("write", 20, 30, value="h1", token=99, outcome="refused", reason="UNKNOWN_TOKEN")
    refused["hazard"] = "hostile_never_issued"
    records = [
        acquire(0, 10, 1, index=1),
        refused,
        read(40, 50, "h1"),
    ]
    assert_only(records, chk.FAILED_WRITE_VISIBLE)


def watched_refusal(invoke, complete, *, hwm_after=1, version_after=1):
    """hx's never-issued write on its quiet resource, refused; its state read around it."""
    record = op("write", invoke, complete, process="hx", resource="hx-quiet", key="a", value="h1", token=1001,
                outcome="refused", reason="UNKNOWN_TOKEN")
    record["hazard"] = "hostile_never_issued"
    record["args"] = {"quiet": "hx-quiet", "watch_from_ns": invoke - 5, "hwm_before": 1, "version_before": 1,
                      "hwm_after": hwm_after, "version_after": version_after, "watch_to_ns": complete + 5}
    return record


def quiet_settled():
    return [
        acquire(0, 10, 1, index=1, process="hx", resource="hx-quiet"),
        op("write", 12, 14, process="hx", resource="hx-quiet", key="a", value="s", token=1, version=1, hwm=1,
           applied_index=2),
    ]


def test_a_refusal_that_left_the_state_alone_is_judged_and_passes():
    report = check(quiet_settled() + [watched_refusal(100, 110)])
    assert report.ok, [v.to_dict() for v in report.violations]
    assert report.summary["hazards"]["refusals_watched"] == {"judged": 1, "not_judged": 0}


def test_a_refusal_that_moved_the_hwm_or_the_version_is_caught():
    for moved in ({"hwm_after": 1001}, {"version_after": 2}):
        report = assert_only(quiet_settled() + [watched_refusal(100, 110, **moved)], chk.REFUSAL_CHANGED_STATE)
        assert "was refused (UNKNOWN_TOKEN)" in report.violations[0].detail


def test_a_fence_all_floor_or_an_unknown_one_in_the_window_is_not_judged():
    # A floor with fence_all moves every hwm: the change is not the refusal's doing.
    moved = watched_refusal(100, 110, hwm_after=1002)
    # An unknown one that answered before the window may still take effect in it.
    for outcome, invoke, complete in (("ok", 90, 104), ("unknown", 40, 50)):
        fence = floor(invoke, complete, 1002, floor_asked=1001, index=3, fence_all=True)
        if outcome == "unknown":
            fence.update(outcome="unknown", result={})
        report = check(quiet_settled() + [fence, moved])
        assert chk.REFUSAL_CHANGED_STATE not in report.kinds(), [v.to_dict() for v in report.violations]
        assert report.summary["hazards"]["refusals_watched"] == {"judged": 0, "not_judged": 1}

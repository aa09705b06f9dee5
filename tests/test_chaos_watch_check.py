"""The chaos checker's Watch rule (chaos/watch_check.py): a history whose watcher saw every
acknowledged change once and in order passes; one missing, repeated or reordered event is
caught and named."""

from __future__ import annotations

import itertools

from chaos import check as chk
from chaos import history as hist
from chaos import watch_check

_ids = itertools.count(1)


def op(f: str, index: int, *, resource="r1", key=None, value=None, token=None, result=None, outcome="ok"):
    t = next(_ids) * 10
    return {"type": "op", "process": "c1", "op_id": f"{t:032x}", "f": f, "resource": resource, "key": key,
            "value": value, "token": token, "invoke_ns": t, "complete_ns": t + 5, "outcome": outcome,
            "reason": None, "result": {"applied_index": index, **(result or {})}}


def seen(seq: int, revision: int, event: str, *, resource="r1", key=None, value=None, token=None,
         watcher="w0.1", start=1):
    return {"type": "watch", "watcher": watcher, "prefix": "r", "start": start, "seq": seq,
            "revision": revision, "event": event, "resource": resource, "key": key, "value": value,
            "token": token}


OPS = [
    op("acquire", 3, result={"token": 1, "hwm": 1}),
    op("write", 4, key="k", value="c1-1", token=1, result={"version": 1, "hwm": 1}),
    op("delete", 6, key="k", token=1, result={"version": 2, "deleted": True}),
    op("release", 7, token=1, result={"hwm": 1, "released": True}),
]
SEEN = [
    seen(1, 3, "ACQUIRED", token=1),
    seen(2, 4, "WRITTEN", key="k", value="c1-1", token=1),
    seen(3, 5, "EXPIRED", resource="r2", token=2),  # no op behind it: fine
    seen(4, 6, "DELETED", key="k", token=1),
    seen(5, 7, "RELEASED", token=1),
]


def kinds(records) -> list[str]:
    return [v.kind for v in chk.check_history(hist.History.of(records)).violations if v.kind in watch_check.KINDS]


def test_a_watcher_that_saw_every_change_once_in_order_passes():
    assert kinds(OPS + SEEN) == []


def test_a_missing_event_is_caught():
    assert kinds(OPS + SEEN[:1] + SEEN[2:]) == [watch_check.WATCH_MISSED_EVENT]
    report = chk.check_history(hist.History.of(OPS + SEEN[:1] + SEEN[2:]))
    missed = [v for v in report.violations if v.kind == watch_check.WATCH_MISSED_EVENT][0]
    assert "WRITTEN of r1 applied at revision 4" in missed.detail


def test_a_repeated_event_is_caught():
    repeated = [*SEEN[:2], seen(3, 4, "WRITTEN", key="k", value="c1-1", token=1), *[
        {**e, "seq": e["seq"] + 1} for e in SEEN[2:]]]
    assert kinds(OPS + repeated) == [watch_check.WATCH_REPEATED_EVENT]


def test_a_reordered_event_is_caught():
    swapped = [SEEN[0], {**SEEN[3], "seq": 2}, {**SEEN[2], "seq": 3}, {**SEEN[1], "seq": 4}, SEEN[4]]
    assert watch_check.WATCH_OUT_OF_ORDER in kinds(OPS + swapped)


def test_only_changes_inside_a_streams_range_and_prefix_are_expected():
    later = op("write", 40, key="k", value="c1-9", token=1, result={"version": 3, "hwm": 1})
    elsewhere = op("write", 5, resource="x1", key="k", value="c9-1", token=7, result={"version": 1, "hwm": 7})
    unknown = op("write", 5, key="k", value="c1-2", token=1, outcome="unknown")
    assert kinds([*OPS, later, elsewhere, unknown, *SEEN]) == []


def test_watch_records_round_trip_through_the_history_format():
    history = hist.History.of(SEEN)
    assert [hist.to_dict(r) for r in history.records()] == SEEN

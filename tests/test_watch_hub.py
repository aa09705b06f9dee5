"""The Watch hub of one member (coordinator/server/watch_hub.py): its bounded history, the
cursors reading it, and the errors when one cannot go on. Fed as the apply path feeds it."""

from __future__ import annotations

import threading

import pytest

from coordinator.core.changes import Change, ChangeKind
from coordinator.core.commands import Op
from coordinator.core.names import ErrorMeta, ErrorReason
from coordinator.core.outcomes import Applied
from coordinator.core.results import RestoreResult, TickResult, WriteResult
from coordinator.server.errors import ServiceError
from coordinator.server.watch_hub import WatchHub, change_cost


class Feed:
    """What RaftNode.watch_applied hands the hub: the two callbacks."""

    def __init__(self, last: int = 0) -> None:
        self.last = last

    def watch_applied(self, on_applied, on_loaded) -> int:
        self.applied, self.loaded = on_applied, on_loaded
        return self.last


def written(resource: str, version: int = 1, value: bytes = b"v") -> Applied:
    change = Change(ChangeKind.WRITTEN, resource, key="k", value=value, version=version)
    return Applied(Op.WRITE, WriteResult(version=version, hwm=1), changes=(change,))


def hub_and_feed(**kwargs) -> tuple[WatchHub, Feed]:
    hub, feed = WatchHub(**kwargs), Feed()
    hub.attach(feed)
    return hub, feed


def revisions(batches) -> list[int]:
    return [revision for revision, _changes in batches]


def test_a_cursor_reads_its_prefix_in_log_order_and_resumes_without_repeats():
    hub, feed = hub_and_feed()
    for index, name in enumerate(["jobs/a", "other/x", "jobs/b", "jobs/a"], start=1):
        feed.applied(index, written(name))
    feed.applied(5, [Applied(Op.TICK, TickResult(expired=0)), written("jobs/c")])  # a shared entry: a list
    cursor, current = hub.open("jobs/", 1, "host a")
    assert current == 5
    found, upto = hub.next(cursor, 0)
    assert revisions(found) == [1, 3, 4, 5] and upto == 5
    assert hub.next(cursor, 0) == ([], 5)  # nothing new: nothing again
    hub.close(cursor)
    resumed, _ = hub.open("jobs/", 4, "host a")  # resume from a revision: from there on only
    assert revisions(hub.next(resumed, 0)[0]) == [4, 5]


def test_a_start_older_than_the_history_is_compacted_naming_the_current_revision():
    hub, feed = hub_and_feed(history_bytes_max=3 * change_cost(written("jobs/a").changes[0]))
    for index in range(1, 11):
        feed.applied(index, written("jobs/a", index))
    with pytest.raises(ServiceError) as caught:
        hub.open("jobs/", 2, "host a")
    error = caught.value
    assert error.reason is ErrorReason.COMPACTED
    assert error.metadata[ErrorMeta.CURRENT_REVISION] == "10"
    assert error.metadata[ErrorMeta.OLDEST_REVISION] == "8"
    assert "current revision 10" in error.message
    cursor, _ = hub.open("jobs/", 8, "host a")  # the oldest kept still works
    assert revisions(hub.next(cursor, 0)[0]) == [8, 9, 10]


def test_a_slow_cursor_is_ended_with_a_reason_once_the_history_drops_what_it_has_not_read():
    hub, feed = hub_and_feed(history_bytes_max=4 * change_cost(written("jobs/a").changes[0]))
    cursor, _ = hub.open("jobs/", 0, "host a")
    for index in range(1, 20):
        feed.applied(index, written("jobs/a", index))
    with pytest.raises(ServiceError) as caught:
        hub.next(cursor, 0)
    assert caught.value.reason is ErrorReason.LIMIT_EXCEEDED
    assert caught.value.metadata["limit"] == "WATCH_HISTORY_BYTES_MAX"
    assert "too slow" in caught.value.message
    with pytest.raises(ServiceError):
        hub.next(cursor, 0)  # read again: still ended, and still one watcher left behind
    assert hub.left_behind == 1


def test_the_history_stays_within_its_bound_whatever_the_cursors_do():
    bound = 64 * 1024
    hub, feed = hub_and_feed(history_bytes_max=bound, per_caller_max=100)
    cursors = [hub.open("", 0, "host a")[0] for _ in range(50)]  # none of them reads
    for index in range(1, 2001):
        feed.applied(index, written("jobs/a", index, value=b"x" * 100))
    assert hub._bytes <= bound
    assert len(cursors) == hub.open_count()


def test_a_snapshot_loaded_ends_every_cursor_compacted():
    hub, feed = hub_and_feed()
    feed.applied(1, written("jobs/a"))
    cursor, _ = hub.open("jobs/", 1, "host a")
    feed.loaded(50)
    with pytest.raises(ServiceError) as caught:
        hub.next(cursor, 0)
    assert caught.value.reason is ErrorReason.COMPACTED
    assert caught.value.metadata[ErrorMeta.CURRENT_REVISION] == "50"
    assert hub.left_behind == 1
    with pytest.raises(ServiceError):
        hub.open("jobs/", 1, "host b")
    assert hub.open("jobs/", 51, "host b")[0].next_revision == 51


def test_watchers_per_caller_are_capped_and_given_back_on_close():
    hub, _feed = hub_and_feed(per_caller_max=2)
    first, _ = hub.open("", 0, "principal p")
    hub.open("", 0, "principal p")
    with pytest.raises(ServiceError) as caught:
        hub.open("", 0, "principal p")
    assert caught.value.metadata["limit"] == "watchers_per_principal_max"
    hub.open("", 0, "principal q")  # another caller is not held back
    hub.close(first)
    hub.close(first)  # twice: counted once
    hub.open("", 0, "principal p")


def test_a_waiting_cursor_wakes_on_a_matching_entry_and_on_close():
    hub, feed = hub_and_feed()
    cursor, _ = hub.open("jobs/", 0, "host a")
    got: list = []
    reader = threading.Thread(target=lambda: got.append(hub.next(cursor, 30)))
    reader.start()
    feed.applied(1, written("other/x"))
    feed.applied(2, written("jobs/a"))
    reader.join(10)
    assert revisions(got[0][0]) == [2]
    reader = threading.Thread(target=lambda: got.append(hub.next(cursor, 30)))
    reader.start()
    hub.close(cursor)
    reader.join(10)
    assert not reader.is_alive() and got[1] == ([], 2)


def test_a_restore_reaches_every_watcher_whatever_its_prefix():
    hub, feed = hub_and_feed()
    cursor, _ = hub.open("jobs/", 0, "host a")
    reset = (Change(ChangeKind.RESET, ""),)
    feed.applied(1, Applied(Op.RESTORE_COMMIT, RestoreResult(epoch=2, resources=0), changes=reset))
    found, _ = hub.next(cursor, 0)
    assert [c.kind for _, changes in found for c in changes] == [ChangeKind.RESET]


def test_a_cursor_left_behind_while_nobody_reads_it_is_cancelled_off_the_apply_path():
    hub, feed = hub_and_feed(history_bytes_max=4 * change_cost(written("jobs/a").changes[0]))
    cancelled = threading.Event()
    stuck, _ = hub.open("jobs/", 0, "host a")
    stuck.cancel = cancelled.set  # its RPC: blocked sending, never reads the cursor again
    reading, _ = hub.open("jobs/", 0, "host b")
    wrongly: list = []
    reading.cancel = lambda: wrongly.append("cancelled")  # keeps up: never cancelled
    for index in range(1, 20):
        feed.applied(index, written("jobs/a", index))
        hub.next(reading, 0)
    assert cancelled.wait(10)
    assert stuck.cancelled and not reading.cancelled and wrongly == []
    assert hub.left_behind == 1  # the stuck one (fencing_watchers_left_behind_total)

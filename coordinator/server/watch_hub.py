"""Watch's feed on one member: the changes of every applied entry, kept in a bounded history
that each watcher reads at its own pace.

Owns: ``WatchHub`` -- the history ring (each applied entry's changes, core/changes.py, under
its log index: the revision), fed from the apply path (``RaftNode.watch_applied``), bounded by
``WATCH_HISTORY_BYTES_MAX``; the watchers open on this member, each a cursor into that ring,
capped per caller (the ``watchers_per_principal_max`` setting); and the two ways a watcher cannot go on: its
start revision is older than the ring holds, or it fell so far behind that the ring dropped
what it had not read yet (both COMPACTED / LIMIT_EXCEEDED errors naming the current revision).
Must never: block the apply path (publishing appends one item and wakes the waiting watchers:
no per-watcher work, no I/O), keep more than ``WATCH_HISTORY_BYTES_MAX`` of events whatever
the watchers do, or hand a watcher an event twice or out of log order.

Every member applies every entry, so each member serves Watch from its own applied order; a
revision is a log index, the same on every member. The ring is complete from ``oldest``: every
change at a revision >= ``oldest`` is in it (a revision absent from it changed nothing). A
snapshot installed here (a follower far behind, or a restart) leaves a gap: ``oldest`` moves
past it, and every watcher open is ended COMPACTED, as its next events are not known here.
A slow watcher costs nothing while it lags -- the ring is shared, a watcher holds only its
position -- and is ended once the ring drops an entry it has not read.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from typing import Any, Callable

from coordinator.core.changes import Change, ChangeKind
from coordinator.core.names import ErrorMeta
from coordinator.core.outcomes import Applied
from coordinator.core.state_machine import Reason
from coordinator.server.errors import Failure, ServiceError

__all__ = ["WATCH_HISTORY_BYTES_MAX", "WATCHERS_PER_CALLER_MAX", "Cursor", "WatchHub"]

# The member's history of changes, in bytes (estimated: ``change_cost``). What a watcher can
# resume from after a disconnect, and how far a slow one may lag before it is ended. 8 MiB
# holds ~40,000 lease events or 127 writes of the largest value (64 KiB); memory stays
# within it whatever the number of watchers, as they share it.
WATCH_HISTORY_BYTES_MAX = 8 * 1024 * 1024
# Watchers one caller (a principal, or one client host on an open data plane) may have open
# on this member at once, besides the stream caps every stream counts against (streams.py):
# the default of the member's ``watchers_per_principal_max`` setting.
WATCHERS_PER_CALLER_MAX = 2
# Batches (revisions) one ``Cursor.next`` returns at most: one response each.
READ_BATCHES_MAX = 64
_CHANGE_OVERHEAD_BYTES = 160  # the Change object, its tuple slot and the ring's bookkeeping


def change_cost(change: Change) -> int:
    return _CHANGE_OVERHEAD_BYTES + len(change.resource) + len(change.holder) + len(change.key) + len(change.value)


def compacted(start: int, oldest: int, current: int, why: str) -> ServiceError:
    return ServiceError(
        Failure.COMPACTED,
        f"compacted: revision {start} is no longer available on this member ({why}); the oldest"
        f" available is {oldest}, current revision {current}: read the state again and watch from {current + 1}",
        {ErrorMeta.CURRENT_REVISION: current, ErrorMeta.OLDEST_REVISION: oldest},
    )


@dataclasses.dataclass(eq=False)
class Cursor:
    """One watcher: what it watches, who it counts against, and the next revision it reads."""

    prefix: str
    who: str
    next_revision: int
    generation: int  # the ring's generation it reads (a snapshot loaded starts a new one)
    closed: bool = False
    # Ends the RPC from outside its thread (the servicer sets ``context.cancel``): a watcher
    # whose client stopped reading is blocked in gRPC's send and never reads the cursor again.
    cancel: Callable[[], None] | None = None
    cancelled: bool = False
    left_behind: bool = False  # counted once in WatchHub.left_behind, whichever path ended it


class WatchHub:
    """The member's history of changes, and the watchers reading it."""

    def __init__(self, *, history_bytes_max: int = WATCH_HISTORY_BYTES_MAX,
                 per_caller_max: int = WATCHERS_PER_CALLER_MAX) -> None:
        self.history_bytes_max = history_bytes_max
        self.per_caller_max = per_caller_max
        self._cond = threading.Condition(threading.Lock())
        self._revisions: list[int] = []  # ring, oldest first, from _head on
        self._batches: list[tuple[Change, ...]] = []
        self._costs: list[int] = []
        self._head = 0
        self._bytes = 0
        self._oldest = 1  # every change at a revision >= this is in the ring
        self._current = 0  # the last index applied here
        self._generation = 0
        self._open: dict[str, int] = {}  # who -> watchers open
        self._cursors: set[Cursor] = set()
        self._trimmed = threading.Event()  # the ring dropped entries: look for cursors left behind
        self._reaper: threading.Thread | None = None
        # Watchers ended because the history moved past them (too slow, or a snapshot loaded
        # here): fencing_watchers_left_behind_total. Counted under _cond.
        self.left_behind = 0

    # -- the apply path (the Raft thread, under the apply lock): quick, never blocks -------------

    def attach(self, node: Any) -> None:
        """Feed this hub from ``node``'s applied entries from now on."""
        last = node.watch_applied(self.applied, self.loaded)
        with self._cond:
            self._current = max(self._current, last)
            self._oldest = self._current + 1

    def applied(self, index: int, outcome: Any) -> None:
        outcomes = outcome if isinstance(outcome, list) else (outcome,)
        changes = tuple(c for o in outcomes if isinstance(o, Applied) for c in o.changes)
        with self._cond:
            self._current = index
            if changes:
                cost = sum(change_cost(c) for c in changes)
                self._revisions.append(index)
                self._batches.append(changes)
                self._costs.append(cost)
                self._bytes += cost
                self._trim()
            self._cond.notify_all()

    def loaded(self, index: int) -> None:
        """A snapshot replaced the state at ``index``: what came before is gone from here."""
        with self._cond:
            self._revisions, self._batches, self._costs = [], [], []
            self._head = self._bytes = 0
            self._current = index
            self._oldest = index + 1
            self._generation += 1  # every open cursor ends COMPACTED
            self._cond.notify_all()
            self._trimmed.set()

    def _trim(self) -> None:
        # The newest batch stays even when alone over the bound: it is what watchers read next.
        while self._bytes > self.history_bytes_max and len(self._revisions) - self._head > 1:
            self._bytes -= self._costs[self._head]
            self._oldest = self._revisions[self._head] + 1
            self._head += 1
            self._trimmed.set()
        if self._head > 1024 and self._head * 2 > len(self._revisions):
            del self._revisions[: self._head], self._batches[: self._head], self._costs[: self._head]
            self._head = 0

    # -- watchers ------------------------------------------------------------------------------

    @property
    def current(self) -> int:
        with self._cond:
            return self._current

    def open(self, prefix: str, start_revision: int, who: str) -> tuple[Cursor, int]:
        """A cursor for ``who`` on ``prefix`` from ``start_revision`` (0: from the next entry
        applied), and the current revision; ServiceError past the caller's cap or for a start
        older than the history. Every cursor opened must be closed (``close``)."""
        with self._cond:
            held = self._open.get(who, 0)
            if held >= self.per_caller_max:
                raise ServiceError(
                    Reason.LIMIT_EXCEEDED,
                    f"{who} already has {held} watchers on this member"
                    f" (watchers_per_principal_max {self.per_caller_max})",
                    {"limit": "watchers_per_principal_max", "max": self.per_caller_max},
                )
            start = start_revision or self._current + 1
            if start < self._oldest:
                raise compacted(start, self._oldest, self._current, "older than this member's watch history")
            self._open[who] = held + 1
            cursor = Cursor(prefix, who, start, self._generation)
            self._cursors.add(cursor)
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="watch-reaper", daemon=True)
                self._reaper.start()
            return cursor, self._current

    def close(self, cursor: Cursor) -> None:
        with self._cond:
            if cursor.closed:
                return
            cursor.closed = True
            self._cursors.discard(cursor)
            left = self._open[cursor.who] - 1
            if left:
                self._open[cursor.who] = left
            else:
                del self._open[cursor.who]
            self._cond.notify_all()

    def open_count(self) -> int:
        with self._cond:
            return sum(self._open.values())

    def next(self, cursor: Cursor, timeout_s: float) -> tuple[list[tuple[int, list[Change]]], int]:
        """Wait up to ``timeout_s`` for changes under ``cursor.prefix`` at or after its next
        revision: (batches of (revision, changes) in log order, the revision read up to).
        An empty list after the timeout means nothing matched up to that revision.
        ServiceError when the cursor can no longer go on (a snapshot loaded, or it fell
        behind the history); a closed cursor returns nothing."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if cursor.closed:
                    return [], cursor.next_revision - 1
                self._check_alive(cursor)
                found = self._scan(cursor)
                if found:
                    return found, cursor.next_revision - 1
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], cursor.next_revision - 1
                self._cond.wait(left)

    def _reap(self) -> None:
        """Forever (a daemon thread, off the apply path): after each trim or snapshot, cancel
        the RPC of every cursor the ring has left behind. One whose thread still reads would
        end itself with the reason (``_check_alive``); one whose client stopped reading is
        blocked sending and would hold its worker thread and stream slot until the client went
        away. Its client sees CANCELLED, and a resume is answered COMPACTED, the reason."""
        while True:
            self._trimmed.wait()
            self._trimmed.clear()
            with self._cond:
                behind = [c for c in self._cursors if not c.cancelled and c.cancel is not None
                          and (c.next_revision < self._oldest or c.generation != self._generation)]
                for cursor in behind:
                    cursor.cancelled = True
                    self._count_left_behind(cursor)
            for cursor in behind:
                assert cursor.cancel is not None
                cursor.cancel()

    def _count_left_behind(self, cursor: Cursor) -> None:
        if not cursor.left_behind:
            cursor.left_behind = True
            self.left_behind += 1

    def _check_alive(self, cursor: Cursor) -> None:
        if cursor.generation != self._generation or cursor.next_revision < self._oldest:
            self._count_left_behind(cursor)
        if cursor.generation != self._generation:
            raise compacted(cursor.next_revision, self._oldest, self._current,
                            "this member installed a snapshot; the events before it are not known here")
        if cursor.next_revision < self._oldest:
            raise ServiceError(
                Reason.LIMIT_EXCEEDED,
                f"watcher too slow: it had read up to revision {cursor.next_revision - 1} and this member's"
                f" watch history (WATCH_HISTORY_BYTES_MAX {self.history_bytes_max} bytes) now starts at"
                f" {self._oldest}; current revision {self._current}",
                {"limit": "WATCH_HISTORY_BYTES_MAX", "max": self.history_bytes_max,
                 ErrorMeta.CURRENT_REVISION: self._current, ErrorMeta.OLDEST_REVISION: self._oldest},
            )

    def _scan(self, cursor: Cursor) -> list[tuple[int, list[Change]]]:
        """The batches from ``cursor.next_revision`` on that match its prefix (at most
        READ_BATCHES_MAX), advancing the cursor past every revision looked at."""
        position = bisect.bisect_left(self._revisions, cursor.next_revision, lo=self._head)
        found: list[tuple[int, list[Change]]] = []
        prefix = cursor.prefix
        end = len(self._revisions)
        while position < end and len(found) < READ_BATCHES_MAX:
            matching = [c for c in self._batches[position]
                        if c.kind is ChangeKind.RESET or c.resource.startswith(prefix)]
            if matching:
                found.append((self._revisions[position], matching))
            position += 1
        if position < end:
            cursor.next_revision = self._revisions[position]
        else:
            cursor.next_revision = max(cursor.next_revision, self._current + 1)
        return found

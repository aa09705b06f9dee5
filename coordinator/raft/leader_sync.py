"""The leader's own journal sync, on a thread of its own (syncobj.py uses it).

Owns: one background thread that fdatasyncs the journal on request and publishes the
(term, index) it covers. Must never: touch pysyncobj state (it only calls the journal's
thread-safe ``sync()`` and a wake-up callback), or publish an index before its sync returned.
"""

from __future__ import annotations

import threading
from typing import Callable


class LeaderSync:
    """The leader's own journal sync, on a thread of its own.

    A leader may send entries before they are durable on its own disk (Raft allows it);
    what it may not do is count itself toward their commit before. The Raft thread asks
    for a sync of everything up to (term, index) and carries on; this thread runs the
    fdatasync and publishes the (term, index) it covers, and the commit computation counts
    the leader only up to there (``group_commit.GroupCommit._cap_commit_votes``). Within one term
    a leader never truncates its log, so a published index stays durable for that term.

    ``background=False`` (the simulation, no threads) syncs inline at request time.
    """

    def __init__(
        self, journal, *, background: bool, wake: Callable[[], None], on_fatal, exit_code: int
    ) -> None:
        self._journal = journal
        self._exit_code = exit_code  # passed to on_fatal when a sync fails
        self._background = background
        self._wake = wake
        self._on_fatal = on_fatal
        self._cond = threading.Condition()
        self._wanted: tuple[int, int] = (0, 0)
        self._stopped = False
        self.synced: tuple[int, int] = (0, 0)  # (term, index) durable on this node
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._run, name="leader-sync", daemon=True)
            self._thread.start()

    def request(self, term: int, index: int) -> None:
        if not self._background:
            self._sync()
            self.synced = max(self.synced, (term, index))
            return
        with self._cond:
            if (term, index) > self._wanted:
                self._wanted = (term, index)
                self._cond.notify()

    def _sync(self) -> bool:
        try:
            self._journal.sync()
            return True
        except BaseException as exc:  # noqa: BLE001 - a sync failing in any way leaves durability unknown: fatal
            self._on_fatal(f"journal sync failed: {exc!r}", self._exit_code)
            return False

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._wanted <= self.synced and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                target = self._wanted
            if not self._sync():
                return
            self.synced = target  # one tuple assignment: read whole by the Raft thread
            self._wake()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

"""Term and vote saved before they are held, and a Raft thread that never swallows a failure.

Owns: two overrides for ``HardenedSyncObj`` (DESIGN I1, I8; RAFT.md "Failures it swallows"):
- ``_SyncObj__setCurrentTerm``: pysyncobj sets its in-memory term and vote first and only then
  writes them (syncobj.py:1234-1237); when that write failed (EMFILE, ENOSPC) the member went on
  acting in a term its ``raft.meta`` never held, and after a restart could vote a second time in
  a term it had already led (measured: a leader led term 6 with ``raft.meta`` at term 1). Here
  the journal writes them first (tmp + fsync + rename + fsync of the directory, journal.py) and
  the in-memory values change only once that returned; a failure stops the member.
- the guarded tick: anything escaping a tick of the auto-tick thread stops the member, where
  pysyncobj logged "failed _onTick" and ticked on (syncobj.py:594-597).
Must never: change the term or vote in memory before they are durable, send anything after a
failed save (the fatal handler does not return; a test's raises), or let a second failure of
the same stop print a second line (``fatal.once``, and ``default_fatal``'s lock across threads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.raft.fatal import exit_code_for

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object


class DurableTerm(_Host):
    """Mixin for ``HardenedSyncObj``: needs ``self._on_fatal`` and ``self._guard_ticks``."""

    def _SyncObj__setCurrentTerm(self, term, votedForNodeId):
        journal = self._SyncObj__raftLog
        try:
            journal.setCurrentTerm(term, votedForNodeId)
        except BaseException as exc:  # whatever it is, the term is not saved: fatal
            where = getattr(journal, "meta_path", "the journal's meta file")
            self._on_fatal(
                f"cannot save term {term} (vote {votedForNodeId}) to {where},"
                f" stopping before acting in it: {_describe(exc)}",
                exit_code_for(exc),
            )
            raise
        before: int = self.raftCurrentTerm
        # Only now: every message built from here on reflects a saved term and vote.
        self._SyncObj__raftCurrentTerm = term
        self._SyncObj__votedForNodeId = votedForNodeId
        if term > before:
            self.note_term_raised(before, term, votedForNodeId)  # one line saying why (pre_vote.py)

    def _guarded_tick(self, tick, time_to_wait):
        """Run ``tick``; on the auto-tick thread, anything it raises stops the member."""
        if not self._guard_ticks:
            # Ticked by hand (tests, the simulation): the caller sees the exception itself.
            return tick(time_to_wait)
        try:
            return tick(time_to_wait)
        except ReferenceError:
            # The node itself is gone (pysyncobj's tick thread holds a weak proxy to it):
            # its _autoTickThread ends quietly on this, as it should.
            raise
        except BaseException as exc:  # any type: pysyncobj would log it and tick on; fatal
            self._on_fatal(f"the Raft thread failed: {_describe(exc)}", exit_code_for(exc))
            raise


def _describe(exc: BaseException) -> str:
    # str() of an OSError names its file and errno ("[Errno 28] No space left on device:
    # '/data/raft.meta.tmp'"); repr() would drop the file.
    return f"{type(exc).__name__}: {exc}"

"""Who leads, as this member sees it: one log line per change and a count of the changes.

Owns: ``LeaderLog``, told the leader and term on every Raft tick (node.py), which logs
"raft: leader changed: A -> B (term N)" when the leader it sees changes (B "none" while an
election runs), or its term does (A = B: the same leader in a new term), and counts changes to
a known leader (etcd's leader_changes_seen: a leader lost and then found again counts, whoever
it is). These lines are the members' own reports of who led each term: the chaos checker reads
them (chaos/leader_reports.py), so a term change must never go unlogged while a leader is
seen. Peer and quorum lines are peer_log.py's.
Must never: import pysyncobj, or do more per tick than compare one value (it runs on the
Raft thread every tick).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class LeaderLog:
    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._leader: str | None = None
        self._term = 0
        self.changes = 0  # times a leader was seen that differs from the one seen before

    def observe(self, leader: str | None, term: int) -> None:
        # Elections that find no leader change the term too: not a line each.
        if leader == self._leader and (leader is None or term == self._term):
            return
        if leader is not None:
            if leader != self._leader:
                self.changes += 1
            self._log.info("raft: leader changed: %s -> %s (term %d)", self._leader or "none", leader, term)
        else:
            self._log.warning("raft: leader lost: %s -> none (term %d)", self._leader, term)
        self._leader, self._term = leader, term

"""The members' own reports of who led each term, read from their logs after a run.

Owns: turning each member's "raft: leader changed: A -> B (term N)" lines (coordinator/raft/
leader_log.py: one per change of the leader it sees or of that leader's term) into
``leader_report`` history records (chaos.history), which the checker's per-term leader check
reads (chaos.check, TWO_LEADERS_IN_TERM). Every member's view counts, its own leadership and
the leader it followed: in Raft a member takes B as leader of term N only from B's own append
at term N, so two different leaders named for one term, by anyone, is a split term.
Must never: judge anything (the checker does), or read a log while its member still writes it
(the runner calls it after the cluster is closed).

Unlike the runner's Status samples (every 0.4 s, so a leadership shorter than that, or of a
member that answers nobody, goes unseen), the log has every change a member saw, at its tick.
"""

from __future__ import annotations

import re

# The line LeaderLog writes; the text and JSON log formats both carry it verbatim.
LEADER_LINE = re.compile(r"raft: leader changed: (?P<old>\S+) -> (?P<new>\S+) \(term (?P<term>\d+)\)")


# Every LeaderLog line, "leader lost" too: each names the term the member held when it wrote it.
TERM_LINE = re.compile(r"raft: leader (?:changed|lost): \S+ -> \S+ \(term (?P<term>\d+)\)")


def highest_term_logged(log_path: str, offset: int = 0) -> int | None:
    """The highest term a member's LeaderLog lines name from byte ``offset`` on, None if none.
    The Raft thread writes a term (or fails to) before it logs a line naming it."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        terms = [int(m["term"]) for m in TERM_LINE.finditer(f.read())]
    return max(terms, default=None)


def leader_reports(log_path: str, reporter: str) -> list[dict]:
    """``leader_report`` records for every leader line in ``reporter``'s log (a line cut off
    by a kill has no "(term N)" and is skipped)."""
    out = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            m = LEADER_LINE.search(line)
            if m:
                out.append({"type": "leader_report", "node": reporter, "leader": m["new"],
                            "term": int(m["term"]), "log_line": number})
    return out

"""The members' own leader reports (chaos/leader_reports.py) read what LeaderLog
(coordinator/raft/leader_log.py) writes, in both of fencingd's log formats; LeaderLog writes a
line whenever the leader it sees, or that leader's term, changes.

The second matters for the per-term leader check: a leader that keeps leading while its term
moves (a term it could not save) must say so, or its claim on the new term is never seen.
"""

from __future__ import annotations

import io
import logging

import pytest

from chaos import check as chk
from chaos import history as hist
from chaos.leader_reports import leader_reports
from coordinator.raft.leader_log import LeaderLog
from coordinator.server.fencingd import JsonFormatter

A, B = "127.0.0.2:7001", "127.0.0.3:7001"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # fencingd's text format


def logged(observations, formatter: logging.Formatter) -> tuple[str, LeaderLog]:
    """What a LeaderLog told these (leader, term) ticks writes, formatted as fencingd does."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test.leader_log.{id(out)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    leader_log = LeaderLog(logger)
    for leader, term in observations:
        leader_log.observe(leader, term)
    return out.getvalue(), leader_log


@pytest.mark.parametrize("formatter", [logging.Formatter(TEXT_FORMAT), JsonFormatter()], ids=["text", "json"])
def test_every_leader_and_term_change_becomes_a_report(tmp_path, formatter):
    # A leads 2; A again in 3 with no tick in between that saw no leader (re-elected at once,
    # or kept leading on a term it could not save); the election of 4 finds nobody for a
    # while (terms 4, 5: no line each); B leads 5.
    ticks = [(None, 1), (A, 2), (A, 2), (A, 3), (None, 4), (None, 5), (B, 5), (B, 5)]
    text, leader_log = logged(ticks, formatter)
    path = tmp_path / "node.log"
    path.write_text("READY member=...\n" + text + "2026-12-06 06:24:44,1 INFO x: raft: leader changed: none -> ")
    reports = leader_reports(str(path), A)
    assert [(r["leader"], r["term"]) for r in reports] == [(A, 2), (A, 3), (B, 5)]
    assert all(r["node"] == A and r["type"] == "leader_report" for r in reports)
    assert [r["log_line"] for r in reports] == [2, 3, 5]  # line 4: "leader lost"
    assert leader_log.changes == 2  # the metric still counts changes of leader only


def test_a_leader_that_keeps_leading_into_a_term_another_won_is_caught(tmp_path):
    """End to end from the logs: A's term moved to 3 while it stayed leader (its raft.meta
    write failed and was swallowed); B won term 3. Only A's own line shows A's claim."""
    a_text, _ = logged([(A, 2), (A, 3), (B, 3)], logging.Formatter(TEXT_FORMAT))
    b_text, _ = logged([(A, 2), (None, 3), (B, 3)], logging.Formatter(TEXT_FORMAT))
    (tmp_path / "a.log").write_text(a_text)
    (tmp_path / "b.log").write_text(b_text)
    records = leader_reports(str(tmp_path / "a.log"), A) + leader_reports(str(tmp_path / "b.log"), B)
    report = chk.check_history(hist.History.of(records))
    assert report.kinds() == {chk.TWO_LEADERS_IN_TERM}
    (violation,) = report.violations
    assert violation.detail.startswith("term 3: the members' own reports name 2 leaders")

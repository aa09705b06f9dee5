"""The leader's TICK job (coordinator/server/lease_ticker.py): only the leader, one TICK at a time.

A stand-in node says whether it leads; a stand-in proposer records what is proposed and can
fail. The real job, on real members, is in tests/test_quota_cluster.py (expired resources
forgotten without a release) and tests/test_clock_step.py (the clock keeps time).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from coordinator.core.commands import Op
from coordinator.core.results import TickResult
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.lease_ticker import LeaseTicker
from testsupport.supervisor import wait_until


class Node:
    def __init__(self, leading: bool) -> None:
        self.leading = leading

    def is_leader(self) -> bool:
        return self.leading


class Proposer:
    """Records proposals; the number in flight at once; fails while ``failing`` is set."""

    def __init__(self) -> None:
        self.proposed: list = []
        self.in_flight = self.most_in_flight = 0
        self.failing = False
        self._lock = threading.Lock()

    def propose(self, command, timeout_s, *, client_slot=True):
        # The member's own job never takes a client's in-flight slot (a bound of 1 would
        # otherwise refuse a client once a second).
        assert client_slot is False
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.proposed.append(command)
            if self.failing:
                raise ServiceError(Failure.OVERLOADED, "busy")
            return SimpleNamespace(value=SimpleNamespace(result=TickResult(expired=2)))
        finally:
            with self._lock:
                self.in_flight -= 1


def test_a_follower_proposes_no_tick():
    proposer = Proposer()
    ticker = LeaseTicker(Node(leading=False), proposer, interval_s=1.0, timeout_s=1.0)
    assert ticker.tick_once() is None
    assert proposer.proposed == []


def test_the_leader_proposes_a_tick_and_survives_a_failed_one():
    proposer = Proposer()
    ticker = LeaseTicker(Node(leading=True), proposer, interval_s=1.0, timeout_s=1.0)
    assert ticker.tick_once() == 2
    proposer.failing = True
    assert ticker.tick_once() is None
    assert [c.op for c in proposer.proposed] == [Op.TICK, Op.TICK]
    assert ticker.ticks_applied == 1


def test_the_job_ticks_one_at_a_time_while_leading_and_stops():
    node, proposer = Node(leading=True), Proposer()
    ticker = LeaseTicker(node, proposer, interval_s=0.01, timeout_s=1.0)
    ticker.start()
    try:
        wait_until(lambda: len(proposer.proposed) >= 5, 10.0, what="five TICKs")
        node.leading = False
        seen = len(proposer.proposed)
        # No longer leading: a TICK already past its leadership check may still land.
        wait_until(lambda: ticker.ticks_applied >= seen, 10.0, what="the last TICK")
    finally:
        ticker.stop()
        ticker.join(timeout=5.0)
    assert not ticker.is_alive()
    assert proposer.most_in_flight == 1
    assert len(proposer.proposed) <= seen + 1

"""A Raft connection on which nothing was said for a while is idle, not dead (RAFT.md "Idle is
not dead").

pysyncobj dropped a connection at its first event after ``connectionTimeout`` without a read.
Between two followers nothing flows while a leader leads, so the first vote request of an
election closed the connection unsent (or unread on the other side), and the candidate waited a
whole election timeout more. Both ends here are pysyncobj's TcpConnection on a socket pair, with
the patches installed and a manual clock, so no test waits for a timeout to pass.
"""

from __future__ import annotations

import socket

import pysyncobj.tcp_connection as ps_tcp
import pytest
from pysyncobj.poller import createPoller

from coordinator.raft import connection, patches
from testsupport.supervisor import wait_until

TIMEOUT_S = 3.5  # connectionTimeout as syncobj.py sets it for the production timings
SENDER = {"cluster": None, "incarnation": 42}  # who votes, appends or acknowledges (member_gate.py stamps it)
VOTE = {"type": "request_vote", "term": 7, "last_log_index": 12, "last_log_term": 6, **SENDER}
APPEND = {"type": "append_entries", "term": 7, "commit_index": 12, "prevLogIdx": 12, "prevLogTerm": 6,
          "entries": (), **SENDER}
ACK = {"type": "next_node_idx", "next_node_idx": 13, "reset": False, "success": True, **SENDER}


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pair(monkeypatch):
    """Two connected TcpConnections (a, b) on one poller, the clock manual; what each received
    and whether it was dropped."""
    patches.install()  # what RaftNode does first: the timeout rule under test
    clock = ManualClock()
    monkeypatch.setattr(ps_tcp, "monotonicTime", clock)
    monkeypatch.setattr(connection, "_monotonic", clock)
    poller = createPoller("auto")
    left, right = socket.socketpair()
    left.setblocking(False)
    right.setblocking(False)
    got = {"a": [], "b": [], "a_dropped": [], "b_dropped": []}
    a = ps_tcp.TcpConnection(poller, socket=left, timeout=TIMEOUT_S, onMessageReceived=got["a"].append,
                             onDisconnected=lambda: got["a_dropped"].append(1))
    b = ps_tcp.TcpConnection(poller, socket=right, timeout=TIMEOUT_S, onMessageReceived=got["b"].append,
                             onDisconnected=lambda: got["b_dropped"].append(1))
    poller.poll(0.01)  # the first write events of a connection just made
    yield a, b, poller, clock, got
    a.disconnect()
    b.disconnect()


def test_a_vote_request_on_a_long_idle_connection_arrives_and_keeps_it(pair):
    a, b, poller, clock, got = pair
    clock.now += 60  # a minute of a stable leader: nothing between two followers
    a.send(VOTE)
    wait_until(lambda: poller.poll(0.01) or got["b"] or got["a_dropped"] or got["b_dropped"], 10,
               what="the vote request, or a drop")
    assert got["b"] == [VOTE]
    assert not got["a_dropped"] and not got["b_dropped"]
    assert a.state == b.state == ps_tcp.CONNECTION_STATE.CONNECTED


def test_a_peer_that_owes_an_answer_and_stays_silent_is_still_dropped(pair):
    a, b, poller, clock, got = pair
    a.send(APPEND)
    wait_until(lambda: poller.poll(0.01) or got["b"], 10, what="the append")
    clock.now += TIMEOUT_S + 1  # b never acknowledges: stopped, or its host gone
    a.send(APPEND)  # the connection's next event
    assert got["a_dropped"] == [1]
    assert a.state == ps_tcp.CONNECTION_STATE.DISCONNECTED


def test_an_answer_clears_what_the_peer_owed(pair):
    a, b, poller, clock, got = pair
    a.send(APPEND)
    wait_until(lambda: poller.poll(0.01) or got["b"], 10, what="the append")
    clock.now += 1
    b.send(ACK)  # an answer, itself owed nothing back
    wait_until(lambda: poller.poll(0.01) or got["a"], 10, what="the acknowledgement")
    clock.now += TIMEOUT_S + 1  # then silence on both sides: a leader that lost its last command
    a.send(VOTE)
    wait_until(lambda: poller.poll(0.01) or len(got["b"]) == 2 or got["a_dropped"] or got["b_dropped"], 10,
               what="the second message, or a drop")
    assert got["b"] == [APPEND, VOTE]
    assert not got["a_dropped"] and not got["b_dropped"]

"""Lease reads (coordinator/raft/read_lease.py, read_index.py, pre_vote.py; RAFT.md "Lease reads").

- ``ReadLease`` with a manual clock: a lease starts when its round started, lasts its duration,
  is earned only from a round it recorded, and a clock that goes back voids it.
- One member by hand (tests/test_raft_overrides.py's recording transport): as a voter it drops a
  vote request of a later term while it hears a live leader (for the vote window, also once
  that leader's connection closed, and after its own start) and grants a transfer's; as a
  leader it earns a lease only from a confirmed round after an entry of its term committed, and
  loses it on a transfer and on stepping down, before the vote it then grants.
- The simulation (tests/sim) asks every member for a lease read after each tick and at every
  client step: none may hold once a later term elected a leader, and each must cover every
  acknowledged command. Pauses and partitions of the leader and followers; a lease made ten
  times longer than its window is caught.
"""

from __future__ import annotations

import pytest
from pysyncobj.node import TCPNode

from coordinator.raft import read_lease
from coordinator.raft.membership import Configuration, Member
from coordinator.raft.node import RaftConfig
from coordinator.raft.read_lease import LEASE_ROUNDS_PENDING_MAX, ReadLease
from coordinator.raft.syncobj import ALL_FIXES
from tests.sim.harness import Fault, Simulation
from tests.test_raft_overrides import LEADER, OTHER, PEER_INCARNATIONS, SELF, append, become_leader, make_node


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- ReadLease, pure -------------------------------------------------------------------------


def test_a_lease_runs_from_its_round_s_start_for_its_duration():
    clock = ManualClock()
    lease = ReadLease(0.25, clock)
    assert not lease.holds()
    lease.round_started(1)
    clock.now += 0.1  # the round's acknowledgements take their time: the lease still starts at 100
    assert not lease.holds()
    lease.confirmed(1)
    assert lease.holds()
    clock.now = 100.249
    assert lease.holds()
    clock.now = 100.25
    assert not lease.holds()


def test_only_a_recorded_round_of_this_lease_earns_it():
    clock = ManualClock()
    lease = ReadLease(0.25, clock)
    lease.confirmed(3)  # never recorded as started here
    assert not lease.holds()
    lease.round_started(4)
    lease.void()  # a new term, configuration or a transfer: earlier rounds count no more
    lease.confirmed(4)
    assert not lease.holds()
    lease.round_started(5)
    lease.round_started(6)
    lease.confirmed(6)  # a majority echoed 6: 5 is settled too, and the lease runs from 6's start
    assert lease.holds() and lease.remaining_s() == pytest.approx(0.25)


def test_a_clock_that_goes_back_voids_the_lease_and_a_jump_forward_ends_it():
    clock = ManualClock()
    lease = ReadLease(0.25, clock)
    lease.round_started(1)
    lease.confirmed(1)
    clock.now -= 0.01  # back: every recorded start is on another timeline now
    assert not lease.holds() and lease.clock_steps_back == 1
    clock.now += 0.005  # still before the step: nothing held, nothing counted again
    assert not lease.holds() and lease.clock_steps_back == 1
    lease.round_started(2)
    lease.confirmed(2)
    assert lease.holds()  # a round started after the step earns a lease again
    clock.now += 3600  # forward (a resumed VM, or a step): the lease has simply run out
    assert not lease.holds()


def test_pending_starts_are_bounded_and_reads_are_counted():
    clock = ManualClock()
    lease = ReadLease(0.25, clock)
    for seq in range(1, LEASE_ROUNDS_PENDING_MAX + 10):
        lease.round_started(seq)
    lease.confirmed(1)  # dropped long ago: no lease, no crash
    assert not lease.holds(count=True)
    lease.confirmed(LEASE_ROUNDS_PENDING_MAX + 9)
    assert lease.holds(count=True) and lease.holds(count=True)
    assert (lease.reads, lease.fallbacks) == (2, 1)


def test_the_lease_is_the_vote_window_less_the_drift_bound():
    config = RaftConfig(SELF, (LEADER, OTHER), "/nonexistent")
    assert config.vote_window_s == 0.3  # leader_lost_election_s, below raft_min_timeout_s
    assert config.read_lease_s == pytest.approx(0.25)
    assert RaftConfig(SELF, (LEADER, OTHER), "/x", leader_lost_election_s=0).read_lease_s == pytest.approx(0.95)
    assert RaftConfig(SELF, (LEADER, OTHER), "/x", lease_reads=False).read_lease_s == 0
    # Without the voters' refusal (the pre_vote fix) nothing bounds a new election: no lease.
    assert RaftConfig(SELF, (LEADER, OTHER), "/x", fixes=ALL_FIXES - {"pre_vote"}).read_lease_s == 0
    with pytest.raises(ValueError, match="lease_read_clock_drift_s"):
        RaftConfig(SELF, (LEADER, OTHER), "/x", lease_read_clock_drift_s=0.3)


# -- a voter, by hand ---------------------------------------------------------------------------


@pytest.fixture
def voter(tmp_path):
    """A configured voter (m1) with two voter peers, both connected, following LEADER in term 1."""
    node = make_node(tmp_path)
    so = node.syncobj
    config = Configuration("cluster-a", (
        Member("m1", SELF, node.identity.incarnation),
        Member("m2", LEADER, PEER_INCARNATIONS[LEADER]),
        Member("m3", OTHER, PEER_INCARNATIONS[OTHER]),
    ))
    node.tick(0)
    for peer in (LEADER, OTHER):
        so._SyncObj__transport._onNodeConnected(TCPNode(peer))
    append(node, 1, 0, [(config.encode_entry(), 2, 1)], commit=2)  # the leader's append, just now
    return node


def _vote_request(node, term, **extra):
    so = node.syncobj
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {
        "type": "request_vote", "term": term, "last_log_index": so._SyncObj__getCurrentLogIndex(),
        "last_log_term": so._SyncObj__getCurrentLogTerm(), **extra})


def _votes_sent(node):
    return [m for to, m in node.syncobj._SyncObj__transport.sent if m["type"] == "response_vote"]


def _long_ago(so):
    so._leader_heard_at -= 10.0


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"pre_vote"}])
def test_a_voter_that_hears_its_leader_drops_a_vote_of_a_later_term(voter, fixes, tmp_path):
    node = voter if fixes == ALL_FIXES else make_node(tmp_path, fixes, name="stock")
    so = node.syncobj
    if fixes != ALL_FIXES:
        node.tick(0)
        append(node, 1, 0, [], commit=1)  # its leader, just now
    term = so.raftCurrentTerm
    _vote_request(node, term + 1)
    if fixes != ALL_FIXES:
        assert _votes_sent(node) and so.raftCurrentTerm == term + 1  # stock: it votes at once
        return
    assert not _votes_sent(node) and so.raftCurrentTerm == term  # dropped: not even its term moved
    assert node.status()["votes_refused_leader_heard"] == 1
    _long_ago(so)  # the vote window has passed
    _vote_request(node, term + 1)
    assert [m["term"] for m in _votes_sent(node)] == [term + 1]


def test_a_transfer_s_vote_is_granted_while_the_leader_is_heard(voter):
    so = voter.syncobj
    term = so.raftCurrentTerm
    _vote_request(voter, term + 1, transfer=True)
    assert [m["term"] for m in _votes_sent(voter)] == [term + 1]


def test_a_closed_leader_connection_shortens_the_window_to_leader_lost_election_s(voter):
    so = voter.syncobj
    assert so.vote_window_s() == so._SyncObj__conf.raftMinTimeout
    so._SyncObj__transport._onNodeDisconnected(TCPNode(LEADER))
    assert so.vote_window_s() == voter.config.leader_lost_election_s
    _vote_request(voter, so.raftCurrentTerm + 1)
    assert not _votes_sent(voter)  # never at once: the leader's lease may still hold that long


def test_a_member_just_started_refuses_for_the_window(tmp_path):
    node = make_node(tmp_path)
    assert node.syncobj._hears_leader()  # it may have acknowledged a round just before it stopped
    node.syncobj._leader_heard_at -= node.config.vote_window_s
    assert not node.syncobj._hears_leader()


def test_a_transferee_s_vote_requests_say_so(voter):
    so = voter.syncobj
    so._SyncObj__onMessageReceived(TCPNode(LEADER), {"type": "timeout_now", "term": so.raftCurrentTerm})
    term = so.raftCurrentTerm
    voter.tick(0)
    requests = [m for _, m in so._SyncObj__transport.sent if m["type"] == "request_vote"]
    assert requests and all(m["term"] == term + 1 for m in requests)
    assert all(so.outgoing_fields(m).get("transfer") is True for m in requests)
    assert "transfer" not in so.outgoing_fields({"type": "request_vote", "term": term + 2})


# -- a leader, by hand --------------------------------------------------------------------------


def _echo_all(node, seq):
    so = node.syncobj
    for peer in (LEADER, OTHER):
        so._SyncObj__onMessageReceived(TCPNode(peer), {
            "type": "next_node_idx", "next_node_idx": so._SyncObj__getCurrentLogIndex() + 1, "success": True,
            "reset": False, "read_term": so.raftCurrentTerm, "read_seq": seq})


def _leader_with_lease(tmp_path):
    node = make_node(tmp_path)
    become_leader(node)
    so = node.syncobj
    node.tick(0)  # the no-op and the configuration go out with round 1
    assert so._read_rounds.sent == 1
    _echo_all(node, 1)
    # A majority confirmed round 1, but no entry of this term is committed yet: no lease.
    assert so._read_rounds.confirmed == 1 and so.lease_read_index() is None
    node.tick(0)  # they commit
    assert so.raftCommitIndex == so._SyncObj__getCurrentLogIndex()
    so._lease_round_at = float("-inf")
    node.tick(0)  # a lease that runs short sends a round of its own
    assert so._read_rounds.sent >= 2
    _echo_all(node, so._read_rounds.sent)
    assert so.lease_read_index() == so.raftCommitIndex
    return node


def test_a_leader_s_lease_needs_a_committed_entry_of_its_term_and_a_confirmed_round(tmp_path):
    node = _leader_with_lease(tmp_path)
    assert node.status()["lease_reads"] == 1


def test_a_transfer_ends_the_lease_for_the_rest_of_the_term(tmp_path):
    node = _leader_with_lease(tmp_path)
    so = node.syncobj
    so._SyncObj__raftMatchIndex[TCPNode(OTHER)] = so._SyncObj__getCurrentLogIndex()
    so.transferLeadership(OTHER)
    assert so.lease_read_index() is None
    so._lease_round_at = float("-inf")
    node.tick(0)
    _echo_all(node, so._read_rounds.sent)
    assert so.lease_read_index() is None


def test_stepping_down_ends_the_lease_before_the_vote_it_grants(tmp_path):
    node = _leader_with_lease(tmp_path)
    so = node.syncobj
    held_when_voting = []
    send = so._SyncObj__transport.send

    def watch(peer, message):
        if message["type"] == "response_vote":
            held_when_voting.append(so._lease.holds())
        return send(peer, message)

    so._SyncObj__transport.send = watch
    _vote_request(node, so.raftCurrentTerm + 1)  # a leader steps down and may vote (pysyncobj)
    assert held_when_voting == [False]


# -- the simulation -------------------------------------------------------------------------------

SEED = 5
FAULT_US = 2_000_000


@pytest.mark.parametrize("kind, target", [("pause", "leader"), ("partition", "leader"), ("pause", "follower"),
                                          ("partition", "follower"), ("cut", "leader")])
def test_no_lease_outlives_a_leader_paused_or_cut_off(kind, target):
    peer = "follower" if kind == "cut" else ("any" if kind == "partition" else "")
    result = Simulation(SEED, profile="network", schedule=[Fault(1_500_000, kind, target, peer, FAULT_US)]).run()
    assert result.ok, result.describe()
    assert result.stats["lease_reads"] > 100, dict(result.stats)
    if target == "leader" and kind != "cut":
        assert result.stats["elections_won"] >= 2, dict(result.stats)  # a later term did elect a leader


def test_the_check_catches_a_lease_longer_than_the_vote_window(monkeypatch):
    """The same schedule with every lease ten times its length: the paused leader's lease
    still holds when it resumes after a new leader was elected."""
    init = read_lease.ReadLease.__init__
    monkeypatch.setattr(read_lease.ReadLease, "__init__", lambda self, s, clock: init(self, 10 * s, clock))
    result = Simulation(SEED, profile="network", schedule=[Fault(1_500_000, "pause", "leader", "", FAULT_US)]).run()
    assert "stale_lease" in result.violation_kinds, result.describe()

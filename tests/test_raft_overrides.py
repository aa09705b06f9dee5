"""Each override of pysyncobj internals, shown to matter: with the fix the bad
thing does not happen, with that one fix switched off it does.

Nodes here run with autoTick=False on a transport that records what it sends, and
messages are injected directly, so each upstream bug is reproduced exactly.
"""

import socket
import threading
import time

import pysyncobj.pickle as ps_pickle
import pysyncobj.syncobj as ps_syncobj
import pytest
from pysyncobj.config import FAIL_REASON
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport

from coordinator.core import limits
from coordinator.raft import patches
from coordinator.raft import wire as raft_wire
from coordinator.raft.fatal import EXIT_APPLY_FAILED
from coordinator.raft.interface import ProposeFailure, ProposeOutcome
from coordinator.raft.node import ALL_FIXES, RaftConfig, RaftNode

SELF = "127.0.0.10:4001"
LEADER = "127.0.0.11:4001"
OTHER = "127.0.0.12:4001"


class RecordingTransport(Transport):
    def __init__(self, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self.sent = []

    @property
    def ready(self):
        return True

    def tryGetReady(self):
        pass

    def waitReady(self):
        pass

    def addNode(self, node):
        pass

    def dropNode(self, node):
        pass

    def send(self, node, message):
        self.sent.append((node.address, message))
        return True

    def destroy(self):
        pass


class ListMachine:
    """Minimal state machine: the list of applied payloads."""

    log_clock_ms = 0

    def __init__(self, fail_on=None):
        self.applied = []
        self.fail_on = fail_on

    def apply(self, entry, index):
        if entry == self.fail_on:
            raise AssertionError("bug in apply")
        self.applied.append(entry)
        return len(self.applied)

    def snapshot(self):
        return list(self.applied)

    def restore(self, state):
        self.applied = list(state)

    def digest(self):
        return repr(self.applied)


class Fatal(Exception):
    pass


def make_node(tmp_path, fixes=ALL_FIXES, machine=None, name="n", **config_fields):
    fatal = []

    def on_fatal(message, code):
        fatal.append((message, code))
        raise Fatal(message)

    config = RaftConfig(SELF, (LEADER, OTHER), str(tmp_path / name), fixes=frozenset(fixes), **config_fields)
    node = RaftNode(config, machine or ListMachine(), on_fatal=on_fatal,
                    transport_class=RecordingTransport, auto_tick=False)
    node.fatal = fatal
    as_peers_send_it(node.syncobj)
    return node


# The incarnation each fake peer votes and acknowledges with (member_gate.py counts a vote or
# an ack only from the incarnation the configuration names).
PEER_INCARNATIONS = {LEADER: 11, OTHER: 12}


def as_peers_send_it(so):
    """Messages a test hands to the node carry what a member of ours stamps on votes and acks
    (wire.py _SENDER): the node's cluster id and the peer's incarnation, unless the test set them."""
    receive = so._SyncObj__onMessageReceived

    def stamped(node, message):
        if message.get("type") in ("request_vote", "response_vote", "next_node_idx"):
            config = so._configs.current()
            message = {"cluster": config.cluster_id if config else None,
                       "incarnation": PEER_INCARNATIONS.get(node.address), **message}
        return receive(node, message)

    so._SyncObj__onMessageReceived = stamped


def entry(node, payload: bytes, idx: int, term: int):
    """A log entry exactly as our members write one (the typed entry format)."""
    return (raft_wire.encode_entry(payload), idx, term)


def append(node, prev_idx, prev_term, entries, commit, term=1, leader=LEADER):
    so = node.syncobj
    so._SyncObj__onMessageReceived(TCPNode(leader), {
        "type": "append_entries", "term": term, "commit_index": commit,
        "prevLogIdx": prev_idx, "prevLogTerm": prev_term, "entries": list(entries),
    })


def log_of(node):
    return [(e[1], e[2]) for e in node.syncobj._SyncObj__raftLog[:]]


def acks(node):
    return [m for _, m in node.syncobj._SyncObj__transport.sent if m["type"] == "next_node_idx"]


def fill_follower(node, last=5, term=1, commit=1):
    append(node, 1, 0, [entry(node, b"p%d" % i, i, term) for i in range(2, last + 1)], commit, term=term)


# -- version pin and journal injection --------------------------------------------


def test_refuses_other_pysyncobj_versions():
    patches.check_pysyncobj_version()  # the installed one
    with pytest.raises(RuntimeError, match="requires exactly 0.3.17"):
        patches.check_pysyncobj_version("0.3.18")


def test_our_journal_object_reaches_pysyncobj(tmp_path):
    node = make_node(tmp_path)
    assert node.syncobj._SyncObj__raftLog is node.journal


# -- truncate_on_conflict ---------------------------------------------------------


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"truncate_on_conflict"}])
def test_matching_resend_does_not_truncate_acked_tail(tmp_path, fixes):
    node = make_node(tmp_path, fixes)
    fill_follower(node, last=5)
    assert log_of(node)[-1] == (5, 1)
    # A late resend of entries 3..4 (all matching) must not cut 5.
    append(node, 2, 1, [entry(node, b"p3", 3, 1), entry(node, b"p4", 4, 1)], 1)
    if "truncate_on_conflict" in fixes:
        assert log_of(node)[-1] == (5, 1)
    else:
        assert log_of(node)[-1] == (4, 1)  # stock pysyncobj dropped an acknowledged entry


def test_real_conflict_still_truncates(tmp_path):
    node = make_node(tmp_path)
    fill_follower(node, last=5)
    append(node, 2, 1, [entry(node, b"new3", 3, 2)], 1, term=2)
    assert log_of(node)[1:] == [(2, 1), (3, 2)]


# -- commit_needs_match -------------------------------------------------------------


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"commit_needs_match"}])
def test_commit_only_what_the_message_proved(tmp_path, fixes):
    node = make_node(tmp_path, fixes)
    fill_follower(node, last=5, term=1)  # entries 4, 5 may be stale term-1 leftovers
    # New leader (term 2) sends a heartbeat proving only up to index 3.
    append(node, 3, 1, [], commit=5, term=2)
    if "commit_needs_match" in fixes:
        assert node.syncobj.raftCommitIndex == 3
    else:
        assert node.syncobj.raftCommitIndex == 5  # unproven entries counted as committed


# -- durable_journal: group commit, acks only after sync ------------------------------


def test_follower_acks_only_after_sync(tmp_path):
    node = make_node(tmp_path)
    fill_follower(node, last=5)
    assert acks(node) == []  # deferred: not durable yet
    assert node.journal.synced_length < node.journal._end
    node.tick(0)
    assert node.journal.synced_length == node.journal._end
    assert acks(node)[-1]["next_node_idx"] == 6 and acks(node)[-1]["success"]


def test_without_fix_journal_is_stock_and_never_synced(tmp_path):
    node = make_node(tmp_path, ALL_FIXES - {"durable_journal"})
    assert not hasattr(node.journal, "sync_count")
    fill_follower(node, last=5)
    node.tick(0)
    assert acks(node)  # acked, yet nothing was ever fsynced


# -- next_index_forward -------------------------------------------------------------


def become_leader(node):
    so = node.syncobj
    transport = so._SyncObj__transport
    for peer in (LEADER, OTHER):
        transport._onNodeConnected(TCPNode(peer))
    so._SyncObj__raftElectionDeadline = 0
    node.tick(0)
    term = so.raftCurrentTerm
    # A new cluster: its first leader needs every initial member's vote (unanimous bootstrap).
    so._SyncObj__onMessageReceived(TCPNode(LEADER), {"type": "response_vote", "term": term})
    assert not node.is_leader()
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {"type": "response_vote", "term": term})
    assert node.is_leader()


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"next_index_forward"}])
def test_late_ack_does_not_move_next_index_back(tmp_path, fixes):
    node = make_node(tmp_path, fixes)
    become_leader(node)
    so = node.syncobj
    for i in range(20):
        so._applyCommand(entry(node, b"c%d" % i, 0, 0)[0], None)
    node.tick(0)
    peer = TCPNode(OTHER)
    pipelined = so._SyncObj__raftNextIndex[peer]
    assert pipelined > 10
    # A success ack for an early batch arrives after later batches were sent.
    so._SyncObj__onMessageReceived(peer, {"type": "next_node_idx", "next_node_idx": 5,
                                          "success": True, "reset": False})
    if "next_index_forward" in fixes:
        assert so._SyncObj__raftNextIndex[peer] == pipelined
    else:
        assert so._SyncObj__raftNextIndex[peer] == 5


# -- the leader's own sync off the Raft thread ----------------------------------------


@pytest.mark.parametrize("synced_in_term", ["current", "previous"])
def test_leader_counts_itself_only_up_to_its_durable_index(tmp_path, synced_in_term):
    node = make_node(tmp_path)
    become_leader(node)
    so = node.syncobj
    for i in range(5):
        so._applyCommand(entry(node, b"c%d" % i, 0, 0)[0], None)
    so._leader_sync.request = lambda term, index: None  # our own sync lags from here on
    node.tick(0)
    last, term = so._SyncObj__getCurrentLogIndex(), so.raftCurrentTerm
    durable = last - 3
    so._leader_sync.synced = (term if synced_in_term == "current" else term - 1, durable)
    so._SyncObj__onMessageReceived(TCPNode(LEADER), {
        "type": "next_node_idx", "next_node_idx": last + 1, "success": True, "reset": False})
    node.tick(0)
    node.tick(0)
    # One follower plus our own durable copy: a quorum only up to our durable index (an
    # index published in an earlier term proves nothing: a log can change across terms).
    assert so.raftCommitIndex == (durable if synced_in_term == "current" else 1)
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {
        "type": "next_node_idx", "next_node_idx": last + 1, "success": True, "reset": False})
    node.tick(0)
    node.tick(0)
    assert so.raftCommitIndex == last  # both followers: a quorum without us


# -- commands sharing an entry -----------------------------------------------------------


def collect(results, name):
    return lambda result, error: results.append((name, result, error))


def test_commands_with_distinct_keys_share_one_entry_in_order(tmp_path):
    node = make_node(tmp_path)
    become_leader(node)
    so = node.syncobj
    before = so._SyncObj__getCurrentLogIndex()
    results = []
    for name, key in [(b"a1", "a"), (b"b1", "b"), (b"a2", "a"), (b"n1", None), (b"c1", "c")]:
        node.propose_async(name, collect(results, name), batch_key=key)
    node.tick(0)
    log = so._SyncObj__raftLog
    shared = [raft_wire.decode_shared_entry(raft_wire.entry_command(e[0])) for e in log[before + 1 - log[0][1]:]]
    # a2 repeats key "a": a new entry (of one command: a plain one); n1 has no key:
    # alone, keeping its place; c1 is then alone too.
    assert shared == [[b"a1", b"b1"], None, None, None]
    ack_all(node, so._SyncObj__getCurrentLogIndex() + 1)
    node.tick(0)
    assert node.state_machine.applied == [b"a1", b"b1", b"a2", b"n1", b"c1"]
    first = before + 1
    assert results == [
        (b"a1", (first, 1), 0), (b"b1", (first, 2), 0),  # one index, each its own outcome
        (b"a2", (first + 1, 3), 0), (b"n1", (first + 2, 4), 0), (b"c1", (first + 3, 5), 0),
    ]


def test_a_malformed_shared_entry_reaches_the_state_machine_as_one_command(tmp_path):
    node = make_node(tmp_path)
    for bad in (raft_wire.SHARED_ENTRY_MARKER + b"\xff", raft_wire.SHARED_ENTRY_MARKER + b"\x90",
                raft_wire.encode_shared_entry([b"x"]) + b"\x01"):
        assert raft_wire.decode_shared_entry(bad) is None
    fill_follower(node, last=2)
    bad = raft_wire.SHARED_ENTRY_MARKER + b"\x92\x01\x02"  # a list, but not of bytes
    append(node, 2, 1, [entry(node, bad, 3, 1)], commit=3)
    node.tick(0)
    assert node.state_machine.applied == [b"p2", bad]  # refused there as a value, no crash


def test_queued_commands_wake_the_raft_thread_once(tmp_path):
    node = make_node(tmp_path)
    become_leader(node)
    so = node.syncobj
    wakes = []
    so._SyncObj__pipeNotifier.notify = lambda: wakes.append(1)
    for i in range(3):
        node.propose_async(b"w%d" % i, lambda result, error: None, batch_key=i)
    assert wakes == [1]  # the first queued command wakes it; the rest ride along
    node.tick(0)
    # Handing the packed entry to pysyncobj's queue on the Raft thread wakes nobody.
    assert wakes == [1] and len(so._SyncObj__raftLog) > 2  # and the entry was appended


def test_shared_queue_is_bounded(tmp_path):
    node = make_node(tmp_path, commands_queue_size=2)
    results = []
    for i in range(3):
        node.propose_async(b"k%d" % i, collect(results, i), batch_key=i)
    assert results == [(2, None, FAIL_REASON.QUEUE_FULL)]


# -- fast_backup ---------------------------------------------------------------------------


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"fast_backup"}])
def test_conflict_answer_skips_the_whole_conflicting_term(tmp_path, fixes):
    node = make_node(tmp_path, fixes)
    fill_follower(node, last=3)  # entries 2..3 of term 1
    # A later leader of term 2 wrote 4..9 that we hold (not committed here); term 3 replaces them.
    append(node, 3, 1, [entry(node, b"q%d" % i, i, 2) for i in range(4, 10)], commit=3, term=2)
    node.tick(0)
    node.syncobj._SyncObj__transport.sent.clear()
    append(node, 9, 3, [entry(node, b"r10", 10, 3)], commit=3, term=3)
    node.tick(0)
    reply = acks(node)[-1]
    assert reply["reset"] and not reply["success"]
    if "fast_backup" in fixes:
        assert reply["next_node_idx"] == 4  # first index of our term-2 run: one round trip
    else:
        assert reply["next_node_idx"] == 9  # stock: one index back per round trip


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"fast_backup"}])
def test_rejected_append_is_resent_at_the_next_tick(tmp_path, fixes):
    node = make_node(tmp_path, fixes, heartbeat_s=0.3)
    become_leader(node)
    so = node.syncobj
    node.tick(0)
    so._SyncObj__transport.sent.clear()
    last = so._SyncObj__getCurrentLogIndex()
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {
        "type": "next_node_idx", "next_node_idx": last, "success": False, "reset": True})
    node.tick(0)
    # Within the heartbeat period: only the rejection can have caused this send.
    resent = [(m["prevLogIdx"], len(m["entries"])) for a, m in so._SyncObj__transport.sent
              if a == OTHER and m["type"] == "append_entries"]
    assert resent == ([(last - 1, 1)] if "fast_backup" in fixes else [])  # stock: wait for a heartbeat


# -- commit notices ride on the next append -------------------------------------------


def appends_sent(node):
    return [m for _, m in node.syncobj._SyncObj__transport.sent if m["type"] == "append_entries"]


def ack_all(node, next_index):
    for peer in (LEADER, OTHER):
        node.syncobj._SyncObj__onMessageReceived(TCPNode(peer), {
            "type": "next_node_idx", "next_node_idx": next_index, "success": True, "reset": False})


@pytest.mark.parametrize("delay_s", [0.0, 0.2])
def test_commit_notice_waits_for_the_next_append(tmp_path, delay_s):
    node = make_node(tmp_path, heartbeat_s=0.3, commit_notify_delay_s=delay_s)
    become_leader(node)
    so = node.syncobj
    ack_all(node, so._SyncObj__getCurrentLogIndex() + 1)
    node.tick(0)  # the no-op commits
    node.tick(0)
    so._SyncObj__transport.sent.clear()

    so._applyCommand(entry(node, b"c1", 0, 0)[0], None)
    node.tick(0)
    first = so._SyncObj__getCurrentLogIndex()
    assert [len(m["entries"]) for m in appends_sent(node)] == [1, 1]
    so._SyncObj__transport.sent.clear()
    ack_all(node, first + 1)
    node.tick(0)
    assert so.raftCommitIndex == first
    if delay_s == 0:
        # Stock behaviour: the new commit index goes out at once, on its own.
        assert [(m["entries"], m["commit_index"]) for m in appends_sent(node)] == [([], first)] * 2
        return
    assert appends_sent(node) == []  # held back
    so._applyCommand(entry(node, b"c2", 0, 0)[0], None)
    node.tick(0)
    # The next command's append carries the held-back commit index.
    assert [(len(m["entries"]), m["commit_index"]) for m in appends_sent(node)] == [(1, first)] * 2
    so._SyncObj__transport.sent.clear()

    ack_all(node, first + 2)
    sends_before = so.commit_only_sends
    started = time.monotonic()
    node.tick(0)
    assert so.raftCommitIndex == first + 1 and appends_sent(node) == []
    deadline = started + 5.0
    while not appends_sent(node) and time.monotonic() < deadline:
        node.tick(0.01)
    # With nothing to carry it, the notice goes out on its own once the delay ran out.
    assert [(m["entries"], m["commit_index"]) for m in appends_sent(node)] == [([], first + 1)] * 2
    assert time.monotonic() - started >= delay_s
    assert so.commit_only_sends == sends_before + 1


def test_commit_notify_delay_must_stay_below_the_heartbeat():
    with pytest.raises(ValueError, match="commit_notify_delay_s"):
        RaftConfig(SELF, (LEADER,), "/nonexistent", heartbeat_s=0.1, commit_notify_delay_s=0.1)


# -- no_old_snapshot and keep_tail --------------------------------------------------------


def snapshot_of(tmp_path, upto: int):
    """Write a dump file of a second node that applied entries up to ``upto``."""
    donor = make_node(tmp_path, name="donor")
    fill_follower(donor, last=upto)
    append(donor, upto, 1, [], commit=upto)
    donor.tick(0)
    donor.force_log_compaction()
    donor.tick(0)
    donor.tick(0)
    with open(donor.syncobj.conf.fullDumpFile, "rb") as f:
        data = f.read()
    donor.close()
    return data


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"no_old_snapshot"}])
def test_old_snapshot_never_rolls_state_back(tmp_path, fixes):
    old = snapshot_of(tmp_path, upto=4)
    node = make_node(tmp_path, fixes)
    fill_follower(node, last=8)
    append(node, 8, 1, [], commit=8)
    node.tick(0)
    assert len(node.state_machine.applied) == 7
    with open(node.syncobj.conf.fullDumpFile, "wb") as f:
        f.write(old)
    node.syncobj._SyncObj__loadDumpFile(clearJournal=True)  # as on snapshot install
    if "no_old_snapshot" in fixes:
        assert len(node.state_machine.applied) == 7
        assert node.status()["refused_old_snapshots"] == 1
    else:
        assert len(node.state_machine.applied) == 3  # applied state went backwards


@pytest.mark.parametrize("installing", [True, False], ids=["install", "startup"])
def test_loading_a_snapshot_restarts_the_election_timer(tmp_path, monkeypatch, installing):
    """Installing the leader's snapshot, or loading one's own at start-up (pysyncobj set the
    timer in __init__, before the first tick loads): either way a load that outlasts the
    election timeout must not call an election the moment it ends."""
    new = snapshot_of(tmp_path, upto=8)
    node = make_node(tmp_path)
    fill_follower(node, last=3)
    so = node.syncobj
    clock = [1000.0]
    monkeypatch.setattr(ps_syncobj, "monotonicTime", lambda: clock[0])
    so._SyncObj__raftElectionDeadline = clock[0] + node.config.raft_min_timeout_s  # as the append / __init__ set it
    restore = node._replica.deserialize

    def slow_restore(path):
        clock[0] += 5.0  # a large state takes a while: longer than any election timeout
        return restore(path)

    monkeypatch.setattr(node._replica, "deserialize", slow_restore)
    so._SyncObj__serializer._Serializer__deserializer = slow_restore
    with open(so.conf.fullDumpFile, "wb") as f:
        f.write(new)
    so._SyncObj__loadDumpFile(clearJournal=installing)
    assert len(node.state_machine.applied) == 7  # loaded
    # The timer counts from the end of the load, not from the message or start that preceded it.
    assert so._SyncObj__raftElectionDeadline >= clock[0] + node.config.raft_min_timeout_s


@pytest.mark.parametrize("fixes", [ALL_FIXES, ALL_FIXES - {"keep_tail"}])
def test_restart_keeps_journal_tail_after_newer_snapshot(tmp_path, fixes):
    node = make_node(tmp_path, fixes)
    fill_follower(node, last=30)
    append(node, 30, 1, [], commit=20)
    node.tick(0)
    so = node.syncobj
    # Snapshot at 20 written, then "crash" before the journal was compacted:
    # the dump is newer than the journal head, entries 21..30 are acknowledged.
    so._SyncObj__serializer.serialize((None, so._SyncObj__raftLog[19], so._SyncObj__raftLog[18], set()), 19)
    node.journal.sync()
    node.close()
    again = make_node(tmp_path, fixes)
    again.tick(0)
    last = log_of(again)[-1]
    if "keep_tail" in fixes:
        assert last == (30, 1)
    else:
        assert last == (20, 1)  # stock pysyncobj cleared the journal: 21..30 lost


# -- apply must not wedge -------------------------------------------------------------


def test_exception_in_apply_stops_the_node(tmp_path):
    node = make_node(tmp_path, machine=ListMachine(fail_on=b"p3"))
    fill_follower(node, last=4)
    append(node, 4, 1, [], commit=4)
    with pytest.raises(Fatal):
        node.tick(0)
    assert node.fatal and node.fatal[0][1] == EXIT_APPLY_FAILED


def test_propose_without_leader_is_definitely_not_applied(tmp_path):
    node = make_node(tmp_path)
    box = []
    worker = threading.Thread(target=lambda: box.append(node.propose(b"x", timeout_s=10.0)))
    worker.start()
    deadline = time.monotonic() + 10
    while not box and time.monotonic() < deadline:
        node.tick(0.01)  # no leader known: pysyncobj answers MISSING_LEADER
    worker.join(10)
    assert box[0].outcome is ProposeOutcome.NOT_APPLIED and box[0].failure is ProposeFailure.NO_LEADER
    assert box[0].detail == "no_leader"


def test_oversized_command_never_reaches_the_log(tmp_path):
    node = make_node(tmp_path)
    before = len(node.journal)
    result = node.propose(b"x" * (limits.COMMAND_BYTES_MAX + 1), timeout_s=1.0)
    assert result.outcome is ProposeOutcome.NOT_APPLIED and result.failure is ProposeFailure.COMMAND_TOO_LARGE
    assert result.detail == "command_too_large"
    node.tick(0)
    assert len(node.journal) == before


# -- outgoing sockets leave from the node's own address ---------------------------------


def test_outgoing_connections_bind_own_address(tmp_path):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.3", 0))
    listener.listen(1)
    listener.settimeout(10)
    peer = f"127.0.0.3:{listener.getsockname()[1]}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.4", 0))
        own = f"127.0.0.4:{probe.getsockname()[1]}"
    # The higher address connects out (pysyncobj transport._shouldConnect).
    config = RaftConfig(own, (peer,), str(tmp_path / "bind"), raft_min_timeout_s=0.4, raft_max_timeout_s=0.8)
    node = RaftNode(config, ListMachine())
    try:
        conn, (src_host, _port) = listener.accept()
        conn.close()
        assert src_host == "127.0.0.4"
    finally:
        node.close()
        listener.close()


# -- peer input: entries that call code never run ---------------------------------------


class _CreatesMarker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_committed_entry_that_calls_code_is_skipped_and_the_log_goes_on(tmp_path):
    marker = tmp_path / "pwned-entry"
    poisoned = b"\x00" + ps_pickle.dumps(_CreatesMarker(str(marker)))
    ps_pickle.loads(poisoned[1:])  # the control: unpickled the stock way, it runs code
    assert marker.exists()
    marker.unlink()
    node = make_node(tmp_path)
    append(node, 1, 0, [entry(node, b"p2", 2, 1), (poisoned, 3, 1), entry(node, b"p4", 4, 1)], commit=1)
    append(node, 4, 1, [], commit=4)
    node.tick(0)
    assert not marker.exists()
    assert node.status()["refused_entries"] == 1 and not node.fatal
    assert node.syncobj.raftLastApplied == 4
    assert node._replica._sm.applied == [b"p2", b"p4"]  # every replica skips the same entry


def test_a_split_append_is_dropped_unread(tmp_path):
    # pysyncobj joins the parts of a split entry and unpickles them (syncobj.py:960-977);
    # our members never split one, so a split append is refused whole.
    node = make_node(tmp_path)
    fill_follower(node, last=2)
    whole = ps_pickle.dumps(entry(node, b"p3", 3, 1))
    before = log_of(node)
    for part, data in (("start", whole[:10]), ("finish", whole[10:])):
        node.syncobj._SyncObj__onMessageReceived(TCPNode(LEADER), {
            "type": "append_entries", "transmission": part, "data": data, "term": 1,
            "commit_index": 1, "prevLogIdx": 2, "prevLogTerm": 1,
        })
    assert log_of(node) == before
    assert node.status()["refused_peer_messages"] == 2


@pytest.mark.parametrize("forged", [
    "wrong-method-id", "two-arguments", "text-argument", "keyword-arguments", "not-a-tuple",
    "membership", "code-version", "not-a-pickle", "a-pickled-call-of-apply", "typed-but-another-version", "empty",
])
def test_a_committed_entry_no_member_writes_is_skipped(tmp_path, forged):
    # Stock pysyncobj calls whatever method id and arguments an entry names
    # (syncobj.py:894-907): these raised inside apply and stopped every member.
    node = make_node(tmp_path)
    apply_id = 0  # what stock pysyncobj numbers Replica.apply (its one replicated method)
    body = {
        "wrong-method-id": b"\x00" + ps_pickle.dumps((apply_id + 1000, (b"x",))),
        "two-arguments": b"\x00" + ps_pickle.dumps((apply_id, (b"x", b"y"))),
        "text-argument": b"\x00" + ps_pickle.dumps((apply_id, ("x",))),
        "keyword-arguments": b"\x00" + ps_pickle.dumps((apply_id, (b"x",), {"index": 1})),
        "not-a-tuple": b"\x00" + ps_pickle.dumps(apply_id),
        "membership": b"\x02" + ps_pickle.dumps(["rem", "127.0.0.12:4001", "127.0.0.12:4001"]),
        "code-version": b"\x03" + ps_pickle.dumps(7),
        "not-a-pickle": b"\x00garbage",
        "a-pickled-call-of-apply": b"\x00" + ps_pickle.dumps((apply_id, (b"x",))),  # typed entries only now
        "typed-but-another-version": b"\x00\x02" + b"x",
        "empty": b"",
    }[forged]
    append(node, 1, 0, [entry(node, b"p2", 2, 1), (body, 3, 1), entry(node, b"p4", 4, 1)], commit=1)
    append(node, 4, 1, [], commit=4)
    node.tick(0)
    assert node.status()["refused_entries"] == 1 and not node.fatal
    assert node._replica._sm.applied == [b"p2", b"p4"]


def test_no_compaction_starts_while_the_state_machine_defers_snapshots(tmp_path):
    """A restore staged in chunks: a snapshot would hold the staged chunks, the very bytes of
    the entries it replaces, so the journal grows past its compaction bound until the
    staging ends, then compacts."""

    class Staging(ListMachine):
        snapshot_deferred = True

    machine = Staging()
    node = make_node(tmp_path, machine=machine, log_compaction_min_bytes=1_000)
    payloads = [b"x" * 600 for _ in range(6)]
    append(node, 1, 0, [entry(node, p, i, 1) for i, p in enumerate(payloads, start=2)], commit=7)
    for _ in range(3):
        node.tick(0)
    assert len(machine.applied) == 6
    assert log_of(node)[0][0] == 1, "compacted while snapshots were deferred"
    machine.snapshot_deferred = False
    node.tick(0)
    node.tick(0)  # the snapshot is collected (the journal head moves) at the next tick
    assert log_of(node)[0][0] > 1, "never compacted once snapshots were allowed again"


def test_a_vote_from_another_cluster_is_refused_counted_and_logged(tmp_path, caplog, monkeypatch):
    """A member of another cluster (two clusters' members pointed at each other, or a data dir
    from another cluster) is refused: no vote, no term change, a log line and a count, which
    the server exports as fencing_raft_refused_cluster_ids (test_metrics shows the series)."""
    from coordinator.raft import member_gate, transport
    from coordinator.raft.membership import Configuration, Member

    # A limiter of its own: the module's one is shared by every test in this process, and a
    # warning another test logged within the last second would suppress this test's line.
    monkeypatch.setattr(member_gate, "peer_warnings", transport.PeerWarnings(transport.log, 1_000))
    node = make_node(tmp_path)
    so = node.syncobj
    config = Configuration("cluster-a", (
        Member("m1", SELF, node.identity.incarnation),
        Member("m2", LEADER, PEER_INCARNATIONS[LEADER]),
        Member("m3", OTHER, PEER_INCARNATIONS[OTHER]),
    ))
    node.tick()  # loads the (empty) snapshot: the configuration below the log is known
    append(node, 1, 0, [(config.encode_entry(), 2, 1)], commit=2)  # after pysyncobj's initial entry
    assert so.config() == config
    term_before = so.raftCurrentTerm
    caplog.set_level("WARNING")
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {
        "type": "request_vote", "term": term_before + 5, "last_log_index": 10, "last_log_term": term_before + 4,
        "cluster": "cluster-b",
    })
    assert node.status()["refused_cluster_ids"] == 1
    assert so.raftCurrentTerm == term_before  # dropped before pysyncobj saw its term
    assert "belongs to cluster cluster-b, this member to cluster cluster-a" in caplog.text
    # Nor can another cluster's leader overwrite the log with an append.
    log_before = log_of(node)
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {
        "type": "append_entries", "term": term_before + 5, "commit_index": 3, "prevLogIdx": 1, "prevLogTerm": 0,
        "entries": [entry(node, b"theirs", 2, term_before + 5)], "cluster": "cluster-b",
    })
    assert node.status()["refused_cluster_ids"] == 2
    assert log_of(node) == log_before and so.raftCurrentTerm == term_before
    # The same vote naming this cluster is not refused for its cluster id.
    so._SyncObj__onMessageReceived(TCPNode(OTHER), {
        "type": "request_vote", "term": term_before + 5, "last_log_index": 10, "last_log_term": term_before + 4,
    })
    assert node.status()["refused_cluster_ids"] == 2


def test_nothing_is_applied_while_a_snapshot_reads_the_state(tmp_path):
    """snapshot_writer.py: from the tick that starts a snapshot until its writer thread has
    read the last piece, committed entries wait in the journal, so the file holds exactly
    the state at its last index; they are applied once the read is done."""
    node = make_node(tmp_path)
    writer = node.syncobj._snapshot_writer()
    assert writer is not None and writer.inline, "a node ticked by hand writes on its own thread"
    fill_follower(node, last=5, commit=3)
    node.tick(0)
    applied = list(node.state_machine.applied)
    writer.capturing = True  # as between BackgroundSerializer.serialize and its captured()
    append(node, 5, 1, [], commit=5)
    node.tick(0)
    assert node.state_machine.applied == applied
    assert node.syncobj._SyncObj__raftCommitIndex == 5
    writer.capturing = False
    node.tick(0)
    assert len(node.state_machine.applied) == len(applied) + 2


def test_a_member_without_configuration_stops_campaigning_once_a_peer_shows_a_cluster(tmp_path):
    """A wiped member (no configuration, allowed to bootstrap) whose peers are configured: each
    campaign is refused and raised its term past the cluster's, until the cluster's leader could
    not reach it any more (test_member_identity). Once a peer's message names a cluster it
    stands for no election, and its term stays where the cluster's leader can reach it."""
    node = make_node(tmp_path)
    so = node.syncobj
    transport = so._SyncObj__transport
    for peer in (LEADER, OTHER):
        transport._onNodeConnected(TCPNode(peer))
    node.tick(0)  # loads (nothing): the gate decides from here on
    assert so.is_voter(), "before any peer shows a cluster it may bootstrap"
    so._SyncObj__raftElectionDeadline = 0
    node.tick(0)
    campaigned = so.raftCurrentTerm
    assert campaigned >= 1
    # A configured peer campaigns too: its vote request carries its cluster id.
    so._SyncObj__onMessageReceived(TCPNode(LEADER), {
        "type": "request_vote", "term": campaigned, "last_log_index": 0, "last_log_term": 0,
        "cluster": "c" * 32, "incarnation": PEER_INCARNATIONS[LEADER]})
    assert not so.is_voter()
    for _ in range(5):
        so._SyncObj__raftElectionDeadline = 0
        node.tick(0)
    assert so.raftCurrentTerm == campaigned, "no campaign raised the term"

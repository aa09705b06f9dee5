"""Term and vote are durable or the member stops (issue 26, fencing coordinator point 2).

Every write a term change makes (the journal's sync of entries appended before it, then
``raft.meta``: tmp open, write, fsync, rename, directory fsync) is failed with EMFILE and with
ENOSPC, for each way a term changes (a vote request from a higher term, the member's own
election, an append from a higher-term leader). Each time: the fatal handler fires once with
EXIT_DISK_FAILED and a message naming the file and the error; the term and vote in memory are
the saved ones; ``raft.meta`` still holds them; no message reflecting the unsaved term was sent.

Then the guarded tick: anything escaping a tick of the auto-tick thread (pysyncobj logged it
and ticked on, syncobj.py:594-597) stops the member, once, with the code its kind means.

Nodes are those of test_raft_overrides.py (a recording transport, messages injected); the
faults are injected into the journal module's ``os`` and the journal's fsync functions, because
a real disk cannot be made to refuse one chosen step of one write.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from pysyncobj import SyncObj
from pysyncobj.node import TCPNode

from coordinator.raft import journal as journal_module
from coordinator.raft import journal_file
from coordinator.raft.fatal import EXIT_APPLY_FAILED, EXIT_DISK_FAILED, exit_code_for, once
from coordinator.raft.journal import JOURNAL_NAME, META_NAME, read_meta
from coordinator.raft.node import RaftConfig, RaftNode
from tests.test_raft_overrides import (
    LEADER,
    OTHER,
    SELF,
    Fatal,
    ListMachine,
    RecordingTransport,
    append,
    as_peers_send_it,
    entry,
    fill_follower,
    make_node,
)
from testsupport.supervisor import wait_until

ERRNOS = [errno.EMFILE, errno.ENOSPC]
# Each step of a term change that writes, and the file its failure must name.
STEPS = {
    "journal_sync": JOURNAL_NAME,  # entries appended before the term change are synced first
    "open": META_NAME + ".tmp",
    "write": META_NAME + ".tmp",
    "fsync": META_NAME + ".tmp",
    "rename": META_NAME,
    "dir_fsync": "",  # the data directory itself: checked below
}
# How long a test waits for the auto-tick thread to get somewhere (it ticks every 50 ms).
TICK_THREAD_WAIT_S = 10.0


class FailingOs:
    """The journal modules' ``os``, failing one step of the ``raft.meta`` write (or a journal
    append) with ``err``; everything else goes to the real ``os``."""

    def __init__(self, step: str, err: int):
        self.step, self.err = step, err
        self.paths: dict[int, str] = {}  # fd -> path, of files opened through here
        self.failed = 0

    def __getattr__(self, name):
        return getattr(os, name)

    def _fail(self, *names):
        self.failed += 1
        raise OSError(self.err, os.strerror(self.err), *names)

    def open(self, path, flags, mode=0o777):
        if self.step == "open" and path.endswith(META_NAME + ".tmp"):
            self._fail(path)
        fd = os.open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def pwrite(self, fd, data, offset):
        path = self.paths.get(fd, "")
        if self.step == "write" and path.endswith(META_NAME + ".tmp"):
            self._fail()
        if self.step == "append" and fd == self.journal_fd:
            self._fail()
        return os.pwrite(fd, data, offset)

    def replace(self, src, dst):
        if self.step == "rename" and dst.endswith(META_NAME):
            self._fail(src, None, dst)
        return os.replace(src, dst)

    def fsync(self, fd):
        path = self.paths.get(fd, "")
        if self.step == "fsync" and path.endswith(META_NAME + ".tmp"):
            self._fail()
        if self.step == "dir_fsync" and os.path.isdir(path):
            self._fail()
        return os.fsync(fd)

    def fdatasync(self, fd):
        if self.step == "journal_sync":
            self._fail()
        return os.fdatasync(fd)

    journal_fd = -1


def inject(monkeypatch, node, step: str, err: int) -> FailingOs:
    failing = FailingOs(step, err)
    failing.journal_fd = node.journal._fd
    monkeypatch.setattr(journal_module, "os", failing)
    monkeypatch.setattr(journal_file, "os", failing)  # the meta file's writes and the appends' pwrite
    monkeypatch.setattr(node.journal, "_fsync", failing.fsync)
    monkeypatch.setattr(node.journal, "_fdatasync", failing.fdatasync)
    return failing


def sent(node):
    return node.syncobj._SyncObj__transport.sent


def saved_term(node):
    return read_meta(os.path.join(node.config.data_dir, META_NAME))


def follower_at_term_1(tmp_path):
    """A follower of LEADER in term 1 holding entries 1..3, synced, raft.meta at term 1."""
    node = make_node(tmp_path)
    fill_follower(node, last=3)
    node.tick(0)
    assert saved_term(node) == (1, None)
    return node


# How a term changes. Each returns what it calls, so the test can expect Fatal from it.
def vote_request(node):
    # A vote of a later term is weighed only once the member's vote window has passed since it
    # last heard its leader (RAFT.md "Lease reads"; within it the request is dropped and no
    # term moves): here that leader has been silent for an hour.
    node.syncobj._leader_heard_at -= 3600
    return lambda: node.syncobj._SyncObj__onMessageReceived(
        TCPNode(OTHER), {"type": "request_vote", "term": 5, "last_log_index": 99, "last_log_term": 1})


def own_election(node):
    so = node.syncobj
    for peer in (LEADER, OTHER):
        so._SyncObj__transport._onNodeConnected(TCPNode(peer))
    so._SyncObj__raftElectionDeadline = 0
    return lambda: node.tick(0)


def higher_term_append(node):
    return lambda: append(node, 3, 1, [], commit=1, term=5)


TRIGGERS = {"vote_request": vote_request, "own_election": own_election, "higher_term_append": higher_term_append}


@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("trigger", list(TRIGGERS))
def test_a_term_that_cannot_be_saved_stops_the_member_before_it_is_held(tmp_path, monkeypatch, trigger, step, err):
    node = follower_at_term_1(tmp_path)
    so = node.syncobj
    # An entry appended and not yet synced: the term change must sync it first (journal.py).
    append(node, 3, 1, [entry(node, b"p4", 4, 1)], commit=1)
    run = TRIGGERS[trigger](node)
    term, vote = so.raftCurrentTerm, so._SyncObj__votedForNodeId
    before = len(sent(node))
    failing = inject(monkeypatch, node, step, err)

    with pytest.raises(Fatal):
        run()

    assert failing.failed == 1, "the step was never reached"
    assert len(node.fatal) == 1, node.fatal
    message, code = node.fatal[0]
    assert code == EXIT_DISK_FAILED
    assert os.strerror(err) in message
    named = os.path.join(node.config.data_dir, STEPS[step]).rstrip(os.sep)
    assert repr(named)[1:-1] in message or named in message, message
    # Nothing in memory moved, and nothing went out in (or because of) the unsaved term.
    assert (so.raftCurrentTerm, so._SyncObj__votedForNodeId) == (term, vote) == (1, None)
    assert not [m for _, m in sent(node)[before:] if m.get("term", 0) > term or
                m["type"] in ("request_vote", "response_vote")], sent(node)[before:]
    monkeypatch.undo()
    if step == "dir_fsync":
        # Renamed into place, the rename not yet durable: either file may survive a power cut,
        # and a saved term the member never acted in is safe (it only refuses older ones).
        assert saved_term(node)[0] in (1, 2 if trigger == "own_election" else 5)
    else:
        assert saved_term(node) == (1, None)


def test_stock_pysyncobj_holds_a_term_it_failed_to_save(tmp_path, monkeypatch):
    """Why the override exists: pysyncobj's own __setCurrentTerm changes the term in memory
    first, so a failed write leaves the member in a term raft.meta never held."""
    node = follower_at_term_1(tmp_path)
    so = node.syncobj
    inject(monkeypatch, node, "open", errno.EMFILE)
    with pytest.raises(OSError):
        SyncObj._SyncObj__setCurrentTerm(so, 5, None)
    assert so.raftCurrentTerm == 5
    monkeypatch.undo()
    assert saved_term(node) == (1, None)


def test_a_saved_term_is_held_and_survives_a_restart(tmp_path):
    node = follower_at_term_1(tmp_path)
    vote_request(node)()
    assert (node.syncobj.raftCurrentTerm, node.syncobj._SyncObj__votedForNodeId) == (5, OTHER)
    assert saved_term(node) == (5, OTHER)
    assert sent(node)[-1][1]["type"] == "response_vote"
    node.close()
    again = make_node(tmp_path)
    assert (again.syncobj.raftCurrentTerm, again.syncobj._SyncObj__votedForNodeId) == (5, OTHER)


# -- the guarded tick -------------------------------------------------------------------


def ticking_node(tmp_path):
    """A node whose auto-tick thread runs, as in a real member (the guard is on)."""
    fatal = []

    def on_fatal(message, code):
        fatal.append((message, code))
        raise Fatal(message)

    config = RaftConfig(SELF, (LEADER, OTHER), str(tmp_path / "t"))
    node = RaftNode(config, ListMachine(), on_fatal=on_fatal, transport_class=RecordingTransport)
    node.fatal = fatal
    as_peers_send_it(node.syncobj)
    return node


def on_tick_thread(node, work):
    """Run ``work`` once inside a tick of the auto-tick thread, as a message arriving there is."""
    runs = []

    def once_per_node():
        if not runs:
            runs.append(1)
            work()

    node.syncobj.addOnTickCallback(once_per_node)
    wait_until(lambda: runs, TICK_THREAD_WAIT_S, interval_s=0.01, what="a tick of the auto-tick thread")


@pytest.mark.parametrize("failure, code", [(RuntimeError("a bug"), EXIT_APPLY_FAILED),
                                            (OSError(errno.EIO, "I/O error"), EXIT_DISK_FAILED)])
def test_anything_escaping_a_tick_stops_the_member_once(tmp_path, failure, code):
    node = ticking_node(tmp_path)
    raised = []

    def broken():
        raised.append(1)
        raise failure

    try:
        node.syncobj.addOnTickCallback(broken)
        # The test's handler raises instead of exiting, so pysyncobj's loop ticks on and the
        # callback raises again each tick: only the first of those may act.
        wait_until(lambda: len(raised) >= 3, TICK_THREAD_WAIT_S, interval_s=0.01, what="three failed ticks")
        assert len(node.fatal) == 1, node.fatal
        assert node.fatal[0][1] == code and str(failure) in node.fatal[0][0]
    finally:
        node.syncobj.removeOnTickCallback(broken)
        node.close()


@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
def test_a_journal_append_that_fails_on_the_tick_thread_stops_the_member(tmp_path, monkeypatch, err):
    node = ticking_node(tmp_path)
    try:
        on_tick_thread(node, lambda: fill_follower(node, last=3))
        wait_until(lambda: node.journal.synced_length == node.journal._end, TICK_THREAD_WAIT_S,
                   interval_s=0.01, what="the first entries synced")
        failing = inject(monkeypatch, node, "append", err)
        acks_before = len(sent(node))
        # pysyncobj would log "failed _onTick" and carry on, with no entry 4 and no error.
        on_tick_thread(node, lambda: append(node, 3, 1, [entry(node, b"p4", 4, 1)], commit=1))
        wait_until(lambda: node.fatal, TICK_THREAD_WAIT_S, interval_s=0.01, what="the fatal handler")
        assert failing.failed == 1
        assert len(node.fatal) == 1, node.fatal
        message, code = node.fatal[0]
        assert code == EXIT_DISK_FAILED and os.strerror(err) in message
        assert os.path.join(node.config.data_dir, JOURNAL_NAME) in message
        assert not [m for _, m in sent(node)[acks_before:] if m["type"] == "next_node_idx" and m["success"]
                    and m["next_node_idx"] > 4]
    finally:
        monkeypatch.undo()
        node.close()


# -- fatal.py ------------------------------------------------------------------------------


def test_exit_codes_by_kind():
    assert exit_code_for(OSError(errno.ENOSPC, "full")) == EXIT_DISK_FAILED
    assert exit_code_for(PermissionError(errno.EACCES, "denied")) == EXIT_DISK_FAILED
    assert exit_code_for(RuntimeError("bug")) == EXIT_APPLY_FAILED
    assert exit_code_for(KeyError("bug")) == EXIT_APPLY_FAILED


def test_once_lets_only_the_first_fatal_act_and_later_ones_wait_for_it():
    calls = []
    release = threading.Event()

    def handler(message, code):
        calls.append(message)
        release.wait(TICK_THREAD_WAIT_S)

    fatal = once(handler)
    assert once(fatal) is fatal
    first = threading.Thread(target=fatal, args=("first", 71))
    first.start()
    wait_until(lambda: calls, TICK_THREAD_WAIT_S, interval_s=0.01, what="the first fatal")
    second_done = threading.Event()
    second = threading.Thread(target=lambda: (fatal("second", 70), second_done.set()))
    second.start()
    # The second waits while the first is under way (the default handler never ends: it exits).
    assert not second_done.wait(0.2)
    release.set()
    first.join(TICK_THREAD_WAIT_S)
    second.join(TICK_THREAD_WAIT_S)
    assert second_done.is_set() and calls == ["first"]


def test_default_fatal_from_two_threads_prints_one_line_and_exits_with_the_first_code():
    program = textwrap.dedent("""
        import threading
        from coordinator.raft.fatal import default_fatal
        go = threading.Barrier(3)
        def fail(name, code):
            go.wait()
            default_fatal(name + " failed", code)
        for name, code in (("disk", 71), ("apply", 70)):
            threading.Thread(target=fail, args=(name, code)).start()
        go.wait()
        threading.Event().wait(30)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("FATAL: "), done.stderr
    assert done.returncode == (71 if "disk" in lines[0] else 70)
    assert f"(exit {done.returncode})" in lines[0]

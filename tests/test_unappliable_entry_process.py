"""An entry a member cannot apply stops it: exit 70 and one log line, never a refusal
(DESIGN §8 "Rolling upgrades"). Three real member processes (testsupport/node_process.py:
a RaftNode and the state machine, with the default fatal handler) are sent, past every check
a fencingd member makes before proposing, an entry with an op no build knows -- what an
entry of a later build looks like to this one. Every member that applies it stops at it, with
one line saying which entry and why, and stops again at it when started again; none serves
on with a state the others lack.
"""

from __future__ import annotations

import msgpack

from coordinator.core import commands
from coordinator.raft.fatal import EXIT_APPLY_FAILED
from testsupport.cluster import ProcessCluster
from testsupport.supervisor import wait_until

UNKNOWN_OP = 99  # no build has it (commands.Op): an op of a later entry level
STOP_TIMEOUT_S = 20.0


def test_an_entry_of_an_unknown_op_stops_every_member_with_exit_70_and_one_line(tmp_path):
    assert UNKNOWN_OP not in set(commands.Op)
    with ProcessCluster(str(tmp_path)) as cluster:
        cluster.start_all()
        leader = cluster.wait_for_leader()
        node = cluster.nodes[leader]
        good = commands.acquire(resource="r", holder="h", ttl_ms=10_000, op_id=b"o" * 16, stamp_ms=0)
        assert node.call({"op": "propose", "cmd": good.encode()})["outcome"] == "applied"
        entry = msgpack.packb([commands.FORMAT_VERSION, UNKNOWN_OP, 0, {}], use_bin_type=True)
        try:
            reply = node.call({"op": "propose_raw", "entry": entry, "timeout_s": 5.0})
        except (OSError, EOFError, ValueError) as exc:
            reply = {"no answer": repr(exc)}  # the member may stop before it answers
        try:
            # A majority applies it and stops (a member that had not learned the entry was
            # committed is left without a quorum, before it: it applies nothing more).
            wait_until(lambda: sum(n.proc.poll() is not None for n in cluster.nodes) >= 2, STOP_TIMEOUT_S,
                       what="a majority to stop at the entry")
            stopped = [n.index for n in cluster.nodes if n.proc.poll() is not None]
            first = {i: cluster.nodes[i].proc.returncode for i in stopped}
            # Started again, a member meets the same entry once a quorum is back, and stops again
            # (deploy/'s units do not restart on 70: no crash loop there).
            for i in stopped:
                cluster.start(i, wait=False)
            wait_until(lambda: any(cluster.nodes[i].proc.poll() is not None for i in stopped), STOP_TIMEOUT_S,
                       what="a member started again to stop at the entry again")
            again = {i: cluster.nodes[i].proc.returncode for i in stopped if cluster.nodes[i].proc.poll() is not None}
        except TimeoutError:
            print(reply, cluster.logs())
            raise
        now = [n.proc.poll() for n in cluster.nodes]  # before the logs: a line only follows a stop
        logs = [open(n.log_path, encoding="utf-8", errors="replace").read() for n in cluster.nodes]
    assert set(first.values()) == {EXIT_APPLY_FAILED} and set(again.values()) == {EXIT_APPLY_FAILED}, (first, again)
    assert all(code in (None, EXIT_APPLY_FAILED) for code in now), now
    for i, log in enumerate(logs):
        fatal = [line for line in log.splitlines() if "FATAL" in line]
        # One line per stop, none for a run still going when the code was read (the run
        # after may have stopped by the time the log was read: at most one more).
        stops = (i in first) + (now[i] == EXIT_APPLY_FAILED)
        assert stops <= len(fatal) <= stops + (now[i] is None), (i, now, log)
        for line in fatal:
            assert "UnappliableEntry('log entry 5 " in line and f"unknown op {UNKNOWN_OP}" in line, line
            assert "(exit 70)" in line, line

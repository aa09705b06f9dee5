"""Read-index reads (coordinator/raft/read_index.py, RAFT.md "Read-index reads") on real members.

- A follower echoes the term and round of the append each acknowledgement answers, and only
  for an append it accepted (a fake leader, testsupport.raft_peer, drives one node).
- On three ``fencingd serve`` members: a read after an acknowledged write sees it, on the
  leader by its lease or a confirmation round (no log entry) and on a follower through the log.
- An isolated leader that still believes it leads (its leader fallback is longer than the
  test) never answers a read from its stale state once the others elected a new leader and
  acknowledged a newer write: without a majority it cannot confirm a round.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft.node import RaftConfig, RaftNode
from testsupport.grpc_cluster import metered_cluster
from testsupport.raft_peer import RaftPeer
from testsupport.supervisor import pick_ports, wait_until

NO_ELECTION_S = 60.0
RPC_S = 5.0
# The isolated leader's read: long enough for a round to be confirmed many times over on a
# loaded machine, were there a majority to confirm it.
STALE_READ_S = 3.0


# -- a follower's echo --------------------------------------------------------------------------


@pytest.fixture
def follower(tmp_path):
    """(node, fake leader connected to it, the fake leader's term)."""
    port, _ = pick_ports(("127.0.0.2",))
    leader_address = f"127.0.0.3:{port}"  # above the node's: it does not dial it
    config = RaftConfig(f"127.0.0.2:{port}", (leader_address, f"127.0.0.4:{port}"), str(tmp_path / "n"),
                        raft_min_timeout_s=NO_ELECTION_S, raft_max_timeout_s=2 * NO_ELECTION_S)
    node = RaftNode(config, FencingStateMachine())
    wait_until(node.listening, 10, what="the node to listen")
    last = node.syncobj._SyncObj__raftLog[-1]
    peer = RaftPeer(config.self_address).name(leader_address)
    try:
        yield node, peer, last, last[2] + 1
    finally:
        peer.close()
        node.close()


def append(last, term: int, **extra) -> dict:
    return {"type": "append_entries", "term": term, "commit_index": 0, "prevLogIdx": last[1],
            "prevLogTerm": last[2], "entries": (), "cluster": None, "incarnation": 42, **extra}


def next_ack(peer) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = peer.receive(deadline - time.monotonic())
        if isinstance(message, dict) and message["type"] == "next_node_idx":
            return message
    raise AssertionError("no acknowledgement within 10 s")


def test_a_follower_echoes_the_term_and_round_of_the_append_it_answers(follower):
    node, peer, last, term = follower
    peer.send(peer.frame(append(last, term, read_seq=5)))
    ack = next_ack(peer)
    assert ack["success"] and (ack["read_term"], ack["read_seq"]) == (term, 5)
    peer.send(peer.frame(append(last, term)))  # an append without a round: nothing echoed
    ack = next_ack(peer)
    assert ack["success"] and "read_seq" not in ack and "read_term" not in ack
    peer.send(peer.frame(append(last, term, read_seq=3)))  # rounds echo what this append carried
    assert next_ack(peer)["read_seq"] == 3
    # An append of an older term is not accepted, so it is not answered at all: never echoed.
    peer.send(peer.frame(append(last, term - 1, read_seq=9)), peer.frame(append(last, term, read_seq=4)))
    ack = next_ack(peer)
    assert (ack["read_term"], ack["read_seq"]) == (term, 4)


# -- three real members -----------------------------------------------------------------------

# An isolated leader keeps leading this long (stock pysyncobj: 30 s): the case a read-index
# read must survive. The members' raft port traffic is cut by an nft table of the test's own.
SETTINGS = {"leader_fallback_timeout_s": 30.0}
needs_nft = pytest.mark.skipif(
    os.geteuid() != 0 or subprocess.run(["which", "nft"], capture_output=True).returncode != 0,
    reason="needs root and nft",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from metered_cluster(str(tmp_path_factory.mktemp("read-index")), request, settings=SETTINGS)


def metric(cluster, index: int, name: str) -> float:
    with urllib.request.urlopen(cluster.metrics_urls[index], timeout=RPC_S) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} series")


def rounds_sent(cluster, index: int) -> float:
    return metric(cluster, index, "fencing_raft_read_index_rounds_total")


def lease_reads(cluster, index: int) -> float:
    return metric(cluster, index, "fencing_raft_lease_reads_total")


def acquire(node, resource: str) -> int:
    return node.lease.Acquire(
        pb.AcquireRequest(resource=resource, holder="t", ttl_ms=120_000, op_id=os.urandom(16)), timeout=RPC_S
    ).token


def write(node, resource: str, token: int, value: bytes) -> None:
    node.store.Write(
        pb.WriteRequest(resource=resource, key="k", value=value, token=token, op_id=os.urandom(16)), timeout=RPC_S
    )


def read(node, resource: str, timeout_s: float = RPC_S) -> bytes:
    return node.store.Read(pb.ReadRequest(resource=resource, key="k"), timeout=timeout_s).value


def test_a_read_after_an_acknowledged_write_sees_it_on_every_member(cluster):
    leader_i = cluster.wait_ready()
    leader = cluster.nodes[leader_i]
    followers = [n for n in cluster.nodes if n.index != leader_i]
    token = acquire(leader, "ri/a")
    before = rounds_sent(cluster, leader_i) + lease_reads(cluster, leader_i)
    for n in range(20):
        writer = (leader, *followers)[n % 3]
        write(writer, "ri/a", token, b"v%d" % n)
        for reader in (leader, *followers):  # the leader by a round, followers through the log
            assert read(reader, "ri/a") == b"v%d" % n
    described = leader.lease.Describe(pb.DescribeRequest(resource="ri/a"), timeout=RPC_S)
    assert described.held and described.token == token
    # The leader's 20 reads and a Describe went by its lease or confirmation rounds, not entries.
    assert rounds_sent(cluster, leader_i) + lease_reads(cluster, leader_i) - before >= 21


@needs_nft
def test_an_isolated_leader_never_answers_from_its_stale_state(cluster):
    old_i = cluster.wait_ready()
    old = cluster.nodes[old_i]
    others = [n for n in cluster.nodes if n.index != old_i]
    token = acquire(old, "ri/stale")
    write(old, "ri/stale", token, b"old")
    assert read(old, "ri/stale") == b"old"
    table = f"read_index_{os.getpid()}"
    nft = lambda *args: subprocess.run(["nft", *args], check=True, capture_output=True, timeout=10)  # noqa: E731
    nft("add", "table", "inet", table)
    nft("add", "chain", "inet", table, "input", "{ type filter hook input priority 0 ; policy accept ; }")
    try:
        for other in others:
            for src, dst in ((old, other), (other, old)):
                for direction in ("dport", "sport"):
                    nft("add", "rule", "inet", table, "input", "ip", "saddr", src.host, "ip", "daddr", dst.host,
                        "tcp", direction, str(cluster.raft_port), "drop")

        def new_leader():
            for status in cluster.statuses(nodes=others).values():
                if status.leader and status.leader != old.raft_address:
                    return (cluster.index_of_raft(status.leader),)
            return None

        new_i = wait_until(new_leader, 20, interval_s=0.2, what="the majority to elect a new leader")[0]
        write(cluster.nodes[new_i], "ri/stale", token, b"new")  # acknowledged by the new majority
        # The case that matters: it still believes it leads, so its reads take the read-index path.
        assert metric(cluster, old_i, "fencing_raft_is_leader") == 1
        try:
            value = read(old, "ri/stale", STALE_READ_S)
        except grpc.RpcError as exc:
            # It cannot confirm a round, so it answers nothing: OUTCOME_UNKNOWN at the deadline (as
            # the READ_BARRIER entry answers), the client's own deadline, or no leader.
            assert exc.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.ABORTED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ), exc
        else:
            assert value == b"new", f"the isolated leader answered {value!r} after the new leader acknowledged b'new'"
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=10)
    cluster.wait_ready(60)
    assert read(old, "ri/stale") == b"new"

"""Members that find each other by name: a name that moves, and a name that does not resolve yet.

Real ``fencingd serve`` processes with the Raft secret, whose Raft addresses are host names in
/etc/hosts (testsupport/hosts_file.py: a block of lines of our own, rewritten in place, cut off
afterwards), each pointing at a loopback address of its own; the API stays on 127.0.0.51-.53.
A member "restarted under a new IP" is killed, its name pointed at 127.0.0.61, and started
again: it binds (listens and dials from) the new address, as a re-created pod does. Loopback
addresses and the hosts file, not network namespaces: this machine's sandbox has no netns,
every 127.0.0.0/8 address is bindable, and the system resolver reads the hosts file on every
lookup as it would ask DNS. The addresses .51-.53 and .61 are used by no other test.
Editing /etc/hosts needs root: without it these tests fail, saying so.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import subprocess
import threading
import time
from itertools import pairwise

import pytest
from pysyncobj.tcp_connection import CONNECTION_STATE

from chaos.check import check_file, format_report
from chaos.history import read_history
from chaos.workload import run_client, write_final_states
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft import limits as raft_limits
from coordinator.raft.node import RaftConfig, RaftNode
from coordinator.server.fencingd import port_free
from testsupport.grpc_cluster import SERVING, TEST_SETTINGS, GrpcCluster, GrpcNode
from testsupport.hosts_file import HOSTS_PATH, HostNames
from testsupport.supervisor import pick_ports, wait_until

NAME_IPS = ("127.0.0.51", "127.0.0.52", "127.0.0.53")
MOVED_IP = "127.0.0.61"
# "Within a few seconds": a peer retries every connection_retry_s (0.5 s) with a fresh lookup;
# the restarted member then needs an election timeout at most and a read barrier to be SERVING.
REJOIN_BOUND_S = 10.0
RESOURCES = ("mv-r0", "mv-r1", "mv-r2")


@pytest.fixture(autouse=True)
def _hosts_writable():
    if not os.access(HOSTS_PATH, os.W_OK):
        pytest.fail(f"these tests point test names at loopback addresses in {HOSTS_PATH}: run them as root")


@pytest.fixture
def names() -> tuple[str, ...]:
    tag = f"fnc{os.getpid()}{secrets.token_hex(3)}"  # never the name of another run's member
    return tuple(f"{tag}-n{i}.invalid" for i in range(3))


class NamedCluster(GrpcCluster):
    """Three members whose Raft addresses are ``names`` (the lowest name is dialled by both
    others: pysyncobj's higher address dials); each API on its own fixed loopback address."""

    def __init__(self, base_dir: str, names: tuple[str, ...], **kwargs):
        self.names = names
        secret_path = os.path.join(base_dir, "raft-secret")
        os.makedirs(base_dir, exist_ok=True)
        fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        settings = {**TEST_SETTINGS, "raft_secret_file": secret_path}
        super().__init__(base_dir, hosts=NAME_IPS, settings=settings, **kwargs)

    def node_class(self, index, host, raft_port, api_port, base_dir, credentials):
        node = GrpcNode(index, host, raft_port, api_port, base_dir, credentials)
        node.raft_address = f"{self.names[index]}:{raft_port}"
        return node


def _log(node) -> str:
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def test_member_starts_before_its_own_name_resolves(tmp_path, names):
    """The own name does not resolve at start: the member says so once, stays up and out, and
    joins once the name resolves. (Before: it died at start with ``TypeError: inet_aton()
    argument 1 must be str, not None``.) The cluster is formed first: a brand-new cluster
    bootstraps only with every initial member (RAFT.md "Member identity"), so a member whose name
    never resolved could not be left out of the first election; here it restarts while its name
    is gone, as a re-created pod does before its DNS record is published."""
    with HostNames({names[i]: NAME_IPS[i] for i in range(3)}) as hosts, \
            NamedCluster(str(tmp_path / "cluster"), names) as cluster:
        try:
            for i in range(3):
                cluster.spawn(i)
            cluster.wait_answering([0, 1, 2], timeout_s=30.0)
            cluster.kill(0)
            hosts.set(names[0], None)
            cluster.spawn(0)
            cluster.wait_answering([1, 2], timeout_s=30.0)  # two of three: a quorum without it
            late = cluster.nodes[0]
            line = f"raft: own address (raft_address) {names[0]} does not resolve"

            def said_so():
                late.check_running()  # MemberExited at once if it died (it did, before)
                return line in _log(late)

            wait_until(said_so, 10.0, what="the member to log that its own name does not resolve")
            # Its peers retry every 0.5 s meanwhile; each said it once, not per attempt.
            wait_until(lambda: f"raft: peer {names[0]} does not resolve" in _log(cluster.nodes[1]), 5.0,
                       what="a peer to log that the name does not resolve")
            assert late.health_status() != SERVING
            hosts.set(names[0], NAME_IPS[0])
            started = time.monotonic()
            cluster.wait_answering([0], timeout_s=REJOIN_BOUND_S)
            print(f"joined {time.monotonic() - started:.2f} s after its name resolved")
            assert _log(late).count(line) == 1
            assert _log(cluster.nodes[1]).count(f"raft: peer {names[0]} does not resolve") == 1
            assert f"raft: own address (raft_address) {names[0]} resolves again, to {NAME_IPS[0]}" in _log(late)
            assert f"raft: listening on {late.raft_address} ({NAME_IPS[0]})" in _log(late)
            assert "raft: quorum reached" in _log(late)
        except BaseException:
            print(cluster.logs())
            raise


def _acknowledged(paths) -> int:
    count = 0
    for path in paths:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                count += sum('"outcome":"ok"' in line for line in f)
    return count


def _longest_gap_s(paths, since_ns: int) -> float:
    """The longest time after ``since_ns`` between two acknowledged operations of any client."""
    ends = sorted(op.complete_ns for path in paths for op in read_history(path).ops
                  if op.outcome == "ok" and op.complete_ns is not None and op.complete_ns >= since_ns)
    return max((b - a for a, b in pairwise(ends)), default=0) / 1e9


def test_member_restarted_under_a_new_address_rejoins_under_load(tmp_path, names):
    """The member every other dials is killed and restarted under a new IP while two clients
    run: it is back within seconds, and the history shows no acknowledged loss and intact
    token order. (Before: its peers kept dialling the address they had cached for 10 minutes,
    and it stayed NOT_SERVING with no Raft connection.)"""
    histories = [str(tmp_path / f"c{k}.jsonl") for k in range(2)]
    with (
        HostNames(dict(zip(names, NAME_IPS, strict=True))) as hosts,
        NamedCluster(str(tmp_path / "cluster"), names) as cluster,
    ):
        try:
            assert port_free(MOVED_IP, cluster.raft_port)
            cluster.start_all(timeout_s=30.0)
            cluster.wait_ready(timeout_s=30.0)
            stop = threading.Event()
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                clients = [pool.submit(run_client, f"c{k}", cluster.endpoints, histories[k], list(RESOURCES),
                                       k + 1, stop) for k in range(2)]
                try:
                    wait_until(lambda: _acknowledged(histories) >= 20, 30.0, what="20 acknowledged operations")
                    moved_at_ns = time.monotonic_ns()
                    cluster.kill(0)
                    hosts.set(names[0], MOVED_IP)
                    cluster.start(0)
                    cluster.wait_answering([0], timeout_s=REJOIN_BOUND_S)
                    rejoin_s = (time.monotonic_ns() - moved_at_ns) / 1e9
                    after = _acknowledged(histories)
                    wait_until(lambda: _acknowledged(histories) >= after + 20, 30.0,
                               what="20 more acknowledged operations after the rejoin")
                finally:
                    stop.set()
                    for client in clients:
                        client.result(timeout=60)
            write_final_states(cluster.endpoints, RESOURCES, str(tmp_path / "final.jsonl"))
            gap_s = _longest_gap_s(histories, moved_at_ns)
            print(f"moved member SERVING again {rejoin_s:.2f} s after the kill; longest time without an"
                  f" acknowledged operation since then: {gap_s:.2f} s")
            peer_log = _log(cluster.nodes[1])
            assert f"raft: peer {names[0]} moved from {NAME_IPS[0]} to {MOVED_IP}" in peer_log
            assert f"raft: peer {cluster.nodes[0].raft_address} connected ({MOVED_IP}:" in peer_log
            assert f"raft: peer {cluster.nodes[0].raft_address} lost" in peer_log
        except BaseException:
            print(cluster.logs())
            raise
    merged = tmp_path / "history.jsonl"
    with open(merged, "w", encoding="utf-8") as out:
        for path in [*histories, str(tmp_path / "final.jsonl")]:
            with open(path, encoding="utf-8") as f:
                out.write(f.read())
    report = check_file(str(merged))
    print(format_report(report))
    assert report.ok, format_report(report)
    assert report.summary["final_states"] == len(RESOURCES)
    assert rejoin_s < REJOIN_BOUND_S
    # The clients fail over to the other members: service is never out for long.
    assert gap_s < REJOIN_BOUND_S


# -- a connect nobody answers ------------------------------------------------------------------

SILENT_IP = "127.0.0.62"  # packets to it are dropped by an nft table of the test's own
SELF_IP = "127.0.0.63"


@pytest.fixture
def silent_address():
    """An address:port whose SYNs vanish, as an old pod IP's do once the pod is gone."""
    port, _ = pick_ports((SILENT_IP, SELF_IP))
    table = f"fencing_addr_{os.getpid()}"
    rule = f"add rule inet {table} out ip daddr {SILENT_IP} tcp dport {port} drop"
    for cmd in (f"add table inet {table}",
                f"add chain inet {table} out {{ type filter hook output priority 0; policy accept; }}", rule):
        subprocess.run(["nft", *cmd.split()], check=True, capture_output=True, timeout=10)
    try:
        yield f"{SILENT_IP}:{port}"
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=10)


def test_a_connect_nobody_answers_is_abandoned_and_retried(tmp_path, silent_address):
    """pysyncobj checks a connection's timeout only when its socket reports an event: a connect
    whose SYNs are dropped sat in CONNECTING for the kernel's SYN retries (about two minutes),
    never trying the name again. Now it is abandoned after RAFT_CONNECT_TIMEOUT_MS."""
    port = int(silent_address.rsplit(":", 1)[1])
    config = RaftConfig(f"{SELF_IP}:{port}", (silent_address, f"127.0.0.64:{port}"), str(tmp_path / "n"))
    node = RaftNode(config, FencingStateMachine())
    try:
        transport = node.syncobj._SyncObj__transport
        peer = next(n for n in transport._connections if n.address == silent_address)
        conn = transport._connections[peer]
        first = wait_until(lambda: conn.state == CONNECTION_STATE.CONNECTING and transport._lastConnectAttempt[peer],
                           10.0, what="a connect attempt waiting for an answer")
        started = time.monotonic()
        wait_until(lambda: transport._lastConnectAttempt.get(peer) != first,
                   raft_limits.RAFT_CONNECT_TIMEOUT_MS / 1000 + config.connection_retry_s + 2.0,
                   what="the unanswered connect to be abandoned and tried again")
        print(f"tried again after {time.monotonic() - started:.2f} s")
    finally:
        node.close()

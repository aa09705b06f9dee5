"""A member whose Raft port closed because an accept failed listens again (RAFT.md "Addresses
that move", the port closed under it).

pysyncobj's server closes its listening socket for good when ``accept`` fails with anything but
EAGAIN, and never binds it again. In the 30-minute soak a follower whose descriptors ran out
(chaos ``fd_exhaustion_follower``) kept running with its Raft port closed: the peers that dial
it (the higher addresses) could not reach it for minutes, until the next fault restarted it.

A real member: its soft descriptor limit lowered below what it holds (prlimit on the live
process), a connection to its Raft port (the accept fails with EMFILE, the port closes), the
limit put back; the port must accept connections again within a few seconds, the member says
so in one line and counts the loss.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import socket

import pytest

from chaos.harness import ChaosCluster
from testsupport.supervisor import wait_until

# Below what the member holds: an accept cannot get a descriptor even if a connection closes.
FD_BELOW_HELD = 4
# pysyncobj's bindRetryTime (1 s) and a loaded machine's ticks.
RELISTEN_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ChaosCluster(str(tmp_path_factory.mktemp("relisten"))) as c:
        c.start_all(timeout_s=60)
        yield c


def _connect_outcome(host: str, port: int) -> str:
    """"open" if a TCP connection to host:port completes and stays up a moment, "refused" if it
    is refused or the member closes it at once."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    with sock:
        sock.settimeout(0.2)
        try:
            # A stranger names no member: the member closes it after RAFT_NAMING_DEADLINE_MS,
            # not within this moment; a connection the failed accept reset ends at once.
            return "refused" if sock.recv(1) == b"" else "open"
        except TimeoutError:
            return "open"
        except OSError as exc:
            return "refused" if exc.errno in (errno.ECONNRESET, errno.EPIPE) else "open"


def test_a_raft_port_closed_by_a_failed_accept_listens_again(cluster):
    leader = cluster.wait_leader()
    i = next(k for k in range(len(cluster.nodes)) if k != leader)
    node = cluster.nodes[i]
    losses = cluster.metric(i, "fencing_raft_listen_losses_total")
    pid = node.proc.pid
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    held = len(os.listdir(f"/proc/{pid}/fd"))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (held - FD_BELOW_HELD, old[1]))
    try:
        # The kernel completes the connect; the member's accept fails with EMFILE.
        wait_until(lambda: _connect_outcome(node.host, cluster.raft_port) == "refused", RELISTEN_TIMEOUT_S,
                   what="the member's Raft port to close after a failed accept")
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)
    try:
        wait_until(lambda: _connect_outcome(node.host, cluster.raft_port) == "open", RELISTEN_TIMEOUT_S,
                   what="the member's Raft port to accept connections again")
        assert cluster.metric(i, "fencing_raft_listen_losses_total") >= losses + 1
        with open(node.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert f"raft: stopped listening on {node.raft_address}" in log
        assert re.search(rf"raft: listening on {re.escape(node.raft_address)} \(\S+\) again", log)
        assert node.proc.poll() is None, "the member exited"
        cluster.wait_ready(timeout_s=30)
    except BaseException:
        print(cluster.logs())
        raise

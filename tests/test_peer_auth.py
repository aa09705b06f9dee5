"""A name sent on a Raft connection is not an identity (SECURITY.md, "Peer authentication").

Real ``fencingd serve`` members, and a raw TCP client playing the attacker who reaches a Raft
port. It speaks exactly what a member speaks: its frames are made by pysyncobj's own
TcpConnection with our wire patches installed (testsupport/raft_peer.py), so they follow the wire
members use.

- Naming hijack: the attacker names member V at the other members and hangs up. pysyncobj put
  the attacker's connection in place of the working one, and V was out of the cluster (then
  kept deposing leaders with ever higher terms). V must stay SERVING throughout.
- State injection: the attacker names a member and sends ``apply_command`` with an entry that
  raises the epoch floor. Without the secret (insecure mode) that commits — the control shows
  the probe is real; with the secret it is dropped unread and the epoch stays.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from chaos.faults import hung_up_on
from coordinator.client import FencingClient
from testsupport.grpc_cluster import SERVING, running_cluster
from testsupport.raft_peer import epoch_floor_entry, member_bytes, running_secret_cluster
from testsupport.supervisor import wait_until

SECRET = "peer-auth-test-secret-0123456789abcdef"
# Long enough for the damage to show on unpatched members: a follower cut off from the leader
# times out within raft_max_timeout_s (1 s in tests) and a leader without acks steps down after
# leader_fallback_timeout_s (1 s); its health reflects that within health_check_interval_s.
OBSERVE_S = 6.0
# A member answers a frame it refuses by hanging up at once; allow for a loaded CI machine.
HANG_UP_S = 5.0


def connect(raft_address: str) -> socket.socket:
    host, port = raft_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=HANG_UP_S)


def name_and_hang_up(raft_address: str, named: str, *, secret: str | None = None) -> bool:
    """Name member ``named`` at ``raft_address``, give the member time to act on it, hang up.
    True if the member hung up first (it refused the name)."""
    with connect(raft_address) as sock:
        sock.sendall(member_bytes(named, secret=secret))
        return hung_up_on(sock, 1.0)


def holds_for(predicate, duration_s: float, what: str) -> None:
    """``predicate`` is true at every check for ``duration_s`` (the first false one fails)."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        time.sleep(0.1)  # the health service re-checks every 0.2 s: twice per change


def serves_everywhere(cluster, through: int) -> None:
    """A write made through member ``through`` reads back on every member."""
    resource = f"peer-auth/{through}-{os.urandom(4).hex()}"  # module clusters serve several tests
    with FencingClient([cluster.nodes[through].api_address]) as client:
        lease = client.acquire(resource, holder="t", ttl_ms=60_000)
        written = client.write(resource, "k", b"v", token=lease.token)
    for node in cluster.nodes:
        with FencingClient([node.api_address]) as direct:
            assert direct.read(resource, "k").version == written.version


# -- without the secret (loopback, so allowed): a name is all there is ----------------------


@pytest.fixture
def open_cluster(tmp_path, request):
    yield from running_cluster(str(tmp_path), request)


# Member 0 has the lowest address: the others dial it, and pysyncobj put the attacker in place
# of the connection they dial. Member 2 has the highest: it dials the others, who take its
# name from whoever connects.
@pytest.mark.parametrize("victim", [0, 2], ids=["dialled-by-the-others", "dials-the-others"])
def test_a_connection_naming_a_connected_member_is_dropped_and_changes_nothing(open_cluster, victim):
    cluster = open_cluster
    cluster.wait_ready()
    named = cluster.nodes[victim].raft_address
    refused = {n.index: name_and_hang_up(n.raft_address, named) for n in cluster.nodes if n.index != victim}
    holds_for(lambda: cluster.nodes[victim].health_status() == SERVING, OBSERVE_S,
              what=f"member {victim} SERVING")
    serves_everywhere(cluster, through=victim)
    assert all(refused.values()), f"members kept the impostor: {refused}"


def test_without_the_secret_a_named_connection_can_commit_anything(open_cluster):
    """The control for the state-injection test below: the probe is real. While a member is
    down, anyone may take its name (there is no connection to keep) and commit an entry."""
    cluster = open_cluster
    cluster.stop(2)  # the highest address: it dials the others, so its name is taken from callers
    leader = cluster.wait_ready()
    before = cluster.nodes[leader].status().epoch
    floor = before + 1_000_000
    with connect(cluster.nodes[leader].raft_address) as sock:
        sock.sendall(member_bytes(cluster.nodes[2].raft_address,
                                  {"type": "apply_command", "command": epoch_floor_entry(floor)}))
        wait_until(lambda: cluster.nodes[leader].status().epoch >= floor, 10, what="the injected entry to apply")
    cluster.start(2)
    cluster.wait_ready()


# -- with the secret: nobody without it gets as far as a name --------------------------------


@pytest.fixture(scope="module")
def secret_cluster(tmp_path_factory, request):
    yield from running_secret_cluster(tmp_path_factory, request, SECRET)


@pytest.mark.parametrize("secret", [None, "not-the-cluster-secret-0123456789abcdef"], ids=["plain", "wrong-secret"])
def test_with_the_secret_an_impostor_is_dropped_before_it_names_anyone(secret_cluster, secret):
    cluster = secret_cluster
    cluster.wait_ready()
    for victim in (0, 2):
        named = cluster.nodes[victim].raft_address
        for node in cluster.nodes:
            if node.index != victim:
                assert name_and_hang_up(node.raft_address, named, secret=secret)
    holds_for(lambda: all(n.health_status() == SERVING for n in cluster.nodes), OBSERVE_S,
              what="every member SERVING")
    serves_everywhere(cluster, through=0)


@pytest.mark.parametrize("secret", [None, "not-the-cluster-secret-0123456789abcdef"], ids=["plain", "wrong-secret"])
def test_with_the_secret_an_injected_command_is_dropped_and_nothing_commits(secret_cluster, secret):
    cluster = secret_cluster
    leader = cluster.wait_ready()
    before = cluster.nodes[leader].status().epoch
    injection = member_bytes(cluster.nodes[(leader + 1) % 3].raft_address,
                             {"type": "apply_command", "command": epoch_floor_entry(before + 1_000_000)},
                             secret=secret)
    for node in cluster.nodes:  # the leader takes commands; followers would forward them
        with connect(node.raft_address) as sock:
            sock.sendall(injection)
            assert hung_up_on(sock, HANG_UP_S), f"member {node.index} kept the connection"
    for node in cluster.nodes:
        assert node.status().epoch == before  # a read through the log: nothing was committed

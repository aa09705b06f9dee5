"""A name sent on a Raft connection is not an identity (SECURITY.md, "Peer authentication").

Real ``fencingd serve`` members, and a raw Raft-port client playing the attacker who reaches a
Raft port (testsupport/raft_peer.py): it speaks the typed wire members speak, with or without
the secret's key exchange.

- Naming hijack: the attacker names member V at the other members and hangs up. pysyncobj put
  the attacker's connection in place of the working one, and V was out of the cluster (then
  kept deposing leaders with ever higher terms). V must stay SERVING throughout.
- State injection: the attacker names a member and sends ``apply_command`` with an entry that
  raises the epoch floor. Without the secret (insecure mode) that commits — the control shows
  the probe is real; with the secret it is dropped unread and the epoch stays.
- With the secret, a newcomer that holds it and names a member replaces that member's
  connection even while it still looks open (a member restarted after a power loss), and the
  old one is closed: pysyncobj left it open, and the member, still connected as far as it
  could tell, never dialled again. A key exchange that sends anything but a key is dropped,
  on a connection a member accepted and on one it dialled.
"""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest
from pysyncobj.encryptor import getEncryptor

from coordinator.client import FencingClient
from coordinator.raft import wire as raft_wire
from testsupport.grpc_cluster import SERVING, running_cluster
from testsupport.raft_peer import RaftPeer, epoch_floor_entry, running_secret_cluster
from testsupport.supervisor import wait_until

SECRET = "peer-auth-test-secret-0123456789abcdef"
# Long enough for the damage to show on unpatched members: a follower cut off from the leader
# times out within raft_max_timeout_s (1 s in tests) and a leader without acks steps down after
# leader_fallback_timeout_s (1 s); its health reflects that within health_check_interval_s.
OBSERVE_S = 6.0
# A member answers a frame it refuses by hanging up at once; allow for a loaded CI machine.
HANG_UP_S = 5.0


def stranger(raft_address: str, secret: str | None) -> RaftPeer:
    """A connection that skips the key exchange: plain, or under a secret that is not the
    cluster's (a member drops both at their first frame)."""
    return RaftPeer(raft_address, secret=secret, key_exchange=False, timeout_s=HANG_UP_S)


def name_and_hang_up(raft_address: str, named: str, *, secret: str | None = None) -> bool:
    """Name member ``named`` at ``raft_address``, give the member time to act on it, hang up.
    True if the member hung up first (it refused the name)."""
    with stranger(raft_address, secret) as peer:
        return peer.name(named).hung_up(1.0)


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
    with RaftPeer(cluster.nodes[leader].raft_address, timeout_s=HANG_UP_S) as peer:
        peer.name_and_command(cluster.nodes[2].raft_address, epoch_floor_entry(floor))
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
    for node in cluster.nodes:  # the leader takes commands; followers would forward them
        with stranger(node.raft_address, secret) as peer:
            peer.name_and_command(cluster.nodes[(leader + 1) % 3].raft_address, epoch_floor_entry(before + 1_000_000))
            assert peer.hung_up(HANG_UP_S), f"member {node.index} kept the connection"
    for node in cluster.nodes:
        assert node.status().epoch == before  # a read through the log: nothing was committed


def test_with_the_secret_a_holder_replaces_a_connection_that_looks_open_and_the_old_one_closes(secret_cluster):
    """A member restarted after a power loss reconnects before its old connection reports
    closed: it holds the secret, so it takes that connection's place. Played here by a holder
    that names member 2 (it dials the others) at members 0 and 1. The replaced connection
    must be closed: member 2 then dials again at once and takes its place back. pysyncobj
    left it open, so member 2, connected as far as it could tell, kept sending into it while
    every answer went to the holder: no acks, and member 2 fell out until its connection
    timed out."""
    cluster = secret_cluster
    cluster.wait_ready()
    named = cluster.nodes[2].raft_address
    holders = [RaftPeer(node.raft_address, secret=SECRET, timeout_s=HANG_UP_S).name(named) for node in cluster.nodes[:2]]
    try:
        # Member 0 is dialled by the others: a name of it at them is dropped, secret or not.
        with RaftPeer(cluster.nodes[1].raft_address, secret=SECRET, timeout_s=HANG_UP_S) as holder:
            assert holder.name(cluster.nodes[0].raft_address).hung_up(HANG_UP_S)
        holds_for(lambda: all(n.health_status() == SERVING for n in cluster.nodes), OBSERVE_S,
                  what="every member SERVING")
    finally:
        for holder in holders:
            holder.close()
    serves_everywhere(cluster, through=2)


def test_with_the_secret_a_key_exchange_that_sends_no_key_is_dropped(secret_cluster):
    """pysyncobj stored whatever came first as the connection's key: here a name, under the
    secret. A member answers a key exchange only with a key."""
    cluster = secret_cluster
    cluster.wait_ready()
    with RaftPeer(cluster.nodes[0].raft_address, secret=SECRET, key_exchange=False, timeout_s=HANG_UP_S) as peer:
        assert peer.name(cluster.nodes[2].raft_address).hung_up(HANG_UP_S)
    serves_everywhere(cluster, through=0)


def test_with_the_secret_a_dialled_peer_that_answers_the_key_exchange_with_no_key_is_dropped(secret_cluster):
    """The outgoing side of the key exchange: pysyncobj took the first answer on a connection it
    dialled as the key unseen (transport.py:473-475), then named itself and called the peer
    connected. A listener in member 0's place (the others dial it) answers their key with a name,
    under the secret: the member must hang up instead of naming itself."""
    cluster = secret_cluster
    cluster.wait_ready()
    encryptor = getEncryptor(SECRET)
    host, port = cluster.nodes[0].raft_address.rsplit(":", 1)
    cluster.stop(0)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, int(port)))
            listener.listen()
            listener.settimeout(HANG_UP_S * 2)  # members dial every connection_retry_s
            conn, _ = listener.accept()
        with conn:
            conn.settimeout(HANG_UP_S)
            head = conn.recv(4, socket.MSG_WAITALL)
            (length,) = struct.unpack("i", head)
            their_key = raft_wire.decode_frame(encryptor.decrypt(conn.recv(length, socket.MSG_WAITALL)), None)
            assert raft_wire.is_connection_key(their_key)  # the member did dial with a key
            # Under the member's own key, as every answer must be (the frame reader drops any
            # other): only the transport's check tells that a name is no key.
            answer = encryptor.encrypt_at_time(raft_wire.encode_frame(cluster.nodes[0].raft_address, their_key),
                                               int(time.monotonic()))
            conn.sendall(struct.pack("i", len(answer)) + answer)
            try:
                assert conn.recv(65536) == b"", "the member went on (named itself) after an answer that was no key"
            except ConnectionResetError:
                pass  # hung up with our answer unread: refused too
    finally:
        cluster.start(0)
    cluster.wait_ready()
    serves_everywhere(cluster, through=0)

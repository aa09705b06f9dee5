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
from coordinator.raft import limits as raft_limits
from coordinator.raft import wire as raft_wire
from coordinator.raft.peer_binding import NONCE_BYTES, STEP_WELCOME, Party, Transcript
from testsupport.grpc_cluster import SERVING, metric_value, running_cluster
from testsupport.raft_peer import RaftPeer, Relay, epoch_floor_entry, member_party, running_secret_cluster
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
    yield from running_secret_cluster(tmp_path_factory, request, SECRET, metered=True)


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
    as_2 = member_party(cluster, 2)  # the holder binds as member 2, incarnation and all
    holders = [RaftPeer(node.raft_address, secret=SECRET, timeout_s=HANG_UP_S, dialler=as_2).name(named)
               for node in cluster.nodes[:2]]
    try:
        # Member 0 is dialled by the others: a name of it at them is dropped, secret or not.
        with RaftPeer(cluster.nodes[1].raft_address, secret=SECRET, timeout_s=HANG_UP_S,
                      dialler=member_party(cluster, 0)) as holder:
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


def read_frame(conn, encryptor, key):
    """The next frame a member sent on ``conn`` (a socket), decrypted and decoded under ``key``."""
    (length,) = struct.unpack("i", conn.recv(4, socket.MSG_WAITALL))
    return raft_wire.decode_frame(encryptor.decrypt(conn.recv(length, socket.MSG_WAITALL)), key)


def send_frame(conn, encryptor, message, key) -> None:
    body = encryptor.encrypt_at_time(raft_wire.encode_frame(message, key), int(time.monotonic()))
    conn.sendall(struct.pack("i", len(body)) + body)


def _welcome_from_another_member(hello, cluster, parties):
    """A welcome as member 1 answers (a relay forwarded the dial to it)."""
    return _welcomed(hello, parties[1]).message(STEP_WELCOME)


def _welcome_to_another_hello(hello, cluster, parties):
    """A welcome recorded from another connection: it echoes another dialler nonce."""
    other = Transcript(os.urandom(NONCE_BYTES), _party_of(hello), hello["receiver"])
    return _welcomed(other, parties[0]).message(STEP_WELCOME)


def _hello_sent_back(hello, cluster, parties):
    """The member's own hello reflected back at it (step 1 where the welcome belongs)."""
    return hello


def _name_in_place_of_welcome(hello, cluster, parties):
    """pysyncobj's exchange answered a key with a key and took anything; a name is no welcome."""
    return cluster.nodes[0].raft_address


def _party_of(hello) -> Party:
    return Party(hello["dialler"], hello["dialler_id"], hello["dialler_incarnation"])


def _welcomed(hello, receiver: Party) -> Transcript:
    if isinstance(hello, dict):
        hello = Transcript(hello["dialler_nonce"], _party_of(hello), hello["receiver"])
    return hello.answered(os.urandom(NONCE_BYTES), receiver)


@pytest.mark.parametrize("answer", [
    _name_in_place_of_welcome, _welcome_from_another_member, _welcome_to_another_hello, _hello_sent_back,
], ids=["a-name", "another-member", "a-replayed-welcome", "its-own-hello-reflected"])
def test_with_the_secret_a_dialled_peer_that_answers_with_no_welcome_of_the_member_dialled_is_dropped(
    secret_cluster, answer,
):
    """The dialling side: pysyncobj took the first answer on a connection it dialled as the key
    unseen (transport.py:473-475), then named itself and called the peer connected. A listener
    in member 0's place (the others dial it), holding the secret, answers the hello with
    something that is not member 0's welcome to it: the member must hang up (and count it)
    instead of confirming."""
    cluster = secret_cluster
    cluster.wait_ready()
    parties = [member_party(cluster, i) for i in range(3)]
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
            hello = read_frame(conn, encryptor, None)
            assert hello["type"] == "bind" and hello["step"] == 1  # the member did dial with a hello
            assert hello["receiver"] == cluster.nodes[0].raft_address  # naming whom it dialled
            # Under the member's own nonce, as every answer must be (the frame reader drops any
            # other): only the handshake's checks tell this answer from member 0's welcome.
            send_frame(conn, encryptor, answer(hello, cluster, parties), hello["dialler_nonce"])
            try:
                assert conn.recv(65536) == b"", "the member went on (confirmed) after an answer that was no welcome"
            except ConnectionResetError:
                pass  # hung up with our answer unread: refused too
    finally:
        cluster.start(0)
    cluster.wait_ready()
    serves_everywhere(cluster, through=0)


# -- with the secret: a connection is bound to the member dialled and the member dialling --------
# (peer_binding.py). Member 0 has the lowest address (both others dial it), member 2 the
# highest (it dials both): a hello at member 0 naming member 2 is the one a member accepts.
# Window of the relay probe: C dials B's address every connection_retry_s (0.5 s), so several
# relayed dials; the issue measured its effect over 4-5 s.
RELAY_WINDOW_S = 4.0


def refused_for(cluster, index: int, reason: str) -> float:
    return metric_value(cluster.metrics_urls[index], f'fencing_raft_refused_bindings_total{{reason="{reason}"}}', 0.0)


def replaced_at(cluster, index: int, default: float | None = None) -> float:
    return metric_value(cluster.metrics_urls[index], "fencing_raft_peer_connections_replaced_total", default)


def _log_of(node) -> str:
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def test_with_the_secret_a_relay_on_a_stopped_members_address_changes_nothing(secret_cluster):
    """Issue 26's probe. With B stopped, a plain TCP forwarder (no secret) listens on B's Raft
    address and forwards every dial to A. C dials B's address (the higher address dials): the
    relay handed C's hello to A. Before the binding, A took it for C reconnecting and put it in
    place of C's working connection, then C's own redial in place of that, every retry (30
    swaps in 8 s; writes 519 ok / 0 failed without the relay, 187 ok / 53 failed with it). Now A
    refuses the hello (it names B as the member dialled), counts it, and nothing else moves."""
    cluster = secret_cluster
    cluster.wait_ready()
    a, b, c = cluster.nodes
    cluster.stop(b.index)
    try:
        cluster.wait_ready()
        # (0 where a member exports no such series: the log below is what the test reads first.)
        replaced, misdialled = replaced_at(cluster, a.index, 0.0), refused_for(cluster, a.index, "misdialled")
        log_from = len(_log_of(a))
        ok = failed = 0
        with FencingClient([a.api_address, c.api_address]) as client:
            lease = client.acquire(f"peer-auth/relay-{os.urandom(4).hex()}", holder="t", ttl_ms=60_000)
            relayed_from = time.monotonic()
            with Relay(b.raft_address, a.raft_address) as relay:
                deadline = time.monotonic() + RELAY_WINDOW_S
                while time.monotonic() < deadline:
                    try:
                        client.write(lease.resource, "k", b"v", token=lease.token, timeout_s=1.0)
                        ok += 1
                    except Exception as exc:  # noqa: BLE001 - every failed write is counted and shown
                        failed += 1
                        print(f"write failed: {exc!r}")
                relay.stop_listening()
                wait_until(lambda: relay.closed_by_target == relay.forwarded, HANG_UP_S,
                           what="A hanging up on every relayed dial")
            relayed_s = time.monotonic() - relayed_from
        logged = _log_of(a)[log_from:]
        swaps = logged.count(f"peer {c.raft_address} connected again")
        refusal_lines = logged.count("raft: refused an incoming connection")
        print(f"relay on B's address -> A for {RELAY_WINDOW_S:g} s: {relay.forwarded} dials relayed, "
              f"{swaps} swaps of C's connection on A, {refusal_lines} refusal lines logged, "
              f"writes {ok} ok / {failed} failed")
        assert relay.forwarded >= 2, "C did not dial B's address through the relay"
        assert swaps == 0, f"A put relayed connections in place of C's {swaps} times"
        assert replaced_at(cluster, a.index) == replaced
        assert refused_for(cluster, a.index, "misdialled") - misdialled >= relay.forwarded
        # Logged through the connection warnings' limiter: never a line per relayed dial.
        assert refusal_lines <= relayed_s * 1000 / raft_limits.RAFT_PEER_WARNING_LOG_INTERVAL_MS + 1
        assert failed == 0 and ok > 0
    finally:
        cluster.start(b.index)
    cluster.wait_ready()
    serves_everywhere(cluster, through=0)


def test_with_the_secret_a_hello_for_another_member_is_refused(secret_cluster):
    """The receiving side: a dial meant for member 1 (a relay, or a stale address) reaching
    member 0 is refused at its hello, counted, and displaces nothing; so is a hello with the
    direction reversed (a welcome, step 2, as the first message: a reflected handshake)."""
    cluster = secret_cluster
    cluster.wait_ready()
    as_2 = member_party(cluster, 2)
    before = refused_for(cluster, 0, "misdialled"), refused_for(cluster, 0, "not_a_handshake")
    replaced = replaced_at(cluster, 0)
    with pytest.raises(ConnectionError):
        RaftPeer(cluster.nodes[0].raft_address, secret=SECRET, dialler=as_2, target=cluster.nodes[1].raft_address,
                 timeout_s=HANG_UP_S)
    with RaftPeer(cluster.nodes[0].raft_address, secret=SECRET, key_exchange=False, timeout_s=HANG_UP_S) as peer:
        reflected = _welcomed(Transcript(os.urandom(NONCE_BYTES), as_2, cluster.nodes[0].raft_address),
                              member_party(cluster, 0)).message(STEP_WELCOME)
        peer.send(peer.frame(reflected))
        assert peer.hung_up(HANG_UP_S)
    assert refused_for(cluster, 0, "misdialled") == before[0] + 1
    assert refused_for(cluster, 0, "not_a_handshake") == before[1] + 1
    assert replaced_at(cluster, 0) == replaced
    serves_everywhere(cluster, through=0)


def test_with_the_secret_a_dialler_naming_another_member_id_for_its_address_is_refused(secret_cluster):
    """A holder dialling as member 2's address under a member id the configuration gives no
    member there: the whole handshake is valid, and still binds nothing."""
    cluster = secret_cluster
    cluster.wait_ready()
    as_2 = member_party(cluster, 2)
    misdialled, replaced = refused_for(cluster, 0, "misdialled"), replaced_at(cluster, 0)
    posing = Party(as_2.address, "m9", as_2.incarnation)
    with RaftPeer(cluster.nodes[0].raft_address, secret=SECRET, dialler=posing, timeout_s=HANG_UP_S) as peer:
        assert peer.name(posing.address).hung_up(HANG_UP_S)
    assert refused_for(cluster, 0, "misdialled") == misdialled + 1
    assert replaced_at(cluster, 0) == replaced


def test_with_the_secret_a_replayed_confirm_is_refused(secret_cluster):
    """A confirm recorded on one connection, replayed on another: as sent (under the first
    connection's nonce: the frame reader refuses it) and re-keyed by a holder of the secret
    (it confirms the first connection's nonces). Neither binds, so member 2's connection stays."""
    cluster = secret_cluster
    cluster.wait_ready()
    as_2 = member_party(cluster, 2)
    address = cluster.nodes[0].raft_address
    replaced, replayed = replaced_at(cluster, 0), refused_for(cluster, 0, "replayed")
    with RaftPeer(address, secret=SECRET, dialler=as_2, timeout_s=HANG_UP_S) as recorded:
        confirm = recorded.naming_frame(as_2.address)  # recorded, never sent on its own connection
        old = recorded.welcomed.message(3)
    with RaftPeer(address, secret=SECRET, dialler=as_2, timeout_s=HANG_UP_S) as replayer:
        replayer.send(confirm)
        assert replayer.hung_up(HANG_UP_S)
    with RaftPeer(address, secret=SECRET, dialler=as_2, timeout_s=HANG_UP_S) as replayer:
        replayer.send(replayer.frame(old))  # the old nonces under this connection's key
        assert replayer.hung_up(HANG_UP_S)
    assert refused_for(cluster, 0, "replayed") == replayed + 1
    assert replaced_at(cluster, 0) == replaced
    serves_everywhere(cluster, through=0)


def test_with_the_secret_an_incarnation_the_configuration_does_not_name_is_not_acted_on(secret_cluster):
    """A holder binding as member 2 under another incarnation (member 2's old self, still
    running) does not displace member 2's connection, bound to the incarnation the configuration
    names. A holder bound as member 2's own incarnation that then sends a vote request stamped
    with another incarnation is not acted on: the connection closes."""
    cluster = secret_cluster
    cluster.wait_ready()
    as_2 = member_party(cluster, 2)
    address = cluster.nodes[0].raft_address
    replaced = replaced_at(cluster, 0)
    stale = Party(as_2.address, as_2.member_id, as_2.incarnation % (2**63 - 1) + 1)
    with RaftPeer(address, secret=SECRET, dialler=stale, timeout_s=HANG_UP_S) as old_self:
        assert old_self.name(stale.address).hung_up(HANG_UP_S)
    assert replaced_at(cluster, 0) == replaced
    assert refused_for(cluster, 0, "stale_incarnation") >= 1
    mismatched = refused_for(cluster, 0, "incarnation_mismatch")
    with RaftPeer(address, secret=SECRET, dialler=as_2, timeout_s=HANG_UP_S) as holder:
        vote = {"type": "request_vote", "term": 0, "last_log_index": 0, "last_log_term": 0,
                "cluster": None, "incarnation": stale.incarnation}
        # In one write: member 2 redials once its connection is replaced, and would replace ours.
        holder.send(holder.naming_frame(as_2.address), holder.frame(vote))
        assert holder.hung_up(HANG_UP_S)
    assert refused_for(cluster, 0, "incarnation_mismatch") == mismatched + 1
    wait_until(lambda: all(n.health_status() == SERVING for n in cluster.nodes), 30, what="every member SERVING")
    serves_everywhere(cluster, through=2)

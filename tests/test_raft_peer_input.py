"""What a stranger who reaches a Raft port can do: not run code, not join, not skip the secret.

pysyncobj unpickles every frame and every log entry
(coordinator/raft/RAFT.md "Network transport"); ``patches.install()`` puts in the typed wire
(raft_wire.decode_frame: no pickle at all), and the transport accepts only connections that
name a member. The probe sends one
frame exactly as a stock pysyncobj peer would (length, zlib, pickle) whose unpickling would
create a marker file: harmless, and visible. Each test first shows that the same bytes do
create the marker when unpickled the stock way.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import zlib

import pysyncobj.pickle as ps_pickle
import pytest

from chaos.faults import hung_up_on
from coordinator.client import FencingClient
from coordinator.core import limits
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft import limits as raft_limits
from coordinator.raft import patches
from coordinator.raft import wire as raft_wire
from coordinator.raft.node import RaftConfig, RaftNode
from coordinator.server import config as config_mod
from testsupport.raft_peer import running_secret_cluster
from testsupport.supervisor import pick_ports, wait_until

SECRET = "0123456789abcdef0123456789abcdef-test"
PEERS = ("127.0.0.3:1", "127.0.0.4:1")  # nothing listens there: the node stays a follower


class _CreatesMarker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def frame(payload: bytes) -> bytes:
    """A frame of stock pysyncobj's wire (length, zlib, pickle bytes ``payload``)."""
    body = zlib.compress(payload)
    return struct.pack("i", len(body)) + body


def typed(message) -> bytes:
    """A frame of the typed wire, as a member of ours sends ``message`` without the secret."""
    body = raft_wire.encode_frame(message)
    return struct.pack("i", len(body)) + body


def exchange(raft_address: str, *frames: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``frames`` to ``raft_address``; return what it answered once it hung up.

    Raises TimeoutError when the member keeps the connection open past ``timeout_s``.
    """
    host, port = raft_address.rsplit(":", 1)
    received = b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(b"".join(frames))
        s.settimeout(timeout_s)
        try:
            while chunk := s.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def probe(raft_address: str, marker: str, *, announce: str | None = None) -> None:
    """Send one malicious frame (after naming ``announce``, if given); return once hung up on."""
    first = () if announce is None else (typed(announce),)
    exchange(raft_address, *first, frame(pickle.dumps(_CreatesMarker(marker))))


def assert_probe_is_real(marker) -> None:
    """The control: the probe's payload runs code when unpickled the stock way."""
    pickle.loads(pickle.dumps(_CreatesMarker(str(marker))))
    assert marker.exists()
    marker.unlink()


@pytest.fixture
def lone_node(tmp_path):
    host = "127.0.0.2"
    raft_port, _ = pick_ports((host,))
    node = RaftNode(RaftConfig(f"{host}:{raft_port}", PEERS, str(tmp_path / "n")), FencingStateMachine())
    yield node
    node.close()


@pytest.mark.parametrize("announce", [None, PEERS[0]], ids=["first-frame", "after-naming-a-member"])
def test_without_a_secret_a_frame_that_calls_code_is_refused(lone_node, tmp_path, announce):
    marker = tmp_path / "pwned-plain"
    assert_probe_is_real(marker)
    probe(lone_node.config.self_address, str(marker), announce=announce)
    assert not marker.exists()
    assert lone_node.status()["self"] == lone_node.config.self_address  # still running


def _utility(*words) -> bytes:
    # Utility commands are lists, which no schema of the typed wire has: built by hand.
    import msgpack

    body = msgpack.packb([raft_wire.WIRE_VERSION, raft_wire.KIND_NAME, None, list(words)])
    return struct.pack("i", len(body)) + body


@pytest.mark.parametrize(
    "hello",
    [typed("readonly"), _utility("status"), _utility("transfer", "127.0.0.3:1"), typed("127.0.0.99:1"),
     typed(b"127.0.0.3:1"), frame(ps_pickle.dumps(PEERS[0]))],
    ids=["readonly", "utility-status", "utility-transfer", "not-a-member", "bytes", "stock-pickle-naming"],
)
def test_a_connection_that_does_not_name_a_member_is_dropped_unanswered(lone_node, hello):
    # Stock pysyncobj answers ["status"] with its status, takes "readonly" as a node it then
    # sends every entry to, and would run "transfer" for anyone (transport.py:343-384).
    before = lone_node.status()["refused_peer_messages"]
    answer = exchange(lone_node.config.self_address, hello)
    assert answer == b""
    wait_until(lambda: lone_node.status()["refused_peer_messages"] == before + 1, 10,
               what="the refusal to be counted")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from running_secret_cluster(tmp_path_factory, request, SECRET)


def test_members_with_the_secret_replicate_and_a_stranger_is_dropped_unread(cluster, tmp_path):
    """With the secret a stranger is dropped before the unpickler sees its frame at all."""
    endpoints = [n.api_address for n in cluster.nodes]
    with FencingClient(endpoints) as client:
        lease = client.acquire("secret/1", holder="t", ttl_ms=60_000)
        client.write("secret/1", "k", b"v", token=lease.token)
        leader = cluster.wait_ready()
        follower = cluster.nodes[(leader + 1) % 3]
        with FencingClient([follower.api_address]) as direct:
            assert direct.read("secret/1", "k").value == b"v"  # replicated over the encrypted wire
    marker = tmp_path / "pwned-secret"
    for node in cluster.nodes:
        probe(node.raft_address, str(marker))
    assert not marker.exists()
    with FencingClient(endpoints) as client:  # the members are unharmed
        assert client.write("secret/1", "k", b"w", token=lease.token).version >= 2


def test_a_stopped_member_still_completes_many_connections(cluster):
    """The kernel queues connections for a member that is not accepting (paused here, or
    busy): with pysyncobj's backlog of 5 the seventh connect already waited on SYN
    retransmits, so a stranger could hold a member's reconnects off for seconds."""
    leader = cluster.wait_ready()
    index = (leader + 1) % 3
    host, port = cluster.nodes[index].raft_address.rsplit(":", 1)
    wanted = 40  # well above 5, well below raft_limits.RAFT_LISTEN_BACKLOG
    opened: list[socket.socket] = []
    cluster.pause(index)
    try:
        for _ in range(wanted):
            try:
                opened.append(socket.create_connection((host, int(port)), timeout=0.5))
            except OSError:
                break
    finally:
        for sock in opened:
            sock.close()
        cluster.resume(index)
    assert len(opened) == wanted
    cluster.wait_ready()


@pytest.mark.parametrize("content, fragment", [("short", "at least 32"), (None, "cannot read")])
def test_a_missing_or_short_secret_stops_the_member_at_start(tmp_path, content, fragment):
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.build({"data_dir": str(tmp_path / "d"), "raft_address": "127.0.0.1:7000",
                          "members": ["127.0.0.1:7000=127.0.0.1:7100"], "raft_secret_file": str(path)}, {})
    assert str(caught.value).startswith("raft_secret_file: ") and fragment in str(caught.value)


def test_the_secret_never_shows_in_a_config_repr():
    assert SECRET not in repr(RaftConfig("127.0.0.1:1", (), "/nonexistent", secret=SECRET))


# -- frame bounds (raft_limits.RAFT_MESSAGE_BYTES_MAX) ------------------------------

MESSAGE_MAX = raft_limits.RAFT_MESSAGE_BYTES_MAX


def heads(*lengths: int) -> bytes:
    return b"".join(struct.pack("i", n) + b"x" * max(n, 0) for n in lengths)


def test_scan_frames_reads_each_head_once_however_the_bytes_arrive():
    stream = heads(3, 0, 10, 7)
    complete_before = [0, 7, 11, 25, 36]  # offsets where each frame starts, then the end
    scanned = 0
    for cut in range(len(stream) + 1):
        scanned = raft_wire.scan_frames(stream[:cut], scanned, max_bytes=10)
        assert scanned == max(o for o in complete_before if o <= cut)
    assert raft_wire.scan_frames(stream, 0, max_bytes=10) == len(stream)


@pytest.mark.parametrize("bad", [11, -1, 2**31 - 1], ids=["over-the-bound", "negative", "two-gib"])
def test_scan_frames_refuses_a_head_before_its_bytes_are_in(bad):
    stream = heads(3) + struct.pack("i", bad)  # nothing of the bad frame's body has arrived
    with pytest.raises(raft_wire.FrameTooLarge):
        raft_wire.scan_frames(stream, 0, max_bytes=10)
    assert raft_wire.scan_frames(heads(3, 10), 0, max_bytes=10) == 21  # at the bound: accepted


def test_the_largest_append_a_member_sends_fits_the_bound():
    # pysyncobj adds entries while their bytes stay under the batch size, plus the one that
    # crosses it (syncobj.py:1156-1162); HardenedSyncObj caps the count. Worst case: the count at
    # its cap, the batch just under the size, then the largest entry we make (a restore).
    n = raft_limits.RAFT_APPEND_ENTRIES_MAX - 1
    each = (raft_limits.RAFT_BATCH_BYTES - 1) // n
    entries = [(raft_wire.encode_entry(os.urandom(each)), 10**12 + i, 10**6) for i in range(n)]
    entries.append((raft_wire.encode_entry(os.urandom(limits.RESTORE_COMMAND_BYTES_MAX)), 10**12 + n, 10**6))
    message = {"type": "append_entries", "term": 10**6, "commit_index": 10**12, "entries": entries,
               "prevLogIdx": 10**12 - 1, "prevLogTerm": 10**6,
               # the sender's cluster id and incarnation, at their largest
               "cluster": "c" * raft_limits.RAFT_CLUSTER_ID_CHARS_MAX, "incarnation": 2**63 - 1}
    assert len(entries[-1][0]) <= raft_limits.RAFT_LOG_ENTRY_BYTES_MAX
    payload = raft_wire.encode_frame(message)
    assert len(payload) <= MESSAGE_MAX
    assert raft_wire.decode_frame(payload)["entries"][-1][1] == 10**12 + n  # and members accept it


def test_an_append_is_capped_in_entries_as_well_as_bytes(lone_node):
    so = lone_node._syncobj
    for _ in range(raft_limits.RAFT_APPEND_ENTRIES_MAX + 50):
        so._SyncObj__raftLog.add(b"\x00x", so._SyncObj__raftLog[-1][1] + 1, 0)
    first = so._SyncObj__raftLog[0][1]
    batch = so._SyncObj__getEntries(first, None, raft_limits.RAFT_BATCH_BYTES)  # what the sender asks
    assert len(batch) == raft_limits.RAFT_APPEND_ENTRIES_MAX
    assert len(so._SyncObj__getEntries(first)) > raft_limits.RAFT_APPEND_ENTRIES_MAX  # other callers: all


@pytest.mark.parametrize("announce", [None, PEERS[0]], ids=["first-frame", "after-naming-a-member"])
def test_a_frame_declaring_more_than_the_bound_is_dropped_unread(lone_node, announce):
    before = lone_node.status()["refused_peer_messages"]
    first = () if announce is None else (typed(announce),)
    # Only the head is sent: the member must hang up without waiting for 2 GiB to arrive.
    answer = exchange(lone_node.config.self_address, *first, struct.pack("i", MESSAGE_MAX + 1), timeout_s=10)
    assert answer == b""
    wait_until(lambda: lone_node.status()["refused_peer_messages"] == before + 1, 10,
               what="the refusal to be counted")
    assert lone_node.status()["self"] == lone_node.config.self_address  # still running


def test_frames_of_any_size_in_any_chunks_arrive_whole_and_in_order():
    """The read path with the bound: pysyncobj's TcpConnection on a real socket pair, fed
    frames of random sizes (some above one recv) in random chunks, one message at a time
    or many per read; every message arrives once, in order, and the connection stays up."""
    import random

    import pysyncobj.tcp_connection as ps_tcp
    from pysyncobj.poller import createPoller


    patches.install()  # what RaftNode does first: the bounded reader under test
    rng = random.Random(20261203)
    poller = createPoller("auto")
    ours, theirs = socket.socketpair()
    ours.setblocking(False)  # as the transport sets accepted sockets
    received: list = []
    disconnects: list = []
    conn = ps_tcp.TcpConnection(poller, socket=ours, timeout=60, recvBufferSize=2**16,
                                onDisconnected=lambda: disconnects.append(1))
    conn.setOnMessageReceivedCallback(received.append)
    messages = [{"type": "apply_command", "command": raft_wire.encode_entry(os.urandom(n))}
                for n in (rng.choice([0, 1, 100, 5000, 70_000, 200_000]) for _ in range(200))]
    stream = b"".join(typed(m) for m in messages)
    steps = [rng.choice([1, 3, 4, 5, 1000, 65_536, 300_000]) for _ in range(len(stream))]

    def send() -> None:
        pos = 0
        for step in steps:
            if pos >= len(stream):
                return
            theirs.sendall(stream[pos:pos + step])
            pos += step

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    wait_until(lambda: poller.poll(0.001) or len(received) == len(messages) or disconnects, 60,
               what="every message")
    sender.join(10)
    assert not disconnects
    assert received == messages
    assert conn.__dict__["_frames_scanned_to"] == 0  # nothing left half-read
    conn.disconnect()
    theirs.close()


def test_a_frame_larger_than_the_socket_buffer_goes_out_whole_without_another_send():
    """The write path: a 1 MiB frame (a restore chunk's append) is far more than the kernel
    takes at once. The rest must go out on the poller's write events alone; pysyncobj sent it
    only with the next message, so on an idle connection it waited for heartbeats."""
    import pysyncobj.tcp_connection as ps_tcp
    from pysyncobj.poller import createPoller

    patches.install()  # what RaftNode does first: the writer under test
    poller = createPoller("auto")
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = ps_tcp.TcpConnection(poller, socket=ours, timeout=60, sendBufferSize=2**16)
    message = {"type": "apply_command", "command": raft_wire.encode_entry(os.urandom(limits.BACKUP_CHUNK_BYTES))}
    expected = typed(message)
    received = bytearray()

    def read() -> None:
        while len(received) < len(expected):
            piece = theirs.recv(1 << 16)
            if not piece:
                return
            received.extend(piece)

    # A connection in use: its first write event (an empty buffer) dropped the write
    # interest, as on every Raft connection once it is up.
    poller.poll(0.01)
    reader = threading.Thread(target=read, daemon=True)
    try:
        conn.send(message)  # the one send: nothing else is sent on this connection
        # Nobody reads yet, so the kernel holds only its buffer's worth (a reader started
        # earlier could drain it all during the send on a busy machine: nothing to show).
        assert conn.getSendBufferSize() > 0, "the kernel took the whole frame: the test shows nothing"
        reader.start()
        wait_until(lambda: poller.poll(0.01) or len(received) == len(expected), 10,
                   what="the rest of the frame, on write events alone")
        reader.join(10)
        assert bytes(received) == expected
        assert conn.getSendBufferSize() == 0
    finally:
        conn.disconnect()
        theirs.close()


def test_the_frame_offset_starts_over_when_a_connection_is_dropped_and_made_again():
    # pysyncobj reuses an outgoing connection object (connect() after disconnect()); frames
    # left in the buffer by a disconnect must not shift where the next connection's heads are read.
    import pysyncobj.tcp_connection as ps_tcp
    from pysyncobj.poller import createPoller


    patches.install()  # what RaftNode does first: the bounded reader under test
    poller = createPoller("auto")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received: list = []
    conn = ps_tcp.TcpConnection(poller, timeout=60)

    def on_message(message):
        received.append(message)
        if message == "hang:1":
            conn.disconnect()  # from the callback, with another frame still in the buffer

    conn.setOnMessageReceivedCallback(on_message)
    wire = typed
    try:
        assert conn.connect("127.0.0.1", port)
        first, _ = listener.accept()
        first.sendall(wire("hang:1") + wire("x" * 200))
        wait_until(lambda: poller.poll(0.01) or received, 10, what="the first frame")
        assert received == ["hang:1"]
        assert conn.__dict__["_frames_scanned_to"] == 0
        assert conn.connect("127.0.0.1", port)
        second, _ = listener.accept()
        later = [{"type": "apply_command", "command": raft_wire.encode_entry(os.urandom(n))}
                 for n in (1, 200, 3000, 9000, 7)]
        second.sendall(b"".join(wire(m) for m in later))
        wait_until(lambda: poller.poll(0.01) or len(received) == 1 + len(later), 10, what="the later frames")
        assert received == ["hang:1"] + later
        first.close()
        second.close()
    finally:
        conn.disconnect()
        listener.close()


def test_connections_that_name_no_member_are_bounded_in_number(lone_node, monkeypatch):
    monkeypatch.setattr(raft_limits, "RAFT_NAMING_DEADLINE_MS", 120_000)  # only the count drops here
    host, port = lone_node.config.self_address.rsplit(":", 1)
    before = lone_node.status()["refused_peer_messages"]
    extra = 4
    idle = [socket.create_connection((host, int(port)), timeout=5)
            for _ in range(raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX + extra)]
    try:
        wait_until(lambda: all(hung_up_on(s, 0.05) for s in idle[:extra]), 10, what="the oldest to be dropped")
        assert not any(hung_up_on(s, 0.2) for s in idle[extra:])  # the newest still wait
        wait_until(lambda: lone_node.status()["refused_peer_messages"] == before + extra, 10,
                   what="the drops to be counted")
        with socket.create_connection((host, int(port)), timeout=5) as member:  # a member still gets in
            member.sendall(typed(PEERS[0]))
            wait_until(lambda: hung_up_on(idle[extra], 0.05), 10, what="room made for it")
            assert not hung_up_on(member, 0.5)
    finally:
        for s in idle:
            s.close()


def test_a_connection_that_names_no_member_in_time_is_dropped(lone_node, monkeypatch):
    monkeypatch.setattr(raft_limits, "RAFT_NAMING_DEADLINE_MS", 300)
    host, port = lone_node.config.self_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as silent, \
            socket.create_connection((host, int(port)), timeout=5) as member:
        member.sendall(typed(PEERS[0]))
        wait_until(lambda: hung_up_on(silent, 0.05), 10, what="the silent connection to be dropped")
        assert not hung_up_on(member, 0.5)  # a named one has no deadline


# -- per-connection warnings are rate limited ---------------------------------------------------


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_per_connection_warnings_are_one_line_per_interval_counting_the_rest():
    """A stranger can make connections (and so warnings) as fast as it likes; the log gets one
    line per interval, which says how many it did not print."""
    import logging

    from coordinator.raft.transport import PeerWarnings

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.peer_warnings")
    logger.propagate = False
    logger.addHandler(Collect())
    clock = _FakeClock()
    warnings = PeerWarnings(logger, 1_000, clock=clock)
    for i in range(1000):  # a thousand drops within one interval
        warnings.warning("raft: dropped an incoming connection: %s", i)
    assert lines == ["raft: dropped an incoming connection: 0"]
    clock.now += 0.999
    warnings.warning("raft: dropped a connection: %s", "still inside the interval")
    assert len(lines) == 1
    clock.now += 0.001  # the interval is over: the next line counts what was not printed
    warnings.warning("raft: dropped a connection: %s", "x")
    assert lines[1] == "raft: dropped a connection: x (and 1000 more since the last line)"
    clock.now += 5.0  # a quiet spell: the next one is logged at once, with nothing suppressed
    warnings.warning("raft: dropped a connection: %s", "y")
    assert lines[2] == "raft: dropped a connection: y"

"""A raw client of a member's Raft port, for tests that play a stranger or an insider there.

Owns: ``RaftPeer`` (connect, the secret's binding handshake (peer_binding.py), naming a member, sending frames of the
typed wire or raw bodies, ``apply_command`` with a typed entry, seeing whether the member hung
up), ``stock_frame`` (a frame as stock pysyncobj writes it: zlib of a protocol-2 pickle, what
members before the typed wire spoke), ``epoch_floor_entry`` (a typed log entry whose command
raises the epoch: visible in Status when it commits), ``member_party`` (a member as a handshake names
it, from a live member's Status), ``Relay`` (a plain TCP forwarder with no secret, listening on a
stopped member's address), ``running_secret_cluster`` (a fixture's
cluster whose members share a secret) and ``send_first_frames`` (many fresh connections at
once, each carrying one frame in the slot where a member names itself, for the Raft-port
fuzzer). Must never: be imported by ``coordinator`` (tests/test_layers.py), or sleep where a
condition can be polled: ``hung_up`` waits on the socket with a deadline and
``send_first_frames`` on a selector.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Callable

import pysyncobj.pickle as ps_pickle
from pysyncobj.encryptor import getEncryptor

from coordinator.core import commands
from coordinator.raft import limits as raft_limits
from coordinator.raft import peer_binding
from coordinator.raft import wire as raft_wire
from coordinator.raft.peer_binding import Party, Transcript

_HEAD = struct.Struct("i")  # pysyncobj's frame head: native-endian 32-bit length


def stock_frame(message) -> bytes:
    """``message`` framed as stock pysyncobj sends it without the secret (tcp_connection.py:141-149)."""
    body = zlib.compress(ps_pickle.dumps(message), 3)
    return _HEAD.pack(len(body)) + body


def epoch_floor_entry(floor: int) -> bytes:
    """A log entry as a member writes it (the typed entry format) whose command raises the
    epoch to ``floor``."""
    command = commands.set_epoch_floor(floor=floor, stamp_ms=int(time.time() * 1000), fence_all=False).encode()
    return raft_wire.encode_entry(command)


# Who a RaftPeer says it is in its hello unless told: no member's address or id, so a member
# refuses its confirm (a stranger holding the secret cannot name a member it did not say it is).
STRANGER = Party("raft-peer.invalid:1", "raft-peer", 1)


def member_party(cluster, index: int, *, asking: int | None = None) -> Party:
    """Member ``index`` of ``cluster`` as its handshakes name it (address, id, incarnation),
    read from the Status of member ``asking`` (default: ``index`` itself; ask another when it
    is stopped)."""
    address = cluster.nodes[index].raft_address
    members = cluster.nodes[index if asking is None else asking].status().members
    member = next(m for m in members if m.id == address)  # Member.id is the Raft address
    return Party(address, member.member_id, member.incarnation)


def connected_to(node, address: str) -> bool:
    """Whether ``node`` (a RaftNode) counts a live connection to the member at ``address``."""
    return any(n.address == address for n in list(node.syncobj._SyncObj__connectedNodes))


class RaftPeer:
    """One TCP connection to a Raft port. With ``secret`` it sends the binding handshake's
    hello first, as a member's outgoing connection does (transport.py ``_onOutgoingConnected``),
    naming ``dialler`` (default ``STRANGER``) as who dials and the member at ``address`` as who
    is dialled, and reads the welcome (``welcomed``); ``name`` then confirms, so it speaks as an
    insider. ``key_exchange=False`` encrypts under ``secret`` but skips the handshake (what a
    peer that does not follow it sends: with a wrong secret, a stranger who gets no further
    anyway); ``target`` names another member as the one dialled (a relayed dial)."""

    def __init__(self, address: str, *, secret: str | None = None, encryptor=None, timeout_s: float = 5.0,
                 key_exchange: bool = True, dialler: Party = STRANGER, target: str | None = None):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.encryptor = encryptor if encryptor is not None else (getEncryptor(secret) if secret else None)
        self.send_key: bytes | None = None
        self.timeout_s = timeout_s
        self.hello = Transcript(os.urandom(peer_binding.NONCE_BYTES), dialler, target or address)
        self.welcomed: Transcript | None = None
        if self.encryptor is not None and key_exchange:
            self.sock.sendall(self.frame(self.hello.message(peer_binding.STEP_HELLO)))
            welcome = self._read_first(self.hello.dialler_nonce)
            self.welcomed, refusal = peer_binding.check_welcome(welcome, self.hello, None)
            if refusal is not None:
                raise ConnectionError(f"the member's welcome is refused: {refusal.why}")
            self.send_key = self.welcomed.receiver_nonce

    def _read_first(self, mine: bytes):
        buffer = b""
        deadline = time.monotonic() + self.timeout_s
        while len(buffer) < _HEAD.size or len(buffer) < _HEAD.size + _HEAD.unpack_from(buffer)[0]:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the member hung up during the handshake")
            buffer += chunk
        (length,) = _HEAD.unpack_from(buffer)
        body = self.encryptor.decrypt(buffer[_HEAD.size : _HEAD.size + length])
        return raft_wire.decode_frame(body, mine)

    def body(self, payload: bytes) -> bytes:
        """A frame around ``payload`` (a typed-wire body, or any bytes), encrypted with the secret."""
        if self.encryptor is not None:
            payload = self.encryptor.encrypt_at_time(payload, int(time.monotonic()))
        return _HEAD.pack(len(payload)) + payload

    def frame(self, message) -> bytes:
        """``message`` (a Raft message dict, a name, a key) as a frame of the typed wire."""
        return self.body(raft_wire.encode_frame(message, self.send_key))

    def name(self, member: str) -> RaftPeer:
        """Without the secret, name ``member``; with it, send the confirm that ends the
        handshake (naming ``member`` as the dialler: a member refuses a confirm that names
        another than the hello did)."""
        self.sock.sendall(self.naming_frame(member))
        return self

    def naming_frame(self, member: str) -> bytes:
        if self.welcomed is None:
            return self.frame(member)
        confirm = self.welcomed.message(peer_binding.STEP_CONFIRM)
        if member != self.welcomed.dialler.address:
            confirm["dialler"] = member
        return self.frame(confirm)

    def command_frame(self, entry: bytes, request_id: int | None = None) -> bytes:
        """An ``apply_command`` frame carrying ``entry`` (a typed entry), as a follower forwards a command."""
        message = {"type": "apply_command", "command": entry}
        if request_id is not None:
            message["request_id"] = request_id
        return self.frame(message)

    def apply_command(self, entry: bytes, request_id: int | None = None) -> RaftPeer:
        self.sock.sendall(self.command_frame(entry, request_id))
        return self

    def name_and_command(self, member: str, entry: bytes) -> RaftPeer:
        """Name ``member`` and send ``apply_command`` with ``entry`` in one write: a member that
        hangs up on the name cannot make the second write fail."""
        self.send(self.naming_frame(member), self.command_frame(entry))
        return self

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def receive(self, timeout_s: float):
        """The next message the member sends on this connection (decoded, typed wire without a
        secret), or None if none arrives within ``timeout_s``."""
        buffer = getattr(self, "_received", b"")
        deadline = time.monotonic() + timeout_s
        try:
            while len(buffer) < _HEAD.size or len(buffer) < _HEAD.size + _HEAD.unpack_from(buffer)[0]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the member hung up")
                buffer += chunk
        except TimeoutError:
            return None
        finally:
            self._received = buffer
        (length,) = _HEAD.unpack_from(buffer)
        body, self._received = buffer[_HEAD.size : _HEAD.size + length], buffer[_HEAD.size + length :]
        return raft_wire.decode_frame(body)

    def hung_up(self, timeout_s: float) -> bool:
        """True once the member closed the connection within ``timeout_s`` (what it sent is discarded)."""
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self.sock.recv(65536):
                    return True
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RaftPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Relay:
    """A plain TCP forwarder: every connection accepted on ``listen`` ("host:port") is joined
    to a fresh one to ``target``, bytes copied both ways unread (no secret), and both closed
    when either side closes. ``forwarded`` counts the joined pairs, ``closed_by_target`` the
    pairs the target hung up on first. Threads block on the sockets, so no poll sleeps."""

    def __init__(self, listen: str, target: str) -> None:
        host, port = listen.rsplit(":", 1)
        self._target = target.rsplit(":", 1)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, int(port)))
        self._listener.listen(16)
        self._lock = threading.Lock()
        self.forwarded = 0
        self.closed_by_target = 0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                dialler, _ = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            try:
                target = socket.create_connection((self._target[0], int(self._target[1])), timeout=_SOCKET_TIMEOUT_S)
            except OSError:
                dialler.close()  # the target is down: the dialler sees its dial end
                continue
            target.settimeout(None)
            with self._lock:
                self.forwarded += 1
                self._sockets += [dialler, target]
            threading.Thread(target=self._pump, args=(dialler, target, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(target, dialler, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_target: bool) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            if from_target:
                with self._lock:
                    self.closed_by_target += 1
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop_listening(self) -> None:
        """No more dials are accepted; the pairs joined so far stay."""
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()

    def close(self) -> None:
        self.stop_listening()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def secret_settings(directory, secret: str) -> dict:
    """Member settings that give every member ``secret`` (a file written in ``directory``)."""
    path = os.path.join(str(directory), "raft-secret")
    with open(path, "w", encoding="ascii") as f:
        f.write(secret + "\n")
    return {"raft_secret_file": path}


def running_secret_cluster(tmp_path_factory, request, secret: str, *, settings: dict | None = None,
                           metered: bool = False):
    """Generator for a pytest fixture: a running GrpcCluster whose members share ``secret``
    (its ``secret`` attribute), with any other ``settings`` for every member, and with
    ``metered`` their Prometheus endpoints on (``metrics_urls``, grpc_cluster.metered_cluster)."""
    # The harness imports much; only fixtures need it.
    from testsupport.grpc_cluster import metered_cluster, running_cluster

    base = tmp_path_factory.mktemp("raft-secret")
    start = metered_cluster if metered else running_cluster
    for cluster in start(str(base), request, settings={**(settings or {}), **secret_settings(base, secret)}):
        cluster.secret = secret
        yield cluster


# -- many first frames at once (the Raft-port fuzzer) ----------------------------------------
# A member drops a connection at its first refused frame, so every fuzzed frame needs a
# connection of its own; these are driven without threads, many at a time, on one selector.

# How long a blocking connect or send may take on loopback before the member counts as stuck.
_SOCKET_TIMEOUT_S = 5.0
# How often ``send_first_frames`` calls its ``watch`` while connections are in flight.
_WATCH_INTERVAL_S = 0.25


@dataclass
class FloodCounts:
    """What ``send_first_frames`` did at one member."""

    connections: int = 0
    bytes_sent: int = 0
    # Connections whose bytes held a whole first frame or a head over the bound: the member
    # must refuse (and count) each. The others only began a frame and were ended by an EOF.
    refusable: int = 0
    resets: int = 0  # the member reset the connection (it hung up before reading all we sent)


def holds_a_refusable_frame(data: bytes) -> bool:
    """Whether ``data`` (sent after the key exchange) holds a whole first frame or begins with a
    head over the bound. Read here, not with the wire's own scan, so a test does not inherit
    a mistake in what it tests."""
    if len(data) < _HEAD.size:
        return False
    (length,) = _HEAD.unpack_from(data)
    return length < 0 or length > raft_limits.RAFT_MESSAGE_BYTES_MAX or _HEAD.size + length <= len(data)


def first_frame_welcome(buffer: bytes, encryptor, hello: Transcript) -> Transcript | None:
    """The handshake bound by the member's welcome to ``hello``, once ``buffer`` holds it whole."""
    if len(buffer) < _HEAD.size or len(buffer) < _HEAD.size + _HEAD.unpack_from(buffer)[0]:
        return None
    (length,) = _HEAD.unpack_from(buffer)
    welcome = raft_wire.decode_frame(encryptor.decrypt(buffer[_HEAD.size : _HEAD.size + length]), hello.dialler_nonce)
    welcomed, refusal = peer_binding.check_welcome(welcome, hello, None)
    assert refusal is None, refusal
    return welcomed


def send_first_frames(
    targets: dict[str, deque],
    *,
    encryptor=None,
    concurrency: int,
    hang_up_within_s: float,
    watch: Callable[[], None] = lambda: None,
    dialler: Party = STRANGER,
) -> dict[str, FloodCounts]:
    """Open a fresh connection per case at each target (Raft address -> deque of cases).

    A case is a callable ``case(key, frame, confirm)`` that returns the bytes to send in the
    naming slot: ``key`` is the member's connection key after the secret's handshake (with
    ``encryptor``, a hello naming ``dialler`` sent first as a member's outgoing connection
    does, with one nonce of this side for all connections) or None, ``frame(body, head=None)``
    frames a body (encrypted with ``encryptor``) under its length or the given ``head``, and
    ``confirm`` is the frame that completes the handshake as ``dialler`` (b"" without it). A
    connection whose bytes hold no whole frame (and no head over the bound) shuts its write
    side after them, so it ends in an EOF rather than the naming deadline; the others stay
    open, as pysyncobj parses nothing that arrived with an EOF (it reads to the end, then
    drops the connection and its buffer). The member must close every connection within
    ``hang_up_within_s`` (AssertionError naming the target otherwise). At most ``concurrency``
    connections per target are open at once; ``watch`` is called every _WATCH_INTERVAL_S (to
    see members still running) and may raise.
    """
    counts = {address: FloodCounts() for address in targets}
    addresses = {address: (address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])) for address in targets}
    selector = selectors.DefaultSelector()
    open_at: dict[str, int] = {address: 0 for address in targets}

    def frame(body: bytes, head: int | None = None) -> bytes:
        if encryptor is not None:
            body = encryptor.encrypt_at_time(body, int(time.monotonic()))
        return _HEAD.pack(len(body) if head is None else head) + body

    def send_case(state: dict) -> None:
        welcomed = state.get("welcomed")
        confirm = b"" if welcomed is None else frame(
            raft_wire.encode_frame(welcomed.message(peer_binding.STEP_CONFIRM), state["key"]))
        data = state["case"](state["key"], frame, confirm)
        count = counts[state["address"]]
        count.bytes_sent += len(data)
        refusable = holds_a_refusable_frame(data)
        count.refusable += refusable
        try:
            state["sock"].sendall(data)
            if not refusable:
                state["sock"].shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            count.resets += 1  # refused before all of it was read
        state["phase"] = "hang-up"

    def open_one(address: str) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # test clusters listen on IPv4 loopback
        sock.settimeout(_SOCKET_TIMEOUT_S)
        # Sent at once: Nagle would hold the frame after the key exchange for the member's ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.connect(addresses[address])
        except OSError:
            sock.close()
            raise
        state = {"address": address, "sock": sock, "case": targets[address].popleft(), "key": None,
                 "buffer": b"", "deadline": time.monotonic() + hang_up_within_s}
        counts[address].connections += 1
        open_at[address] += 1
        if encryptor is not None:
            state["phase"] = "key"
            sock.sendall(hellos[address])
        else:
            send_case(state)
        selector.register(sock, selectors.EVENT_READ, state)

    def close(state: dict) -> None:
        selector.unregister(state["sock"])
        state["sock"].close()
        open_at[state["address"]] -= 1

    # The handshake's hello, encrypted once per member: a member answers any hello for it with
    # a welcome of its own nonce, so one frame serves all its connections (half the encryption).
    mine = os.urandom(peer_binding.NONCE_BYTES)
    hello_of = {address: Transcript(mine, dialler, address) for address in targets}
    hellos = {address: frame(raft_wire.encode_frame(hello.message(peer_binding.STEP_HELLO)))
              for address, hello in hello_of.items()} if encryptor is not None else {}
    watched_at = time.monotonic()
    try:
        while True:
            for address, cases in targets.items():
                while cases and open_at[address] < concurrency:
                    open_one(address)
            if not selector.get_map():
                return counts
            for selected, _ in selector.select(timeout=_WATCH_INTERVAL_S):
                state = selected.data
                try:
                    chunk = state["sock"].recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if state["phase"] == "key" and chunk:
                    state["buffer"] += chunk
                    welcomed = first_frame_welcome(state["buffer"], encryptor, hello_of[state["address"]])
                    if welcomed is not None:
                        state["key"], state["welcomed"] = welcomed.receiver_nonce, welcomed
                        send_case(state)
                elif not chunk:
                    assert state["phase"] == "hang-up", f"{state['address']} hung up during the key exchange"
                    close(state)
            now = time.monotonic()
            for key in list(selector.get_map().values()):
                assert now < key.data["deadline"], (
                    f"{key.data['address']} kept a connection open {hang_up_within_s} s after its first frame"
                )
            if now - watched_at >= _WATCH_INTERVAL_S:
                watched_at = now
                watch()
    finally:
        for key in list(selector.get_map().values()):
            key.data["sock"].close()
        selector.close()

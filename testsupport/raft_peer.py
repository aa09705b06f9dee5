"""A raw client of a member's Raft port, for tests that play a stranger or an insider there.

Owns: ``RaftPeer`` (connect, the secret's key exchange, naming a member, sending frames of the
typed wire or raw bodies, ``apply_command`` with a typed entry, seeing whether the member hung
up), ``stock_frame`` (a frame as stock pysyncobj writes it: zlib of a protocol-2 pickle, what
members before the typed wire spoke), ``epoch_floor_entry`` (a typed log entry whose command
raises the epoch: visible in Status when it commits), ``running_secret_cluster`` (a fixture's
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
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Callable

import pysyncobj.pickle as ps_pickle
from pysyncobj.encryptor import getEncryptor

from coordinator.core import commands
from coordinator.raft import limits as raft_limits
from coordinator.raft import wire as raft_wire

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


def connected_to(node, address: str) -> bool:
    """Whether ``node`` (a RaftNode) counts a live connection to the member at ``address``."""
    return any(n.address == address for n in list(node.syncobj._SyncObj__connectedNodes))


class RaftPeer:
    """One TCP connection to a Raft port. With ``secret`` it does the key exchange first, as a
    member's outgoing connection does (transport.py:423-470), so it speaks as an insider;
    ``key_exchange=False`` encrypts under ``secret`` but skips the exchange (what a peer that
    does not follow it sends: with a wrong secret, a stranger who gets no further anyway)."""

    def __init__(self, address: str, *, secret: str | None = None, encryptor=None, timeout_s: float = 5.0,
                 key_exchange: bool = True):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.encryptor = encryptor if encryptor is not None else (getEncryptor(secret) if secret else None)
        self.send_key: bytes | None = None
        self.timeout_s = timeout_s
        if self.encryptor is not None and key_exchange:
            mine = os.urandom(32)
            self.sock.sendall(self.frame(mine))
            self.send_key = self._read_key(mine)

    def _read_key(self, mine: bytes) -> bytes:
        buffer = b""
        deadline = time.monotonic() + self.timeout_s
        while len(buffer) < _HEAD.size or len(buffer) < _HEAD.size + _HEAD.unpack_from(buffer)[0]:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the member hung up during the key exchange")
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
        self.sock.sendall(self.frame(member))
        return self

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
        self.send(self.frame(member), self.command_frame(entry))
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


def running_secret_cluster(tmp_path_factory, request, secret: str, *, settings: dict | None = None):
    """Generator for a pytest fixture: a running GrpcCluster whose members share ``secret``
    (its ``secret`` attribute), with any other ``settings`` for every member."""
    from testsupport.grpc_cluster import running_cluster  # the harness imports much; only fixtures need it

    base = tmp_path_factory.mktemp("raft-secret")
    secret_file = base / "raft-secret"
    secret_file.write_text(secret + "\n")
    for cluster in running_cluster(str(base), request, settings={**(settings or {}), "raft_secret_file": str(secret_file)}):
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


def first_frame_key_reply(buffer: bytes, encryptor, mine: bytes) -> bytes | None:
    """The member's key from its key-exchange reply once ``buffer`` holds the whole frame."""
    if len(buffer) < _HEAD.size or len(buffer) < _HEAD.size + _HEAD.unpack_from(buffer)[0]:
        return None
    (length,) = _HEAD.unpack_from(buffer)
    return raft_wire.decode_frame(encryptor.decrypt(buffer[_HEAD.size : _HEAD.size + length]), mine)


def send_first_frames(
    targets: dict[str, deque],
    *,
    encryptor=None,
    concurrency: int,
    hang_up_within_s: float,
    watch: Callable[[], None] = lambda: None,
) -> dict[str, FloodCounts]:
    """Open a fresh connection per case at each target (Raft address -> deque of cases).

    A case is a callable ``case(key, frame)`` that returns the bytes to send in the naming
    slot: ``key`` is the member's connection key after the secret's key exchange (with
    ``encryptor``, done first as a member's outgoing connection does it, with one key of this
    side for all connections) or None, and ``frame(body, head=None)`` frames a body (encrypted with ``encryptor``) under its length
    or the given ``head``. A connection whose bytes hold no whole frame (and no head over the
    bound) shuts its write side after them, so it ends in an EOF rather than the naming
    deadline; the others stay open, as pysyncobj parses nothing that arrived with an EOF
    (it reads to the end, then drops the connection and its buffer). The member must close
    every connection within ``hang_up_within_s`` (AssertionError naming the target
    otherwise). At most ``concurrency`` connections per target are open at once; ``watch``
    is called every _WATCH_INTERVAL_S (to see members still running) and may raise.
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
        data = state["case"](state["key"], frame)
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
            sock.sendall(hello)
        else:
            send_case(state)
        selector.register(sock, selectors.EVENT_READ, state)

    def close(state: dict) -> None:
        selector.unregister(state["sock"])
        state["sock"].close()
        open_at[state["address"]] -= 1

    # The key exchange's first frame, encrypted once: the member takes any 32 bytes as this
    # side's key, on every connection alike, so one frame serves all (half the encryption).
    mine = os.urandom(32)
    hello = frame(raft_wire.encode_frame(mine)) if encryptor is not None else b""
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
                    state["key"] = first_frame_key_reply(state["buffer"], encryptor, mine)
                    if state["key"] is not None:
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

"""A raw client of a member's Raft port, for tests that play a stranger or an insider there.

Owns: ``RaftPeer`` (connect, the secret's key exchange, naming a member, sending frames of the
typed wire or raw bodies, ``apply_command`` with a typed entry, seeing whether the member hung
up), ``stock_frame`` (a frame as stock pysyncobj writes it: zlib of a protocol-2 pickle, what
members before the typed wire spoke), ``epoch_floor_entry`` (a typed log entry whose command
raises the epoch: visible in Status when it commits) and ``running_secret_cluster`` (a
fixture's cluster whose members share a secret). Must never: be imported by ``coordinator``
(tests/test_layers.py), or sleep where a condition can be polled: ``hung_up`` waits on the
socket with a deadline.
"""

from __future__ import annotations

import os
import socket
import struct
import time
import zlib

import pysyncobj.pickle as ps_pickle
from pysyncobj.encryptor import getEncryptor

from coordinator.core import commands
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

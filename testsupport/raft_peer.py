"""A stranger at a Raft port who speaks exactly what a member speaks: for attack tests.

Owns: ``member_bytes`` (messages framed by pysyncobj's own TcpConnection with our wire patches
installed, so they follow whatever wire the members use, optionally encrypted under a secret)
and ``epoch_floor_entry`` (a log entry as a member writes it, whose command raises the epoch:
visible in Status when it commits), and ``running_secret_cluster``. Must never: be imported by anything under coordinator/.
"""

from __future__ import annotations

import socket
import time

import pysyncobj.tcp_connection as ps_tcp
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import createPoller

from coordinator.core import commands
from coordinator.raft import patches
from coordinator.raft import wire as raft_wire
from coordinator.raft.syncobj import _ENTRY_REGULAR


def member_bytes(*messages, secret: str | None = None) -> bytes:
    """``messages`` as a member's TcpConnection puts them on the wire (``secret``: encrypted
    under it, as a member with that secret would, but without the key exchange)."""
    patches.install()  # what every member runs with: the wire under test
    ours, theirs = socket.socketpair()
    try:
        conn = ps_tcp.TcpConnection(createPoller("auto"), socket=ours, timeout=60)
        if secret is not None:
            conn.encryptor = getEncryptor(secret)
        for message in messages:
            conn.send(message)  # a socketpair takes a few KiB at once: written before this returns
        theirs.setblocking(False)
        out = b""
        while True:
            try:
                chunk = theirs.recv(1 << 16)
            except BlockingIOError:
                return out
            out += chunk
    finally:
        ours.close()
        theirs.close()


def epoch_floor_entry(floor: int) -> bytes:
    """A log entry as a member writes it: a call of the state machine's apply (method id 0,
    its only replicated method) with a command that raises the epoch to ``floor``."""
    command = commands.set_epoch_floor(floor=floor, stamp_ms=int(time.time() * 1000), fence_all=False).encode()
    return _ENTRY_REGULAR + raft_wire.dumps((0, (command,)))


def running_secret_cluster(tmp_path_factory, request, secret: str):
    """Generator for a pytest fixture: a running GrpcCluster whose members share ``secret``."""
    from testsupport.grpc_cluster import running_cluster

    base = tmp_path_factory.mktemp("raft-secret")
    secret_file = base / "raft-secret"
    secret_file.write_text(secret + "\n")
    yield from running_cluster(str(base), request, settings={"raft_secret_file": str(secret_file)})

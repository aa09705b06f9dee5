"""Connection limits of the gRPC API (issue 26): how many connections it holds, from whom, for
how long, and the descriptors kept for everything else.

Owns: the gRPC server options that cap connections per member (``api_connections_max``), time
out a handshake (``api_handshake_timeout_s``) and close an idle connection
(``api_connection_idle_s``); the per-address cap (``PeerConnectionCap``,
``api_connections_per_peer_max``), which reads the kernel's connection table once a second and
shuts down the newest connections of an address over the cap; and the descriptor budget at
start (``ensure_fd_budget``): the soft RLIMIT_NOFILE raised to the hard one, and a refusal to
start when ``api_connections_max`` plus the reserve (``fd_reserve``: Raft port, journal,
snapshots, metrics, the process itself) does not fit under it.
Must never: read or write a connection's data, close a descriptor it does not own (it shuts
down the socket through a duplicate, and gRPC closes its own), or block an RPC or the Raft thread.

Why not in gRPC: the Python server has no per-address hook before a call, and a connection that
never makes a call never reaches an interceptor. The scan lags by at most ``PEER_SCAN_INTERVAL_S``:
an address may hold up to ``api_connections_max`` for that long, never more.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import resource
import socket
import sys
import threading
from typing import Callable

from coordinator.raft import limits as raft_limits
from coordinator.server.log_limits import RefusedLines

log = logging.getLogger(__name__)

# How often the per-address cap looks at the connection table: an address over the cap keeps its
# excess at most this long. A scan of 1,000 connections reads ~150 KB of /proc and takes ~2 ms.
PEER_SCAN_INTERVAL_S = 1.0
# Descriptors of the process itself, whatever it serves: stdio, the gRPC core's epoll and wakeup
# descriptors, the listeners, log and audit files, /proc reads (an idle member holds ~20).
FD_PROCESS_RESERVE = 64
# Descriptors of the journal, its metadata, a snapshot being written and one being read, their
# directory syncs, and a backup being streamed (coordinator/core/limits.BACKUP_TRANSFERS_MAX).
FD_STORAGE_RESERVE = 16
# Raft connections per other member: its connection to us, ours to it, and a third while one
# that restarted replaces its old connection (RAFT.md "Member identity").
FD_RAFT_PER_MEMBER = 3

_TCP_ESTABLISHED = "01"  # the st column of /proc/net/tcp (include/net/tcp_states.h)
_TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")


class FdBudgetError(Exception):
    """The descriptor limit cannot hold ``api_connections_max`` and the reserve; one line."""


def grpc_options(config) -> tuple[tuple[str, int], ...]:
    """The gRPC server options of the three limits gRPC enforces itself (milliseconds)."""
    return (
        # beyond it gRPC closes a connection right after accepting it (its descriptor is freed)
        ("grpc.max_allowed_incoming_connections", config.api_connections_max),
        # TLS handshake, HTTP/2 preface and first SETTINGS: a silent connection is closed then
        ("grpc.server_handshake_timeout_ms", _ms(config.api_handshake_timeout_s)),
        # no call for this long: GOAWAY, and the connection closes
        ("grpc.max_connection_idle_ms", _ms(config.api_connection_idle_s)),
    )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def fd_reserve(config) -> int:
    """Descriptors kept for everything but API connections."""
    metrics = config.metrics_connections_max + 1 if config.metrics_address else 0  # + the listener
    raft = raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX + FD_RAFT_PER_MEMBER * raft_limits.RAFT_MEMBERS_MAX + 1
    return FD_PROCESS_RESERVE + FD_STORAGE_RESERVE + raft + metrics


def ensure_fd_budget(config) -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one, and check that ``api_connections_max``
    and the reserve fit under it; (descriptors needed, limit). FdBudgetError (one line naming
    api_connections_max) if they do not: the member would otherwise start and later fail its
    Raft accepts and its journal writes when its API fills (issue 26)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # e.g. a hard limit above the kernel's nr_open: the check below uses the soft one
    reserve = fd_reserve(config)
    needed = config.api_connections_max + reserve
    if soft != resource.RLIM_INFINITY and needed > soft:
        raise FdBudgetError(
            f"api_connections_max {config.api_connections_max}: with {reserve} descriptors kept for the"
            f" Raft port, journal, snapshots and metrics it needs {needed}, above this process's"
            f" descriptor limit {soft} (RLIMIT_NOFILE, hard {hard}); lower api_connections_max to"
            f" {max(0, soft - reserve)} or raise the limit (LimitNOFILE=, ulimit -n)"
        )
    return needed, soft


# -- the per-address cap -------------------------------------------------------------------


def _address(hex_address: str) -> tuple[str, int]:
    """(ip, port) of a /proc/net/tcp{,6} address: hex words in host byte order, then the port."""
    ip_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(ip_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack listener sees IPv4 callers as ::ffff:a.b.c.d
    return str(ip), int(port_hex, 16)


def established_by_peer(port: int, tables=_TCP_TABLES) -> dict[str, list[int]]:
    """Remote IP -> socket inodes of the established connections to local ``port`` this network
    namespace holds (inode 0, not yet accepted, left out)."""
    suffix = f":{port:04X}"
    peers: dict[str, list[int]] = {}
    for path in tables:
        try:
            with open(path, encoding="ascii") as table:
                next(table, None)  # the header
                for line in table:
                    fields = line.split()
                    if len(fields) < 10 or not fields[1].endswith(suffix) or fields[3] != _TCP_ESTABLISHED:
                        continue
                    inode = int(fields[9])
                    if inode:
                        peers.setdefault(_address(fields[2])[0], []).append(inode)
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
    return peers


def socket_fds() -> dict[int, int]:
    """Socket inode -> descriptor, for this process's sockets."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed in between
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def shut_down(fd: int, inode: int) -> bool:
    """Shut the socket ``fd`` down if it still is socket ``inode`` (the number may have been
    reused since it was read); its owner (gRPC) sees the end and closes its descriptor."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    sock = None
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        sock = socket.socket(fileno=dup)
        dup = -1
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if sock is not None:
            sock.close()  # the duplicate only
        elif dup >= 0:
            os.close(dup)


class PeerConnectionCap:
    """Once every ``interval_s``, shuts down the newest API connections of each remote address
    over ``per_peer_max``. Newest: first seen by the latest scan. Socket inode numbers are not
    an age (Linux hands them out in per-CPU batches: CI saw an older connection numbered above
    newer ones), so each connection's first scan is remembered; among connections first seen by
    the same scan, the highest inode goes first."""

    def __init__(self, port: int, per_peer_max: int, *, interval_s: float = PEER_SCAN_INTERVAL_S,
                 refused_lines: RefusedLines | None = None,
                 on_closed: Callable[[int], None] | None = None) -> None:
        self.port = port
        self.per_peer_max = per_peer_max
        self.interval_s = interval_s
        self.closed_total = 0
        self._scans = 0
        self._first_seen: dict[int, int] = {}  # inode -> the scan that first saw it (live ones only)
        self._lines = refused_lines or RefusedLines()
        self._on_closed = on_closed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scan_once(self) -> int:
        """One pass; the number of connections shut down."""
        peers = established_by_peer(self.port)
        self._scans += 1
        first_seen = {inode: self._first_seen.get(inode, self._scans)
                      for inodes in peers.values() for inode in inodes}
        self._first_seen = first_seen  # at most the connections held: closed ones are forgotten
        over = {peer: inodes for peer, inodes in peers.items() if len(inodes) > self.per_peer_max}
        if not over:
            return 0
        fds = socket_fds()
        closed = 0
        for peer, inodes in over.items():
            # only sockets of this process, oldest first
            mine = sorted((i for i in inodes if i in fds), key=lambda i: (first_seen[i], i))
            excess = mine[self.per_peer_max:]
            done = sum(shut_down(fds[inode], inode) for inode in excess)
            closed += done
            admitted = self._lines.admit(peer) if done else None
            if admitted is not None:
                log.warning("closed %d API connections from %s: it held %d, above api_connections_per_peer_max %d%s",
                            done, peer, len(mine), self.per_peer_max, admitted.note())
        self.closed_total += closed
        if closed and self._on_closed is not None:
            self._on_closed(closed)
        return closed

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.scan_once()
            except OSError as exc:  # e.g. EMFILE: the descriptor limit was lowered under us
                log.warning("API connection scan failed (%s); trying again in %.1f s", exc, self.interval_s)
            except Exception:  # not only OSError: a bug of any type in the scan must not end the cap
                log.exception("API connection scan failed; trying again in %.1f s", self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="api-peer-cap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 1)
            self._thread = None

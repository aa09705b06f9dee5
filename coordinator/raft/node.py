"""One Raft replica of the fencing state machine: the only module that imports pysyncobj.

Owns: a hardened pysyncobj 0.3.17 node (journal, snapshots, transport binding,
coalesced sends) and ``propose()``, which reports what happened to a command —
applied, refused, not applied, or outcome unknown — and never guesses.

Must never: decide domain rules (the state machine does), let an exception raised
inside apply wedge the node (it stops the process instead), or acknowledge a
command before it is durable on a majority.

Every override of pysyncobj internals below names the upstream line it fixes and
can be switched off by name (``RaftConfig.fixes``), so a test can show it matters.
Fix names:
  durable_journal      own fsynced journal + group commit (journal.py, _flush_tick)
  keep_tail            keep the journal tail on restart (syncobj.py:1489-1495)
  next_index_forward   success acks never move nextIndex back (syncobj.py:1079-1082)
  truncate_on_conflict truncate only on a real term conflict (syncobj.py:991-1004)
  no_old_snapshot      never install a snapshot older than lastApplied (syncobj.py:1021-1025)
  commit_needs_match   commit only what this message proved matches (syncobj.py:1027-1035)
  fast_backup          a follower answers a term conflict with the first index of its
                       conflicting term, and the leader resends at its next tick
                       (syncobj.py:988-989, 1077-1078: one index per heartbeat, which
                       pipelined sends keep undoing: a divergent follower never caught up)

Batching: commands proposed with a ``batch_key`` while the tick thread is busy share one
Raft entry (``raft_wire.encode_shared_entry``), applied one by one in order under one
index. Two commands with the same key never share an entry, so per key (the service uses
the resource name) every command still has an index of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import gc
import inspect
import logging
import os
import socket
import struct
import sys
import threading
import time
import zlib
from typing import Any, Callable

import msgpack
import pysyncobj
import pysyncobj.pickle as _ps_pickle
import pysyncobj.syncobj as _ps
import pysyncobj.tcp_connection as _ps_tcp
import pysyncobj.version
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.journal import FileJournal, Journal
from pysyncobj.transport import TCPTransport

from coordinator.core import limits
from coordinator.raft import wire as raft_wire
from coordinator.raft.journal import DurableJournal, JOURNAL_NAME, fsync_directory
from coordinator.raft.leader_sync import LeaderSync

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION_REQUIRED = "0.3.17"
DUMP_NAME = "raft.dump"

ALL_FIXES = frozenset(
    {
        "durable_journal",
        "keep_tail",
        "next_index_forward",
        "truncate_on_conflict",
        "no_old_snapshot",
        "commit_needs_match",
        "fast_backup",
    }
)

EXIT_APPLY_FAILED = 70  # a programmer error inside apply: stop, never wedge
EXIT_DISK_FAILED = 71  # fsync or write failed: durability can no longer be promised


def check_pysyncobj_version(found: str | None = None) -> None:
    """Refuse to run on any pysyncobj but the one whose internals we patch."""
    found = pysyncobj.version.VERSION if found is None else found
    if found != PYSYNCOBJ_VERSION_REQUIRED:
        raise RuntimeError(
            f"pysyncobj {found} is installed, but this coordinator requires exactly "
            f"{PYSYNCOBJ_VERSION_REQUIRED}: its Raft fixes override that version's internals "
            f"(pip install pysyncobj=={PYSYNCOBJ_VERSION_REQUIRED})"
        )


# pysyncobj builds its journal with a module-level createJournal(conf.journalFile)
# (syncobj.py:161) that only knows paths. Accepting a ready Journal object there is
# the narrowest way in; paths and None keep the stock behaviour.
_stock_create_journal = _ps.createJournal


def _create_journal(journal_file):
    if isinstance(journal_file, Journal):
        return journal_file
    return _stock_create_journal(journal_file)


_ps.createJournal = _create_journal


# pysyncobj deflates every Raft message (tcp_connection.py:144); small ones go out as
# stored zlib blocks instead, the same format for any peer (raft_wire.py says why).
class _RaftWireZlib:
    """What tcp_connection.py sees as ``zlib``: stored blocks for small messages."""

    decompress = staticmethod(raft_wire.bounded_inflate)  # its errors drop the connection
    error = zlib.error

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        if len(data) < raft_wire.ZLIB_STORED_BELOW_BYTES:
            return raft_wire.zlib_stored(data)
        return zlib.compress(data, level)  # large snapshot chunks: worth compressing


_ps_tcp.zlib = _RaftWireZlib


# pysyncobj's frame reader (tcp_connection.py:261-299) buffers until a frame's 32-bit length
# is in: up to 2 GiB per connection, from anyone who reaches a Raft port (with the secret
# too: it is checked once the frame is whole). It also grows its buffer by concatenating
# bytes, which copies the buffer on every read: seconds on the Raft thread for a frame of
# tens of MiB. Ours is the same reader with the heads checked as bytes arrive
# (raft_wire.scan_frames: a head declaring more than limits.RAFT_MESSAGE_BYTES_MAX drops the
# connection before its body is waited for) and a bytearray that grows in place.
# ``_frames_scanned_to`` is where the first frame not yet whole starts in the buffer.
_ps_conn = _ps_tcp.TcpConnection
_stock_connect = _ps_conn.connect
_stock_disconnect = _ps_conn.disconnect
# Our per-connection state, as class defaults a connection overrides for itself.
_ps_conn._frames_scanned_to = 0
_ps_conn.on_refused_frame = None  # the transport's refusal counter, once it owns the connection
_ps_conn.accepted_at = 0.0  # monotonic time an incoming connection was accepted


def _process_read_bounded(conn) -> bool:
    # tcp_connection.py:261-275, with the buffer a bytearray and the heads checked.
    try:
        incoming = conn._TcpConnection__socket.recv(conn._TcpConnection__recvBufferSize)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            conn.disconnect()
        return False
    if conn._TcpConnection__socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        conn.disconnect()
        return False
    if not incoming:
        conn.disconnect()
        return False
    buffer = conn._TcpConnection__readBuffer
    if not isinstance(buffer, bytearray):  # pysyncobj (re)sets it to bytes() on (dis)connect
        buffer = conn._TcpConnection__readBuffer = bytearray(buffer)
    buffer += incoming
    try:
        conn._frames_scanned_to = raft_wire.scan_frames(buffer, conn._frames_scanned_to)
    except raft_wire.FrameTooLarge as exc:
        log.warning("raft: dropped a connection: %s", exc)
        if conn.on_refused_frame is not None:
            conn.on_refused_frame()
        conn.disconnect()
        return False
    return True


def _parse_message_bounded(conn):
    # tcp_connection.py:277-299, reading the bytearray; a refused frame drops the connection.
    buffer = conn._TcpConnection__readBuffer
    if len(buffer) < raft_wire.FRAME_HEAD.size:
        return None
    (length,) = raft_wire.FRAME_HEAD.unpack_from(buffer, 0)
    end = raft_wire.FRAME_HEAD.size + length
    if len(buffer) < end:
        return None
    with memoryview(buffer) as view:  # released before the buffer shrinks
        data = view[raft_wire.FRAME_HEAD.size : end].tobytes()
    try:
        if conn.encryptor:
            timestamp = conn.encryptor.extract_timestamp(data)
            if timestamp < conn.recvLastTimestamp:
                raise ValueError("a replayed or reordered frame")
            conn.recvLastTimestamp = timestamp
            data = conn.encryptor.decrypt(data)
        message = _ps_tcp.pickle.loads(_ps_tcp.zlib.decompress(data))
        if conn.recvRandKey:
            rand_key, message = message
            if rand_key != conn.recvRandKey:
                raise ValueError("a frame under another connection's key")
    except Exception:  # noqa: BLE001 - as pysyncobj: any bad frame drops the connection
        conn.disconnect()
        return None
    del buffer[:end]
    conn._frames_scanned_to = max(0, conn._frames_scanned_to - end)
    return message


def _connect_tracked(conn, host, port):
    conn._frames_scanned_to = 0
    return _stock_connect(conn, host, port)


def _disconnect_tracked(conn):
    conn._frames_scanned_to = 0
    return _stock_disconnect(conn)


_ps_conn._TcpConnection__processRead = _process_read_bounded
_ps_conn._TcpConnection__processParseMessage = _parse_message_bounded
_ps_conn.connect = _connect_tracked
_ps_conn.disconnect = _disconnect_tracked


# pysyncobj unpickles every Raft frame (tcp_connection.py:291) and every log entry it applies
# (syncobj.py:874, 894, 977, 1419): code execution for anyone who reaches a Raft port or gets
# an entry into the log. What pysyncobj itself sends and stores is plain data, so both modules
# get an unpickler that refuses every global (raft_wire.plain_loads says why that suffices),
# and what we send is pickled with protocol 5, which needs no global for bytes.
# A refused frame drops the connection (tcp_connection.py:293-296); entries are checked
# further by _SyncObj__doApplyCommand below.
class _RaftWirePickle:
    """What syncobj.py and tcp_connection.py see as ``pickle``: plain data in, protocol 5 out."""

    @staticmethod
    def dumps(value, protocol=None) -> bytes:  # pysyncobj's signature; it ignores protocol too
        return raft_wire.dumps(value)

    loads = staticmethod(raft_wire.plain_loads)
    to_bytes = staticmethod(_ps_pickle.to_bytes)


_ps.pickle = _RaftWirePickle
_ps_tcp.pickle = _RaftWirePickle

# An entry's first byte is its pysyncobj command type (syncobj.py:56-60, 497).
_ENTRY_REGULAR = _ps._bchr(_ps._COMMAND_TYPE.REGULAR)
_ENTRY_NEVER_OURS = (_ps._bchr(_ps._COMMAND_TYPE.MEMBERSHIP), _ps._bchr(_ps._COMMAND_TYPE.VERSION))


class Outcome(enum.Enum):
    APPLIED = "applied"  # committed and applied; the state machine accepted it
    REFUSED = "refused"  # committed and applied; the state machine refused it (a value)
    NOT_APPLIED = "not_applied"  # definitely never applied: safe to retry anywhere
    UNKNOWN = "unknown"  # may or may not apply: retry with the same op_id


@dataclasses.dataclass(frozen=True)
class ProposeResult:
    outcome: Outcome
    value: Any = None  # the state machine's result (APPLIED / REFUSED)
    index: int = 0  # the Raft index it was applied at (APPLIED / REFUSED)
    detail: str = ""  # why, for NOT_APPLIED / UNKNOWN


# PYSYNCOBJ.md "Call semantics": these codes mean the entry was never appended
# by a leader, or was overwritten; the rest are ambiguous.
_DEFINITE_FAILURES = {
    FAIL_REASON.QUEUE_FULL: "queue_full",
    FAIL_REASON.MISSING_LEADER: "no_leader",
    FAIL_REASON.NOT_LEADER: "not_leader",
    FAIL_REASON.REQUEST_DENIED: "request_denied",
    FAIL_REASON.DISCARDED: "discarded",
}
_AMBIGUOUS_FAILURES = {
    FAIL_REASON.LEADER_CHANGED: "leader_changed",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown_outcome",
}


@dataclasses.dataclass(frozen=True)
class RaftConfig:
    self_address: str  # "host:port"; the node binds this for listening and outgoing
    peer_addresses: tuple[str, ...]  # the other members (static membership)
    data_dir: str
    # Election timeout window. 1-2 s keeps spurious elections rare on a loaded
    # 2-core machine (PYSYNCOBJ.md "Settings that behaved well"); tests lower it.
    raft_min_timeout_s: float = 1.0
    raft_max_timeout_s: float = 2.0
    # An isolated leader steps down after this long without a majority answering
    # (stock default 30 s would let it claim leadership for half a minute).
    leader_fallback_timeout_s: float = 1.5
    # How soon a dropped peer connection is retried.
    connection_retry_s: float = 0.5
    # Heartbeat period; also the longest a leader waits before resending.
    heartbeat_s: float = 0.1
    # The leader runs its own journal fdatasync on a thread of its own, so the Raft thread
    # keeps handling acks and new commands meanwhile (it counts itself toward a commit
    # only once its copy is durable). False: sync inline, once per tick.
    leader_sync_in_background: bool = True
    # A commit index advance with no new entry to carry it is announced to followers
    # after at most this long (0 = at once, stock behaviour). In a stream of commands
    # the next append carries it for free; announcing each commit on its own costs the
    # leader one send and each follower one receive, one tick and one ack per op
    # (about half of a follower's CPU per op when commands come one at a time). Only
    # followers' apply lags by it (their own proposals and local reads), never commits.
    commit_notify_delay_s: float = 0.002
    # Bounded queue of proposals waiting for the tick thread; beyond it, QUEUE_FULL.
    commands_queue_size: int = 10_000
    # Snapshot + compact after this many entries or this many seconds. A snapshot runs
    # on the tick thread (~40 ms with a full dedup table), so rarer is smoother; 50k
    # entries keep the in-memory log near 10 MB and a replay on restart around a second.
    log_compaction_min_entries: int = 50_000
    log_compaction_min_time_s: float = 300.0
    # Test switches: which fixes are on (default all), and whether the journal
    # records its synced length for power-loss simulation.
    fixes: frozenset[str] = ALL_FIXES
    track_synced: bool = False
    # Shared secret of member-to-member traffic: pysyncobj's Fernet (AES-CBC + HMAC,
    # encryptor.py), so a peer without it is disconnected before anything it sent is
    # unpickled. None: plaintext, and whoever reaches the Raft port can pose as a member.
    secret: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        unknown = set(self.fixes) - ALL_FIXES
        if unknown:
            raise ValueError(f"unknown raft fixes: {sorted(unknown)}")
        if not (0 < self.raft_min_timeout_s < self.raft_max_timeout_s):
            raise ValueError("need 0 < raft_min_timeout_s < raft_max_timeout_s")
        if not (0 <= self.commit_notify_delay_s < self.heartbeat_s):
            raise ValueError("need 0 <= commit_notify_delay_s < heartbeat_s")
        if self.raft_min_timeout_s <= 3 * self.heartbeat_s:
            # pysyncobj's own rule (config.py:174): several heartbeats per timeout.
            raise ValueError("raft_min_timeout_s must exceed 3 * heartbeat_s")


def _default_fatal(message: str, exit_code: int) -> None:
    log.critical(message)
    print(f"FATAL: {message}", file=sys.stderr, flush=True)
    os._exit(exit_code)


# -- snapshot files: msgpack, checksummed, fsynced ------------------------------

_DUMP_MAGIC = b"FNCDUMP\x00"
_DUMP_HEAD = struct.Struct("<8sIQQI")  # magic, version, last index, last term, crc32(body)
_DUMP_VERSION = 1


def _verify_dump(path: str) -> tuple[int, int]:
    """Check a snapshot file's header and checksum; return its (last index, last term)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < _DUMP_HEAD.size:
        raise ValueError(f"{path}: snapshot shorter than its header")
    magic, version, index, term, crc = _DUMP_HEAD.unpack_from(raw, 0)
    if magic != _DUMP_MAGIC or version != _DUMP_VERSION:
        raise ValueError(f"{path}: not a snapshot of format {_DUMP_VERSION}")
    if zlib.crc32(raw[_DUMP_HEAD.size :]) != crc:
        raise ValueError(f"{path}: snapshot checksum mismatch")
    return index, term


@contextlib.contextmanager
def _gc_paused():
    """The cyclic GC off while a snapshot is built or read: millions of short-lived
    containers trigger it over and over (measured: a full-table snapshot 269 -> 130 ms,
    its restore 1.5 -> 1.0 s, on the Raft thread). Nothing cyclic is made meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _entry_tuple(entry) -> tuple[bytes, int, int]:
    # pysyncobj compares entries as tuples (syncobj.py:1489-1495); a list from
    # msgpack would never compare equal and the journal would be cleared.
    return (bytes(entry[0]), int(entry[1]), int(entry[2]))


class _Replica(SyncObjConsumer):
    """Holds the state machine; its one replicated method takes our own bytes."""

    def __init__(self, state_machine, on_fatal: Callable[[str, int], None]):
        self._sm = state_machine
        self._on_fatal = on_fatal
        self.lock = threading.Lock()  # apply (tick thread) vs readers (other threads)
        self.last_applied_index = 0
        self._apply_takes_index = "index" in inspect.signature(state_machine.apply).parameters
        super().__init__()

    # One @replicated entry point: pysyncobj numbers replicated methods by sorted
    # name (syncobj.py:248-255), so a single method never renumbers on upgrade.
    @replicated
    def apply(self, entry: bytes):
        try:
            index = self._syncObj.raftLastApplied + 1
            shared = raft_wire.decode_shared_entry(entry)
            with self.lock:
                if shared is None:
                    # A malformed shared entry goes to the state machine as is: refused as a value.
                    outcome = self._apply_one(entry, index)
                else:
                    outcome = [self._apply_one(command, index) for command in shared]
                self.last_applied_index = index
            return index, outcome
        except BaseException as exc:  # noqa: BLE001 - any failure here is a bug
            # An exception escaping apply is re-applied forever by pysyncobj
            # (syncobj.py:708-734): stop loudly instead of wedging silently.
            self._on_fatal(f"state machine apply raised {exc!r}; stopping", EXIT_APPLY_FAILED)
            raise

    def _apply_one(self, command: bytes, index: int):
        # The index lets the state machine report where an op_id first applied.
        return self._sm.apply(command, index) if self._apply_takes_index else self._sm.apply(command)

    def serialize(self, path: str, data) -> None:
        last, prev, _cluster = data
        with self.lock, _gc_paused():
            state = self._sm.snapshot()
        body = msgpack.packb([list(last), list(prev), state], use_bin_type=True)
        head = _DUMP_HEAD.pack(_DUMP_MAGIC, _DUMP_VERSION, last[1], last[2], zlib.crc32(body))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(head + body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)  # pysyncobj renames it into place (serializer.py:93)
        finally:
            os.close(fd)

    def deserialize(self, path: str):
        with open(path, "rb") as f:
            raw = f.read()
        magic, version, _index, _term, crc = _DUMP_HEAD.unpack_from(raw, 0)
        body = raw[_DUMP_HEAD.size :]
        if magic != _DUMP_MAGIC or version != _DUMP_VERSION or zlib.crc32(body) != crc:
            raise ValueError(f"{path}: damaged snapshot")
        try:
            with self.lock, _gc_paused():
                last, prev, state = msgpack.unpackb(body, raw=False)
                self._sm.restore(state)
                self.last_applied_index = int(last[1])
        except BaseException as exc:  # noqa: BLE001
            # pysyncobj swallows loader errors (syncobj.py:1510); a half-restored
            # state machine must never serve.
            self._on_fatal(f"restoring snapshot {path} failed: {exc!r}", EXIT_APPLY_FAILED)
            raise
        return _entry_tuple(last), _entry_tuple(prev), set()


class _BoundTCPTransport(TCPTransport):
    """Outgoing peer connections leave from this node's own address.

    pysyncobj never binds outgoing sockets (tcp_connection.py:119), so every node on
    127.0.0.2/.3/.4 would connect from 127.0.0.1 and packet filters could not tell
    them apart. TcpConnection.connect() calls setSockoptKeepalive() right before
    connect() (tcp_connection.py:123): binding there is the smallest hook.
    """

    def _count_refused(self) -> None:
        self._syncObj.refused_peer_messages += 1

    def _maybeBind(self):
        if self._ready:  # bound already; pysyncobj checks this first too, every tick
            return
        super()._maybeBind()
        if self._ready:
            # listen() again on a listening socket only resizes its queue (transport.py:285-299
            # binds; tcp_server.py:42 listened with a backlog of 5).
            self._server._TcpServer__socket.listen(limits.RAFT_LISTEN_BACKLOG)

    def _onNewIncomingConnection(self, conn):
        conn.on_refused_frame = self._count_refused
        conn.accepted_at = time.monotonic()
        while len(self._unknownConnections) >= limits.RAFT_UNNAMED_CONNECTIONS_MAX:
            oldest = min(self._unknownConnections, key=lambda c: c.accepted_at)
            self._drop_unnamed(oldest, f"more than {limits.RAFT_UNNAMED_CONNECTIONS_MAX} have named no member yet")
        super()._onNewIncomingConnection(conn)

    def _onTick(self):
        super()._onTick()
        if self._unknownConnections:  # usually empty: members name themselves at once
            cutoff = time.monotonic() - limits.RAFT_NAMING_DEADLINE_MS / 1000
            for conn in [c for c in self._unknownConnections if c.accepted_at < cutoff]:
                self._drop_unnamed(conn, f"it named no member within {limits.RAFT_NAMING_DEADLINE_MS} ms")

    def _drop_unnamed(self, conn, why: str) -> None:
        log.warning("raft: dropped an incoming connection: %s", why)
        self._count_refused()
        self._unknownConnections.discard(conn)
        conn.disconnect()

    def addNode(self, node):
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:
            conn.on_refused_frame = self._count_refused
        if conn is None or self._selfNode is None:
            return
        host = self._selfNode.host
        keepalive = conn.setSockoptKeepalive

        def bind_then_keepalive():
            sock = conn._TcpConnection__socket
            if sock is not None:
                sock.bind((host, 0))
            keepalive()

        conn.setSockoptKeepalive = bind_then_keepalive

    def _onIncomingMessageReceived(self, conn, message):
        """Accept only members on incoming connections: no read-only nodes, no utility commands.

        pysyncobj lets any connection announce itself as a read-only node, which is then sent
        every entry, or send utility commands (status, add, remove, set_version, transfer;
        transport.py:375-384) that no member of ours uses. Only the first message is seen
        here (after the secret's key exchange, when there is one): it must name a member.
        """
        if self._syncObj.encryptor and not conn.sendRandKey:
            return super()._onIncomingMessageReceived(conn, message)  # the key exchange
        if not isinstance(message, str) or message not in self._nodeAddrToNode:
            self._drop_unnamed(conn, f"its first message did not name a member ({type(message).__name__})")
            return
        super()._onIncomingMessageReceived(conn, message)


class _HardenedSyncObj(SyncObj):
    """pysyncobj with the durability and safety holes of PYSYNCOBJ.md closed."""

    def __init__(self, config: RaftConfig, replica: _Replica, journal, on_fatal, on_leadership=None, **kwargs):
        # Set before SyncObj.__init__: the tick thread starts inside it.
        self._on_leadership = on_leadership
        self._fixes = config.fixes
        self._journal = journal
        self._on_fatal = on_fatal
        self._pending_acks: list[tuple] = []
        self._append_pending = False
        self._append_has_new_entries = True
        self._replica = replica
        self._queued_lock = threading.Lock()
        self._queued: list[tuple[bytes, Any, Callable]] = []  # (command, batch key, callback)
        self._queued_max = config.commands_queue_size
        self._packing = False
        self.shared_entries = 0  # entries that carried more than one command
        self._commit_notify_delay_s = config.commit_notify_delay_s
        self._commit_notify_at = None  # when a held-back commit-only append must go out
        self.commit_only_sends = 0  # appends sent that carried no entry to anyone
        self.truncated_applied = 0  # times an applied entry would have been truncated
        self.refused_old_snapshots = 0
        # Peer input no member of ours sends: connections that did not name a member (or not in
        # time, or past the bound on waiting ones), frames over the size bound, and split
        # transmissions (frames that call anything are dropped by the frame reader before we
        # see them).
        self.refused_peer_messages = 0
        self.refused_entries = 0  # committed entries no member of ours writes: skipped everywhere
        self.leader_commit_seen = None  # commit index announced to this process by a leader
        self._leader_sync = None  # set once the transport's pipe notifier exists (below)
        self._true_match: dict = {}  # follower -> highest index it acked, this term
        self._true_match_term = -1
        self._match_capped = False  # some follower's matchIndex is shown below its ack
        self._conflict_hint = None  # where to resume, for the append being handled
        conf = SyncObjConf(
            autoTick=kwargs.pop("autoTick", True),
            # Send one append per new entry (not every 100 ms) and coalesce them
            # into one send per tick below: 1 ms latency instead of 100 ms.
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_s,
            # Far above limits.COMMAND_BYTES_MAX and above the largest admin entry
            # (RESTORE_COMMAND_BYTES_MAX), so the split-transmission path with its
            # length bug (syncobj.py:1276-1281) is never used.
            appendEntriesBatchSizeBytes=limits.RAFT_BATCH_BYTES,
            raftMinTimeout=config.raft_min_timeout_s,
            raftMaxTimeout=config.raft_max_timeout_s,
            connectionTimeout=max(3.5, config.raft_max_timeout_s),
            connectionRetryTime=config.connection_retry_s,
            leaderFallbackTimeout=config.leader_fallback_timeout_s,
            # Fail fast with MISSING_LEADER instead of queueing behind an election.
            commandsWaitLeader=False,
            commandsQueueSize=config.commands_queue_size,
            journalFile=journal,
            fullDumpFile=os.path.join(config.data_dir, DUMP_NAME),
            serializer=replica.serialize,
            deserializer=replica.deserialize,
            useFork=False,  # never fork() a process that runs gRPC threads
            logCompactionMinEntries=config.log_compaction_min_entries,
            logCompactionMinTime=config.log_compaction_min_time_s,
            bindAddress=config.self_address,
            dynamicMembershipChange=False,
            password=config.secret or None,
            onStateChanged=self._state_changed,
        )
        super().__init__(
            config.self_address,
            list(config.peer_addresses),
            conf=conf,
            consumers=[replica],
            **kwargs,
        )
        if self._has("durable_journal"):
            self._leader_sync = LeaderSync(
                journal,
                background=config.leader_sync_in_background and conf.autoTick,
                wake=self._wake_raft_thread,
                on_fatal=on_fatal,
                exit_code=EXIT_DISK_FAILED,
            )
        self.addOnTickCallback(self._flush_tick)

    def _has(self, fix: str) -> bool:
        return fix in self._fixes

    def _state_changed(self, old_state, new_state) -> None:
        # pysyncobj calls this on the Raft thread for every state change (syncobj.py:1239-1244).
        was, now = old_state == _ps._RAFT_STATE.LEADER, new_state == _ps._RAFT_STATE.LEADER
        if self._on_leadership is None or was == now:
            return
        try:
            self._on_leadership(now)
        except Exception:  # noqa: BLE001 - an observer must never break the Raft thread
            log.exception("raft: the leadership observer failed")

    # -- shared entries -----------------------------------------------------------

    def queue_command(self, command: bytes, batch_key, callback) -> None:
        """Queue ``command`` for the next tick, which packs queued commands into entries.

        Replaces pysyncobj's own queue for our commands (same bound: commands_queue_size),
        so commands keep their arrival order whether they share an entry or not.
        """
        with self._queued_lock:
            full = len(self._queued) >= self._queued_max
            if not full:
                self._queued.append((command, batch_key, callback))
                wake = len(self._queued) == 1
        if full:
            callback(None, FAIL_REASON.QUEUE_FULL)
            return
        if wake:
            self._wake_raft_thread()  # what pysyncobj's _applyCommand does (syncobj.py:498-499)

    def _wake_raft_thread(self) -> None:
        """End the Raft thread's poll early, from any thread (pysyncobj's pipe notifier)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return
        try:
            notifier.notify()
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending already

    def _checkCommandsToApply(self):
        # pysyncobj takes queued commands here (syncobj.py:503); ours go first, packed.
        self._packing = True
        try:
            self._pack_queued()
        finally:
            self._packing = False
        SyncObj._checkCommandsToApply(self)

    def _applyCommand(self, command, callback, commandType=None):
        if not self._packing:
            return SyncObj._applyCommand(self, command, callback, commandType)
        # syncobj.py:492-501 without its pipe notify: on the Raft thread, right before
        # the queue is read, a wake-up would only cost one more (empty) tick per entry.
        if commandType is not None:
            command = _ps._bchr(commandType) + command
        try:
            self._SyncObj__commandsQueue.put_nowait((command, callback))
        except _ps.Queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)

    def _pack_queued(self) -> None:
        with self._queued_lock:
            queued, self._queued = self._queued, []
        group: list[tuple[bytes, Any, Callable]] = []
        keys: set = set()
        size = 0
        for item in queued:
            command, key, _ = item
            if key is None:
                # Commands without a key keep their place in line, each in an entry of its own.
                if group:
                    self._propose_group(group)
                    group, keys, size = [], set(), 0
                self._propose_group([item])
                continue
            if group and (
                key in keys
                or len(group) >= limits.RAFT_ENTRY_COMMANDS_MAX
                or size + len(command) > limits.RAFT_ENTRY_BYTES_MAX
            ):
                self._propose_group(group)
                group, keys, size = [], set(), 0
            group.append(item)
            keys.add(key)
            size += len(command)
        if group:
            self._propose_group(group)

    def _propose_group(self, group: list[tuple[bytes, Any, Callable]]) -> None:
        if len(group) == 1:
            command, _, callback = group[0]
            self._replica.apply(command, callback=callback)
            return
        callbacks = [callback for _, _, callback in group]

        def fan_out(result, error):
            if error != FAIL_REASON.SUCCESS:
                for callback in callbacks:
                    callback(None, error)
                return
            index, outcomes = result
            if not isinstance(outcomes, list) or len(outcomes) != len(callbacks):
                # Only a shared entry we did not build could get here; never guess.
                self._on_fatal(f"shared entry at {index} answered {outcomes!r}", EXIT_APPLY_FAILED)
                return
            for callback, outcome in zip(callbacks, outcomes):
                callback((index, outcome), error)

        self.shared_entries += 1
        self._replica.apply(raft_wire.encode_shared_entry([command for command, _, _ in group]), callback=fan_out)

    # -- group commit and coalesced sends --------------------------------------

    def _SyncObj__sendAppendEntries(self):
        # With appendEntriesUseBatch=False pysyncobj sends after every single
        # command (syncobj.py:541, 692); remember and send once per tick instead.
        self._append_pending = True

    def _SyncObj__sendNextNodeIdx(self, node, reset=False, nextNodeIdx=None, success=False):
        # A follower acks right after writing its journal (syncobj.py:1005-1019).
        # Queue the ack; _flush_tick syncs the journal once, then sends them all.
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        if reset and not success and self._conflict_hint is not None:
            nextNodeIdx = min(nextNodeIdx, self._conflict_hint)
        self._pending_acks.append((node, reset, nextNodeIdx, success))

    def _flush_tick(self):
        """Runs once per tick, after commands were appended and before polling.

        One sync covers every entry appended this tick (leader and follower), so a
        leader counts itself in the next commit computation (syncobj.py:528, 660)
        only for durable entries, and a follower acks only durable entries.

        Order matters. The leader sends first and syncs second, so its fsync runs in
        parallel with the followers' (Raft allows it: the leader's own vote in the
        commit count is taken at the start of the next tick, after this sync; an
        entry appended later, during poll, cannot be acked before it is sent here,
        after which it is synced). Follower acks go out only after the sync.
        """
        if self._append_pending and self._SyncObj__serializer._Serializer__pid == 0:
            # While a snapshot's result is not yet collected (pysyncobj does that at
            # the next tick's compaction check), a follower needing a snapshot gets
            # nothing to send and __sendAppendEntries spins for a whole
            # appendEntriesPeriod (syncobj.py:1266-1330). Wait one tick instead.
            if not self._isLeader():
                self._append_pending = False
            elif self._append_worth_sending():
                self._append_pending = False
                self._commit_notify_at = None
                SyncObj._SyncObj__sendAppendEntries(self)
        leading = self._leader_sync is not None and self._isLeader()
        if self._pending_acks or not leading:
            self._sync_then_ack()
        if leading:
            # Ask for our own sync and go on: _cap_commit_votes counts us only up to it.
            self._leader_sync.request(self.raftCurrentTerm, self._SyncObj__getCurrentLogIndex())

    def _sync_then_ack(self) -> None:
        """One journal sync for everything appended so far, then the acks that wait on it."""
        try:
            if self._has("durable_journal"):
                self._journal.sync()
        except BaseException as exc:  # noqa: BLE001
            self._on_fatal(f"journal sync failed: {exc!r}", EXIT_DISK_FAILED)
            raise
        acks, self._pending_acks = self._pending_acks, []
        for node, reset, index, success in acks:
            SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=index, success=success)

    def _append_worth_sending(self) -> bool:
        """Send now: entries for someone, a heartbeat due, or a commit notice held long enough."""
        last = self._SyncObj__getCurrentLogIndex()
        next_index = self._SyncObj__raftNextIndex
        if any(next_index.get(node, 0) <= last for node in self._SyncObj__otherNodes):
            return True  # new entries (or a snapshot) to send: they carry the commit index
        now = _ps.monotonicTime()
        if self._commit_notify_delay_s <= 0 or now >= self._SyncObj__newAppendEntriesTime:
            self.commit_only_sends += 1
            return True
        if self._commit_notify_at is None:
            # pysyncobj asks for a send after every apply (syncobj.py:731-733) only to
            # announce the new commit index: hold it, the next command usually carries it.
            self._commit_notify_at = now + self._commit_notify_delay_s
            return False
        if now >= self._commit_notify_at:
            self.commit_only_sends += 1
            return True
        return False

    def _cap_commit_votes(self) -> None:
        """Let pysyncobj's commit count (leader = 1, syncobj.py:655-672) see only durable copies.

        The leader's own copy is durable up to what its sync thread published for this term.
        Commit bound C = the quorum-th largest of {followers' acked indexes, our durable
        index}; every follower's matchIndex is shown to pysyncobj as min(acked, C). Then
        1 + #(shown >= i) reaches a quorum exactly for i <= C. The true acked indexes are
        kept aside (pysyncobj only ever raises matchIndex, and resets it on election).
        """
        if self._leader_sync is None or not self._isLeader():
            return
        term = self.raftCurrentTerm
        if self._true_match_term != term:
            self._true_match, self._true_match_term = {}, term
            self._match_capped = False
        synced_term, synced_index = self._leader_sync.synced
        own = synced_index if synced_term == term else 0
        match = self._SyncObj__raftMatchIndex
        if not self._match_capped and all(acked <= own for acked in match.values()):
            # The usual case, checked without hashing a node (pysyncobj's nodes hash in
            # Python): our durable copy covers every ack, so pysyncobj's count is exact.
            return
        others = list(self._SyncObj__otherNodes)
        true = self._true_match
        for node in others:
            true[node] = max(true.get(node, 0), match.get(node, 0))
        durable = sorted([true[node] for node in others] + [own], reverse=True)
        bound = durable[(len(others) + 1) // 2]  # quorum = n // 2 + 1; 0-based position
        capped = False
        for node in others:
            shown = min(true[node], bound)
            match[node] = shown
            capped = capped or shown < true[node]
        self._match_capped = capped

    def _onTick(self, timeToWait=0.0):
        self._cap_commit_votes()
        # A held-back commit notice bounds the poll wait, so it goes out on time.
        due = self._commit_notify_at
        if due is not None and timeToWait > 0:
            timeToWait = max(0.0, min(timeToWait, due - _ps.monotonicTime()))
        SyncObj._onTick(self, timeToWait)
        if self._pending_acks:
            # A follower queued acks while handling appends in the poll that ends a tick:
            # sync and answer now, not after the next tick body (which applies entries
            # first). The leader's critical path is one follower's round trip.
            self._sync_then_ack()

    # -- message handling --------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries" and "transmission" in message:
            # An entry split over several messages, unpickled whole (syncobj.py:977). Ours never
            # split (appendEntriesBatchSizeBytes is above any entry we make, see __init__).
            self.refused_peer_messages += 1
            log.warning("raft: dropped a split append from %s; members of ours never send one", node)
            return
        if kind == "append_entries":
            message = self._sanitize_append(message)
        next_index_before = None
        if kind == "next_node_idx" and message.get("success") and self._has("next_index_forward"):
            next_index_before = self._SyncObj__raftNextIndex.get(node)
        if kind == "next_node_idx" and message.get("reset") and self._has("fast_backup"):
            # A rejected append: resend from the new nextIndex at the next tick, not
            # at the next heartbeat (pysyncobj waits for one, syncobj.py:1077-1078).
            self._append_pending = True
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            self._conflict_hint = None
        if next_index_before is not None and self._isLeader():
            # A late ack for an earlier batch set nextIndex back (syncobj.py:1079-1082),
            # re-sending entries the follower has and, across the compacted head,
            # an old snapshot that rolled the follower back.
            nxt = self._SyncObj__raftNextIndex
            if node in nxt and nxt[node] < next_index_before:
                nxt[node] = next_index_before

    def _SyncObj__doApplyCommand(self, command):
        # Every entry a member of ours writes is a NO_OP (a new leader's first entry) or a
        # REGULAR call of _Replica.apply with one bytes argument (syncobj.py:1585-1599). Anything
        # else came from someone with access to a Raft port: pysyncobj would unpickle it
        # (syncobj.py:874, 894, 1419) and call whatever method id it names with whatever
        # arguments, so a wrong id or argument list raised and stopped every member. Such an
        # entry is skipped, by every member alike, so replicas stay equal.
        kind = command[:1]
        if kind == _ENTRY_REGULAR:
            try:
                call = raft_wire.plain_loads(command[1:])
            except Exception as exc:  # noqa: BLE001 - refused or not a pickle at all
                return self._skip_entry(f"not a plain-data pickle: {exc}")
            if (
                type(call) is not tuple or len(call) != 2 or call[0] != self._apply_method_id()
                or type(call[1]) is not tuple or len(call[1]) != 1 or type(call[1][0]) is not bytes
            ):
                return self._skip_entry("not a call of this state machine's apply with one bytes argument")
            return self._replica.apply(call[1][0], _doApply=True)
        if kind in _ENTRY_NEVER_OURS:
            return self._skip_entry("a membership or code-version change (membership is static here)")
        return SyncObj._SyncObj__doApplyCommand(self, command)  # NO_OP and unknown types: ignored

    def _apply_method_id(self) -> int:
        return self._methodToID[(id(self._replica), "apply_v0")]

    def _skip_entry(self, why: str) -> None:
        self.refused_entries += 1
        log.error("raft: skipped entry %d, which no member of ours writes: %s", self.raftLastApplied + 1, why)
        return None

    def _SyncObj__getEntries(self, fromIDx, count=None, maxSizeBytes=None):
        # Only the append sender passes a size (syncobj.py:1272); there the count is capped
        # too, so an append of many tiny entries stays within limits.RAFT_MESSAGE_BYTES_MAX.
        if maxSizeBytes is not None:
            count = limits.RAFT_APPEND_ENTRIES_MAX if count is None else min(count, limits.RAFT_APPEND_ENTRIES_MAX)
        return SyncObj._SyncObj__getEntries(self, fromIDx, count, maxSizeBytes)

    def _sanitize_append(self, message: dict) -> dict:
        if message.get("term", -1) < self.raftCurrentTerm:
            return message  # pysyncobj ignores it
        message = dict(message)
        # What the leader says is committed, before we clamp it: readiness target.
        self.leader_commit_seen = message.get("commit_index", 0)
        if message.get("prevLogIdx", 0) is None:
            # A leader whose nextIndex ran past its own log sends prevLogIdx=None;
            # pysyncobj answers it with a reset. Found by the simulation (seed 22).
            return message
        if "prevLogIdx" in message and "transmission" not in message:
            entries = list(message.get("entries", []))
            prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
            local_prev_term = self._local_term(prev_idx)
            if self._has("fast_backup") and local_prev_term is not None and local_prev_term != prev_term:
                # pysyncobj will reject with nextIndex = prevLogIdx, one entry back per round
                # trip. Raft's usual shortcut: skip our whole conflicting term at once.
                self._conflict_hint = self._first_index_of_term(prev_idx, local_prev_term)
            if self._has("truncate_on_conflict") and local_prev_term == prev_term:
                # Skip the entries we already hold with the same term; pysyncobj
                # would otherwise delete everything after prevLogIdx, even a
                # matching tail that was acknowledged (syncobj.py:991-1004).
                skip = 0
                while skip < len(entries) and self._local_term(entries[skip][1]) == entries[skip][2]:
                    skip += 1
                if skip:
                    prev_idx, prev_term = entries[skip - 1][1], entries[skip - 1][2]
                    entries = entries[skip:]
                    message["prevLogIdx"], message["prevLogTerm"] = prev_idx, prev_term
                    message["entries"] = entries
            self._append_has_new_entries = bool(entries)
            if self._has("commit_needs_match"):
                # Raft: commitIndex = min(leaderCommit, index of last *new* entry);
                # pysyncobj uses its own log end (syncobj.py:1032), which may hold
                # unverified entries from an older term.
                proven = prev_idx + len(entries)
                message["commit_index"] = min(message["commit_index"], proven)
        else:
            self._append_has_new_entries = True
            if "serialized" in message and self._has("commit_needs_match"):
                # A snapshot chunk proves nothing about our log (syncobj.py:1021-1035).
                message["commit_index"] = min(message["commit_index"], self.raftCommitIndex)
        return message

    def _local_term(self, index: int):
        log_ = self._journal_obj()
        if not len(log_):
            return None
        pos = index - log_[0][1]
        if 0 <= pos < len(log_):
            return log_[pos][2]
        return None

    def _first_index_of_term(self, index: int, term: int) -> int:
        """The first index of our run of ``term`` entries ending at ``index`` (never the log head)."""
        log_ = self._journal_obj()
        pos = index - log_[0][1]
        # log_[0] is the snapshot point: committed, so it matches the leader's log.
        while pos > 1 and log_[pos - 1][2] == term:
            pos -= 1
        return log_[max(pos, 1)][1] if len(log_) > 1 else index

    def _journal_obj(self):
        return self._SyncObj__raftLog

    def _SyncObj__deleteEntriesFrom(self, fromIDx):
        # Only called from append_entries (syncobj.py:1004). With our sanitizing,
        # a message whose entries all matched has none left: nothing conflicts.
        if self._has("truncate_on_conflict") and not self._append_has_new_entries:
            return
        if fromIDx <= self.raftLastApplied:
            self.truncated_applied += 1
            if self._has("truncate_on_conflict"):
                self._on_fatal(
                    f"leader asked to truncate applied entries from {fromIDx} "
                    f"(last applied {self.raftLastApplied}): refusing to diverge",
                    EXIT_APPLY_FAILED,
                )
                return
        SyncObj._SyncObj__deleteEntriesFrom(self, fromIDx)

    def _SyncObj__loadDumpFile(self, clearJournal):
        path = self.conf.fullDumpFile
        installing = clearJournal
        try:
            index, term = _verify_dump(path)
        except (OSError, ValueError) as exc:
            if installing:
                log.warning("ignoring damaged snapshot from leader: %s", exc)
                return None
            # pysyncobj would log and carry on without the snapshot (syncobj.py:1510),
            # replaying a compacted journal onto empty state: a silent divergence.
            self._on_fatal(f"cannot load snapshot at startup: {exc}", EXIT_DISK_FAILED)
            return None
        if installing:
            if self._has("no_old_snapshot") and index <= self.raftLastApplied:
                # An old snapshot would move applied state backwards (PYSYNCOBJ.md:
                # measured 14972 -> 14772). Keep ours; the ack reports our log end.
                self.refused_old_snapshots += 1
                log.warning("refusing snapshot at %d: already applied %d", index, self.raftLastApplied)
                return None
            if self._has("durable_journal"):
                # pysyncobj renamed the received file into place without fsync
                # (serializer.py:198); make it durable before the journal is cleared.
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_directory(os.path.dirname(os.path.abspath(path)))
        if self._has("keep_tail") and self._align_journal_head(index, term):
            # The journal holds the snapshot point: keep everything after it.
            # Stock code clears the whole journal when its head is older than the
            # dump (syncobj.py:1489-1495), dropping acknowledged entries.
            clearJournal = False
        loaded = SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        if installing:
            # The leader's election timer started when its message arrived (syncobj.py:952);
            # restoring a full state takes about a second (RAFT.md), and a follower that
            # spent it installing the leader's own snapshot must not then depose it.
            self._SyncObj__raftElectionDeadline = _ps.monotonicTime() + self._SyncObj__generateRaftTimeout()
        return loaded

    def _align_journal_head(self, index: int, term: int) -> bool:
        log_ = self._journal_obj()
        if not len(log_):
            return False
        pos = index - log_[0][1]
        if pos < 1 or pos >= len(log_) or log_[pos][2] != term:
            return False
        if pos > 1:
            log_.deleteEntriesTo(pos - 1)  # head becomes [prev, last] of the snapshot
        return True


class RaftNode:
    """A replica: start it, propose commands with a deadline, read under a lock."""

    def __init__(
        self,
        config: RaftConfig,
        state_machine,
        *,
        on_fatal: Callable[[str, int], None] = _default_fatal,
        transport_class=None,
        auto_tick: bool = True,
        journal_fsync: Callable[[int], None] | None = None,
        wall_ms: Callable[[], int] | None = None,
        on_leadership: Callable[[bool], None] | None = None,
    ) -> None:
        """``on_leadership(is_leader)`` runs on the Raft thread whenever this node becomes or
        stops being the leader; it must be quick and must not propose or wait."""
        check_pysyncobj_version()
        self.config = config
        self.state_machine = state_machine
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._stamp_lock = threading.Lock()
        self._last_stamp_ms = 0
        self._ready_latched = False
        os.makedirs(config.data_dir, exist_ok=True)
        if "durable_journal" in config.fixes:
            sync_kwargs = {}
            if journal_fsync is not None:
                sync_kwargs = {"fsync": journal_fsync, "fdatasync": journal_fsync}
            journal = DurableJournal(config.data_dir, track_synced=config.track_synced, **sync_kwargs)
        else:
            journal = FileJournal(os.path.join(config.data_dir, JOURNAL_NAME + ".stock"))
        self.journal = journal
        self._replica = _Replica(state_machine, on_fatal)
        kwargs = {"transportClass": transport_class or _BoundTCPTransport}
        if not auto_tick:
            kwargs["autoTick"] = False
        self._syncobj = _HardenedSyncObj(config, self._replica, journal, on_fatal, on_leadership, **kwargs)

    # -- proposing -----------------------------------------------------------

    def next_stamp_ms(self) -> int:
        """DESIGN I6: stamp = max(last_stamp + 1, wall_ms), and never below the log clock."""
        with self._stamp_lock:
            stamp = max(self._last_stamp_ms + 1, self._wall_ms(), getattr(self.state_machine, "log_clock_ms", 0))
            self._last_stamp_ms = stamp
            return stamp

    def propose(
        self,
        command: bytes,
        timeout_s: float,
        *,
        max_bytes: int = limits.COMMAND_BYTES_MAX,
        batch_key: Any = None,
    ) -> ProposeResult:
        """Replicate ``command``; wait at most ``timeout_s`` for its fate.

        ``max_bytes`` caps the encoded command; only admin restore raises it, never above
        ``limits.RESTORE_COMMAND_BYTES_MAX`` (the Raft batch size is kept above that).
        ``batch_key``: see ``propose_async``.
        """
        assert max_bytes <= limits.RESTORE_COMMAND_BYTES_MAX, "no entry may reach the split path"
        if not isinstance(command, (bytes, bytearray)) or len(command) > max_bytes:
            return ProposeResult(Outcome.NOT_APPLIED, detail="command_too_large")
        done = threading.Event()
        box: list = []

        def on_result(result, error):
            box.append((result, error))
            done.set()

        self.propose_async(bytes(command), on_result, batch_key=batch_key)
        if not done.wait(max(0.0, timeout_s)):
            # The entry may still commit later: only the caller's op_id can tell.
            return ProposeResult(Outcome.UNKNOWN, detail="deadline_exceeded")
        result, error = box[0]
        return self._result_of(result, error)

    def propose_async(self, command: bytes, callback: Callable[[Any, int], None], *, batch_key: Any = None) -> None:
        """Queue ``command``; ``callback(result, fail_reason)`` runs on the Raft thread.

        With a ``batch_key`` (any hashable but None) the command may share a Raft entry with
        others proposed meanwhile, never with one of the same key; without one it gets an
        entry of its own. Sizes are the caller's to check (``propose`` does).
        """
        if len(command) > limits.COMMAND_BYTES_MAX:
            batch_key = None  # an admin restore: always alone
        self._syncobj.queue_command(command, batch_key, callback)

    @staticmethod
    def _result_of(result, error) -> ProposeResult:
        """Turn a pysyncobj callback's (result, fail reason) into a ProposeResult."""
        if error == FAIL_REASON.SUCCESS:
            index, value = result
            # A retry answered from the dedup table reports where its op_id first applied.
            index = getattr(value, "first_applied_index", 0) or index
            refused = getattr(value, "reason", None) is not None
            return ProposeResult(Outcome.REFUSED if refused else Outcome.APPLIED, value=value, index=index)
        if error in _DEFINITE_FAILURES:
            return ProposeResult(Outcome.NOT_APPLIED, detail=_DEFINITE_FAILURES[error])
        return ProposeResult(Outcome.UNKNOWN, detail=_AMBIGUOUS_FAILURES.get(error, f"fail_reason_{error}"))

    # -- observing -----------------------------------------------------------

    def read(self, fn: Callable[[Any], Any]):
        """Run ``fn(state_machine)`` under the apply lock (a local, possibly stale read)."""
        with self._replica.lock:
            return fn(self.state_machine)

    def digest(self) -> tuple[int, str]:
        with self._replica.lock:
            return self._replica.last_applied_index, self.state_machine.digest()

    def status(self) -> dict:
        so = self._syncobj
        for _ in range(10):
            try:
                raw = so.getStatus()  # races with the tick thread (syncobj.py:819-849)
                break
            except RuntimeError:
                continue
        else:
            raw = {}
        leader = raw.get("leader")
        return {
            "self": self.config.self_address,
            "leader": leader.address if leader is not None else None,
            "is_leader": so._isLeader(),
            "term": raw.get("raft_term", so.raftCurrentTerm),
            "commit_index": raw.get("commit_idx", so.raftCommitIndex),
            "last_applied": raw.get("last_applied", so.raftLastApplied),
            "has_quorum": raw.get("has_quorum", False),
            "log_len": raw.get("log_len", 0),
            "ready": self._caught_up(),
            "journal_syncs": getattr(self.journal, "sync_count", 0),
            "shared_entries": so.shared_entries,
            "truncated_applied": so.truncated_applied,
            "refused_old_snapshots": so.refused_old_snapshots,
            "refused_peer_messages": so.refused_peer_messages,
            "refused_entries": so.refused_entries,
        }

    def _caught_up(self) -> bool:
        """True once this process applied everything up to a commit of the current term.

        pysyncobj's isReady() latches as soon as lastApplied equals the commit index
        a new leader announces (syncobj.py:694); after a full-cluster restart that
        index is a stale one from the leader's disk, so a node was "ready" with old
        state. Here the target is the leader's announced commit index (our own, on
        the leader), and it counts only if its entry carries the current term: then
        it covers everything ever committed. Latched per process.
        """
        if self._ready_latched:
            return True
        so = self._syncobj
        try:
            target = so.raftCommitIndex if so._isLeader() else so.leader_commit_seen
            term = so.raftCurrentTerm
            if target is not None and so.raftLastApplied >= target and so._local_term(target) == term:
                self._ready_latched = True
        except (IndexError, RuntimeError):  # the journal is changing under the tick thread
            return False
        return self._ready_latched

    def term_and_applied(self) -> tuple[int, int]:
        """(current Raft term, index of the last applied entry): cheap, for response headers."""
        return self._syncobj.raftCurrentTerm, self._replica.last_applied_index

    def is_leader(self) -> bool:
        return self._syncobj._isLeader()

    def leader_address(self) -> str | None:
        leader = self._syncobj._getLeader()
        return leader.address if leader is not None else None

    def force_log_compaction(self) -> None:
        self._syncobj.forceLogCompaction()

    # -- lifecycle and simulation hooks ---------------------------------------

    def tick(self, wait_s: float = 0.0) -> None:
        """One step of the Raft loop (only with auto_tick=False: the simulation)."""
        self._syncobj.doTick(wait_s)

    @property
    def syncobj(self) -> SyncObj:
        return self._syncobj

    def close(self) -> None:
        so = self._syncobj
        if so.conf.autoTick:
            so.destroy_synchronous()
        else:
            so.destroy()
        if so._leader_sync is not None:
            so._leader_sync.stop()

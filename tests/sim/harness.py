"""Deterministic simulation of three Raft replicas in one process.

Owns: a virtual clock and seeded randomness patched into pysyncobj for the length
of one run, an in-memory fault-injecting network (``Network`` + ``SimTransport``),
simulated crashes (kill -9 and power loss), restarts and pauses, a client load,
and the safety checks run during and after each run. ``run_simulation(seed)``
replays one run exactly: everything it does is drawn from ``seed``.

Must never: sleep, read the real clock, use threads, or share Python objects
between nodes (every message crosses the network as a frame of the typed wire, read back
with the members' decoder, so a message of ours the wire refuses fails the run), and never leave
pysyncobj patched after a run.

Model, in short (the docstrings below give the details):
- Time is virtual, in microseconds. Every read of pysyncobj's clock costs
  ``CLOCK_READ_COST_US`` of virtual CPU time, so loops that wait for the clock to
  move (``__sendAppendEntries`` spins up to appendEntriesPeriod) end.
- A node ticks when something arrives for it (plus a scheduling delay) or after
  an idle poll timeout, like pysyncobj's autoTick loop. Messages and connection
  events are handled inside the receiving node's tick, exactly where the TCP
  transport handles them (the poller call at the end of ``SyncObj._onTick``).
- Links behave like TCP connections: FIFO and never lossy while a connection
  lives; a cut holds traffic; a connection torn down (cut noticed, peer killed,
  peer silent too long, reset) loses what was in flight and fires pysyncobj's
  disconnected/connected callbacks, which its elections and sends depend on.
- Crashes happen between ticks. Kill -9 keeps every file as written. Power loss:
  with the durable journal, the journal is cut to ``DurableJournal.synced_length``
  and the other files (meta, snapshot: written with fsync + rename + directory
  fsync) are kept; with the stock FileJournal nothing is ever synced, so the whole
  data dir rolls back to its last periodic "kernel writeback" image. Not modelled:
  a lost snapshot rename (the old snapshot coming back), torn records, disk errors.

Checked: at most one leader per term; no member's read lease holds (``lease_read_index``,
asked after every tick of every member and, as if a read arrived, of every member at every
client step, paused ones too) once a leader of a later term was elected, and a lease read's
index covers every command acknowledged before it; applied sequences are prefixes of one
another and never move backwards; no command is applied twice; a SUCCESS callback
names the entry it acknowledges; every acknowledged command is applied exactly
once on every node at the end; no command reported as definitely-not-applied is
ever applied; ``truncated_applied`` stays 0 and pysyncobj never logs
'truncating already-applied log entries'; no fatal error and no exception.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import heapq
import logging
import os
import random
import shutil
import tempfile
import time
import traceback
import types
import zlib

import pysyncobj.dns_resolver as _ps_dns
import pysyncobj.node as _ps_node
import pysyncobj.syncobj as _ps_syncobj
import pysyncobj.tcp_connection as _ps_tcp
import pysyncobj.transport as _ps_transport
from pysyncobj.config import FAIL_REASON
from pysyncobj.transport import Transport

from coordinator.raft import identity as _raft_identity
from coordinator.raft import wire as raft_wire
from coordinator.raft.interface import ProposeOutcome
from coordinator.raft.journal import JOURNAL_NAME, DurableJournal
from coordinator.raft.node import ALL_FIXES, RaftConfig, RaftNode, failure_of

NODE_ADDRESSES = ("127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4003")
LABELS = {address: f"n{i + 1}" for i, address in enumerate(NODE_ADDRESSES)}

# Virtual CPU time charged per read of pysyncobj's clock. pysyncobj reads it ~10
# times per tick, so a tick costs ~0.5 ms. Its append loop that spins "until the
# clock moves appendEntriesPeriod" while a fresh snapshot is pending would never
# end on a frozen clock; reads past CLOCK_READS_CHEAP_MAX in one tick cost
# CLOCK_READ_SLOW_US, so it ends after ~300 rounds (in production it spins for the
# whole 0.1 s and sends thousands of empty messages; ~2000 here would only be slow).
CLOCK_READ_COST_US = 50
CLOCK_READS_CHEAP_MAX = 200
CLOCK_READ_SLOW_US = 1_000
# Raft timing of the simulated cluster: fast enough for ~10 elections per run.
HEARTBEAT_S = 0.1  # pysyncobj needs raftMinTimeout > 3 * appendEntriesPeriod
RAFT_MIN_TIMEOUT_S = 0.4
RAFT_MAX_TIMEOUT_S = 0.8
LEADER_FALLBACK_S = 0.6  # an isolated leader steps down after this
CONNECTION_RETRY_S = 0.2
# pysyncobj's TcpConnection drops a connection that read nothing for this long.
CONNECTION_TIMEOUT_US = 3_500_000
# After healing: clients keep going this long (load during recovery), then a
# barrier command is retried until acknowledged and the nodes must agree within
# the bound (a healed 3-node cluster elects and catches up in a few seconds;
# 30 s separates "slow" from "stuck").
HEAL_CLIENT_US = 1_000_000
CONVERGENCE_BOUND_US = 30_000_000
BARRIER_RETRY_US = 500_000  # a barrier gets no answer when proposed mid-election
CONVERGENCE_CHECK_US = 100_000  # one heartbeat
PRESYNC_WAIT_US = 300_000  # a crash armed for "right before a sync" strikes anyway after this
RECENT_EVENTS_MAX = 60  # events quoted in a failure report

_LEADER_STATE = 2  # pysyncobj _RAFT_STATE.LEADER
_TRUNCATE_APPLIED_LOG = "truncating already-applied log entries"


# What a run can find. The safety kinds break a Raft guarantee (or made a node stop
# to avoid breaking one); the others are liveness or robustness findings.
SAFETY_VIOLATIONS = frozenset(
    {
        "two_leaders",  # two leaders in one term
        "divergence",  # applied sequences are not prefixes of one another
        "state_regression",  # a live node's applied state moved backwards
        "duplicate_apply",  # one command applied twice
        "ack_lost",  # an acknowledged command is missing at the end
        "ack_mismatch",  # SUCCESS reported for an entry other than the command's
        "definite_failure_applied",  # reported "definitely not applied", yet applied
        "truncated_applied",  # syncobj.truncated_applied > 0
        "log_truncating_applied",  # pysyncobj logged 'truncating already-applied log entries'
        "fatal",  # on_fatal: the node stopped rather than diverge or lose data
        "config_lost",  # a member that had a cluster configuration has none (RAFT.md "Member identity")
        "stale_lease",  # a member's read lease held after a leader of a later term was elected
        "stale_lease_read",  # a lease read's index misses a command acknowledged before it
    }
)
OTHER_VIOLATIONS = frozenset(
    {
        "exception",  # an exception escaped a tick
        "start_failed",  # a restart failed (e.g. a damaged journal)
        "dump_load_failed",  # pysyncobj logged 'failed to load full dump'
        "no_convergence",  # no agreement within the bound after healing
    }
)
VIOLATION_KINDS = SAFETY_VIOLATIONS | OTHER_VIOLATIONS


class _CrashBeforeSync(Exception):
    """Raised inside a tick by an armed member's journal sync: it dies right there."""


class SimFatal(Exception):
    """Raised by ``on_fatal``: the node would have stopped the process here."""


# -- virtual time and randomness -------------------------------------------------


class VirtualClock:
    """A clock that only the simulation moves, and that never goes backwards."""

    def __init__(self) -> None:
        self._now_us = 0
        self._reads_this_tick = 0

    @property
    def now_us(self) -> int:
        return self._now_us

    def now_ms(self) -> int:
        return self._now_us // 1000

    def advance_to(self, t_us: int) -> None:
        # An event due before "now" (CPU time spent in a tick ran past it) runs late.
        if t_us > self._now_us:
            self._now_us = t_us

    def begin_tick(self) -> None:
        self._reads_this_tick = 0

    def monotonic(self) -> float:
        """pysyncobj's monotonicTime(): reading it costs virtual CPU time."""
        now = self._now_us
        self._reads_this_tick += 1
        if self._reads_this_tick > CLOCK_READS_CHEAP_MAX:
            self._now_us += CLOCK_READ_SLOW_US
        else:
            self._now_us += CLOCK_READ_COST_US
        return now / 1_000_000


_node_hashes: dict = {}


def _stable_node_hash(node) -> int:
    # Node.__hash__ is hash(id): string hashing is salted per process, so the
    # order in which pysyncobj iterates its node sets (sends, the append loop that
    # runs until the clock moves) would differ between processes.
    node_id = node.id
    value = _node_hashes.get(node_id)
    if value is None:
        value = _node_hashes[node_id] = zlib.crc32(repr(node_id).encode())
    return value


def _refuse_sleep(seconds):
    raise RuntimeError(f"pysyncobj tried to sleep {seconds!r} s inside the simulation")


_patched = False


@contextlib.contextmanager
def virtual_pysyncobj(clock: VirtualClock, rng: random.Random):
    """Replace every clock and random source pysyncobj reads; always restore them.

    Also gives pysyncobj's Node a hash that is the same in every process, so a
    seed replays identically under any PYTHONHASHSEED.

    syncobj.py reads ``monotonicTime`` (elections, heartbeats, leader fallback,
    compaction timers, the append loop), ``random.random()`` (election timeouts)
    and ``time.sleep`` (only when the transport is not ready: never here). The
    TCP modules (transport, tcp_connection, dns_resolver) are not reached with
    SimTransport, but are patched too so that a stray call stays deterministic.
    """
    global _patched
    if _patched:
        raise RuntimeError("virtual_pysyncobj is not reentrant: one simulation at a time")
    fake_time = types.SimpleNamespace(sleep=_refuse_sleep, time=clock.monotonic, monotonic=clock.monotonic)
    patches = [
        (_ps_syncobj, "monotonicTime", clock.monotonic),
        (_ps_syncobj, "random", rng),
        (_ps_syncobj, "time", fake_time),
        (_ps_transport, "monotonicTime", clock.monotonic),
        (_ps_transport, "random", rng),
        (_ps_transport, "time", fake_time),
        (_ps_tcp, "monotonicTime", clock.monotonic),
        (_ps_dns, "monotonicTime", clock.monotonic),
        (_ps_dns, "random", rng),
        (_ps_node.Node, "__hash__", _stable_node_hash),
        # Member incarnations and a new cluster's id (coordinator/raft/identity.py).
        (_raft_identity, "_rng", rng),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    _patched = True
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)
        _patched = False


# -- network ---------------------------------------------------------------------


class _Conn:
    """The TCP connection between two nodes (one per unordered pair)."""

    __slots__ = ("epoch", "up", "up_at", "down_at")

    def __init__(self) -> None:
        self.epoch = 0
        self.up = False
        self.up_at = None  # when a pending (re)connect completes
        self.down_at = None  # when a pending cut is noticed and the connection dropped


@dataclasses.dataclass(frozen=True)
class NetParams:
    latency_us: tuple[int, int]
    spike_prob: float
    spike_us: int
    detect_us: tuple[int, int]  # how long until a cut connection is noticed
    connect_us: tuple[int, int]  # how long a (re)connect takes


class Network:
    """Per-(src, dst) FIFO queues with virtual delivery times, cuts and connections.

    A message sent at ``t`` is due at ``max(t + latency, previous due time on the
    link)``: links are FIFO, as over TCP. A cut direction holds its messages (TCP
    retransmits) until it heals, or until the connection is torn down: a cut is
    noticed after ``detect_us``, a killed peer at once, a paused peer after
    CONNECTION_TIMEOUT_US. Teardown loses everything in flight both ways and
    queues 'down' events for both ends; a usable pair reconnects after
    ``connect_us`` with a new epoch and 'up' events. Every random draw comes from
    a per-link or per-pair stream, so the order in which pysyncobj iterates its
    node sets (string hashing differs between processes) changes nothing.
    """

    def __init__(self, clock: VirtualClock, seed: int, names, params: NetParams) -> None:
        self.clock = clock
        self.params = params
        self.names = tuple(sorted(names))
        self._endpoints: dict[str, SimTransport] = {}
        self._paused_since: dict[str, int] = {}
        self._cuts: collections.Counter = collections.Counter()  # (src, dst) -> active cut count
        self._links = {}
        self._link_due = {}
        self._link_seq = {}
        self._link_rng = {}
        for a in self.names:
            for b in self.names:
                if a != b:
                    self._links[(a, b)] = collections.deque()
                    self._link_due[(a, b)] = 0
                    self._link_seq[(a, b)] = 0
                    self._link_rng[(a, b)] = random.Random(f"{seed}:link:{a}->{b}")
        self._pairs = [(a, b) for i, a in enumerate(self.names) for b in self.names[i + 1 :]]
        self._conns = {pair: _Conn() for pair in self._pairs}
        self._conn_rng = {pair: random.Random(f"{seed}:conn:{pair[0]}|{pair[1]}") for pair in self._pairs}
        self._events: dict[str, list] = {name: [] for name in self.names}
        self._event_seq = 0
        self.stats: collections.Counter = collections.Counter()
        self.on_due = None  # callback(name, due_us): something will be ready for name then

    @staticmethod
    def _pair(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a < b else (b, a)

    # -- membership of the network ------------------------------------------------

    def attach(self, name: str, transport: "SimTransport") -> None:
        assert name not in self._endpoints, f"{name} attached twice"
        self._endpoints[name] = transport
        self._events[name] = []

    def detach(self, name: str) -> None:
        """The process is gone: its sockets close, peers notice at once."""
        if self._endpoints.pop(name, None) is None:
            return
        self._events[name] = []
        self._paused_since.pop(name, None)
        for pair in self._pairs:
            if name in pair and self._conns[pair].up:
                self._teardown(pair, "peer_killed")

    def set_paused(self, name: str, paused: bool) -> None:
        if paused:
            self._paused_since.setdefault(name, self.clock.now_us)
        else:
            self._paused_since.pop(name, None)

    # -- faults ---------------------------------------------------------------------

    def cut(self, src: str, dst: str) -> None:
        self._cuts[(src, dst)] += 1

    def uncut(self, src: str, dst: str) -> None:
        self._cuts[(src, dst)] -= 1
        if self._cuts[(src, dst)] <= 0:
            del self._cuts[(src, dst)]
            if self._links[(src, dst)] and self.on_due is not None:
                self.on_due(dst, self.clock.now_us)  # held traffic flows again

    def heal_all(self) -> None:
        for src, dst in list(self._cuts):
            self._cuts[(src, dst)] = 1
            self.uncut(src, dst)

    def reset(self, a: str, b: str) -> None:
        """A connection reset (RST, NAT timeout, ...): in-flight messages are lost."""
        pair = self._pair(a, b)
        if self._conns[pair].up:
            self._teardown(pair, "reset")

    def _usable(self, a: str, b: str) -> bool:
        now = self.clock.now_us
        for name in (a, b):
            if name not in self._endpoints:
                return False
            since = self._paused_since.get(name)
            if since is not None and now - since >= CONNECTION_TIMEOUT_US:
                return False
        return (a, b) not in self._cuts and (b, a) not in self._cuts

    def update(self) -> None:
        """Advance connection state to the current virtual time."""
        now = self.clock.now_us
        for pair in self._pairs:
            conn = self._conns[pair]
            usable = self._usable(*pair)
            rng = self._conn_rng[pair]
            if conn.up:
                if usable:
                    conn.down_at = None
                elif conn.down_at is None:
                    since = [self._paused_since.get(n) for n in pair if n in self._paused_since]
                    if since:  # a silent peer: pysyncobj's read timeout fires
                        conn.down_at = min(since) + CONNECTION_TIMEOUT_US
                    else:
                        conn.down_at = now + rng.randint(*self.params.detect_us)
                elif now >= conn.down_at:
                    self._teardown(pair, "cut_detected")
            else:
                if not usable:
                    conn.up_at = None
                elif conn.up_at is None:
                    conn.up_at = now + rng.randint(*self.params.connect_us)
                elif now >= conn.up_at:
                    conn.up = True
                    conn.up_at = None
                    conn.epoch += 1
                    self.stats["connects"] += 1
                    for name in pair:
                        peer = pair[1] if name == pair[0] else pair[0]
                        self._post(name, "up", peer, conn.epoch)

    def _teardown(self, pair, why: str) -> None:
        conn = self._conns[pair]
        conn.up = False
        conn.down_at = None
        conn.up_at = None
        self.stats[f"disconnects_{why}"] += 1
        a, b = pair
        for link in ((a, b), (b, a)):
            self.stats["messages_lost_in_teardown"] += len(self._links[link])
            self._links[link].clear()
        for name in pair:
            peer = b if name == a else a
            if name in self._endpoints:
                self._post(name, "down", peer, conn.epoch)

    def _post(self, name: str, kind: str, peer: str, epoch: int) -> None:
        self._event_seq += 1
        self._events[name].append((self.clock.now_us, 0, peer, self._event_seq, kind, epoch))
        if self.on_due is not None:
            self.on_due(name, self.clock.now_us)

    # -- traffic ----------------------------------------------------------------------

    def send(self, src: str, dst: str, message, epoch: int) -> None:
        conn = self._conns[self._pair(src, dst)]
        if not conn.up or conn.epoch != epoch:
            # Written into a socket that is already dead; the sender learns of
            # the disconnect from its own 'down' event.
            self.stats["messages_sent_into_dead_connection"] += 1
            return
        link = (src, dst)
        rng = self._link_rng[link]
        lo, hi = self.params.latency_us
        latency = rng.randint(lo, hi)
        if rng.random() < self.params.spike_prob:
            latency += rng.randint(0, self.params.spike_us)
        due = max(self._link_due[link], self.clock.now_us + latency)
        self._link_due[link] = due
        self._link_seq[link] += 1
        if message.get("serialized", 0) is None:
            # pysyncobj's append loop spinning while a fresh snapshot is pending.
            self.stats["empty_snapshot_messages"] += 1
        blob = raft_wire.encode_frame(message)
        self._links[link].append((due, 1, src, self._link_seq[link], "msg", blob))
        self.stats["messages_sent"] += 1
        if self.on_due is not None:
            self.on_due(dst, due)

    def take_due(self, name: str) -> list:
        """Everything due at ``name`` now, in (time, kind, source, sequence) order."""
        now = self.clock.now_us
        due = []
        events = self._events[name]
        if events:
            keep = []
            for event in events:
                (due if event[0] <= now else keep).append(event)
            self._events[name] = keep
        for src in self.names:
            if src == name or (src, name) in self._cuts:
                continue
            queue = self._links[(src, name)]
            while queue and queue[0][0] <= now:
                due.append(queue.popleft())
        due.sort(key=lambda item: item[:4])
        return due


class SimTransport(Transport):
    """pysyncobj ``Transport`` on the simulated ``Network`` (bound by ``bind_transport``).

    Incoming traffic is handled inside the node's tick: the transport wraps the
    node's poller, whose ``poll()`` is the last step of ``SyncObj._onTick`` and the
    place where TCPTransport delivers messages and connection events.
    """

    network: Network = None  # set on the subclass made by bind_transport()

    def __init__(self, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self._syncObj = syncObj
        self._self_id = selfNode.id
        self._nodes = {node.id: node for node in otherNodes}
        self._connected: dict[str, int] = {}  # peer id -> connection epoch we joined
        self._attached = True
        poller = syncObj._poller
        self._poll_inner = poller.poll
        poller.poll = self._poll
        self.network.attach(self._self_id, self)

    @property
    def ready(self):
        return True

    def tryGetReady(self):
        pass

    def waitReady(self):
        pass

    def addNode(self, node):
        self._nodes[node.id] = node

    def dropNode(self, node):
        self._nodes.pop(node.id, None)
        self._connected.pop(node.id, None)

    def send(self, node, message):
        epoch = self._connected.get(node.id)
        if epoch is None or not self._attached:
            return False
        self.network.send(self._self_id, node.id, message, epoch)
        return True

    def _poll(self, timeout):
        if self._attached:
            self.deliver()
        self._poll_inner(0)  # drains pysyncobj's pipe notifier; never blocks

    def deliver(self) -> None:
        network = self.network
        for _t, _rank, peer, _seq, kind, payload in network.take_due(self._self_id):
            node = self._nodes.get(peer)
            if node is None:
                continue
            if kind == "up":
                self._connected[peer] = payload
                self._onNodeConnected(node)
            elif kind == "down":
                if self._connected.get(peer) == payload:
                    del self._connected[peer]
                    self._onNodeDisconnected(node)
            else:
                if peer not in self._connected:
                    network.stats["messages_dropped_unconnected"] += 1
                    continue
                network.stats["messages_delivered"] += 1
                self._onMessageReceived(node, raft_wire.decode_frame(payload))

    def detach(self) -> None:
        if self._attached:
            self._attached = False
            self.network.detach(self._self_id)

    def destroy(self):
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        self.detach()


def bind_transport(network: Network):
    """A SimTransport subclass bound to ``network`` (pysyncobj takes a class)."""
    return type("BoundSimTransport", (SimTransport,), {"network": network})


# -- the state machine under replication -----------------------------------------


class RecordingStateMachine:
    """Appends every applied entry to a list; the list is its whole state.

    ``changes`` records every apply and restore in order until the harness checks
    them after the tick, so an entry applied and then replaced by a snapshot
    within one tick is still checked.
    """

    def __init__(self) -> None:
        self.applied: list[bytes] = []
        self._seen: set[bytes] = set()
        self.duplicates: list[bytes] = []
        self.changes: list[tuple[int, object]] = []  # (position, entry) or (0, restored list)
        self.log_clock_ms = 0
        self.snapshots = 0
        self.restores = 0

    def apply(self, entry: bytes, index: int):
        entry = bytes(entry)
        if entry in self._seen:
            self.duplicates.append(entry)
        self._seen.add(entry)
        self.applied.append(entry)
        self.changes.append((len(self.applied), entry))
        return len(self.applied)  # the entry's 1-based position: checked by the harness

    def snapshot(self):
        self.snapshots += 1
        return list(self.applied)

    def restore(self, state) -> None:
        self.applied = [bytes(entry) for entry in state]
        self._seen = set(self.applied)
        self.restores += 1
        self.changes.append((0, tuple(self.applied)))

    def digest(self) -> str:
        h = hashlib.sha256()
        for entry in self.applied:
            h.update(len(entry).to_bytes(4, "little") + entry)
        return h.hexdigest()


# -- run parameters and fault schedule ---------------------------------------------

FAULT_KINDS = (
    "partition",
    "cut",
    "pause",
    "crash",
    "crash_pair",
    "crash_after_snapshot",
    "crash_pair_after_snapshot",
    "reset",
    "compact",
)

PROFILES = {
    # A bit of everything.
    "default": dict(
        partition=3,
        cut=3,
        pause=2,
        crash=2,
        crash_pair=1,
        crash_after_snapshot=2,
        crash_pair_after_snapshot=1,
        reset=2,
        compact=1,
    ),
    # Disks: crashes at the worst moments, mostly with power loss.
    "crashy": dict(
        partition=2,
        cut=1,
        pause=2,
        crash=3,
        crash_pair=3,
        crash_after_snapshot=3,
        crash_pair_after_snapshot=4,
        reset=1,
        compact=1,
    ),
    # Network only: partitions, one-way cuts, resets, latency spikes; no crashes.
    "network": dict(
        partition=4,
        cut=4,
        pause=2,
        crash=0,
        crash_pair=0,
        crash_after_snapshot=0,
        crash_pair_after_snapshot=0,
        reset=4,
        compact=2,
    ),
}


@dataclasses.dataclass(frozen=True)
class SimParams:
    fault_phase_us: int
    fault_gap_us: int  # mean gap between faults
    client_gap_us: tuple[int, int]
    idle_tick_us: tuple[int, int]  # poll timeout when nothing arrives (pysyncobj: 50 ms)
    wake_us: tuple[int, int]  # from a message's arrival to the tick that handles it
    compaction_min_entries: int
    power_loss_prob: float
    writeback_us: int  # stock journal only: the kernel's periodic writeback
    weights: tuple[tuple[str, int], ...]
    net: NetParams


def params_for_seed(seed: int, profile: str = "default") -> SimParams:
    rng = random.Random(f"{seed}:params:{profile}")
    weights = PROFILES[profile]
    assert set(weights) == set(FAULT_KINDS), f"profile {profile!r} must weigh every fault kind"
    latency_hi = rng.choice((2_000, 5_000, 15_000, 40_000))
    return SimParams(
        fault_phase_us=rng.randint(5_000, 9_000) * 1000,
        fault_gap_us=rng.randint(400, 1200) * 1000,
        client_gap_us=(5_000, rng.choice((20_000, 40_000, 80_000))),
        idle_tick_us=(5_000, 50_000),
        wake_us=(0, rng.choice((200, 2_000, 10_000))),
        compaction_min_entries=rng.randint(20, 50),
        power_loss_prob=0.8 if profile == "crashy" else 0.5,
        writeback_us=rng.randint(1_000, 5_000) * 1000,
        weights=tuple(sorted(weights.items())),
        net=NetParams(
            latency_us=(200, latency_hi),
            spike_prob=rng.choice((0.0, 0.01, 0.05)),
            spike_us=rng.choice((50_000, 300_000)),
            detect_us=(300_000, CONNECTION_TIMEOUT_US),
            connect_us=(1_000, int(CONNECTION_RETRY_S * 1_000_000)),
        ),
    )


@dataclasses.dataclass(frozen=True)
class Fault:
    at_us: int
    kind: str
    target: str  # "leader", "follower", "any" or a node label ("n1"); resolved when it fires
    peer: str = ""  # cuts/resets: "any" or a label; an explicit cut is target -> peer
    duration_us: int = 0  # partition/cut/pause length, or downtime before restart
    power_loss: bool = False

    def __str__(self) -> str:
        parts = [f"t={self.at_us / 1e6:7.3f}s {self.kind:<20} target={self.target}"]
        if self.peer:
            parts.append(f"peer={self.peer}")
        if self.duration_us:
            parts.append(f"for={self.duration_us / 1e6:.3f}s")
        if self.kind.startswith("crash"):
            parts.append("power_loss" if self.power_loss else "kill-9")
        return " ".join(parts)


def make_schedule(seed: int, params: SimParams) -> list[Fault]:
    rng = random.Random(f"{seed}:schedule")
    kinds = [kind for kind, weight in params.weights for _ in range(weight)]
    faults = []
    t = rng.randint(300_000, 1_500_000)  # let a first leader settle sometimes, not always
    while t < params.fault_phase_us and kinds:
        kind = rng.choice(kinds)
        target = rng.choice(("leader", "leader", "follower", "any"))
        peer = ""
        duration = 0
        power_loss = False
        if kind in ("partition", "cut"):
            duration = rng.randint(200_000, 4_000_000)
            peer = "any"
        elif kind == "reset":
            peer = "any"
        elif kind == "pause":
            duration = rng.choice((rng.randint(100_000, 1_500_000), rng.randint(1_000_000, 5_000_000)))
        elif kind.startswith("crash"):
            duration = rng.randint(100_000, 2_000_000)
            power_loss = rng.random() < params.power_loss_prob
        faults.append(Fault(t, kind, target, peer, duration, power_loss))
        t += max(20_000, int(rng.expovariate(1 / params.fault_gap_us)))
    return faults


# -- the simulation ------------------------------------------------------------------


@dataclasses.dataclass
class _Command:
    payload: bytes
    node: str
    proposed_us: int
    acked: bool = False
    position: int = 0  # the 1-based position apply reported with SUCCESS
    definite_failure: str = ""
    ambiguous: str = ""
    callbacks: int = 0


class _Member:
    """One of the three nodes across its incarnations (restarts)."""

    def __init__(self, address: str, data_dir: str, config: RaftConfig) -> None:
        self.address = address
        self.label = LABELS[address]
        self.data_dir = data_dir
        self.config = config
        self.node: RaftNode | None = None
        self.transport: SimTransport | None = None
        self.sm: RecordingStateMachine | None = None
        self.incarnation = 0
        self.paused_until = 0  # virtual us; paused while now < paused_until
        self.ticks = 0  # ticks of the current incarnation
        self.applied_len = 0  # length of the applied sequence as last checked
        self.truncated_seen = 0
        self.had_config = False  # across kills (its disk is never wiped here); reset by a power loss
        self.armed_snapshots = None  # crash_after_snapshot: SM.snapshots when armed
        self.armed_fault: Fault | None = None
        self.armed_presync: Fault | None = None  # crash: dies at its next sync with unsynced bytes
        self.pending_tick = 0  # id of the one tick event that is current
        self.next_tick_at = 0
        self.disk_image: dict[str, bytes] = {}  # stock journal: the last writeback

    @property
    def alive(self) -> bool:
        return self.node is not None


class _LogRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string is still a record
            message = str(record.msg)
        self.records.append((record.name, record.levelno, message))


@dataclasses.dataclass
class SimResult:
    seed: int
    profile: str
    fixes: frozenset
    violations: list[str]
    violation_kinds: list[str]
    stats: collections.Counter
    trace_hash: str
    schedule: list[Fault]
    recent: list[str]
    final_applied: list[bytes]
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def unsafe(self) -> bool:
        """Whether a Raft safety guarantee was broken (not just liveness)."""
        return any(kind in SAFETY_VIOLATIONS for kind in self.violation_kinds)

    def describe(self) -> str:
        missing = sorted(ALL_FIXES - set(self.fixes))
        lines = [
            f"simulation seed={self.seed} profile={self.profile!r} fixes removed={missing or 'none'}",
            f"replay: run_simulation({self.seed}, profile={self.profile!r}"
            + (f", fixes=ALL_FIXES - {set(missing)!r}" if missing else "")
            + ")",
            "violations:",
            *[f"  - {v}" for v in self.violations],
            "schedule:",
            *[f"  {f}" for f in self.schedule],
            f"last {len(self.recent)} events:",
            *[f"  {e}" for e in self.recent],
            "stats: " + ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items())),
        ]
        return "\n".join(lines)


def _noop_fsync(fd: int) -> None:
    pass  # tmpfs: what a sync would make durable is tracked by the journal itself


class Simulation:
    def __init__(
        self,
        seed: int,
        *,
        fixes=ALL_FIXES,
        profile: str = "default",
        params: SimParams | None = None,
        schedule: list[Fault] | None = None,
        root_dir: str | None = None,
        leader_lost_election_s: float = RaftConfig.leader_lost_election_s,
    ) -> None:
        self.seed = seed
        # 0 replays a seed picked before a closed leader connection called an early election.
        self.leader_lost_election_s = leader_lost_election_s
        self.fixes = frozenset(fixes)
        self.profile = profile
        self.params = params or params_for_seed(seed, profile)
        self.schedule = schedule if schedule is not None else make_schedule(seed, self.params)
        self.root_dir = root_dir
        self.durable = "durable_journal" in self.fixes
        self.clock = VirtualClock()
        self.raft_rng = random.Random(f"{seed}:raft")
        self.sched_rng = random.Random(f"{seed}:sched")
        self.fault_rng = random.Random(f"{seed}:faults")
        # Its own stream, so choosing when a crash strikes never shifts the fault schedule.
        self.presync_rng = random.Random(f"{seed}:presync")
        self.client_rng = random.Random(f"{seed}:clients")
        self.network = Network(self.clock, seed, NODE_ADDRESSES, self.params.net)
        self.network.on_due = self._wake
        self.transport_class = bind_transport(self.network)
        self.members: dict[str, _Member] = {}
        self.stats: collections.Counter = collections.Counter()
        self.violations: list[str] = []
        self.violation_kinds: list[str] = []
        self.recent: collections.deque = collections.deque(maxlen=RECENT_EVENTS_MAX)
        self.leader_of_term: dict[int, str] = {}
        self.commands: dict[bytes, _Command] = {}
        self.canonical: list[bytes] = []
        self.canonical_from: list[str] = []
        self._heap: list = []
        self._seq = 0
        self._trace = hashlib.blake2b(digest_size=16)
        self._clients_until_us = 0
        self._barrier: bytes | None = None
        self._barrier_count = 0
        self._converged = False
        self._log = _LogRecorder()
        self._logs_checked = 0
        self._acked_position_max = 0  # the highest position any acknowledged command applied at
        self._lease_reads: list[tuple[_Member, int, int, int]] = []  # (member, incarnation, index, position)

    # -- bookkeeping ---------------------------------------------------------------

    def _event(self, text: str) -> None:
        line = f"t={self.clock.now_us / 1e6:8.4f}s {text}"
        self.recent.append(line)
        self._trace.update(line.encode())

    def _violate(self, kind: str, text: str) -> None:
        assert kind in VIOLATION_KINDS, kind
        self._event(f"VIOLATION {kind}: {text}")
        self.violations.append(f"t={self.clock.now_us / 1e6:.4f}s {kind}: {text}")
        self.violation_kinds.append(kind)

    def _push(self, t_us: int, kind: str, data=None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t_us, self._seq, kind, data))

    # -- node lifecycle --------------------------------------------------------------

    def _config(self, address: str, data_dir: str) -> RaftConfig:
        return RaftConfig(
            self_address=address,
            peer_addresses=tuple(a for a in NODE_ADDRESSES if a != address),
            data_dir=data_dir,
            raft_min_timeout_s=RAFT_MIN_TIMEOUT_S,
            raft_max_timeout_s=RAFT_MAX_TIMEOUT_S,
            leader_fallback_timeout_s=LEADER_FALLBACK_S,
            connection_retry_s=CONNECTION_RETRY_S,
            heartbeat_s=HEARTBEAT_S,
            leader_lost_election_s=self.leader_lost_election_s,
            log_compaction_min_entries=self.params.compaction_min_entries,
            fixes=self.fixes,
        )

    def _start(self, m: _Member) -> None:
        m.incarnation += 1
        m.sm = RecordingStateMachine()
        m.ticks = 0
        m.applied_len = m.truncated_seen = 0
        m.paused_until = 0
        self.network.set_paused(m.address, False)
        try:
            node = RaftNode(
                m.config,
                m.sm,
                on_fatal=functools.partial(self._on_fatal, m),
                transport_class=self.transport_class,
                auto_tick=False,
                journal_fsync=_noop_fsync,
                monotonic_ms=self.clock.now_ms,
            )
        except Exception as exc:  # noqa: BLE001 - e.g. JournalCorrupt: a finding
            self._violate("start_failed", f"{m.label} failed to start: {exc!r}")
            return
        m.node = node
        m.transport = node.syncobj._SyncObj__transport
        # Every journal sync a tick runs goes through one of these two: a follower's (then its
        # acks), a leader's own (after it sent the entries). An armed crash strikes at either.
        so = node.syncobj
        so._sync_then_ack = functools.partial(self._sync_or_crash, m, so._sync_then_ack)
        if so._leader_sync is not None:
            so._leader_sync.request = functools.partial(self._sync_or_crash, m, so._leader_sync.request)
        node.syncobj.conf.onStateChanged = functools.partial(self._on_state_changed, m, m.incarnation)
        self._event(f"{m.label} started (incarnation {m.incarnation})")
        self._schedule_tick(m, self.clock.now_us + self.sched_rng.randint(*self.params.idle_tick_us))

    def _sync_or_crash(self, m: _Member, sync, *args) -> None:
        """A member armed to crash dies at its first sync that has unsynced bytes to cover:
        written (a leader's also sent), not yet durable, not yet acknowledged or counted
        toward a commit (power loss cuts them)."""
        if m.armed_presync is not None and self.durable:
            path = os.path.join(m.data_dir, JOURNAL_NAME)
            if m.node.journal.synced_length < os.path.getsize(path):
                raise _CrashBeforeSync()
        sync(*args)

    def _schedule_tick(self, m: _Member, at_us: int) -> None:
        self._seq += 1
        m.pending_tick = self._seq
        m.next_tick_at = at_us
        self._push(at_us, "tick", (m, self._seq))

    def _wake(self, address: str, due_us: int) -> None:
        """Something arrives for ``address`` at ``due_us``: its poll returns then."""
        m = self.members.get(address)
        if m is None or not m.alive or due_us < m.paused_until:
            return
        at = due_us + self.sched_rng.randint(*self.params.wake_us)
        if at < m.next_tick_at:
            self._schedule_tick(m, at)

    def _release(self, m: _Member) -> None:
        """Free a dead node's resources the way a killed process would: nothing synced."""
        node = m.node
        so = node.syncobj
        journal = node.journal
        if isinstance(journal, DurableJournal):
            if journal._fd is not None:
                os.close(journal._fd)  # no sync: only what sync() covered is "on disk"
                journal._fd = None
        else:
            journal._destroy()  # FileJournal: closes its mmap; its pages stay in "page cache"
        notifier = getattr(so, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            for attr in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
                fd = getattr(notifier, attr, None)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    setattr(notifier, attr, None)
        m.transport.detach()
        self.stats["truncated_applied"] += so.truncated_applied
        self.stats["refused_old_snapshots"] += so.refused_old_snapshots
        self.stats["shared_entries"] += so.shared_entries
        self.stats["snapshots_taken"] += m.sm.snapshots
        m.node = None
        m.transport = None
        m.pending_tick = 0

    def _crash(self, m: _Member, power_loss: bool, downtime_us: int | None, why: str) -> None:
        if not m.alive:
            return
        synced = m.node.journal.synced_length if self.durable else None
        self._release(m)
        m.armed_snapshots = None
        m.armed_fault = None
        m.armed_presync = None
        self.network.set_paused(m.address, False)
        m.paused_until = 0
        if power_loss:
            # A CONFIG entry it appended but never synced (so never acknowledged) may be cut: it
            # then catches up from the leader like any member. config_lost judges what it loads
            # from here on (a loaded snapshot's configuration must never be forgotten again).
            m.had_config = False
            self.stats["crashes_power_loss"] += 1
            if self.durable:
                path = os.path.join(m.data_dir, JOURNAL_NAME)
                size = os.path.getsize(path)
                if synced < size:
                    os.truncate(path, synced)
                    self.stats["power_loss_bytes_dropped"] += size - synced
            else:
                self._restore_disk_image(m)
        else:
            self.stats["crashes_kill"] += 1
        self._event(f"{m.label} crashed ({why}, {'power loss' if power_loss else 'kill -9'})")
        if downtime_us is not None:
            self._push(self.clock.now_us + downtime_us, "restart", (m, m.incarnation))

    def _restore_disk_image(self, m: _Member) -> None:
        for name in os.listdir(m.data_dir):
            os.unlink(os.path.join(m.data_dir, name))
        for name, data in sorted(m.disk_image.items()):
            with open(os.path.join(m.data_dir, name), "wb") as f:
                f.write(data)
        self.stats["power_loss_disk_rollbacks"] += 1

    def _writeback(self) -> None:
        """Stock journal: the kernel writes dirty pages back; a power cut keeps this."""
        for m in self.members.values():
            image = {}
            for name in sorted(os.listdir(m.data_dir)):
                path = os.path.join(m.data_dir, name)
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        image[name] = f.read()
            m.disk_image = image

    # -- callbacks from pysyncobj ------------------------------------------------------

    def _on_fatal(self, m: _Member, message: str, exit_code: int) -> None:
        self._violate("fatal", f"{m.label} fatal (exit {exit_code}): {message}")
        raise SimFatal(message)

    def _on_state_changed(self, m: _Member, incarnation: int, old: int, new: int) -> None:
        if new != _LEADER_STATE or m.incarnation != incarnation or m.node is None:
            return
        term = m.node.syncobj.raftCurrentTerm
        self.stats["elections_won"] += 1
        self._event(f"{m.label} became leader of term {term}")
        holder = self.leader_of_term.setdefault(term, m.label)
        if holder != m.label:
            self._violate("two_leaders", f"two leaders in term {term}: {holder} and {m.label}")

    def _on_result(self, cmd: _Command, m: _Member, incarnation: int, result, error) -> None:
        cmd.callbacks += 1
        if cmd.callbacks > 1:
            self.stats["callbacks_fired_twice"] += 1
        if error == FAIL_REASON.SUCCESS:
            _index, position = result
            cmd.acked = True
            cmd.position = position
            self._acked_position_max = max(self._acked_position_max, position)
            self.stats["acked"] += 1
            applied = m.sm.applied if m.sm is not None and m.incarnation == incarnation else []
            if not (0 < position <= len(applied) and applied[position - 1] == cmd.payload):
                there = applied[position - 1] if 0 < position <= len(applied) else None
                self._violate(
                    "ack_mismatch",
                    f"{m.label} acknowledged {cmd.payload!r} at position {position}, but applied {there!r} there",
                )
        else:
            failure, detail = failure_of(error)  # what propose() would report
            if failure.outcome is ProposeOutcome.NOT_APPLIED:
                cmd.definite_failure = detail
                self.stats[f"not_applied_{detail}"] += 1
            else:
                cmd.ambiguous = detail
                self.stats["ambiguous"] += 1

    # -- running ------------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        root = tempfile.mkdtemp(prefix=f"raftsim-{self.seed}-", dir=self.root_dir or _default_root())
        loggers = [logging.getLogger("pysyncobj"), logging.getLogger("coordinator")]
        for lg in loggers:
            lg.addHandler(self._log)
        try:
            with virtual_pysyncobj(self.clock, self.raft_rng):
                try:
                    self._run(root)
                finally:
                    for m in self.members.values():
                        if m.alive:
                            self._release(m)
        finally:
            for lg in loggers:
                lg.removeHandler(self._log)
            shutil.rmtree(root, ignore_errors=True)
        net_stats = getattr(self, "_net_stats", self.network.stats)
        self.stats.update({f"net_{k}": v for k, v in net_stats.items()})
        self.stats["virtual_ms"] = self.clock.now_us // 1000
        final = self.members[NODE_ADDRESSES[0]].sm.applied if self.members else []
        self._trace.update(repr(sorted(self.stats.items())).encode())
        for m in self.members.values():
            if m.sm is not None:
                self._trace.update(m.sm.digest().encode())
        return SimResult(
            seed=self.seed,
            profile=self.profile,
            fixes=self.fixes,
            violations=list(self.violations),
            violation_kinds=list(self.violation_kinds),
            stats=self.stats,
            trace_hash=self._trace.hexdigest(),
            schedule=list(self.schedule),
            recent=list(self.recent),
            final_applied=list(final),
            wall_s=time.perf_counter() - started,
        )

    def _run(self, root: str) -> None:
        for address in NODE_ADDRESSES:
            data_dir = os.path.join(root, LABELS[address])
            os.makedirs(data_dir)
            self.members[address] = _Member(address, data_dir, self._config(address, data_dir))
        for m in self.members.values():
            self._start(m)
        for fault in self.schedule:
            self._push(fault.at_us, "fault", fault)
        heal_at = self.params.fault_phase_us
        self._clients_until_us = heal_at + HEAL_CLIENT_US
        self._push(self.client_rng.randint(*self.params.client_gap_us), "client")
        self._push(heal_at, "heal")
        self._push(self._clients_until_us, "barrier")
        if not self.durable:
            self._push(self.params.writeback_us, "writeback")
        deadline = self._clients_until_us + CONVERGENCE_BOUND_US
        while self._heap and not self.violations and not self._converged:
            t, _seq, kind, data = heapq.heappop(self._heap)
            if kind == "tick" and data[0].pending_tick != data[1]:
                continue  # superseded by an earlier wake-up
            if t > deadline:
                break
            self.clock.advance_to(t)
            self.network.update()
            getattr(self, f"_do_{kind}")(data)
            self._check_logs()
        if not self.violations and not self._converged:
            self._violate(
                "no_convergence",
                f"no agreement within {CONVERGENCE_BOUND_US / 1e6:.0f} virtual seconds after healing: "
                + self._status_line(),
            )
        if not self.violations:
            self._final_checks()
        self._net_stats = collections.Counter(self.network.stats)  # before the final teardown

    def _status_line(self) -> str:
        parts = []
        for m in self.members.values():
            if not m.alive:
                parts.append(f"{m.label}:dead")
                continue
            so = m.node.syncobj
            parts.append(
                f"{m.label}:term={so.raftCurrentTerm} state={so._SyncObj__raftState} "
                f"leader={LABELS.get(getattr(so._getLeader(), 'id', None), None)} "
                f"commit={so.raftCommitIndex} applied={so.raftLastApplied} len={len(m.sm.applied)}"
            )
        return "; ".join(parts)

    # -- events --------------------------------------------------------------------------

    def _do_tick(self, data) -> None:
        m, tick_id = data
        if m.pending_tick != tick_id or not m.alive:
            return
        now = self.clock.now_us
        if now < m.paused_until:
            self._schedule_tick(m, m.paused_until)
            return
        if m.paused_until:
            m.paused_until = 0
            self.network.set_paused(m.address, False)
            self._event(f"{m.label} resumed")
        so = m.node.syncobj
        self.clock.begin_tick()
        try:
            m.node.tick(0)
        except SimFatal:
            return  # already recorded by _on_fatal
        except _CrashBeforeSync:
            fault = m.armed_presync
            self._crash(m, True, fault.duration_us, "right before a journal sync, power loss")
            self.stats["crashes_before_sync"] += 1
            return
        except Exception as exc:  # noqa: BLE001 - anything escaping a tick is a finding
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            self._violate("exception", f"{m.label} tick raised {exc!r}\n" + "".join(tb[-6:]))
            return
        m.ticks += 1
        self.stats["ticks"] += 1
        self._trace.update(
            b"%d %s %d %d %d %d %d"
            % (
                now,
                m.label.encode(),
                so.raftCurrentTerm,
                so._SyncObj__raftState,
                so.raftCommitIndex,
                so.raftLastApplied,
                len(m.sm.applied),
            )
        )
        self._check_member(m)
        self._check_lease(m)
        if m.armed_snapshots is not None and m.sm.snapshots > m.armed_snapshots:
            fault = m.armed_fault
            partner = None
            if fault.kind == "crash_pair_after_snapshot":
                # Its snapshot is newer than its journal head until the next tick
                # compacts; take the leader (or another node) down with it.
                others = [o for o in self.members.values() if o is not m and o.alive]
                leaders = [o for o in others if o.node.is_leader()]
                if leaders:
                    partner = leaders[0]
                elif others:
                    partner = self.fault_rng.choice(others)
            self._crash(m, fault.power_loss, fault.duration_us, "right after taking a snapshot")
            self.stats["crashes_after_snapshot"] += 1
            if partner is not None:
                downtime = fault.duration_us + self.fault_rng.randint(300_000, 2_000_000)
                self._crash(partner, fault.power_loss, downtime, "with a node that just took a snapshot")
            return
        self._schedule_tick(m, self.clock.now_us + self.sched_rng.randint(*self.params.idle_tick_us))

    def _check_member(self, m: _Member) -> None:
        sm = m.sm
        so = m.node.syncobj
        if so._loaded():
            # Once bootstrapped, a member's log or snapshot always holds the configuration.
            if so.config() is not None:
                m.had_config = True
            elif m.had_config:
                self._violate("config_lost", f"{m.label} had a cluster configuration and now has none")
                return
        if so.truncated_applied > m.truncated_seen:
            m.truncated_seen = so.truncated_applied
            self._violate(
                "truncated_applied",
                f"{m.label} truncated already-applied entries (truncated_applied={so.truncated_applied})",
            )
        if sm.duplicates:
            self._violate("duplicate_apply", f"{m.label} applied {sm.duplicates[0]!r} twice")
            sm.duplicates.clear()
        if not sm.changes:
            return
        changes, sm.changes = sm.changes, []
        for position, item in changes:
            if position:
                if not self._check_position(m, position, item):
                    return
                m.applied_len = position
                continue
            restored = item
            if m.ticks > 1:
                self.stats["snapshot_installs"] += 1
                self._event(f"{m.label} installed a snapshot of {len(restored)} entries")
            else:
                self.stats["snapshot_loads_at_start"] += 1
            if len(restored) < m.applied_len:
                self._violate(
                    "state_regression",
                    f"{m.label} applied state went backwards from {m.applied_len} to {len(restored)} entries "
                    "(a snapshot older than its state was installed)",
                )
                return
            for i, entry in enumerate(restored):
                if not self._check_position(m, i + 1, entry):
                    return
            m.applied_len = len(restored)

    def _check_lease(self, m: _Member) -> None:
        """A read arriving at ``m`` now: if its lease answers it, no later term may have a leader
        yet, and once ``m`` applied the index it returns, every command acknowledged before
        now must be in its state."""
        so = m.node.syncobj
        # Asking costs no virtual CPU time: a check must not move the run it checks.
        _ps_syncobj.monotonicTime, charged = (lambda: self.clock.now_us / 1_000_000), _ps_syncobj.monotonicTime
        try:
            index = so.lease_read_index()
        finally:
            _ps_syncobj.monotonicTime = charged
        if index is not None:
            self.stats["lease_reads"] += 1
            term = so.raftCurrentTerm
            later = sorted(t for t in self.leader_of_term if t > term)
            if later:
                self._violate("stale_lease", f"{m.label}'s lease of term {term} holds, but term {later[0]} "
                              f"elected {self.leader_of_term[later[0]]}")
                return
            self._lease_reads.append((m, m.incarnation, index, self._acked_position_max))
        waiting = []
        for read in self._lease_reads:
            member, incarnation, at, needed = read
            if member.incarnation != incarnation or not member.alive:
                continue  # it died before applying: the read was never answered
            if member.node.syncobj.raftLastApplied < at:
                waiting.append(read)
            elif len(member.sm.applied) < needed:
                self._violate("stale_lease_read", f"{member.label} read by lease at index {at}: "
                              f"{len(member.sm.applied)} commands applied, but one at position {needed} was "
                              "acknowledged before")
        self._lease_reads = waiting

    def _check_position(self, m: _Member, position: int, entry: bytes) -> bool:
        """Every node's n-th applied entry must be the same: the canonical sequence."""
        canonical = self.canonical
        i = position - 1
        if i < len(canonical):
            if canonical[i] != entry:
                self._violate(
                    "divergence",
                    f"divergence at position {position}: {m.label} applied {entry!r}, "
                    f"{self.canonical_from[i]} applied {canonical[i]!r}",
                )
                return False
        elif i == len(canonical):
            canonical.append(entry)
            self.canonical_from.append(m.label)
        else:
            self._violate("divergence", f"{m.label} applied position {position} with nothing before it checked")
            return False
        return True

    def _check_logs(self) -> None:
        records = self._log.records
        while self._logs_checked < len(records):
            _name, level, message = records[self._logs_checked]
            self._logs_checked += 1
            self.stats[f"log_{logging.getLevelName(level).lower()}"] += 1
            if _TRUNCATE_APPLIED_LOG in message:
                self.stats["log_truncating_already_applied"] += 1
                self._violate("log_truncating_applied", f"pysyncobj logged: {message}")
            elif "failed to load full dump" in message:
                self._violate("dump_load_failed", f"pysyncobj logged: {message}")

    def _do_restart(self, data) -> None:
        m, incarnation = data
        if m.alive or m.incarnation != incarnation:
            return
        self.stats["restarts"] += 1
        self._start(m)

    def _do_writeback(self, _data) -> None:
        self._writeback()
        self._push(self.clock.now_us + self.params.writeback_us, "writeback")

    def _do_client(self, _data) -> None:
        now = self.clock.now_us
        if now >= self._clients_until_us:
            return
        for member in self.members.values():
            if member.alive:  # paused ones too: a read handled the moment it resumes
                self._check_lease(member)
        ready = [m for m in self.members.values() if m.alive and now >= m.paused_until]
        if ready:
            m = self.client_rng.choice(ready)
            self._propose(m, b"c%06d" % (len(self.commands) + 1))
        self._push(now + self.client_rng.randint(*self.params.client_gap_us), "client")

    def _propose(self, m: _Member, payload: bytes, *, alone: bool = False) -> None:
        cmd = _Command(payload, m.label, self.clock.now_us)
        self.commands[payload] = cmd
        self.stats["proposed"] += 1
        self._trace.update(b"propose %s %s" % (m.label.encode(), payload))
        # The callback path of RaftNode.propose(): propose() itself would block
        # this single thread on an Event that only a later tick can set. Client
        # commands may share an entry (distinct keys); barriers go alone.
        m.node.propose_async(
            payload,
            functools.partial(self._on_result, cmd, m, m.incarnation),
            batch_key=None if alone else payload,
        )
        self._wake(m.address, self.clock.now_us)  # pysyncobj's pipe notifier wakes the poll

    def _do_heal(self, _data) -> None:
        self._event("heal: all cuts removed, paused nodes resumed, crashed nodes restarted")
        self.network.heal_all()
        for m in self.members.values():
            m.armed_snapshots = None
            m.armed_fault = None
            if m.alive and m.paused_until:
                m.paused_until = self.clock.now_us
                self._schedule_tick(m, self.clock.now_us)
            elif not m.alive:
                self.stats["restarts"] += 1
                self._start(m)

    def _do_barrier(self, _data) -> None:
        """Propose barriers until one is acknowledged: then everything acknowledged
        before it must be applied on every node that applied the barrier."""
        if self._barrier is not None and self.commands[self._barrier].acked:
            self._push(self.clock.now_us + CONVERGENCE_CHECK_US, "converge")
            return
        leaders = [m for m in self.members.values() if m.alive and m.node.is_leader()]
        candidates = leaders or [m for m in self.members.values() if m.alive]
        if candidates:
            self._barrier_count += 1
            self._barrier = b"barrier-%03d" % self._barrier_count
            self._propose(self.client_rng.choice(candidates), self._barrier, alone=True)
        self._push(self.clock.now_us + BARRIER_RETRY_US, "barrier")

    def _do_converge(self, _data) -> None:
        members = list(self.members.values())
        if all(m.alive for m in members):
            first = members[0].sm.applied
            if self._barrier in first and all(m.sm.applied == first for m in members[1:]):
                self._converged = True
                self._event(f"converged: {len(first)} entries on every node")
                return
        self._push(self.clock.now_us + CONVERGENCE_CHECK_US, "converge")

    def _do_fault(self, fault: Fault) -> None:
        rng = self.fault_rng
        alive = [m for m in self.members.values() if m.alive]
        leaders = [m for m in alive if m.node.is_leader()]
        followers = [m for m in alive if not m.node.is_leader()]
        everyone = list(self.members.values())
        by_label = {m.label: m for m in everyone}

        def pick(which: str, pool_default):
            if which in by_label:
                return by_label[which]
            if which == "leader" and leaders:
                return rng.choice(leaders)
            if which == "follower" and followers:
                return rng.choice(followers)
            return rng.choice(pool_default) if pool_default else None

        if fault.kind.startswith("crash") and fault.target == "leader" and not leaders:
            self.stats["faults_skipped_no_leader"] += 1
            return
        target = pick(fault.target, alive or everyone)
        if target is None:
            return
        now = self.clock.now_us
        kind = fault.kind
        self._event(f"fault {fault} -> {target.label}")
        if kind == "partition":
            others = [m for m in everyone if m is not target]
            for other in others:
                self.network.cut(target.address, other.address)
                self.network.cut(other.address, target.address)
            links = [(target.address, o.address) for o in others] + [(o.address, target.address) for o in others]
            self._push(now + fault.duration_us, "uncut", links)
            self.stats["partitions"] += 1
        elif kind == "cut":
            if fault.peer in by_label:  # an explicit schedule: target -> peer
                src, dst = target, by_label[fault.peer]
            elif fault.peer == "follower" and [m for m in followers if m is not target]:
                # An explicit schedule: target -> one follower (the leader's link to it, say).
                src, dst = target, rng.choice([m for m in followers if m is not target])
            else:
                other = rng.choice([m for m in everyone if m is not target])
                src, dst = (target, other) if rng.random() < 0.5 else (other, target)
            self.network.cut(src.address, dst.address)
            self._push(now + fault.duration_us, "uncut", [(src.address, dst.address)])
            self._event(f"one-way cut {src.label} -> {dst.label}")
            self.stats["oneway_cuts"] += 1
        elif kind == "reset":
            other = by_label.get(fault.peer) or rng.choice([m for m in everyone if m is not target])
            self.network.reset(target.address, other.address)
            self.stats["connection_resets"] += 1
        elif kind == "pause":
            if target.alive:
                target.paused_until = max(target.paused_until, now + fault.duration_us)
                self.network.set_paused(target.address, True)
                self.stats["pauses"] += 1
        elif kind == "crash":
            if fault.power_loss and self.durable and target.alive and self.presync_rng.random() < 0.5:
                # Strike between a journal write and its sync: the one moment with unsynced
                # bytes (a tick syncs before it acks or counts its own vote).
                target.armed_presync = fault
                self._push(now + PRESYNC_WAIT_US, "presync_deadline", (target, target.incarnation))
            else:
                self._crash(target, fault.power_loss, fault.duration_us, "fault")
        elif kind == "crash_pair":
            # The leader and one more node at once: the case that loses
            # acknowledged writes when anything acked is not yet durable.
            second = pick("follower" if target in leaders else "any", [m for m in alive if m is not target])
            self._crash(target, fault.power_loss, fault.duration_us, "fault (pair)")
            if second is not None and second is not target:
                self._crash(second, fault.power_loss, fault.duration_us + rng.randint(0, 500_000), "fault (pair)")
            self.stats["crash_pairs"] += 1
        elif kind in ("crash_after_snapshot", "crash_pair_after_snapshot"):
            if target.alive:
                target.armed_snapshots = target.sm.snapshots
                target.armed_fault = fault
                target.node.force_log_compaction()
        elif kind == "compact":
            if target.alive:
                target.node.force_log_compaction()
                self.stats["forced_compactions"] += 1

    def _do_presync_deadline(self, data) -> None:
        m, incarnation = data
        if m.alive and m.incarnation == incarnation and m.armed_presync is not None:
            self._crash(m, True, m.armed_presync.duration_us, "fault (no unsynced write came)")

    def _do_uncut(self, links) -> None:
        for src, dst in links:
            self.network.uncut(src, dst)

    # -- after the run -------------------------------------------------------------------

    def _final_checks(self) -> None:
        members = list(self.members.values())
        final = members[0].sm.applied
        counts = collections.Counter(final)
        position = {payload: i + 1 for i, payload in enumerate(final)}
        for payload, n in counts.items():
            if n > 1:
                self._violate("duplicate_apply", f"{payload!r} applied {n} times")
        for cmd in self.commands.values():
            if cmd.acked:
                if cmd.payload not in position:
                    self._violate("ack_lost", f"acknowledged command {cmd.payload!r} (via {cmd.node}) was lost")
                elif position[cmd.payload] != cmd.position:
                    self._violate(
                        "ack_mismatch",
                        f"acknowledged command {cmd.payload!r} at position {cmd.position}, "
                        f"but it is at {position[cmd.payload]}",
                    )
            if cmd.definite_failure and cmd.payload in position:
                self._violate(
                    "definite_failure_applied",
                    f"{cmd.payload!r} was reported {cmd.definite_failure} (definitely not applied), yet applied",
                )
            if cmd.callbacks == 0:
                self.stats["unanswered"] += 1
        for m in members:
            if m.node.syncobj.truncated_applied:
                count = m.node.syncobj.truncated_applied
                self._violate("truncated_applied", f"{m.label} truncated_applied={count}")
        self.stats["final_entries"] = len(final)
        self.stats["max_term"] = max(self.leader_of_term, default=0)


def _default_root() -> str | None:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


def run_simulation(seed: int, *, fixes=ALL_FIXES, profile: str = "default", **kwargs) -> SimResult:
    """Run one simulation; the same arguments always give the same run."""
    return Simulation(seed, fixes=fixes, profile=profile, **kwargs).run()

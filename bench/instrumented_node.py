"""The product node (testsupport.node_process) with timing probes, for profiling.

    python -m bench.instrumented_node <node_process arguments>

Benchmark-only. Before running node_process.main it swaps, inside this process only,
raft_node's journal, SyncObj and transport classes for subclasses that record:

  * per log index, CLOCK_MONOTONIC timestamps (comparable across processes on one host)
    of each step an entry takes: proposed, added to the journal, fdatasync done,
    append_entries sent, received by a follower, acked, ack received, applied, caller woke;
  * per tick counters: ticks, busy time, time blocked in poll, time in fdatasync, time in
    apply, entries per sync, entries per append message;
  * optionally a cProfile of the tick thread (op ``profile_start`` / ``profile_stop``).

Extra control ops (beside node_process's own):
  trace_reset                 clear events and counters
  threads                     -> {threads: {native_id: name}}
  trace_get                   -> {events: [[index, event, t], ...], props: [[index, t0, t1], ...],
                                   counters: {...}}
  profile_start               start cProfile in the tick thread at its next tick
  profile_stop {top}          -> {text: pstats output, top ``top`` by cumulative and tottime}

Nothing here changes behaviour: every override calls the original and only records.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time

from coordinator.raft import node as raft_node
from testsupport import node_process

_now = time.monotonic  # CLOCK_MONOTONIC: one clock for every process on this host
_cpu = time.thread_time  # CPU time of the calling thread: robust to other load on the host

_lock = threading.Lock()
_events: dict[tuple[int, str], float] = {}
_props: list[tuple[int, float, float]] = []
_counters: dict[str, float] = {}
_MAX_EVENTS = 400_000

_profile_wanted = False
_profile_result: list = []


def _mark(index: int, event: str, t: float | None = None) -> None:
    if len(_events) >= _MAX_EVENTS:
        return
    _events.setdefault((index, event), _now() if t is None else t)


def _count(name: str, value: float = 1.0) -> None:
    with _lock:  # proposer threads count too
        _counters[name] = _counters.get(name, 0.0) + value


class ProbedJournal(raft_node.DurableJournal):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._unsynced: list[int] = []

    def add(self, command, idx, term):
        super().add(command, idx, term)
        _mark(idx, "add")
        self._unsynced.append(idx)

    def sync(self):
        # May run on the leader's sync thread while the Raft thread appends.
        dirty = self._end != self._synced_end
        pending = self._unsynced[:]
        t0, c0 = _now(), _cpu()
        super().sync()
        if dirty:
            t1 = _now()
            _count("sync_calls")
            _count("sync_s", t1 - t0)
            _count("sync_cpu_s", _cpu() - c0)
            _count("sync_entries", len(pending))
            for idx in pending:
                _mark(idx, "synced", t1)
            del self._unsynced[: len(pending)]


class ProbedTransport(raft_node._BoundTCPTransport):
    def send(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries":
            entries = message.get("entries") or ()
            _count("ae_sent")
            if entries:
                _count("ae_sent_with_entries")
                _count("ae_entries_sent", len(entries))
                t = _now()
                for e in entries:
                    _mark(e[1], "ae_sent", t)
        elif kind == "next_node_idx" and message.get("success"):
            _count("acks_sent")
            t = _now()
            last = self._acked_through if hasattr(self, "_acked_through") else 0
            top = message["next_node_idx"] - 1
            for idx in range(max(last + 1, top - 5000), top + 1):
                _mark(idx, "ack_sent", t)
            self._acked_through = max(last, top)
        t0, c0 = _now(), _cpu()
        try:
            return super().send(node, message)
        finally:
            _count("send_calls")
            _count("send_s", _now() - t0)
            _count("send_cpu_s", _cpu() - c0)


class ProbedSyncObj(raft_node._HardenedSyncObj):
    def __init__(self, *a, **kw):
        self._ack_seen: dict = {}
        self._profiler = None
        super().__init__(*a, **kw)
        poller = self._poller
        orig_poll = poller.poll

        def poll(timeout):
            # Includes handling every received message (pysyncobj dispatches in poll).
            t0, c0 = _now(), _cpu()
            try:
                return orig_poll(timeout)
            finally:
                _count("poll_s", _now() - t0)
                _count("poll_cpu_s", _cpu() - c0)

        poller.poll = poll

    def _onTick(self, timeToWait=0.0):
        if _profile_wanted and self._profiler is None:
            self._profiler = cProfile.Profile()
            self._profiler.enable()
        elif not _profile_wanted and self._profiler is not None:
            self._profiler.disable()
            _profile_result.append(self._profiler)
            self._profiler = None
        t0, c0 = _now(), _cpu()
        super()._onTick(timeToWait)
        _count("ticks")
        _count("tick_s", _now() - t0)
        _count("tick_cpu_s", _cpu() - c0)

    def _flush_tick(self):
        t0, c0 = _now(), _cpu()
        try:
            return super()._flush_tick()
        finally:
            _count("flush_s", _now() - t0)
            _count("flush_cpu_s", _cpu() - c0)

    def _SyncObj__onMessageReceived(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries":
            entries = message.get("entries") or ()
            _count("ae_received")
            if entries:
                t = _now()
                for e in entries:
                    _mark(e[1], "ae_recv", t)
        elif kind == "next_node_idx" and message.get("success"):
            _count("acks_received")
            t = _now()
            top = message["next_node_idx"] - 1
            last = self._ack_seen.get(node, top - 1)
            for idx in range(max(last + 1, top - 5000), top + 1):
                _mark(idx, "ack_recv", t)  # setdefault: the first ack (a majority of 3) counts
            self._ack_seen[node] = max(last, top)
        return super()._SyncObj__onMessageReceived(node, message)


_orig_propose = raft_node.RaftNode.propose


def _probed_propose(self, command, timeout_s, **kwargs):
    t0, c0 = _now(), _cpu()
    res = _orig_propose(self, command, timeout_s, **kwargs)
    t1 = _now()
    _count("propose_calls")
    _count("propose_cpu_s", _cpu() - c0)
    if res.index and len(_props) < _MAX_EVENTS:
        _props.append((res.index, t0, t1))
    return res


def _install_apply_probe(node: raft_node.RaftNode) -> None:
    sm = node.state_machine
    orig = sm.apply
    syncobj = node.syncobj

    def apply(*args, **kwargs):  # pass through whatever signature the state machine has
        t0, c0 = _now(), _cpu()
        out = orig(*args, **kwargs)
        t1 = _now()
        _count("apply_calls")
        _count("apply_s", t1 - t0)
        _count("apply_cpu_s", _cpu() - c0)
        _mark(syncobj.raftLastApplied + 1, "applied", t1)
        return out

    sm.apply = apply


_orig_handle = node_process.NodeService.handle


def _probed_handle(self, req):
    global _profile_wanted
    op = req.get("op")
    if op == "trace_reset":
        with _lock:
            _events.clear()
            _props.clear()
            _counters.clear()
        return {"ok": True}
    if op == "trace_get":
        events = [[i, e, t] for (i, e), t in list(_events.items())]
        return {"events": events, "props": [list(p) for p in _props], "counters": dict(_counters),
                "t_now": _now()}
    if op == "threads":
        # native thread id -> name, so the driver can read per-thread CPU from /proc.
        return {"threads": {str(t.native_id): t.name for t in threading.enumerate() if t.native_id}}
    if op == "profile_start":
        _profile_result.clear()
        _profile_wanted = True
        return {"ok": True}
    if op == "profile_stop":
        _profile_wanted = False
        deadline = time.monotonic() + 2.0
        while not _profile_result and time.monotonic() < deadline:
            time.sleep(0.01)
        if not _profile_result:
            return {"text": "(no profile collected)"}
        top = int(req.get("top", 25))
        buf = io.StringIO()
        st = pstats.Stats(_profile_result[0], stream=buf)
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)
        return {"text": buf.getvalue()}
    return _orig_handle(self, req)


_orig_raftnode_init = raft_node.RaftNode.__init__


def _probed_raftnode_init(self, *a, **kw):
    _orig_raftnode_init(self, *a, **kw)
    _install_apply_probe(self)


def install() -> None:
    raft_node.DurableJournal = ProbedJournal
    raft_node._BoundTCPTransport = ProbedTransport
    raft_node._HardenedSyncObj = ProbedSyncObj
    raft_node.RaftNode.propose = _probed_propose
    raft_node.RaftNode.__init__ = _probed_raftnode_init
    node_process.NodeService.handle = _probed_handle


if __name__ == "__main__":
    install()
    sys.exit(node_process.main())

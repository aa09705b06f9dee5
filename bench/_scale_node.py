"""``fencingd serve`` with timing probes on its snapshots and Raft thread, for ``bench.scale``.

    python -m bench._scale_node serve --config node0.toml     (the fencingd command line)

Benchmark-only. Before running ``coordinator.server.fencingd.main`` it wraps, inside this
process only and without changing what they do:

  * ``Replica.snapshot_job``'s job (a snapshot, on the snapshot writer thread: the state read
    in pieces, applying paused until the first piece fixed the state, that part recorded
    apart as ``snapshot_capture``; then
    ``snapshot_file.write_pieces``: msgpack, write, fsync) and the file write alone;
  * ``Replica.deserialize`` (restoring a snapshot) and ``snapshot_file.read_body`` alone;
  * ``HardenedSyncObj._SyncObj__loadDumpFile`` (a snapshot loaded at start or installed from
    the leader) and ``_SyncObj__tryLogCompaction`` (the call in the Raft tick that takes the
    snapshot, or at the next tick drops the compacted journal head);
  * the cyclic GC: a pass longer than ``SLOW_TICK_MS`` is recorded, with its generation and
    the thread it ran in;
  * the Raft thread's poll: the time between one poll's return and the next poll's call is
    the tick body, the time the thread answers no message. A body longer than
    ``SLOW_TICK_MS`` is recorded.

Every record is one JSON line (wall ``ms``; ``cpu_ms``, the thread's CPU time meanwhile)
appended to the file named by ``SCALE_TIMINGS_FILE`` (times from ``time.monotonic``,
CLOCK_MONOTONIC, so comparable with the bench process on the same host).

SIGUSR1 asks the Raft node for a snapshot now (``forceLogCompaction``: the next tick takes it,
unless nothing was applied since the last one). fencingd handles no SIGUSR1 itself, so
the stock action (end the process) is all this replaces.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
import threading
import time

from coordinator.raft import replica as raft_replica
from coordinator.raft import snapshot_file, snapshot_writer
from coordinator.raft import syncobj as raft_syncobj

# A tick body longer than this is recorded: the goal for a snapshot's stall is 20 ms,
# so shorter bodies say nothing about it, and under load they would flood the file.
SLOW_TICK_MS = 20.0
# tryLogCompaction runs every tick; a call shorter than this that took no snapshot dropped no
# journal head worth reporting.
COMPACTION_RECORD_MS = 1.0

_now = time.monotonic
# CPU time of the calling thread: a record's ``cpu_ms`` beside its wall ``ms`` tells the work
# from the wait for a CPU or the GIL (this machine is shared).
_cpu = time.thread_time
_lock = threading.Lock()
_out = None
_syncobjs: list = []
_serialized = [0]  # snapshots taken in this process: a compaction call that took one is recorded


def _record(kind: str, **fields) -> None:
    if _out is None:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), **fields})
    with _lock:
        _out.write(line + "\n")
        _out.flush()


def _timed(kind: str, min_ms: float = 0.0, fields=None):
    """Wrap a function: record its wall time as ``kind`` (calls shorter than ``min_ms`` are not)."""

    def wrap(fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0, c0 = _now(), _cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                ms = (_now() - t0) * 1e3
                if ms >= min_ms:
                    cpu_ms = (_cpu() - c0) * 1e3
                    _record(kind, t0=t0, ms=ms, cpu_ms=cpu_ms, **(fields(*args, **kwargs) if fields else {}))

        return timed

    return wrap


def _file_bytes(path) -> dict:
    try:
        return {"bytes": os.path.getsize(path)}
    except OSError:
        return {}


def _timed_snapshot_job(job_of):
    """``Replica.snapshot_job`` (every snapshot): the time from the job's start to its
    first ``captured()`` call (the state fixed; applying paused until then) as
    ``snapshot_capture``. The job calls it again when done, which changes nothing."""

    @functools.wraps(job_of)
    def timed_job_of(self, data):
        _serialized[0] += 1
        job = job_of(self, data)

        def timed_job(path, captured):
            t0, c0 = _now(), _cpu()

            calls = []

            def timed_captured():
                if not calls:
                    _record("snapshot_capture", t0=t0, ms=(_now() - t0) * 1e3, cpu_ms=(_cpu() - c0) * 1e3)
                calls.append(1)
                captured()

            return job(path, timed_captured)

        return timed_job

    return timed_job_of


def _timed_snapshot_write(write):
    """``BackgroundSerializer._write`` (the job, then the rename and the directory's fsync; on
    the writer thread, or inline when ticked by hand) as ``serialize``: recorded once the file
    is in place, so a member killed right after ``force_snapshot`` restarts from it."""

    @functools.wraps(write)
    def timed_write(self, job):
        t0, c0 = _now(), _cpu()
        try:
            return write(self, job)
        finally:
            _record("serialize", t0=t0, ms=(_now() - t0) * 1e3, cpu_ms=(_cpu() - c0) * 1e3,
                    thread=threading.current_thread().name, **_file_bytes(self._Serializer__fileName))

    return timed_write


def _wrap_compaction(fn):
    @functools.wraps(fn)
    def compaction(self):
        before = _serialized[0]
        journal = self._journal
        prepared_before = getattr(journal, "prepared_compactions", 0)
        t0, c0 = _now(), _cpu()
        try:
            return fn(self)
        finally:
            ms = (_now() - t0) * 1e3
            took_snapshot = _serialized[0] != before
            if ms >= COMPACTION_RECORD_MS or took_snapshot:
                # prepared: the journal used the file the writer thread prepared (journal.py).
                _record("compaction", t0=t0, ms=ms, cpu_ms=(_cpu() - c0) * 1e3, snapshot=took_snapshot,
                        prepared=getattr(journal, "prepared_compactions", 0) != prepared_before)

    return compaction


def _watch_poll(syncobj) -> None:
    """Time the Raft thread's tick bodies through its poller (one per SyncObj)."""
    poller = syncobj._poller
    inner = poller.poll
    state = {"returned": None, "cpu": 0.0}

    def poll(timeout):
        start = _now()
        returned = state["returned"]
        if returned is not None:
            ms = (start - returned) * 1e3
            if ms >= SLOW_TICK_MS:
                _record("slow_tick", t0=returned, ms=ms, cpu_ms=(_cpu() - state["cpu"]) * 1e3)
        try:
            return inner(timeout)
        finally:
            state["returned"], state["cpu"] = _now(), _cpu()

    poller.poll = poll


def _wrap_init(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _syncobjs.append(self)
        _watch_poll(self)

    return __init__


def _watch_gc() -> None:
    """Record every cyclic-GC pass longer than SLOW_TICK_MS: it runs in whichever thread
    allocates, the Raft thread included, and a full pass walks every object of the state."""
    started: dict = {}

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[threading.get_ident()] = (_now(), _cpu())
            return
        t0, c0 = started.pop(threading.get_ident(), (None, None))
        if t0 is None:
            return
        ms = (_now() - t0) * 1e3
        if ms >= SLOW_TICK_MS:
            _record("gc", t0=t0, ms=ms, cpu_ms=(_cpu() - c0) * 1e3, generation=info.get("generation"),
                    thread=threading.current_thread().name)

    gc.callbacks.append(callback)


def install(path: str) -> None:
    global _out
    _out = open(path, "a", encoding="utf-8")  # open for the process's life
    _record("start", t0=_now())
    _watch_gc()
    so = raft_syncobj.HardenedSyncObj
    so.__init__ = _wrap_init(so.__init__)
    so._SyncObj__tryLogCompaction = _wrap_compaction(so._SyncObj__tryLogCompaction)
    so._SyncObj__loadDumpFile = _timed(
        "load_dump", fields=lambda self, clearJournal: {"installing": bool(clearJournal)}
    )(so._SyncObj__loadDumpFile)
    rep = raft_replica.Replica
    rep.snapshot_job = _timed_snapshot_job(rep.snapshot_job)
    writer = snapshot_writer.BackgroundSerializer
    writer._write = _timed_snapshot_write(writer._write)
    rep.deserialize = _timed("deserialize", fields=lambda self, path: _file_bytes(path))(rep.deserialize)
    # replica.py calls these through the module, so the module attributes are what to wrap.
    snapshot_file.write = _timed("snapshot_write")(snapshot_file.write)
    snapshot_file.write_pieces = _timed("snapshot_write")(snapshot_file.write_pieces)
    snapshot_file.read_body = _timed("snapshot_read")(snapshot_file.read_body)

    def force_snapshot(*_):
        for syncobj in _syncobjs:
            syncobj.forceLogCompaction()
        _record("force_snapshot", t0=_now())

    signal.signal(signal.SIGUSR1, force_snapshot)


def main(argv: list[str]) -> int:
    path = os.environ.get("SCALE_TIMINGS_FILE")
    if path:
        install(path)
    from coordinator.server import fencingd

    return fencingd.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

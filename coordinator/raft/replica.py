"""The state machine as pysyncobj sees it: ``apply_entry`` for committed entries, and the snapshot hooks.

Owns: ``Replica`` (a SyncObjConsumer around a ``StateMachine``): the apply lock readers take,
the last applied index, unpacking shared entries into their commands, and the serializer /
deserializer pysyncobj calls for snapshots (format: ``snapshot_file.py``).
Must never: interpret a command (the state machine does), or let an exception escape apply or
restore and carry on: pysyncobj would re-apply forever or serve half-restored state, so it
stops the process (``fatal.EXIT_APPLY_FAILED``).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Any, Callable

from pysyncobj import SyncObjConsumer

from coordinator.raft import snapshot_file
from coordinator.raft import wire as raft_wire
from coordinator.raft.fatal import EXIT_APPLY_FAILED, FatalHandler, exit_code_for
from coordinator.raft.interface import StateMachine


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


def freeze_long_lived(*, collect_young: bool = True) -> None:
    """Move every object alive now into the cyclic GC's permanent generation, which no
    collection scans: a full collection then walks only what was made since (measured at
    100,000 resources: 51 passes over 20 ms during a load, the slowest 371 ms, each walking
    the whole state, in whichever thread allocated, the Raft thread included).

    Called when the state was just read or loaded in full (after a snapshot is written, after
    one is restored), so what is frozen is mostly the state. Young cyclic garbage is collected
    first (a collection of the two young generations: bounded work); a cycle that became
    garbage after reaching the old generation and before this call stays frozen for good, and
    an object frozen while alive is still freed by its reference count when it dies (the
    state's objects hold no cycles: tests/test_snapshot_writer.py churns the state machine
    and checks that the permanent generation follows the live state, not the operations).

    ``collect_young=False`` right after a restore: the restore ran with the GC off, so the
    whole new state sits in the youngest generation and collecting it would walk all of it
    (58 ms measured for 100,000 resources with a lease each, on the Raft thread); it holds
    no garbage cycles."""
    if collect_young:
        gc.collect(1)
    gc.freeze()


# The snapshot writer's pause between two pieces (each read under the apply lock). Releasing
# the lock and taking it again at once let the writer keep it: a follower's Raft thread, waiting
# for it to apply an entry, waited out whole state reads (~1 s ticks at 1,000,000 resources,
# bench scale). Sleeping hands the lock over; ~1,100 pieces at a million make it ~0.1-0.2 s.
PIECE_PAUSE_S = 0.0001
# A full (generation 2) pass of the cyclic GC longer than this freezes what survived it.
FULL_PASS_FREEZE_S = 0.02


class FreezeAfterSlowFullPass:
    """A ``gc.callbacks`` entry: after a full pass that took longer than ``slow_s``, freeze what
    survived it (``gc.freeze()``), so the next full pass walks only what is made after.

    Between snapshots (each followed by ``freeze_long_lived``) a member that grows its state
    grows the GC's old generation with it, and each full pass walks all of it, in whichever
    thread allocated, the Raft thread included: loading 1,000,000 resources through a member,
    152-156 passes over 20 ms, the slowest 703-845 ms, a Raft tick of up to 1.6 s (bench
    scale). Freezing right after a full pass freezes only objects that pass found reachable,
    so no garbage it could have freed; like every freeze, a cycle that becomes garbage later
    stays (freed by reference counts otherwise, as the state's objects are). Fast passes
    freeze nothing: a small process keeps the collector's ordinary behaviour.
    """

    def __init__(self, slow_s: float = FULL_PASS_FREEZE_S) -> None:
        self.slow_s = slow_s
        self.freezes = 0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        started, self._started = self._started, None
        if started is not None and time.perf_counter() - started > self.slow_s:
            gc.freeze()
            self.freezes += 1


def freeze_after_slow_full_passes(slow_s: float = FULL_PASS_FREEZE_S) -> FreezeAfterSlowFullPass:
    """Install ``FreezeAfterSlowFullPass`` for this process (once; a member's start-up)."""
    for callback in gc.callbacks:
        if isinstance(callback, FreezeAfterSlowFullPass):
            return callback
    callback = FreezeAfterSlowFullPass(slow_s)
    gc.callbacks.append(callback)
    return callback


class Replica(SyncObjConsumer):
    """Holds the state machine; ``apply_entry`` takes a typed entry's command bytes."""

    def __init__(self, state_machine: StateMachine, on_fatal: FatalHandler):
        self._sm = state_machine
        self._on_fatal = on_fatal
        self.lock = threading.Lock()  # apply (tick thread) vs readers (other threads)
        # Notified under ``lock`` after every applied entry and loaded snapshot: what a reader
        # waiting for a change (a Lock call waiting for its grant) sleeps on.
        self.applied = threading.Condition(self.lock)
        self.last_applied_index = 0
        # Set by HardenedSyncObj: the configuration at a log index (for a snapshot being
        # written), and where a loaded snapshot's configuration goes.
        self.config_at: Callable[[int], Any] = lambda index: None
        self.on_snapshot_config: Callable[[int, int, Any], None] = lambda index, term, config: None
        # Set by ``watch_applied`` (Watch's hub, coordinator/server/watch_hub.py): called under
        # ``lock`` after each applied entry with (index, its outcome or outcomes), and after a
        # snapshot loaded with its last index; each must be quick and must never block.
        self.on_applied: Callable[[int, Any], None] | None = None
        self.on_loaded: Callable[[int], None] | None = None
        super().__init__()

    def watch_applied(self, on_applied: Callable[[int, Any], None], on_loaded: Callable[[int], None]) -> int:
        """Call ``on_applied`` / ``on_loaded`` from now on (replacing any before); returns the
        last index applied before the first call, read under the same lock."""
        with self.lock:
            self.on_applied, self.on_loaded = on_applied, on_loaded
            return self.last_applied_index

    # Called by HardenedSyncObj for each committed typed entry (wire.py "log entries"):
    # no @replicated method, so pysyncobj never pickles a call (syncobj.py:1599).
    def apply_entry(self, entry: bytes):
        try:
            index = self._syncObj.raftLastApplied + 1
            shared = raft_wire.decode_shared_entry(entry)
            with self.lock:
                if shared is None:
                    # A malformed shared entry goes to the state machine as is, which cannot
                    # apply it: it raises, and the member stops below (DESIGN §8).
                    # The index lets the state machine report where an op_id first applied.
                    outcome = self._sm.apply(entry, index)
                else:
                    outcome = [self._sm.apply(command, index) for command in shared]
                self.last_applied_index = index
                if self.on_applied is not None:
                    self.on_applied(index, outcome)
                self.applied.notify_all()
            return index, outcome
        except BaseException as exc:  # any type escaping apply is a bug: fatal, re-raised
            # An exception escaping apply is re-applied forever by pysyncobj
            # (syncobj.py:708-734): stop loudly instead of wedging silently.
            self._on_fatal(f"state machine apply raised {exc!r}; stopping", EXIT_APPLY_FAILED)
            raise

    def snapshot_deferred(self) -> bool:
        """Whether the state machine asks that no snapshot be taken now (its optional
        ``snapshot_deferred`` property): one would rewrite bytes that stay in memory anyway."""
        return bool(getattr(self._sm, "snapshot_deferred", False))

    def serialize(self, path: str, data) -> None:
        """Write the snapshot at ``data``'s last entry to ``path`` now (the stock serializer's
        hook, on the Raft thread: nothing is applied meanwhile)."""
        self.snapshot_job(data)(path, lambda: None)

    def snapshot_job(self, data) -> Callable[[str, Callable[[], None]], None]:
        """On the Raft thread, the moment a snapshot at ``data``'s last entry (the last applied
        one) is decided: what it needs from that thread (the configuration at that index), and
        the rest as a job ``job(path, captured)`` another thread may run (snapshot_writer.py).

        The job reads the state in pieces, taking the apply lock for each, and calls
        ``captured()`` once the state it holds is fixed (``snapshot_pieces``: its first
        non-empty piece is read; ``snapshot()``: all of it), or it failed; then it reads the rest and writes
        the file. The caller must apply nothing from the moment it asks for the job until
        ``captured()`` is called: that is what makes the pieces the state at ``last``.
        """
        last, prev, _cluster = data
        config = self.config_at(last[1])

        def job(path: str, captured: Callable[[], None]) -> None:
            pieces_of = getattr(self._sm, "snapshot_pieces", None)
            try:
                with _gc_paused():
                    if pieces_of is None:
                        with self.lock:
                            state = self._sm.snapshot()
                    else:
                        pieces = self._read_in_pieces(pieces_of, captured)
            finally:
                captured()  # once only: a second call does nothing
            if pieces_of is None:
                snapshot_file.write(path, last, prev, state, config)
            else:
                snapshot_file.write_pieces(path, last, prev, pieces, config)

        return job

    def _read_in_pieces(self, pieces_of: Callable[[], Any], captured: Callable[[], None]) -> list[bytes]:
        pieces: list[bytes] = []
        with self.lock:
            produce = iter(pieces_of())
        try:
            while True:
                # Entries are applied and readers served between pieces, never during one: the
                # state machine keeps what the snapshot started with (copy-on-write).
                with self.lock:
                    piece = next(produce, None)
                if piece is None:
                    return pieces
                time.sleep(PIECE_PAUSE_S)  # let a thread waiting for the lock have it
                if piece and not pieces:
                    captured()  # the first non-empty piece fixed the state: applying may resume
                if piece:
                    pieces.append(piece)
        finally:
            with self.lock:
                produce.close()  # ends a capture left early (a failure): no-op after the last piece

    def deserialize(self, path: str):
        body = snapshot_file.read_body(path)
        try:
            with self.lock, _gc_paused():
                last, prev, state, config = snapshot_file.decode(body)
                self._sm.restore(state)
                self.last_applied_index = last[1]
                if self.on_loaded is not None:
                    self.on_loaded(last[1])
                self.applied.notify_all()
            freeze_long_lived(collect_young=False)
            self.on_snapshot_config(last[1], last[2], config)
        except BaseException as exc:  # a restore failing in any way leaves a half state: fatal
            # pysyncobj swallows loader errors (syncobj.py:1510); a half-restored
            # state machine must never serve.
            # A disk or descriptor table refusing (OSError): EXIT_DISK_FAILED; else a bug.
            self._on_fatal(f"restoring snapshot {path} failed: {exc!r}", exit_code_for(exc))
            raise
        return last, prev, set()

"""The leader's read lease (RAFT.md "Lease reads"): how long a majority's confirmation lasts.

Owns: ``ReadLease``, one leader term's lease: the monotonic time each confirmation round was
started (before its appends went out), and, once a majority of counted voters echoed a round,
the lease it earns: until that round's start plus ``duration_s``. ``duration_s`` is shorter
than the time any voter that accepted the round's append refuses every vote for another
candidate (pre_vote.py ``vote_window_s``) by the clock-drift bound, so while ``holds(now)`` no
leader of a later term can have been elected, and the leader's commit index covers every
acknowledged write (dissertation §6.4.1).
Must never: extend a lease from a round whose start it did not record in this term and under
this configuration (``void`` forgets them all), or hold a lease across a clock that went
backwards. The clock is injected (the simulation's is virtual) and read under the lock, so
two threads never see each other's readings out of order. Thread-safe: the Raft thread records
and confirms rounds, request threads ask ``holds``.
"""

from __future__ import annotations

import threading
from typing import Callable

# Round starts kept while unconfirmed. A leader sends a new round only once the one in flight
# is confirmed (read_rounds.py), so one or two are pending; the bound only caps a leader whose
# followers never answer (each tick could otherwise add one).
LEASE_ROUNDS_PENDING_MAX = 64


class ReadLease:
    """The lease of one leader term; ``void`` whenever it may no longer hold."""

    def __init__(self, duration_s: float, clock: Callable[[], float]) -> None:
        if duration_s <= 0:
            raise ValueError(f"a lease of {duration_s} s holds nothing")
        self.duration_s = duration_s
        self._clock = clock  # monotonic seconds
        self._lock = threading.Lock()
        self._until = float("-inf")  # monotonic time the lease ends (-inf: none)
        self._starts: dict[int, float] = {}  # round -> monotonic time it was started
        self._clock_high = float("-inf")  # the latest time seen: a clock below it went back
        self.clock_steps_back = 0  # times a clock read below an earlier one voided the lease
        self.reads = 0  # reads the lease answered (holds(count=True))
        self.fallbacks = 0  # reads it did not: they took a read-index round

    def void(self) -> None:
        """Leadership, term or configuration changed, a transfer began, or the clock went
        back: nothing confirmed so far earns a lease any more."""
        with self._lock:
            self._until = float("-inf")
            self._starts.clear()

    def round_started(self, seq: int) -> None:
        """Round ``seq`` is about to go out: its appends leave after this moment."""
        with self._lock:
            now = self._clock()
            if self._went_back(now):
                return
            if len(self._starts) >= LEASE_ROUNDS_PENDING_MAX:
                self._starts.pop(min(self._starts))
            self._starts[seq] = now

    def confirmed(self, seq: int) -> None:
        """A majority echoed round ``seq`` (or a later one): each of them accepted an append
        sent after that round started, and refuses votes for a window counted from then."""
        with self._lock:
            if self._went_back(self._clock()):
                return
            start = self._starts.get(seq)
            for done in [s for s in self._starts if s <= seq]:
                del self._starts[done]
            if start is not None and start + self.duration_s > self._until:
                self._until = start + self.duration_s

    def holds(self, *, count: bool = False) -> bool:
        """The lease is valid now (the caller asks after its read arrived). ``count``: a read
        asks, counted in ``reads`` or ``fallbacks``."""
        with self._lock:
            now = self._clock()
            held = not self._went_back(now) and now < self._until
            if count:
                if held:
                    self.reads += 1
                else:
                    self.fallbacks += 1
            return held

    def remaining_s(self) -> float:
        """Seconds the lease has left (negative or -inf: none)."""
        with self._lock:
            now = self._clock()
            if self._went_back(now):
                return float("-inf")
            return self._until - now

    def _went_back(self, now: float) -> bool:
        # A monotonic clock never goes back on Linux; a clock that did (a faked or broken one)
        # makes every recorded start meaningless: void, and start again from this reading.
        if now < self._clock_high:
            self.clock_steps_back += 1
            self._until = float("-inf")
            self._starts.clear()
            self._clock_high = now
            return True
        self._clock_high = now
        return False

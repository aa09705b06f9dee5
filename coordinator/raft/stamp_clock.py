"""The stamp each command carries: the log clock, advanced by the leader's monotonic time.

Owns: ``StampClock``, the rule of DESIGN I6 that turns this member's monotonic clock into the
``stamp_ms`` of the commands it proposes (the state machine then sets its log clock to
``max(log clock, stamp)``). Must never: read a wall clock (a step of one must move no lease),
let one stamp move the log clock past the previous one by more than ``STAMP_ADVANCE_MS_MAX``,
or carry a stamp chain from one term into another.

The rule, per term T of this member:
- not the leader: stamp 0, "no opinion": the command is judged at the log clock as it
  applies, never by this member's clock (a follower's clock, stepped or not, moves nothing);
- the leader's first stamp in T: the log clock applied here. A new leader continues from the
  last applied stamp; the time its election took is not counted (leases run longer by it);
- the leader's later stamps in T: ``max(previous stamp + min(monotonic ms elapsed since it,
  STAMP_ADVANCE_MS_MAX), log clock applied here)``. A monotonic clock that jumps (a VM
  resumed, a faked clock) moves the log clock by at most the bound per stamp; one that goes
  back moves it by nothing.
A stamp chain ends with its term, so a member that leads again never continues from a stamp
of its own older than what other leaders applied meanwhile.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from coordinator.raft.limits import STAMP_ADVANCE_MS_MAX


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class StampClock:
    """Thread-safe: RPC threads stamp while the Raft thread changes terms."""

    def __init__(
        self,
        monotonic_ms: Callable[[], int] = monotonic_ms,
        advance_ms_max: int = STAMP_ADVANCE_MS_MAX,
    ) -> None:
        if advance_ms_max <= 0:
            raise ValueError(f"advance_ms_max must be positive, got {advance_ms_max}")
        self._monotonic_ms = monotonic_ms
        self._advance_ms_max = advance_ms_max
        self._lock = threading.Lock()
        self._term: int | None = None  # the term of the current stamp chain
        self._last_stamp_ms = 0
        self._last_monotonic_ms = 0

    def stamp(self, *, term: int, leading: bool, log_clock_ms: int) -> int:
        """The stamp of a command proposed now, by a member in ``term`` that leads or not,
        whose applied log clock reads ``log_clock_ms``."""
        if not leading:
            return 0
        with self._lock:
            now_ms = self._monotonic_ms()
            if term != self._term:
                self._term = term
                stamp = log_clock_ms
            else:
                elapsed_ms = min(max(0, now_ms - self._last_monotonic_ms), self._advance_ms_max)
                stamp = max(self._last_stamp_ms + elapsed_ms, log_clock_ms)
            self._last_stamp_ms = stamp
            self._last_monotonic_ms = now_ms
            return stamp

"""What a slow convergence waited on, kept with the step that had it.

Two stalls of earlier runs (a 41.9 s convergence after a clock step, a 29 s member replace)
could never be traced: the runs' directories were gone, and all their output said was the
number. So the runner's convergence wait notes, each time it changes, what stopped the cluster
from counting as converged (members not answering or not agreeing on a leader, each member's
own view; or the probe's failure), and a step that converged slowly or never keeps that
record and prints it: the CI log alone then says where the time went.
"""

from __future__ import annotations

import time

# A convergence this slow (or none) keeps its trace; the CI profile's are ~0.5-4 s, and the
# soak's bound is 10 s.
SLOW_CONVERGENCE_S = 5.0
# Notes kept per wait: the first ones say how it began, the last ones how it ended.
TRACE_NOTES_MAX = 40


class ConvergenceTrace:
    """(seconds since the wait began, what it waited on), one note per change."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.notes: list[tuple[float, str]] = []
        self.dropped = 0

    def note(self, what: str, now: float | None = None) -> None:
        if self.notes and self.notes[-1][1] == what:
            return
        at = (time.monotonic() if now is None else now) - self.started
        if len(self.notes) >= TRACE_NOTES_MAX:  # keep the first half and the latest ones
            del self.notes[TRACE_NOTES_MAX // 2]
            self.dropped += 1
        self.notes.append((round(at, 2), what))

    def record(self) -> list[list]:
        return [[at, what] for at, what in self.notes]

    def render(self) -> str:
        parts = [f"{at:.1f} s {what}" for at, what in self.notes]
        if self.dropped:
            parts.insert(TRACE_NOTES_MAX // 2, f"({self.dropped} notes left out)")
        return "; ".join(parts) if parts else "nothing (converged at the first look)"


def member_views(nodes, timeout_s: float = 1.0) -> str:
    """Each member's own view, asked without a read through the log (which a cluster without
    a leader cannot answer): ``n0 leader=127.0.0.3:5001 term=7 applied=812``, or why not."""
    from coordinator.api.v1 import fencing_pb2 as pb  # the runner's import cost, not the checker's

    views = []
    for node in nodes:
        name = f"n{node.index}"
        if not node.alive:
            views.append(f"{name} down")
            continue
        if node.paused:
            views.append(f"{name} paused")
            continue
        try:
            s = node.cluster.Status(pb.StatusRequest(local=True), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - what it answered is what we note
            code = getattr(exc, "code", None)
            views.append(f"{name} no answer ({code().name if callable(code) else type(exc).__name__})")
            continue
        views.append(f"{name} leader={s.leader or '-'} term={s.term} applied={s.applied_index}")
    return ", ".join(views)


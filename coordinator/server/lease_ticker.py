"""The leader's lease-clock job: one TICK through the log every ``lease_tick_interval_s``.

Owns: ``LeaseTicker``, a thread that, while this member leads, proposes a TICK, waits for its
fate, then waits the interval. Each TICK carries a stamp of the leader's monotonic time
(``coordinator/raft/stamp_clock.py``), so the log clock keeps time while no client writes
(one stamp may move it by at most STAMP_ADVANCE_MS_MAX, far above the interval), and it
forgets every resource whose lease expired with no data, so the cluster's RESOURCES_MAX and
each principal's resources quota count live resources without anyone releasing.
Must never: propose on a member that does not lead, have more than one TICK in flight, or let
an error end its thread (a failed TICK is tried again after the next interval).
"""

from __future__ import annotations

import logging
import threading

from coordinator.core import ops
from coordinator.core.results import TickResult, expect
from coordinator.raft.node import RaftNode
from coordinator.server.errors import ServiceError
from coordinator.server.proposer import Proposer

log = logging.getLogger(__name__)


class LeaseTicker(threading.Thread):
    def __init__(self, node: RaftNode, proposer: Proposer, *, interval_s: float, timeout_s: float) -> None:
        super().__init__(name="lease-ticker", daemon=True)
        self.node = node
        self.proposer = proposer
        self.interval_s = interval_s
        self.timeout_s = timeout_s  # one TICK's wait for its fate; the next one waits for it
        self._stopping = threading.Event()  # not _stop: Thread.join calls its own _stop()
        self.ticks_applied = 0
        self.leases_expired = 0  # by the TICKs this member proposed (metrics, read when scraped)

    def tick_once(self) -> int | None:
        """Propose one TICK if this member leads: how many leases it expired, or None when
        it did not lead or the TICK failed (retried next interval)."""
        if not self.node.is_leader():
            return None
        try:
            result = self.proposer.propose(ops.Tick(), self.timeout_s, client_slot=False)
        except ServiceError as error:  # lost leadership, deadline, overload: try again later
            log.info("lease ticker: TICK not applied: %s", error.reason)
            return None
        self.ticks_applied += 1
        expired = expect(TickResult, result.value.result).expired
        self.leases_expired += expired
        if expired:
            log.debug("lease ticker: %d expired leases ended", expired)
        return expired

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick_once()
            except Exception:  # any failure, whatever its type: logged, and the next tick tries again
                log.exception("lease ticker: TICK failed")
            self._stopping.wait(self.interval_s)

    def stop(self) -> None:
        self._stopping.set()

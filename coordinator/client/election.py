"""Leader election on the lock queue, like etcd's ``concurrency.Election``.

Owns: ``Election`` -- ``campaign`` (wait in the resource's FIFO queue until this candidate
leads, and hold the lease that says so), ``leader`` (who leads now), ``observe`` (each change
of leader, as it is seen) and ``resign`` (give the lead to the next candidate in line). The
leader's identity is the lease's holder label; its fencing token is the term of its lead, so
whatever a leader writes through a fenced resource is refused once a newer leader exists.
Must never: claim a lead the cluster has not granted, or keep one after ``resign``.

    election = Election(client, "jobs/scheduler", ttl_ms=5000)
    lease = election.campaign("worker-1")       # blocks until worker-1 leads
    lease.write("plan", b"...")                 # fenced by the lead's token
    election.resign()

``observe`` polls ``describe`` (a read through the log) every ``interval_s``: a leader change
is seen within that interval, at one Raft entry per interval per observer.
"""

from __future__ import annotations

import threading
from typing import Iterator

from coordinator.client.sync import FencingClient, Lease

__all__ = ["Election"]

# How often observe() reads the leader: a change is seen within this, and each read is one
# Raft entry (a linearizable describe), so an observer costs one entry per interval.
OBSERVE_INTERVAL_S_DEFAULT = 0.5


class Election:
    """One election, named by the resource its lease lives on (sync client)."""

    def __init__(self, client: FencingClient, resource: str, *, ttl_ms: int) -> None:
        self.client = client
        self.resource = resource
        self.ttl_ms = ttl_ms
        self.lease: Lease | None = None

    def campaign(self, candidate: str, *, timeout_s: float | None = None) -> Lease:
        """Wait until ``candidate`` leads (``client.lock`` with ``candidate`` as the holder);
        the returned Lease renews itself and is the proof of the lead (its token)."""
        if self.lease is not None and not self.lease.lost.is_set():
            raise RuntimeError(f"already leading {self.resource} as {self.lease.holder!r}")
        self.lease = self.client.lock(self.resource, ttl_ms=self.ttl_ms, timeout_s=timeout_s, holder=candidate)
        return self.lease

    def leader(self) -> str | None:
        """Who leads now (the holder of the live lease), or None."""
        described = self.client.describe(self.resource)
        return described.holder if described.held else None

    def observe(self, *, interval_s: float = OBSERVE_INTERVAL_S_DEFAULT,
                stop: threading.Event | None = None) -> Iterator[str | None]:
        """Yield the leader (None: nobody) now and after each change, until ``stop`` is set."""
        stop = stop or threading.Event()
        last: object = object()  # nothing seen yet: the first answer is always yielded
        while not stop.is_set():
            current = self.leader()
            if current != last:
                last = current
                yield current
            stop.wait(interval_s)

    def resign(self) -> None:
        """Give up the lead: the lease is released and the next candidate in line gets it in
        the same entry. Nothing happens when this election does not lead."""
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()

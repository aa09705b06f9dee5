"""Leader election on the lock queue, like etcd's ``concurrency.Election``.

Owns: ``Election`` (sync client) and ``AsyncElection`` (asyncio client) -- ``campaign`` (wait
in the resource's FIFO queue until this candidate leads, and hold the lease that says so),
``leader`` (who leads now), ``observe`` (each change of leader, as it is seen) and ``resign``
(give the lead to the next candidate in line). The leader's identity is the lease's holder
label; its fencing token is the term of its lead, so whatever a leader writes through a
fenced resource is refused once a newer leader exists.
Must never: claim a lead the cluster has not granted, or keep one after ``resign``.

    election = Election(client, "jobs/scheduler", ttl_ms=5000)
    lease = election.campaign("worker-1")       # blocks until worker-1 leads
    lease.write("plan", b"...")                 # fenced by the lead's token
    election.resign()

``observe`` reads the leader once (a linearizable ``describe``), then follows the resource's
Watch from the revision that read saw: each grant, release, expiry or force-release is seen as
the member applies it, at no Raft entry per observer. A release and the grant to the next in
line apply in one entry, so the observer sees the new leader without a "nobody" between.
"""

from __future__ import annotations

import threading
from typing import AsyncIterator, Awaitable, Iterable, Iterator, cast

from coordinator.client.aio import AsyncFencingClient, AsyncLease
from coordinator.client.results import Description
from coordinator.client.sync import FencingClient, Lease
from coordinator.client.watch import WatchEvent

__all__ = ["AsyncElection", "Election"]

# How often observe() looks at its ``stop`` event, in seconds (the watch itself is pushed).
OBSERVE_INTERVAL_S_DEFAULT = 0.5
_ENDED = frozenset({"RELEASED", "EXPIRED", "FORCE_RELEASED", "RESET"})


def leader_after(resource: str, leader: str | None, events: Iterable[WatchEvent]) -> str | None:
    """Who leads ``resource`` after ``events`` (one entry's), given ``leader`` before them."""
    for event in events:
        if event.type == "RESET" or event.resource == resource:
            if event.type == "ACQUIRED":
                leader = event.holder
            elif event.type in _ENDED:
                leader = None
    return leader


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
        """Yield the leader (None: nobody) now and after each change, until ``stop`` is set
        (looked at every ``interval_s``)."""
        described = self.client.describe(self.resource)
        current = described.holder if described.held else None
        yield current
        watcher = self.client.watch(self.resource, start_revision=described.header.applied_index + 1)
        done = threading.Event()
        if stop is not None:
            def close_on_stop() -> None:
                while not done.is_set():
                    if stop.wait(interval_s):
                        watcher.close()
                        return
            threading.Thread(target=close_on_stop, name="election-observe", daemon=True).start()
        try:
            for _revision, events in watcher.batches():
                leader = leader_after(self.resource, current, events)
                if leader != current:
                    current = leader
                    yield current
        finally:
            done.set()
            watcher.close()

    def resign(self) -> None:
        """Give up the lead: the lease is released and the next candidate in line gets it in
        the same entry. Nothing happens when this election does not lead."""
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()


class AsyncElection:
    """``Election`` for the asyncio client: the same calls, awaited."""

    def __init__(self, client: AsyncFencingClient, resource: str, *, ttl_ms: int) -> None:
        self.client = client
        self.resource = resource
        self.ttl_ms = ttl_ms
        self.lease: AsyncLease | None = None

    async def campaign(self, candidate: str, *, timeout_s: float | None = None) -> AsyncLease:
        if self.lease is not None and not self.lease.lost.is_set():
            raise RuntimeError(f"already leading {self.resource} as {self.lease.holder!r}")
        self.lease = await self.client.lock(self.resource, ttl_ms=self.ttl_ms, timeout_s=timeout_s, holder=candidate)
        return self.lease

    async def leader(self) -> str | None:
        described = await self._describe()
        return described.holder if described.held else None

    async def _describe(self) -> Description:
        # The asyncio client's methods are awaitables typed as the sync client's results.
        return await cast("Awaitable[Description]", self.client.describe(self.resource))

    async def observe(self) -> AsyncIterator[str | None]:
        """The leader now and after each change; stop by leaving the ``async for``."""
        described = await self._describe()
        current = described.holder if described.held else None
        yield current
        watcher = self.client.watch(self.resource, start_revision=described.header.applied_index + 1)
        try:
            async for _revision, events in watcher.batches():
                leader = leader_after(self.resource, current, events)
                if leader != current:
                    current = leader
                    yield current
        finally:
            watcher.close()

    async def resign(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.release()

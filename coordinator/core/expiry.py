"""Which leases have expired, found without scanning every resource: the TICK's index.

Owns: ``ExpiryIndex``, a heap of ``(expires_at_ms, resource)`` pushed whenever a lease is
granted or extended and popped by a TICK up to the log clock. Each popped entry is checked
against the state: a lease released, renewed or forgotten since leaves a stale entry, dropped
then, so only grants and extensions need to tell the index anything. The state machine's
resources dict is replaced wholesale by a restore or a snapshot load; the index notices the
new dict and rebuilds itself from it.
Must never: decide what the state does not say (it finds candidates; the lease decides), hold
anything a snapshot needs (it is derived, so replicas agree whatever their history), or grow
without bound: past twice the resources, plus REBUILD_SLACK_ENTRIES, it is rebuilt.
"""

from __future__ import annotations

import heapq
from typing import Any, Mapping

# Stale entries (renewals, releases) a small cluster may pile up before a rebuild: a rebuild
# costs one pass over the resources, so it happens at most once per this many stale entries.
REBUILD_SLACK_ENTRIES = 1024


class ExpiryIndex:
    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []
        self._of: Mapping[str, Any] | None = None  # the resources dict the heap indexes

    def add(self, expires_at_ms: int, resource: str) -> None:
        """A lease on ``resource`` was granted or extended until ``expires_at_ms``."""
        heapq.heappush(self._heap, (expires_at_ms, resource))

    def expired(self, resources: Mapping[str, Any], now_ms: int) -> list[str]:
        """The names in ``resources`` whose lease has expired by ``now_ms`` (``expires_at_ms
        <= now_ms``), once each, in (expiry, name) order. The caller ends those leases."""
        if self._of is not resources or len(self._heap) > 2 * len(resources) + REBUILD_SLACK_ENTRIES:
            self._rebuild(resources)
        found: list[str] = []
        seen: set[str] = set()
        while self._heap and self._heap[0][0] <= now_ms:
            expires_at_ms, name = heapq.heappop(self._heap)
            res = resources.get(name)
            lease = None if res is None else res.lease
            if lease is not None and lease.expires_at_ms == expires_at_ms and name not in seen:
                seen.add(name)
                found.append(name)
        return found

    def _rebuild(self, resources: Mapping[str, Any]) -> None:
        self._heap = [(res.lease.expires_at_ms, name) for name, res in resources.items() if res.lease is not None]
        heapq.heapify(self._heap)
        self._of = resources


class WaiterExpiryIndex:
    """The lock waiters a TICK drops, found without scanning every queue: a heap of
    ``(expires_at_ms, resource, waiter_id)`` pushed whenever a waiter is queued or renewed.
    Like ``ExpiryIndex`` it only proposes candidates (the queue decides: a waiter renewed,
    granted or cancelled since is skipped) and rebuilds itself from a replaced resources dict
    or once stale entries outnumber the waiters twice over (plus REBUILD_SLACK_ENTRIES)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, str, bytes]] = []
        self._of: Mapping[str, Any] | None = None

    def add(self, expires_at_ms: int, resource: str, waiter_id: bytes) -> None:
        heapq.heappush(self._heap, (expires_at_ms, resource, waiter_id))

    def expired(self, resources: Mapping[str, Any], now_ms: int, waiters_total: int) -> list[tuple[str, bytes]]:
        """``(resource, waiter_id)`` of every queued waiter whose slot expired by ``now_ms``,
        once each, in (expiry, resource, id) order. The caller drops them."""
        if self._of is not resources or len(self._heap) > 2 * waiters_total + REBUILD_SLACK_ENTRIES:
            self._rebuild(resources)
        found: list[tuple[str, bytes]] = []
        seen: set[tuple[str, bytes]] = set()
        while self._heap and self._heap[0][0] <= now_ms:
            expires_at_ms, name, waiter_id = heapq.heappop(self._heap)
            res = resources.get(name)
            waiter = None if res is None else res.waiters.get(waiter_id)
            if waiter is not None and waiter.expires_at_ms == expires_at_ms and (name, waiter_id) not in seen:
                seen.add((name, waiter_id))
                found.append((name, waiter_id))
        return found

    def _rebuild(self, resources: Mapping[str, Any]) -> None:
        self._heap = [
            (waiter.expires_at_ms, name, waiter.waiter_id)
            for name, res in resources.items()
            for waiter in res.waiters.values()
        ]
        heapq.heapify(self._heap)
        self._of = resources

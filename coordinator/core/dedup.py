"""The dedup table of op_ids (DESIGN I5), accounted per principal: what it keeps, and which
entry leaves when.

Owns: the entries (op_id -> first outcome, in apply order), each principal's count and its
entries' order, and the eviction rules below. Must never: decide whether a command applies
(the state machine does), read a clock (``now`` is the log clock it is given) or do I/O.
Every choice depends on the entries and the arguments alone, never on dict or set order,
so every replica, and a member that loaded a snapshot, evicts the same entries.

Why per principal: one shared bound let a tenant that wrote 100,000 times with fresh op_ids
(7,297 entries/s) turn the 600 s window over every 14 s, and another tenant's Acquire retry
then answered LEASE_HELD against its own lease, its Write retry applied twice (issue 26).

An entry leaves the table only:

1. by age: once the log clock is ``retention_ms`` past the entry's apply, whoever made it;
2. as its own principal's oldest, when that principal adds an entry while it holds its
   budget (``dedup_entries`` of the quota its command carries; no quota: ``entries_max``);
3. when the table holds ``entries_max`` entries (only if the budgets of the principals
   writing at once add up to more): the oldest entry of the principal holding the most
   entries -- the adding principal itself when it holds as many as any other, else the one
   with the smallest name among those holding the most.

So a principal's retries are answered for the whole retention window while it stays within
its budget and some other principal holds more entries than it does; with budgets summing to
at most ``entries_max`` no principal ever loses an entry to another. A principal that
mutates faster than ``budget / retention`` shortens its own window (to ``budget / its
rate``), nobody else's.

Why a principal over its budget loses its own oldest entry rather than being refused: the
budget would otherwise be a throughput quota of ``budget / retention`` mutations a second
(16.7/s at the defaults, 166/s for the whole cluster) -- a lock service refusing a tenant's
writes because a bookkeeping table is full. Its window only shrinks, and fencing never rests
on the dedup table: a retry that misses its entry at worst applies once more with the same
token (a Write), or answers LEASE_HELD against its own lease (an Acquire), which expires.

The anonymous principal (commands not charged to anyone: no principals file) is one
principal, named "". A command without a principal is charged to it.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Iterator

from coordinator.core.state import DedupEntry

# The largest-holder heap is rebuilt from the counts once it holds this many more items than
# there are principals (each count change pushes one while it is kept): memory stays
# O(principals), and a rebuild is paid for by as many pushes as it costs.
_HEAP_SLACK_ITEMS = 64


class DedupTable:
    """op_id -> DedupEntry, in apply order, with each principal's entries counted."""

    def __init__(self, entries_max: int, retention_ms: int) -> None:
        self._entries_max = entries_max
        self._retention_ms = retention_ms
        self._entries: collections.OrderedDict[bytes, DedupEntry] = collections.OrderedDict()
        # principal -> its op_ids, oldest first (same order as in _entries)
        self._own: dict[str, collections.deque[bytes]] = {}
        # (-count, principal) for each principal's current count, plus stale items skipped
        # lazily: the top valid item names the largest holder (ties: the smallest name). Built
        # when the table first fills and kept while it stays full; None otherwise, so a table
        # below its cap (the common case) pays nothing for it. A cache: no choice depends on
        # whether it exists.
        self._largest: list[tuple[int, str]] | None = None

    def load(self, entries: collections.OrderedDict[bytes, DedupEntry]) -> None:
        """Make ``entries`` (in apply order: a snapshot's) the whole table."""
        self._entries = entries
        self._own = {}
        for op_id, entry in entries.items():
            self._own.setdefault(entry.principal, collections.deque()).append(op_id)
        self._largest = None

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, op_id: bytes) -> DedupEntry | None:
        return self._entries.get(op_id)

    def values(self) -> Iterator[DedupEntry]:
        """Every entry, in apply order (a snapshot's dedup array)."""
        return iter(self._entries.values())

    def count(self, principal: str) -> int:
        """How many entries ``principal`` holds now."""
        own = self._own.get(principal)
        return 0 if own is None else len(own)

    def evict_aged(self, now_ms: int) -> None:
        """Drop every entry ``retention_ms`` old at ``now_ms`` (the oldest are first: apply
        order is log-clock order)."""
        horizon_ms = now_ms - self._retention_ms
        entries = self._entries
        while entries:
            oldest = next(iter(entries.values()))
            if oldest.applied_at_ms > horizon_ms:
                return
            self._evict_oldest_of(oldest.principal)

    def add(self, op_id: bytes, entry: DedupEntry, budget: int | None) -> None:
        """Keep ``entry`` for ``op_id`` (not in the table), making room by rules 2 and 3 of
        the module docstring. ``budget``: the principal's quota (None: ``entries_max``); at
        least one entry is always kept, so the op_id just applied answers its retries."""
        principal = entry.principal
        own_max = self._entries_max if budget is None else max(1, min(budget, self._entries_max))
        own = self._own.get(principal)
        if own is None:
            own = self._own[principal] = collections.deque()
        while len(own) >= own_max:
            self._evict_oldest_of(principal)
        while len(self._entries) >= self._entries_max:
            self._evict_oldest_of(self._victim(principal))
        self._entries[op_id] = entry
        self._own[principal] = own  # again: evicting its last entry dropped it
        own.append(op_id)
        self._counted(principal)

    def _victim(self, adding: str) -> str:
        """Whose oldest entry makes room in a full table: ``adding`` if no principal holds
        more than it, else the largest holder (ties: the smallest name)."""
        if self._largest is None:
            self._rebuild_largest()
        heap = self._largest
        assert heap is not None  # built just above
        while True:
            negative, name = heap[0]
            if self.count(name) == -negative:
                break
            heapq.heappop(heap)  # stale: that count has changed since
        return adding if self.count(adding) == -negative else name

    def _evict_oldest_of(self, principal: str) -> None:
        own = self._own[principal]
        del self._entries[own.popleft()]
        if not own:
            del self._own[principal]
        self._counted(principal)

    def _counted(self, principal: str) -> None:
        """``principal``'s count changed: record it for ``_victim`` while the table is full."""
        heap = self._largest
        if heap is None:
            return
        if len(self._entries) < self._entries_max - 1:
            self._largest = None  # below its cap: rebuilt when it is full again
            return
        count = self.count(principal)
        if count:
            heapq.heappush(heap, (-count, principal))
        if len(heap) > 2 * len(self._own) + _HEAP_SLACK_ITEMS:
            self._rebuild_largest()

    def _rebuild_largest(self) -> None:
        self._largest = [(-len(own), name) for name, own in self._own.items()]
        heapq.heapify(self._largest)

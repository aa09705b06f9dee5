"""One page of resources by name: what a listing READ_BARRIER answers (Lease.List).

Owns: ``page``, the resources under some prefixes, after a name, sorted by name, at most
``limit`` of them, each with its lease as of ``now`` (remaining ms on the log clock, never the
wall clock) and its lock waiters; and ``narrowed``, the prefixes a caller may list: the
request's prefix cut down to each of the caller's grants, so a page never names a resource
outside them and a page is full even when most names are someone else's.
Must never: change state (a listing is a read: the capture copy of a snapshot in progress is
not touched either), read a clock, or return more than ``limit`` items.

Cost: a binary search per prefix in the table's sorted names (``name_index``), then only the
names the page returns (+ 1), under the apply lock or on the Raft thread: not a pass over the
table. ``python -m bench list`` prints what a page costs at a given table size.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator

from coordinator.core.name_index import SortedNames
from coordinator.core.results import ListedResource, ListResult
from coordinator.core.state import ResourceTable

# The fields of one listed resource, in the order its map form packs them (results.py).
ITEM_FIELDS = tuple(field.name for field in dataclasses.fields(ListedResource))


def narrowed(prefix: str, grants: Iterable[str] | None) -> tuple[str, ...]:
    """The prefixes that list what both ``prefix`` and ``grants`` cover (None: every name).

    A grant inside the prefix narrows it to the grant; a prefix inside a grant stays as it is;
    disjoint ones cover nothing. Returned sorted, without one inside another; () when the
    caller may see nothing under ``prefix``."""
    if grants is None:
        return (prefix,)
    covered: set[str] = set()
    for grant in grants:
        if grant.startswith(prefix):
            covered.add(grant)
        elif prefix.startswith(grant):
            covered.add(prefix)
    return tuple(sorted(p for p in covered if not any(q != p and p.startswith(q) for q in covered)))


def page(
    resources: ResourceTable,
    now: int,
    prefixes: tuple[str, ...],
    limit: int,
    after: str | None = None,
) -> ListResult:
    """The first ``limit`` resources (by name) under any of ``prefixes``, after ``after``.

    ``more`` says whether another resource follows the last one returned. A lease that has
    expired by ``now`` (its TICK not yet applied) is reported not held, as Describe does."""
    chosen = list(itertools.islice(_names_under(resources.names, prefixes, after), limit + 1))
    items = []
    for name in chosen[:limit]:
        res = dict.__getitem__(resources, name)  # a read: no copy for a snapshot in progress
        lease = res.lease
        live = lease is not None and lease.expires_at_ms > now
        items.append(ListedResource(
            resource=name,
            held=live,
            holder=lease.holder if live and lease is not None else "",
            token=lease.token if live and lease is not None else 0,
            hwm=res.high_water_mark,
            remaining_ms=lease.expires_at_ms - now if live and lease is not None else 0,
            waiters=len(res.waiters),
        ))
    return ListResult(log_clock_ms=now, resources=tuple(items), more=len(chosen) > limit)


def _names_under(names: SortedNames, prefixes: tuple[str, ...], after: str | None) -> Iterator[str]:
    """The names under ``prefixes`` above ``after``, in order. The prefixes cover disjoint
    ranges (none is inside another), and those ranges lie in the prefixes' own order, so each
    range is read in turn from where it starts: O(log n) to find, then only what is read."""
    for prefix in sorted(prefixes):
        if after is not None and after >= prefix:
            if not after.startswith(prefix):
                continue  # this whole range lies before where the page starts
            start, inclusive = after, False
        else:
            start, inclusive = prefix, True
        for name in names.from_name(start, inclusive=inclusive):
            if not name.startswith(prefix):
                break
            yield name

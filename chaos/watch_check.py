"""The Watch rule of the chaos checker: every acknowledged change a watcher should have seen,
seen exactly once and in log order.

A watcher's stream (``watch`` records, chaos/history.py) covers the revisions from its
``start`` to the last revision it saw: every change applied in that range to a resource under
its prefix was streamed to it, so every ok op that made one -- a write, a delete that deleted,
an acquire, a release that released, a force-release -- must appear in it once, at the op's
applied index. Ops whose outcome is unknown may or may not have applied: an event for one is
fine, and so is none. Events with no op behind them are fine too (expiries, lock grants, the
effects of unknown ops).

Violations: WATCH_MISSED_EVENT (an ok op in a stream's range that the stream lacks),
WATCH_REPEATED_EVENT (one change seen twice in one stream), WATCH_OUT_OF_ORDER (a stream's
revisions going backwards). Returned as (kind, detail, ops, events) for ``chaos.check`` to wrap.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

from chaos.history import History, Op, WatchSeen

WATCH_MISSED_EVENT = "WATCH_MISSED_EVENT"
WATCH_REPEATED_EVENT = "WATCH_REPEATED_EVENT"
WATCH_OUT_OF_ORDER = "WATCH_OUT_OF_ORDER"
KINDS = (WATCH_MISSED_EVENT, WATCH_REPEATED_EVENT, WATCH_OUT_OF_ORDER)

# What one change looks like, from either side: (revision, event type, resource, key, value, token).
Change = tuple[int, str, str, "str | None", "str | None", "int | None"]
Found = tuple[str, str, list[Op], list[WatchSeen]]


def expected_change(op: Op) -> Change | None:
    """The change an ok op made, as a watcher sees it, or None when it made none it sees."""
    index = op.applied_index
    if not op.is_ok or index is None:
        return None
    if op.f == "write":
        return (index, "WRITTEN", op.resource, op.key, op.value, None)
    if op.f == "delete" and op.result.get("deleted") is True:
        return (index, "DELETED", op.resource, op.key, None, None)
    if op.f == "acquire":
        return (index, "ACQUIRED", op.resource, None, None, op.issued_token())
    if op.f == "release" and op.result.get("released") is True:
        return (index, "RELEASED", op.resource, None, None, op.token)
    if op.f == "force_release":
        return (index, "FORCE_RELEASED", op.resource, None, None, None)
    return None


def seen_change(event: WatchSeen) -> Change:
    """The same shape, from what the watcher saw (the fields its op's change names)."""
    key = event.key if event.event in ("WRITTEN", "DELETED") else None
    value = event.value if event.event == "WRITTEN" else None
    token = event.token if event.event in ("ACQUIRED", "RELEASED") else None
    return (event.revision, event.event, event.resource, key, value, token)


def check_watches(history: History) -> list[Found]:
    streams: dict[str, list[WatchSeen]] = collections.defaultdict(list)
    for event in history.watches:
        streams[event.watcher].append(event)
    expected = [(change, op) for op in history.ops if (change := expected_change(op)) is not None]
    found: list[Found] = []
    for name, events in sorted(streams.items()):
        events.sort(key=lambda e: e.seq)
        found += _check_stream(name, events, expected)
    return found


def _check_stream(name: str, events: list[WatchSeen], expected: list[tuple[Change, Op]]) -> list[Found]:
    found: list[Found] = []
    for before, after in itertools.pairwise(events):
        if after.revision < before.revision:
            found.append((WATCH_OUT_OF_ORDER,
                          f"watcher {name}: revision {after.revision} (seq {after.seq}) came after"
                          f" {before.revision} (seq {before.seq})", [], [before, after]))
    seen: dict[Change, list[WatchSeen]] = collections.defaultdict(list)
    for event in events:
        seen[seen_change(event)].append(event)
    for change, copies in seen.items():
        if len(copies) > 1:
            found.append((WATCH_REPEATED_EVENT,
                          f"watcher {name}: {change[1]} of {change[2]} at revision {change[0]} seen"
                          f" {len(copies)} times", [], copies))
    if not events:
        return found
    prefix, start, last = events[0].prefix, events[0].start, max(e.revision for e in events)
    for change, op in expected:
        if start <= change[0] <= last and op.resource.startswith(prefix) and change not in seen:
            found.append((WATCH_MISSED_EVENT,
                          f"watcher {name} (revisions {start}..{last} of {prefix!r}) never saw the"
                          f" {change[1]} of {op.resource} applied at revision {change[0]}", [op], []))
    return found


def event_ref(event: WatchSeen) -> dict[str, Any]:
    ref: dict[str, Any] = {"watcher": event.watcher, "seq": event.seq, "revision": event.revision,
                           "event": event.event, "resource": event.resource}
    if event.line is not None:
        ref["line"] = event.line
    return ref

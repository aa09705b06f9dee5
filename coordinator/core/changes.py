"""What one applied log entry changed, as Watch reports it: acquire, release, expiry,
force-release, write, delete, and the whole state replaced by a restore.

Owns: ``ChangeKind`` (numbered like the proto's ``WatchEvent.Type``: never renumber) and
``Change``, one visible change to one resource. The handlers note each change as they make it
(``machine_base.MachineBase._note``); ``FencingStateMachine._execute`` hands them out with the
entry's ``Applied`` outcome (its ``changes``), never with a refusal, which changes nothing.
Must never: read a clock or do I/O, or be stored: changes are not in the snapshot, the dedup
table or an outcome's wire form (a retry answered from the dedup table changed nothing).
"""

from __future__ import annotations

import dataclasses
import enum


class ChangeKind(enum.IntEnum):
    """The kinds of change a watcher sees. Equal to ``fencing.v1.WatchEvent.Type``."""

    ACQUIRED = 1  # a lease granted (Acquire, or a lock waiter's grant): holder, token, expiry
    RELEASED = 2  # a live lease released by its holder (Release, CancelLock of a granted waiter)
    EXPIRED = 3  # a lease ended by the log clock (at the TICK, or the entry that replaced it)
    FORCE_RELEASED = 4  # an admin fenced the resource (ForceRelease, SetEpochFloor fence_all)
    WRITTEN = 5  # a fenced write: key, value, version
    DELETED = 6  # a fenced delete: key, version
    RESET = 7  # a restore replaced the whole state (resource ""): earlier events no longer hold


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One change to ``resource`` made by one log entry. Lease kinds carry the lease's
    ``holder``, ``token`` and ``expires_at_ms`` (for an end: the lease that ended; for a
    force-release with no lease: holder "" and token 0); data kinds carry ``key``,
    ``version`` and, for a write, ``value``."""

    kind: ChangeKind
    resource: str
    holder: str = ""
    token: int = 0
    expires_at_ms: int = 0
    key: str = ""
    value: bytes = b""
    version: int = 0

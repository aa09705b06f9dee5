"""One typed schema per operation: the fields each op's command carries, declared once.

Owns: a frozen, slotted class per op (``Acquire``, ``Write``, ...), whose fields name their
rule (``validation``) and whether they are required; the checking of every field when one is
built (``__post_init__``: a body that exists is a valid one); ``from_map``, which reads one from
a decoded entry's body and refuses a field its op does not name; ``to_map`` and ``encode``,
the entry's bytes; ``decode``, the bytes of a Raft entry straight to ``(stamp_ms, body)``;
the charges (``charge_fields``: the caller's principal and quota, filled by the server, never
from a request); and ``SCHEMAS``, op -> its class. The server builds a body once from a
request (with its charges), the proposer encodes it with its stamp, every replica decodes
and checks it again (a log entry is untrusted bytes) and hands it to the op's handler; the
RPC request rows (``requests``) are taken from these classes, so the server, the state
machine and the client check a field by the same rule.
Must never: change state or depend on it (a body is checked alike on every replica), read a
clock, or accept a field its op does not name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import msgpack

from coordinator.core import commands, validation
from coordinator.core.commands import FORMAT_VERSION, Command, Op, unpack_envelope
from coordinator.core.validation import InvalidField

__all__ = [
    "SCHEMAS",
    "Acquire",
    "Body",
    "Delete",
    "Dequeue",
    "Enqueue",
    "ForceRelease",
    "KeepAlive",
    "ReadBarrier",
    "Release",
    "RestoreAbort",
    "RestoreBegin",
    "RestoreChunk",
    "RestoreCommit",
    "SetClusterLevel",
    "SetEpochFloor",
    "Tick",
    "Write",
    "charge_fields",
    "charged",
    "decode",
    "encode",
    "level_needed",
]

_CHECK = "check"


def _rule(check: Callable[[object], Any]) -> dict[str, Callable[[object], Any]]:
    """A field's metadata: checked by ``check`` (``validation``: returns the checked value or
    raises ``InvalidField``); required unless it defaults to None."""
    return {_CHECK: check}


B = TypeVar("B", bound="Body")
_F = dataclasses.field


class Body:
    """What every op's body shares. A subclass is a frozen, slotted dataclass whose fields
    name their check (``_rule``); an optional field defaults to None, which means absent. The
    server fills ``principal`` and ``quota`` (``CHARGE_FIELDS``), never a request."""

    __slots__ = ()
    OP: ClassVar[Op]
    # Set by ``_register``: (name, check, required) per field, in declaration order (the
    # first bad field is the one reported); and the names, for ``from_map``.
    _PLAN: ClassVar[tuple[tuple[str, Callable[[object], Any], bool], ...]]
    _NAMES: ClassVar[frozenset[str]]
    # Charged ops: which quotas their checks read (None: all of them); see ``charge_fields``.
    QUOTAS_READ: ClassVar[frozenset[str] | None] = None

    def __post_init__(self) -> None:
        for name, check, required in self._PLAN:
            value = getattr(self, name)
            if value is None and not required:
                continue
            checked = check(value)
            if checked is not value:  # a list of prefixes becomes a tuple, and so on
                object.__setattr__(self, name, checked)
        self._check_together()

    def _check_together(self) -> None:
        """Rules between fields (none unless an op says so); raises ``InvalidField``."""

    @classmethod
    def plan(cls) -> tuple[tuple[str, Callable[[object], Any], bool], ...]:
        """(name, check, required) of each field, in the order they are checked."""
        return cls._PLAN

    @classmethod
    def from_map(cls: type[B], body: Mapping[str, object]) -> B:
        """The body ``body`` (a decoded entry's map) holds, every field checked; raises
        ``InvalidField`` naming an unknown, missing or bad field."""
        if not body.keys() <= cls._NAMES:
            unknown = sorted(str(name) for name in body if name not in cls._NAMES)
            raise InvalidField(unknown[0], f"is not a field of {cls.OP.name}")
        for name, _check, required in cls._PLAN:
            if required and name not in body:
                raise InvalidField(name, f"is required by {cls.OP.name}")
        return cls(**body)

    def to_map(self) -> dict[str, Any]:
        """The entry's body map: every field that is not None."""
        return {name: value for name, _c, _r in self._PLAN if (value := getattr(self, name)) is not None}

    @property
    def op(self) -> Op:
        return self.OP

    @property
    def resource(self) -> str | None:
        """The resource this command acts on (None for cluster-wide ones; an op with a
        ``resource`` field shadows this). Proposers use it as the Raft batch key: commands
        on different resources may share an entry, and per resource every command keeps an
        index of its own (the chaos checker orders by it)."""
        return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Charged(Body):
    """A body charged to its caller (``charge_fields``): whom its effect and its dedup entry
    count against, and under which quotas. The server fills both, never a request."""

    principal: str | None = _F(default=None, metadata=_rule(validation.check_principal))
    quota: dict[str, int] | None = _F(default=None, metadata=_rule(validation.check_quota))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Owning(Charged):
    """A charged body that makes its principal the resource's owner (ACQUIRE, ENQUEUE): the
    quotas it is checked against are that principal's, so a quota needs a principal."""

    def _check_together(self) -> None:
        if self.quota is not None and self.principal is None:
            raise InvalidField("quota", "needs a principal")




@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Acquire(Owning):
    """Take the lease on ``resource`` for ``ttl_ms``; the entry issues a new token (I2)."""

    OP = Op.ACQUIRE
    resource: str = _F(metadata=_rule(validation.check_resource))
    holder: str = _F(metadata=_rule(validation.check_holder))
    ttl_ms: int = _F(metadata=_rule(validation.check_ttl_ms))
    op_id: bytes = _F(metadata=_rule(validation.check_op_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KeepAlive(Body):
    """Extend the live lease holding ``token``; ``ttl_ms`` replaces its TTL when given."""

    OP = Op.KEEP_ALIVE
    resource: str = _F(metadata=_rule(validation.check_resource))
    token: int = _F(metadata=_rule(validation.check_token))
    ttl_ms: int | None = _F(default=None, metadata=_rule(validation.check_ttl_ms))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Release(Charged):
    """End the lease holding ``token``; the hwm stays. Charged only with an op_id (its dedup
    entry)."""

    OP = Op.RELEASE
    QUOTAS_READ = frozenset({"dedup_entries"})
    resource: str = _F(metadata=_rule(validation.check_resource))
    token: int = _F(metadata=_rule(validation.check_token))
    op_id: bytes | None = _F(default=None, metadata=_rule(validation.check_op_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Write(Charged):
    """Fenced write of ``key`` under ``resource`` (I3); with ``expected_version`` only while
    the key is at that version (0: absent)."""

    OP = Op.WRITE
    QUOTAS_READ = frozenset({"stored_bytes", "dedup_entries"})  # a Write is the hot path
    resource: str = _F(metadata=_rule(validation.check_resource))
    key: str = _F(metadata=_rule(validation.check_key))
    value: bytes = _F(metadata=_rule(validation.check_value))
    token: int = _F(metadata=_rule(validation.check_token))
    op_id: bytes = _F(metadata=_rule(validation.check_op_id))
    expected_version: int | None = _F(default=None, metadata=_rule(validation.check_expected_version))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Charged):
    """Fenced delete of ``key`` under ``resource``, checked like a write (I7); with
    ``expected_version`` (entry level 2) only while the key is at that version."""

    OP = Op.DELETE
    QUOTAS_READ = frozenset({"dedup_entries"})
    resource: str = _F(metadata=_rule(validation.check_resource))
    key: str = _F(metadata=_rule(validation.check_key))
    token: int = _F(metadata=_rule(validation.check_token))
    op_id: bytes = _F(metadata=_rule(validation.check_op_id))
    expected_version: int | None = _F(default=None, metadata=_rule(validation.check_expected_version))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReadBarrier(Body):
    """A read through the log (I9): reports state as of this entry and changes only the clock.
    With ``resource`` (and perhaps ``key``): that resource; with ``prefixes`` (``limit``,
    perhaps ``after``, entry level 3): a page of the resources under them (List)."""

    OP = Op.READ_BARRIER
    resource: str | None = _F(default=None, metadata=_rule(validation.check_resource))
    key: str | None = _F(default=None, metadata=_rule(validation.check_key))
    prefixes: tuple[str, ...] | None = _F(default=None, metadata=_rule(validation.check_prefixes))
    after: str | None = _F(default=None, metadata=_rule(validation.check_after))
    limit: int | None = _F(default=None, metadata=_rule(validation.check_list_limit))

    def _check_together(self) -> None:
        """One resource (and perhaps a key) or a listing, never both."""
        if self.key is not None and self.resource is None:
            raise InvalidField("key", "needs a resource")
        listing = self.prefixes is not None
        if listing and self.resource is not None:
            raise InvalidField("prefixes", "a READ_BARRIER lists or reads one resource, not both")
        if listing != (self.limit is not None):
            raise InvalidField("limit", "goes with prefixes, and prefixes with it")
        if self.after is not None and not listing:
            raise InvalidField("after", "needs prefixes")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ForceRelease(Charged):
    """Admin: clear the lease by issuing a new epoch for ``resource`` (I7)."""

    OP = Op.FORCE_RELEASE
    QUOTAS_READ = frozenset({"dedup_entries"})
    resource: str = _F(metadata=_rule(validation.check_resource))
    op_id: bytes = _F(metadata=_rule(validation.check_op_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SetEpochFloor(Body):
    """Admin, after a restore (I11): raise the epoch to ``floor``; and fence every resource
    unless ``fence_all`` is False (absent: True)."""

    OP = Op.SET_EPOCH_FLOOR
    floor: int = _F(metadata=_rule(validation.check_floor))
    fence_all: bool | None = _F(default=None, metadata=_rule(validation.check_fence_all))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Tick(Body):
    """Advance the log clock and end expired leases (and stale lock waiters)."""

    OP = Op.TICK


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RestoreBegin(Body):
    """Admin (I11): start staging a backup of ``size`` bytes whose sha256 is ``digest``; its
    COMMIT fences at an epoch above ``epoch_floor``. Replaces a stale staged restore."""

    OP = Op.RESTORE_BEGIN
    restore_id: bytes = _F(metadata=_rule(validation.check_restore_id))
    size: int = _F(metadata=_rule(validation.check_backup_size))
    digest: bytes = _F(metadata=_rule(validation.check_digest))
    epoch_floor: int = _F(metadata=_rule(validation.check_epoch_floor))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RestoreChunk(Body):
    """Admin: stage the ``seq``-th chunk (from 0, in order) of restore ``restore_id``."""

    OP = Op.RESTORE_CHUNK
    restore_id: bytes = _F(metadata=_rule(validation.check_restore_id))
    seq: int = _F(metadata=_rule(validation.check_seq))
    chunk: bytes = _F(metadata=_rule(validation.check_chunk))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RestoreCommit(Body):
    """Admin: check the staged backup's size and digest, re-check its content, swap it in."""

    OP = Op.RESTORE_COMMIT
    restore_id: bytes = _F(metadata=_rule(validation.check_restore_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RestoreAbort(Body):
    """Admin: drop the staged backup of restore ``restore_id`` (nothing else changes)."""

    OP = Op.RESTORE_ABORT
    restore_id: bytes = _F(metadata=_rule(validation.check_restore_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Enqueue(Owning):
    """Queue ``waiter_id`` for the lease on ``resource`` (a lease of ``ttl_ms`` once
    granted), or renew its place if it is queued already."""

    OP = Op.ENQUEUE
    resource: str = _F(metadata=_rule(validation.check_resource))
    holder: str = _F(metadata=_rule(validation.check_holder))
    ttl_ms: int = _F(metadata=_rule(validation.check_ttl_ms))
    waiter_id: bytes = _F(metadata=_rule(validation.check_waiter_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Dequeue(Body):
    """Take ``waiter_id`` out of ``resource``'s queue; release its lease if it was granted."""

    OP = Op.DEQUEUE
    resource: str = _F(metadata=_rule(validation.check_resource))
    waiter_id: bytes = _F(metadata=_rule(validation.check_waiter_id))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SetClusterLevel(Body):
    """Raise the cluster's entry level to ``level`` (entry level 2; never lowers it)."""

    OP = Op.SET_CLUSTER_LEVEL
    level: int = _F(metadata=_rule(validation.check_level))


SCHEMAS: dict[Op, type[Body]] = {}


def _register(*classes: type[Body]) -> None:
    """Fill ``SCHEMAS`` and each class's plan: a field with a default of None is optional."""
    for cls in classes:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # each is a dataclass
        cls._PLAN = tuple((f.name, f.metadata[_CHECK], f.default is dataclasses.MISSING) for f in fields)
        cls._NAMES = frozenset(f.name for f in fields)
        SCHEMAS[cls.OP] = cls


_register(
    Acquire, KeepAlive, Release, Write, Delete, ReadBarrier, ForceRelease, SetEpochFloor, Tick,
    RestoreBegin, RestoreChunk, RestoreCommit, RestoreAbort, Enqueue, Dequeue, SetClusterLevel,
)
assert set(SCHEMAS) == set(Op), "every op needs a schema"

# The fields the server fills from the authenticated caller, never from a request.
CHARGE_FIELDS = frozenset({"principal", "quota"})


def charged_schema(cls: type[Body]) -> bool:
    """True if ``cls`` carries the caller's principal and quota (``charge_fields``)."""
    return issubclass(cls, Charged)


def charge_fields(
    cls: type[Body], fields: Mapping[str, object], *, principal: str, quota: Mapping[str, int]
) -> dict[str, Any]:
    """The charge fields of a body of ``cls`` with ``fields``, made by ``principal`` under
    ``quota`` (empty: no maximum): for an op whose effect a quota counts -- an ACQUIRE or
    ENQUEUE (what it owns), a WRITE (its bytes count against the resource's owner) and every
    command with an op_id (its dedup entry). The quotas its checks do not read stay out of
    its entry, which every replica decodes. Empty for any other."""
    if not charged_schema(cls) or (cls.OP not in (Op.ACQUIRE, Op.ENQUEUE) and fields.get("op_id") is None):
        return {}
    read = cls.QUOTAS_READ
    carried = {name: value for name, value in quota.items() if read is None or name in read}
    return {"principal": principal, "quota": carried} if carried else {"principal": principal}


def level_needed(body: Body) -> int:
    """The entry level a member needs to apply ``body`` (commands.py "Entry levels")."""
    return commands.level_needed(body.OP, lambda name: getattr(body, name, None) is not None)


def encode(body: Body, stamp_ms: int) -> bytes:
    """The bytes of one Raft entry: ``[FORMAT_VERSION, op, stamp_ms, body]`` (commands.py)
    with the proposer's log-clock stamp (I6)."""
    return msgpack.packb([FORMAT_VERSION, int(body.OP), stamp_ms, body.to_map()], use_bin_type=True)


def decode(data: bytes) -> tuple[int, Body]:
    """``(stamp_ms, body)`` of one Raft entry, every field checked. Raises
    ``commands.MalformedCommand`` for a bad envelope and ``InvalidField`` for a bad body."""
    op, stamp_ms, body = unpack_envelope(data)
    return stamp_ms, SCHEMAS[op].from_map(body)


def charged(command: Command, *, principal: str, quota: Mapping[str, int]) -> Command:
    """An unchecked ``command`` with the charge fields ``charge_fields`` gives its op (tests
    and tools; the server builds a body with its charges at once)."""
    extra = charge_fields(SCHEMAS[command.op], command.body, principal=principal, quota=quota)
    return dataclasses.replace(command, body={**command.body, **extra}) if extra else command

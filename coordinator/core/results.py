"""What an applied command answers, one frozen type per op: the ``result`` of ``Applied``.

Owns: each op's result type (``WriteResult``, ``LockState``, ``ReadResult`` ...), its map form
(``to_map``: exactly the map the handlers answered before results were typed, so the dedup
table, snapshots and a build of the release before read and write the same bytes) and the
checked inverse (``from_map``), and ``RESULT_TYPES``, which types each op may answer with.
Must never: change state, read a clock or do I/O; accept a map ``to_map`` does not make (a
missing, extra or wrongly typed field is a ValueError, never a guess); rename a map key (it is
stored in snapshots and read by older builds).

Map rules: a field that is None is absent from the map, except where a type says otherwise
(``ReadResult``'s ``lease`` and ``value`` are present and nil). Ints are never bools.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self, TypeVar

from coordinator.core.commands import Op

# The value types of flat fields. Exact types: a bool is never an int here, and a map read
# from msgpack holds only these.
_TYPES: dict[str, type] = {"int": int, "bool": bool, "str": str, "bytes": bytes}


@dataclasses.dataclass(frozen=True, slots=True)
class _Spec:
    """The fields of one result type as ``from_map`` checks them: each name, its value type
    (None: a nested value, read by hand), and whether it may be absent (None)."""

    names: frozenset[str]
    fields: tuple[tuple[str, type | None, bool], ...]


_SPECS: dict[type, _Spec] = {}


def _spec(cls: type) -> _Spec:
    """The fields of ``cls``, read once from its annotations."""
    spec = _SPECS.get(cls)
    if spec is None:
        fields = []
        for field in dataclasses.fields(cls):
            kind = str(field.type)
            fields.append((field.name, _TYPES.get(kind.removesuffix(" | None")), kind.endswith(" | None")))
        spec = _SPECS[cls] = _Spec(frozenset(name for name, _, _ in fields), tuple(fields))
    return spec


def _checked(cls: type, m: object, *, by_hand: tuple[str, ...] = ()) -> dict[str, Any]:
    """``m``'s fields for ``cls(**fields)``, each checked; ValueError on a missing, extra or
    wrongly typed one. The fields named in ``by_hand`` are left to the caller, as they are.
    (A restore reads up to DEDUP_ENTRIES_MAX of these on the Raft thread: kept lean.)"""
    if not isinstance(m, dict):
        raise ValueError(f"{cls.__name__}: a result must be a map, not {type(m).__name__}")
    spec = _spec(cls)
    if not spec.names.issuperset(m):
        raise ValueError(f"{cls.__name__}: unexpected field(s) {sorted(map(repr, set(m) - spec.names))}")
    fields = {}
    for name, kind, optional in spec.fields:
        if name not in m:
            if not optional:
                raise ValueError(f"{cls.__name__}: field {name!r} is missing")
            continue
        value = m[name]
        if type(value) is not kind and name not in by_hand:
            raise ValueError(f"{cls.__name__}: field {name!r} has the wrong type: {value!r}")
        fields[name] = value
    return fields


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """The base of every op's result: the map rules above, for types of flat fields."""

    def to_map(self) -> dict[str, Any]:
        """The map the handler answers, as stored in the dedup table and snapshots."""
        return {
            name: value for name, _, _ in _spec(type(self)).fields if (value := getattr(self, name)) is not None
        }

    @classmethod
    def from_map(cls, m: object) -> Self:
        """The inverse of ``to_map``; ValueError on any map it does not make."""
        try:
            return cls(**_checked(cls, m))
        except TypeError as exc:  # never expected: _checked names every field
            raise ValueError(f"{cls.__name__}: {exc}") from exc


def _need(condition: bool, cls: type, message: str) -> None:
    """A result's fields that belong together: a ValueError naming ``cls`` otherwise."""
    if not condition:
        raise ValueError(f"{cls.__name__}: {message}")


@dataclasses.dataclass(frozen=True, slots=True)
class AcquireResult(Result):
    token: int
    expires_at_ms: int
    hwm: int


@dataclasses.dataclass(frozen=True, slots=True)
class KeepAliveResult(Result):
    token: int
    expires_at_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseResult(Result):
    hwm: int
    released: bool


@dataclasses.dataclass(frozen=True, slots=True)
class WriteResult(Result):
    version: int
    hwm: int


@dataclasses.dataclass(frozen=True, slots=True)
class DeleteResult(Result):
    """``version`` 0 and ``deleted`` False when the key was absent."""

    version: int
    deleted: bool


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseView(Result):
    """A live lease as a READ_BARRIER reports it (a map nested in ``ReadResult``)."""

    holder: str
    token: int
    expires_at_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class ReadResult(Result):
    """A READ_BARRIER's answer. With a resource: its ``hwm`` and ``lease`` (None when none is
    live: present and nil in the map) and ``waiters`` (absent when none). With a key too: its
    ``version`` and ``value`` (None when absent: present and nil in the map)."""

    epoch: int
    log_clock_ms: int
    hwm: int | None = None
    lease: LeaseView | None = None
    waiters: int | None = None
    version: int | None = None
    value: bytes | None = None

    def __post_init__(self) -> None:
        _need(self.hwm is not None or (self.lease, self.waiters, self.version) == (None, None, None),
              type(self), "a lease, waiters or a version need a resource (hwm)")
        _need(self.version is not None or self.value is None, type(self), "a value needs a version")

    def to_map(self) -> dict[str, Any]:
        m: dict[str, Any] = {"epoch": self.epoch, "log_clock_ms": self.log_clock_ms}
        if self.hwm is not None:
            m["hwm"] = self.hwm
            if self.waiters is not None:
                m["waiters"] = self.waiters
            m["lease"] = None if self.lease is None else self.lease.to_map()
            if self.version is not None:
                m["value"] = self.value
                m["version"] = self.version
        return m

    @classmethod
    def from_map(cls, m: object) -> Self:
        fields = _checked(cls, m, by_hand=("lease", "value"))
        _need(("hwm" in fields) == ("lease" in fields), cls, "hwm and lease go together")
        _need(("version" in fields) == ("value" in fields), cls, "version and value go together")
        lease = fields.get("lease")
        if lease is not None:
            fields["lease"] = LeaseView.from_map(lease)
        _need(fields.get("value") is None or type(fields["value"]) is bytes, cls, "value must be bytes or nil")
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class ListedResource:
    """One resource of a listing page; packed as a list in this field order (a list per item
    keeps the outcome small)."""

    resource: str
    held: bool
    holder: str
    token: int
    hwm: int
    remaining_ms: int
    waiters: int

    def to_list(self) -> list[Any]:
        return [getattr(self, name) for name, _, _ in _spec(ListedResource).fields]

    @classmethod
    def from_list(cls, item: object) -> ListedResource:
        names = [name for name, _, _ in _spec(cls).fields]
        _need(isinstance(item, (list, tuple)) and len(item) == len(names), cls, f"an item must be {len(names)} values")
        assert isinstance(item, (list, tuple))
        return cls(**_checked(cls, dict(zip(names, item, strict=True))))


@dataclasses.dataclass(frozen=True, slots=True)
class ListResult(Result):
    """A listing READ_BARRIER's page: ``more`` says whether another resource follows."""

    log_clock_ms: int
    resources: tuple[ListedResource, ...]
    more: bool

    def to_map(self) -> dict[str, Any]:
        return {
            "log_clock_ms": self.log_clock_ms,
            "resources": [item.to_list() for item in self.resources],
            "more": self.more,
        }

    @classmethod
    def from_map(cls, m: object) -> Self:
        fields = _checked(cls, m, by_hand=("resources",))
        items = fields["resources"]
        _need(isinstance(items, (list, tuple)), cls, "resources must be an array")
        fields["resources"] = tuple(ListedResource.from_list(item) for item in items)
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class LockState(Result):
    """Where a lock waiter stands (ENQUEUE, and the local read a Lock call polls): granted
    (``token``, ``expires_at_ms``, ``hwm``; no ``queued``), queued (``position``, 0-based), or
    neither."""

    granted: bool
    queued: bool | None = None
    position: int | None = None
    token: int | None = None
    expires_at_ms: int | None = None
    hwm: int | None = None

    def __post_init__(self) -> None:
        grant = (self.token, self.expires_at_ms, self.hwm)
        if self.granted:
            _need(None not in grant and self.queued is None and self.position is None, type(self),
                  "a grant has a token, expires_at_ms and hwm, and no queued or position")
        else:
            _need(grant == (None, None, None) and self.queued is not None, type(self),
                  "a waiter not granted has queued, and no token, expires_at_ms or hwm")
            _need((self.position is not None) == self.queued, type(self), "a queued waiter has a position")


@dataclasses.dataclass(frozen=True, slots=True)
class DequeueResult(Result):
    cancelled: bool
    released: bool


@dataclasses.dataclass(frozen=True, slots=True)
class TickResult(Result):
    """How many leases the TICK found due (some may have been granted anew)."""

    expired: int


@dataclasses.dataclass(frozen=True, slots=True)
class ForceReleaseResult(Result):
    hwm: int


@dataclasses.dataclass(frozen=True, slots=True)
class EpochResult(Result):
    """SET_EPOCH_FLOOR: the epoch now."""

    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreBeginResult(Result):
    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreChunkResult(Result):
    staged_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreResult(Result):
    """RESTORE_COMMIT: the epoch the restored state is fenced at, and how many resources."""

    epoch: int
    resources: int


@dataclasses.dataclass(frozen=True, slots=True)
class RestoreAbortResult(Result):
    aborted: bool


@dataclasses.dataclass(frozen=True, slots=True)
class LevelResult(Result):
    """SET_CLUSTER_LEVEL: the cluster's entry level now."""

    level: int


# The types each op answers with; a READ_BARRIER answers a read or a listing page.
RESULT_TYPES: dict[Op, tuple[type[Result], ...]] = {
    Op.ACQUIRE: (AcquireResult,),
    Op.KEEP_ALIVE: (KeepAliveResult,),
    Op.RELEASE: (ReleaseResult,),
    Op.WRITE: (WriteResult,),
    Op.DELETE: (DeleteResult,),
    Op.READ_BARRIER: (ReadResult, ListResult),
    Op.FORCE_RELEASE: (ForceReleaseResult,),
    Op.SET_EPOCH_FLOOR: (EpochResult,),
    Op.TICK: (TickResult,),
    Op.RESTORE_BEGIN: (RestoreBeginResult,),
    Op.RESTORE_CHUNK: (RestoreChunkResult,),
    Op.RESTORE_COMMIT: (RestoreResult,),
    Op.RESTORE_ABORT: (RestoreAbortResult,),
    Op.ENQUEUE: (LockState,),
    Op.DEQUEUE: (DequeueResult,),
    Op.SET_CLUSTER_LEVEL: (LevelResult,),
}
assert set(RESULT_TYPES) == set(Op), "every op that can apply needs its result type"


def result_from_map(op: Op, m: object) -> Result:
    """``op``'s result read from its map; ValueError if no type of ``op`` makes it."""
    kinds = RESULT_TYPES[op]
    if len(kinds) == 1:
        return kinds[0].from_map(m)
    # A READ_BARRIER's read and page share no required field: at most one reads ``m``.
    problems = []
    for kind in kinds:
        try:
            return kind.from_map(m)
        except ValueError as exc:
            problems.append(str(exc))
    raise ValueError("; ".join(problems))


def _built_by_fields_alone(cls: type[Result]) -> bool:
    """Whether ``cls.from_map`` is the inherited one, nothing checks fields together and every
    field is flat: then ``_checked`` passing is ``from_map`` passing, and the map is flat."""
    return (
        cls.__dict__.get("from_map") is None
        and not hasattr(cls, "__post_init__")
        and all(kind is not None for _, kind, _ in _spec(cls).fields)
    )


# The ops whose one result type ``check_result_map`` checks without building it.
_CHECKED_BY_FIELDS: dict[Op, type[Result]] = {
    op: kinds[0] for op, kinds in RESULT_TYPES.items() if len(kinds) == 1 and _built_by_fields_alone(kinds[0])
}
# (op, a map's keys in order) -> the exact type of each value, in that order, for such an op:
# its map with those keys is valid exactly when its values have these types (``_checked``
# checks each field's exact type, and every field of these types is flat). Only shapes that
# passed ``_checked`` are kept: at most every ordering of every subset of a type's fields, so
# no document can grow it.
_SHAPES: dict[tuple[Op, tuple[str, ...]], tuple[type, ...]] = {}


def check_result_map(op: Op, m: object) -> bool:
    """A ValueError wherever ``result_from_map(op, m)`` raises one, without building the
    result where its fields alone decide: a restore checks up to DEDUP_ENTRIES_MAX stored
    results on the Raft thread, and building each was most of the time it took. True when
    the check also showed the map flat (no map or list among its values)."""
    kind = _CHECKED_BY_FIELDS.get(op)
    if kind is None:
        result_from_map(op, m)
        return False
    if type(m) is dict:
        types = _SHAPES.get((op, tuple(m)))
        if types is not None and tuple(map(type, m.values())) == types:
            return True  # a shape checked before, and every value of its type
    _checked(kind, m)
    assert isinstance(m, dict)  # _checked refused anything else
    _SHAPES[(op, tuple(m))] = tuple(map(type, m.values()))
    return True


R = TypeVar("R", bound=Result)


def expect(kind: type[R], result: Result) -> R:
    """``result`` as ``kind``, the type its op answers with (the caller knows the op it
    proposed); TypeError otherwise, as that is a bug, not an input."""
    if not isinstance(result, kind):
        raise TypeError(f"expected a {kind.__name__}, got {result!r}")
    return result

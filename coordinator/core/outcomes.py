"""What applying a command answers: ``Applied`` or ``Rejected`` with a ``Reason``, and their
canonical wire form (kept in the dedup table and in snapshots).

Owns: the refusal reasons (numbers stored in snapshots: never renumber), the two outcome
values and their msgpack form. Must never: change state, read a clock, or do I/O; a wire
form that does not decode is a ValueError, never a guess.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from coordinator.core.changes import Change
from coordinator.core.commands import Op
from coordinator.core.results import RESULT_TYPES, Result, check_result_map, result_from_map
from coordinator.core.validation import is_int


class Reason(enum.IntEnum):
    """Why a command was refused. The numbers are stored in snapshots: never renumber."""

    MALFORMED = 1
    STALE_TOKEN = 2
    UNKNOWN_TOKEN = 3
    LEASE_HELD = 4
    LEASE_EXPIRED = 5
    VERSION_MISMATCH = 6
    LIMIT_EXCEEDED = 7
    EPOCH_EXHAUSTED = 8
    OP_ID_CONFLICT = 9
    EPOCH_FLOOR_TOO_LOW = 10
    QUOTA_EXCEEDED = 11


@dataclasses.dataclass(frozen=True)
class Applied:
    """The command took effect; ``result`` holds what the caller is told, of the type its op
    answers with (``results.RESULT_TYPES``)."""

    op: Op
    result: Result
    # On a retry answered from the dedup table: the log index at which the op_id first
    # applied (0 otherwise). Replies must report that index, not the retry's own entry,
    # or a history would order the effect after writes it preceded.
    first_applied_index: int = dataclasses.field(default=0, compare=False)
    # What the entry changed, for Watch (changes.py); never on the wire, so a retry answered
    # from the dedup table (which changed nothing) carries none.
    changes: tuple[Change, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.result, RESULT_TYPES[self.op]):
            raise TypeError(f"{self.op.name} answers {RESULT_TYPES[self.op]}, not {self.result!r}")


@dataclasses.dataclass(frozen=True)
class Rejected:
    """The command was refused and changed nothing. ``op`` is None if it could not be decoded."""

    op: Op | None
    reason: Reason
    message: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


Outcome = Applied | Rejected

_WIRE_APPLIED = 1
_WIRE_REJECTED = 2


_CONTAINERS = (dict, list, tuple)


def is_flat_map(mapping: dict[Any, Any]) -> bool:
    return not any(isinstance(v, _CONTAINERS) for v in mapping.values())


def _sorted_map(value: Any) -> Any:
    """``value`` with every dict's keys in sorted order, so its msgpack bytes are canonical."""
    if isinstance(value, dict):
        if is_flat_map(value):  # results and details are flat maps: one sort, no recursion
            return dict(sorted(value.items()))
        return {k: _sorted_map(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted_map(v) for v in value]
    return value


def outcome_to_wire(outcome: Outcome) -> list[Any]:
    """A msgpack-encodable, canonical list for ``outcome`` (dedup table, snapshots, replies)."""
    if isinstance(outcome, Applied):
        return [_WIRE_APPLIED, int(outcome.op), _sorted_map(outcome.result.to_map())]
    if isinstance(outcome, Rejected):
        op = None if outcome.op is None else int(outcome.op)
        return [
            _WIRE_REJECTED,
            op,
            int(outcome.reason),
            outcome.message,
            _sorted_map(outcome.details),
        ]
    raise TypeError(f"not an outcome: {type(outcome).__name__}")


def outcome_from_wire(wire: list[Any]) -> Outcome:
    """Inverse of ``outcome_to_wire``; raises ValueError on anything else."""
    if not isinstance(wire, (list, tuple)) or not wire:
        raise ValueError("outcome must be a non-empty list")
    tag = wire[0]
    if tag == _WIRE_APPLIED and is_int(tag):
        if len(wire) != 3:
            raise ValueError("applied outcome must be [1, op, result]")
        _, op, result = wire
        if not isinstance(result, dict) or not all(isinstance(k, str) for k in result):
            raise ValueError("applied outcome result must be a map with string keys")
        known_op = _op_from_wire(op)
        return Applied(op=known_op, result=result_from_map(known_op, result))
    if tag == _WIRE_REJECTED and is_int(tag):
        if len(wire) != 5:
            raise ValueError("rejected outcome must be [2, op, reason, message, details]")
        _, op, reason, message, details = wire
        if not is_int(reason) or reason not in Reason._value2member_map_:
            raise ValueError(f"unknown rejection reason {reason!r}")
        if not isinstance(message, str):
            raise ValueError("rejected outcome message must be a string")
        if not isinstance(details, dict) or not all(isinstance(k, str) for k in details):
            raise ValueError("rejected outcome details must be a map with string keys")
        return Rejected(
            op=None if op is None else _op_from_wire(op),
            reason=Reason(reason),
            message=message,
            details=dict(details),
        )
    raise ValueError(f"unknown outcome tag {tag!r}")


def check_stored_wire(wire: object, op: Op) -> None:
    """A ValueError unless ``outcome_from_wire(wire)`` reads an ``Applied`` of ``op`` whose
    result map is flat (what a dedup entry stores: the handlers make no nested results), found
    without building it (a restore checks up to DEDUP_ENTRIES_MAX stored outcomes on the Raft
    thread: ``results.check_result_map``)."""
    # (``type(x) is int or is_int(x)`` is ``is_int(x)``, its common case first.)
    if not isinstance(wire, (list, tuple)) or len(wire) != 3:
        raise ValueError("an applied outcome must be [1, op, result]")
    tag, stored_op, result = wire
    if not (type(tag) is int or is_int(tag)) or tag != _WIRE_APPLIED:
        raise ValueError("an applied outcome must be [1, op, result]")
    if not (type(stored_op) is int or is_int(stored_op)) or stored_op != op:
        raise ValueError(f"the outcome is of op {stored_op!r}, not {op.name}")
    if not isinstance(result, dict):
        raise ValueError("applied outcome result must be a map with string keys")
    # A map check_result_map passes has only field names for keys, and where it says so
    # (most ops), only flat values.
    if not check_result_map(op, result) and not is_flat_map(result):
        raise ValueError("a stored result must be a flat map")


def _op_from_wire(op: object) -> Op:
    if not is_int(op) or op not in Op._value2member_map_:
        raise ValueError(f"unknown op {op!r}")
    return Op(op)

"""What each op's command body may carry, and the checked reading of it.

Owns: the one check per body field name (each name has one meaning across all ops), each op's
required and optional fields (``SCHEMAS``), and ``parse_body``, which turns a body into the
checked arguments a handler reads. The rules themselves live in ``validation``, shared with
the gRPC layer, so that both refuse exactly the same inputs.
Must never: change state or depend on it (a body is checked the same way on every replica,
whatever it holds), or accept a field its op does not name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordinator.core import validation
from coordinator.core.commands import Op
from coordinator.core.validation import InvalidField

# Checked in this order, so the message for a body with several bad fields is deterministic.
FIELD_CHECKS: dict[str, Callable[[object], Any]] = {
    "resource": validation.check_resource,
    "key": validation.check_key,
    "holder": validation.check_holder,
    "token": validation.check_token,
    "ttl_ms": validation.check_ttl_ms,
    "value": validation.check_value,
    "expected_version": validation.check_expected_version,
    "op_id": validation.check_op_id,
    "floor": validation.check_floor,
    "fence_all": validation.check_fence_all,
    "epoch_floor": validation.check_epoch_floor,
    "principal": validation.check_principal,
    "quota": validation.check_quota,
    "restore_id": validation.check_restore_id,
    "size": validation.check_backup_size,
    "digest": validation.check_digest,
    "seq": validation.check_seq,
    "chunk": validation.check_chunk,
    "waiter_id": validation.check_waiter_id,
    "level": validation.check_level,
    "prefixes": validation.check_prefixes,
    "after": validation.check_after,
    "limit": validation.check_list_limit,
}

# op -> (required fields, optional fields). An optional field that is nil counts as absent.
SCHEMAS: dict[Op, tuple[frozenset[str], frozenset[str]]] = {
    Op.ACQUIRE: (
        frozenset({"resource", "holder", "ttl_ms", "op_id"}),
        frozenset({"principal", "quota"}),
    ),
    Op.KEEP_ALIVE: (frozenset({"resource", "token"}), frozenset({"ttl_ms"})),
    # principal and quota: whom an op_id's dedup entry is charged to, under which budget.
    Op.RELEASE: (frozenset({"resource", "token"}), frozenset({"op_id", "principal", "quota"})),
    Op.WRITE: (
        frozenset({"resource", "key", "value", "token", "op_id"}),
        frozenset({"expected_version", "principal", "quota"}),
    ),
    Op.DELETE: (
        frozenset({"resource", "key", "token", "op_id"}),
        frozenset({"expected_version", "principal", "quota"}),
    ),
    # With prefixes (and limit, perhaps after): a page of the resources under them (List).
    Op.READ_BARRIER: (frozenset(), frozenset({"resource", "key", "prefixes", "after", "limit"})),
    Op.FORCE_RELEASE: (frozenset({"resource", "op_id"}), frozenset({"principal", "quota"})),
    Op.SET_EPOCH_FLOOR: (frozenset({"floor"}), frozenset({"fence_all"})),
    Op.TICK: (frozenset(), frozenset()),
    Op.RESTORE_BEGIN: (frozenset({"restore_id", "size", "digest", "epoch_floor"}), frozenset()),
    Op.RESTORE_CHUNK: (frozenset({"restore_id", "seq", "chunk"}), frozenset()),
    Op.RESTORE_COMMIT: (frozenset({"restore_id"}), frozenset()),
    Op.RESTORE_ABORT: (frozenset({"restore_id"}), frozenset()),
    Op.ENQUEUE: (
        frozenset({"resource", "holder", "ttl_ms", "waiter_id"}),
        frozenset({"principal", "quota"}),
    ),
    Op.DEQUEUE: (frozenset({"resource", "waiter_id"}), frozenset()),
    Op.SET_CLUSTER_LEVEL: (frozenset({"level"}), frozenset()),
}
assert set(SCHEMAS) == set(Op), "every op needs a schema"
assert all(f in FIELD_CHECKS for req, opt in SCHEMAS.values() for f in req | opt)


# op -> (every field it may carry, its fields in FIELD_CHECKS order with their check and
# whether they are required): worked out once, as every replica applies every command.
_PLANS: dict[Op, tuple[frozenset[str], tuple[tuple[str, Callable[[object], Any], bool], ...]]] = {
    op: (
        required | optional,
        tuple(
            (name, check, name in required)
            for name, check in FIELD_CHECKS.items()
            if name in required or name in optional
        ),
    )
    for op, (required, optional) in SCHEMAS.items()
}


def parse_body(op: Op, body: dict[str, Any]) -> dict[str, Any]:
    """The checked fields of ``body`` for ``op``; absent optional fields map to None.
    Raises ``InvalidField`` naming the first bad field."""
    allowed, plan = _PLANS[op]
    if not body.keys() <= allowed:
        unknown = sorted(name for name in body if name not in allowed)
        raise InvalidField(unknown[0], f"is not a field of {op.name}")
    args: dict[str, Any] = {}
    for name, check, required in plan:
        if required:
            if name not in body:
                raise InvalidField(name, f"is required by {op.name}")
            args[name] = check(body[name])
        else:
            value = body.get(name)
            args[name] = None if value is None else check(value)
    if op is Op.READ_BARRIER:
        _check_read_barrier(args)
    if op in (Op.ACQUIRE, Op.ENQUEUE) and args["quota"] is not None and args["principal"] is None:
        raise InvalidField("quota", "needs a principal")
    return args


def _check_read_barrier(args: dict[str, Any]) -> None:
    """A READ_BARRIER reads one resource (and perhaps a key) or lists, never both."""
    if args["key"] is not None and args["resource"] is None:
        raise InvalidField("key", "needs a resource")
    listing = args["prefixes"] is not None
    if listing and args["resource"] is not None:
        raise InvalidField("prefixes", "a READ_BARRIER lists or reads one resource, not both")
    if listing != (args["limit"] is not None):
        raise InvalidField("limit", "goes with prefixes, and prefixes with it")
    if args["after"] is not None and not listing:
        raise InvalidField("after", "needs prefixes")

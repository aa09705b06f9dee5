"""Batch fan-out: the *Many RPCs, each many calls of one kind in one request.

Owns: ``serve_many``, the one fan-out of WriteMany, AcquireMany and ReleaseMany (each item
judged exactly as the same call alone, with its own checks and its own error; the items
proposed together through ``Proposer.propose_many``), their limits (``ManyRpc``: items and
bytes per call, checked before any item so nothing of a call past them is applied), the
per-item error message, and ``KeepAlivePool``, KeepAliveMany's fan-out over worker threads.
Must never: let one item's failure change another's answer, apply any item of a call past a
limit, or build an item's command or response itself (the servicer's ``build`` and
``answer`` do, as for the call alone).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, TypeVar

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import limits, ops
from coordinator.core.names import ErrorMeta
from coordinator.core.results import R, Result, expect
from coordinator.server import errors
from coordinator.server.auth import Principal
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.request_core import Core

B = TypeVar("B", bound=ops.Body)

# Worker threads that propose the items of one KeepAliveMany concurrently (shared by all
# calls); each item still takes an in-flight slot.
KEEP_ALIVE_MANY_WORKERS = 16


@dataclasses.dataclass(frozen=True)
class ManyRpc:
    """One of the batch RPCs (WriteMany, AcquireMany, ReleaseMany): its request's repeated
    field, its limits (named with their units, as the ErrorInfo ``limit`` says them) and
    the result message its items go into (``ok``: the oneof field of a success)."""

    name: str
    field: str
    items_max: int
    items_limit: str
    bytes_max: int | None
    bytes_limit: str
    result: Any
    ok: str


WRITE_MANY = ManyRpc("WriteMany", "writes", limits.WRITE_MANY_ITEMS_MAX, "write_many_items",
                     limits.WRITE_MANY_BYTES_MAX, "write_many_bytes", pb.WriteManyResult, "write")
ACQUIRE_MANY = ManyRpc("AcquireMany", "acquires", limits.ACQUIRE_MANY_ITEMS_MAX, "acquire_many_items",
                       None, "", pb.AcquireManyResult, "acquire")
RELEASE_MANY = ManyRpc("ReleaseMany", "releases", limits.RELEASE_MANY_ITEMS_MAX, "release_many_items",
                       None, "", pb.ReleaseManyResult, "release")


def _check_many_limits(rpc: ManyRpc, items: Any) -> None:
    """INVALID_ARGUMENT (field ``rpc.field``; metadata ``limit`` and ``max`` name the limit)
    for a batch past its items limit or its bytes limit (encoded items, summed): checked
    before any item, so nothing of such a call is applied."""
    count = len(items)
    checks = [(rpc.items_limit, count, rpc.items_max, rpc.field)]
    if rpc.bytes_max is not None:
        size = sum(item.ByteSize() for item in items) if count <= rpc.items_max else 0
        checks.append((rpc.bytes_limit, size, rpc.bytes_max, f"bytes of {rpc.field}"))
    for name, value, maximum, unit in checks:
        if value > maximum:
            raise ServiceError(
                Failure.INVALID_INPUT,
                f"{value} {unit} in one {rpc.name}, more than {name.upper()}_MAX ({maximum}); nothing was applied",
                {ErrorMeta.FIELD: rpc.field, ErrorMeta.LIMIT: name, ErrorMeta.MAX: maximum},
            )


def applied(outcome: tuple[Result, int] | ServiceError, kind: type[R]) -> tuple[R, int]:
    """An item's (result, index), its result the ``kind`` its op answers with, or raise the
    ServiceError it ended with."""
    if isinstance(outcome, ServiceError):
        raise outcome
    result, index = outcome
    return expect(kind, result), index


def _item_error(error: ServiceError, count_refusal: errors.CountRefusal) -> pb.WriteItemError:
    """One batch item's failure: the status and ErrorInfo the call alone would have had
    (counted as the call alone would have been)."""
    count_refusal(error.reason)
    return pb.WriteItemError(
        code=error.code.name, reason=error.reason, message=error.message, metadata=error.metadata,
    )


def serve_many(
    core: Core,
    rpc: ManyRpc,
    items: Any,
    context,
    caller: Principal | None,
    build: Callable[[Any], B],
    answer: Callable[[B, tuple[Result, int] | ServiceError], tuple[Any, int]],
) -> tuple[list[Any], int]:
    """The one fan-out of every batch RPC: each item judged as the same call alone.

    Past a limit the call is refused whole before any item (``_check_many_limits``). Each
    item is then built (``build``: its checks and its charges to the caller's quotas, as
    ``Core.build``; a ServiceError refuses that item alone), authorized as ``Core.run``
    does, and every item that
    passed is proposed at once (``Proposer.propose_many``) within the call's deadline.
    ``answer(command, outcome)`` turns an item's outcome -- (its result, index) or the
    ServiceError the call alone would have raised -- into (its success message, its index),
    or raises the ServiceError the call alone would have ended with. Returns (the result
    messages in request order, the highest index any item reached)."""
    _check_many_limits(rpc, items)
    answers: list[Any] = [None] * len(items)
    proposed: list[tuple[int, B]] = []
    for i, item in enumerate(items):
        try:
            command = build(item)
            core.authorize(caller, command.resource)
        except ServiceError as error:
            answers[i] = rpc.result(error=_item_error(error, core.count_refusal))
            continue
        proposed.append((i, command))
    index = 0
    if proposed:
        outcomes = core.proposer.propose_many([c for _, c in proposed], core.proposer.timeout_s(context))
        for (i, command), outcome in zip(proposed, outcomes, strict=True):
            settled = outcome if isinstance(outcome, ServiceError) else (outcome.value.result, outcome.index)
            try:
                message, at = answer(command, settled)
            except ServiceError as error:
                answers[i] = rpc.result(error=_item_error(error, core.count_refusal))
                index = max(index, error.index)
                continue
            answers[i] = rpc.result(**{rpc.ok: message})
            index = max(index, at)
    return answers, index


class KeepAlivePool:
    """KeepAliveMany's fan-out: each item renewed as a KeepAlive of its own, on a pool of
    worker threads shared by every call (a renewal is cheap and its items independent, so
    they run concurrently rather than as one batch of proposals)."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            KEEP_ALIVE_MANY_WORKERS, thread_name_prefix="keepalive-many"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def serve(
        self, items: Any, keep_alive: Callable[[pb.KeepAliveRequest], pb.KeepAliveResponse],
        count_refusal: errors.CountRefusal = errors.uncounted,
    ) -> tuple[list[pb.KeepAliveResult], int]:
        """(each item's result in request order, the highest index any item reached);
        INVALID_ARGUMENT, nothing renewed, past KEEP_ALIVE_BATCH_ITEMS_MAX."""
        if len(items) > limits.KEEP_ALIVE_BATCH_ITEMS_MAX:
            raise errors.invalid(
                "leases", f"{len(items)} items, more than {limits.KEEP_ALIVE_BATCH_ITEMS_MAX}"
            )

        def one(item: pb.KeepAliveRequest) -> tuple[pb.KeepAliveResult, int]:
            try:
                response = keep_alive(item)
            except ServiceError as error:
                count_refusal(error.reason)
                return (
                    pb.KeepAliveResult(
                        resource=item.resource, token=item.token, ok=False,
                        reason=error.reason, message=error.message,
                    ),
                    error.index,
                )
            return (
                pb.KeepAliveResult(
                    resource=item.resource, token=item.token, ok=True,
                    expires_at_ms=response.expires_at_ms,
                ),
                response.header.applied_index,
            )

        outcomes = list(self._pool.map(one, items))
        return [r for r, _ in outcomes], max((i for _, i in outcomes), default=0)

"""Faults a test injects into the in-memory cluster, each at the layer where it happens.

Owns: ``ProposeFault`` (a proposal's fate at the node: not applied for want of a leader or
of room in the queue, outcome unknown before or after applying, a slow commit that outlives
the proposal's deadline, a refusal the state machine would give), ``TransportFault`` (run
at the server's edge instead of the service: a member that stalls, a status the service
never produces, a failure the service raises before proposing), and ``Faults``, the queues
per RPC that both layers take from, in order.
Must never: answer in place of the service what the service can answer itself (such
statuses go through its own table, ``coordinator.server.errors``), or import pysyncobj.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Callable

import grpc

from coordinator.core.state_machine import Reason, Rejected
from coordinator.raft.interface import ProposeFailure, ProposeResult
from coordinator.server import errors
from testsupport.inmemory_node import InMemoryNode, failed, member_id

if TYPE_CHECKING:
    from testsupport.inmemory import Member


@dataclasses.dataclass(frozen=True)
class ProposeFault:
    """Decides one proposal's fate at the node: ``decide(node, command, timeout_s)``."""

    name: str
    decide: Callable[[InMemoryNode, bytes, float], ProposeResult]


@dataclasses.dataclass(frozen=True)
class TransportFault:
    """Runs in place of one RPC at the server's edge: ``serve(request, context, handler, member)``
    where ``handler(request, context)`` is the real service and ``member`` the cluster's
    ``Member``."""

    name: str
    serve: Callable[[Any, grpc.ServicerContext, Callable[[Any, Any], Any], Member], Any]


Fault = ProposeFault | TransportFault


def no_leader(new_leader: int | None = None) -> ProposeFault:
    """NOT_APPLIED: the node has no leader. ``new_leader`` (a node index) is who leads now,
    so the NO_LEADER answer carries its address as the hint; None: nobody."""

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        with node.log.lock:
            node.log.leader = None if new_leader is None else member_id(new_leader)
        return failed(ProposeFailure.NO_LEADER)

    return ProposeFault("no_leader", decide)


def queue_full() -> ProposeFault:
    """NOT_APPLIED: the Raft command queue is full (back-pressure: the service says OVERLOADED)."""
    return ProposeFault("queue_full", lambda node, command, timeout_s: failed(ProposeFailure.QUEUE_FULL))


def unknown_after_apply() -> ProposeFault:
    """The entry applied, then leadership was lost before the node heard: UNKNOWN."""

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        node.log.append(command)
        return failed(ProposeFailure.LEADER_CHANGED)

    return ProposeFault("unknown_after_apply", decide)


def unknown_before_apply() -> ProposeFault:
    """Leadership was lost before the entry committed; it never applies: still UNKNOWN to the node."""
    return ProposeFault("unknown_before_apply", lambda node, command, timeout_s: failed(ProposeFailure.LEADER_CHANGED))


def slow_commit(delay_s: float) -> ProposeFault:
    """The entry commits after ``delay_s``; the node waits at most the proposal's deadline,
    as RaftNode.propose does, and answers UNKNOWN if the commit comes later."""

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        done = threading.Event()
        box: list[ProposeResult] = []

        def committed(result: ProposeResult) -> None:
            box.append(result)
            done.set()

        node.log.append_later(command, delay_s, committed)
        if not done.wait(max(0.0, timeout_s)):
            return failed(ProposeFailure.DEADLINE_EXCEEDED)
        return box[0]

    return ProposeFault("slow_commit", decide)


def refuse(reason: Reason, message: str, **details: Any) -> ProposeFault:
    """The state machine refuses the entry with ``reason`` (and changes nothing)."""
    rejected = Rejected(op=None, reason=reason, message=message, details=details)

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        return node.log.append_refused(rejected)

    return ProposeFault(f"refuse_{reason.name}", decide)


def stall(seconds: float) -> TransportFault:
    """The member stalls (a GC pause, SIGSTOP) before serving; then it serves the request
    as usual, however late that is for the caller."""

    def serve(request, context, handler, member):
        member.cluster.closing.wait(seconds)
        return handler(request, context)

    return TransportFault("stall", serve)


def fail(key: Reason | errors.Failure, message: str, **metadata: Any) -> TransportFault:
    """The service answers ``key`` through its own status table, before proposing anything
    (as it does for an unknown caller or a bad field)."""
    error = errors.ServiceError(key, message, metadata)

    def serve(request, context, handler, member):
        member.core.abort(context, error)

    return TransportFault(f"fail_{error.reason}", serve)


@dataclasses.dataclass(frozen=True)
class _UnlistedError:
    """A failure with a code and reason outside STATUS_TABLE, shaped like a ServiceError for
    ``errors.rich_status`` (so it is encoded exactly as the server encodes its own)."""

    code: grpc.StatusCode
    reason: str
    message: str
    metadata: dict[str, str]


def unlisted_status(code: grpc.StatusCode, message: str, reason: str = "", **metadata: Any) -> TransportFault:
    """A status the service never sends itself: a bare ``code`` (reason ""), or a ``reason``
    a newer server might add. Carries the usual header trailers."""

    def serve(request, context, handler, member):
        trailers = member.core.trailing()
        if not reason:
            context.set_trailing_metadata(trailers)
            context.abort(code, message)
        unlisted = _UnlistedError(code, reason, message, {k: str(v) for k, v in metadata.items()})
        context.abort_with_status(errors.rich_status(unlisted, trailers))

    return TransportFault(f"status_{code.name}", serve)


class Faults:
    """Queued faults per (node or any node, RPC method name), taken in order by the layer
    each belongs to. The RPC being served is known per handler thread (the interceptor sets
    it), so a node's proposal finds the faults queued for the RPC that made it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[int | None, str], collections.deque[Fault]] = collections.defaultdict(
            collections.deque
        )
        self._serving = threading.local()

    def add(self, method: str, faults: tuple[Fault, ...], node: int | None) -> None:
        with self._lock:
            self._queues[(node, method)].extend(faults)

    def clear(self) -> None:
        with self._lock:
            self._queues.clear()

    def serving(self, method: str | None) -> None:
        """Called by the interceptor on the handler's thread: the RPC it now serves."""
        self._serving.method = method

    def take(self, node: int, layer: type) -> Any:
        """The next fault of ``layer`` queued for the RPC this thread serves on ``node``."""
        method = getattr(self._serving, "method", None)
        if method is None:
            return None  # not a handler thread (e.g. KeepAliveMany's pool): no fault applies
        with self._lock:
            for key in ((node, method), (None, method)):
                queue_ = self._queues.get(key)
                if queue_ and isinstance(queue_[0], layer):
                    return queue_.popleft()
        return None

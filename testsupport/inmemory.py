"""An in-process fencing cluster for client and fencingctl tests: the REAL servicers over an
in-memory Raft node.

Owns: ``InMemoryNode`` (the facade ``coordinator/server/service.py`` and ``app.py`` use of
``coordinator.raft.node.RaftNode``: propose, read, status, term_and_applied, is_leader,
leader_address, next_stamp_ms, close), which applies each command to ONE
``FencingStateMachine`` shared by every node, under one lock, in one log order;
``InMemoryCluster`` (N gRPC servers on 127.0.0.1, each wired the way ``app.py`` wires a member:
service.py's servicers, the errors table, metrics, the admin token); and the faults a test
injects, each at the layer where it happens:

- at the node, a proposal's fate: not applied (no leader, a full queue), outcome unknown
  before or after applying, a slow commit that outlives the RPC's proposal deadline, or a
  refusal the state machine would give (the service maps each one exactly as in production);
- in a server interceptor, what is purely transport: a member that stalls before serving,
  and a status the service never produces (a code or reason a newer server might send);
- a node that is down: its gRPC server is stopped.

The interceptor also records every call that reaches a server, so "nothing was sent" is
checked, not assumed.
Must never: implement an RPC (service.py does, once), import pysyncobj, or be shipped: it
lives in testsupport/, outside the wheel. Proposals apply whatever ``leader`` says: the
leader is what the nodes report (Status, NO_LEADER hints); a test that wants "no leader"
to fail proposals injects ``no_leader()``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable

import grpc

from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.core import limits
from coordinator.core.state_machine import FencingStateMachine, Reason, Rejected
from coordinator.raft.node import Outcome, ProposeResult
from coordinator.server import errors
from coordinator.server.app import audit_logger
from coordinator.server.config import ServerConfig
from coordinator.server.metrics import Metrics
from coordinator.server.service import (
    AdminServicer,
    ClusterServicer,
    Core,
    FencedStoreServicer,
    LeaseServicer,
    Proposer,
)

# One Raft term for the whole life of the in-memory cluster: there are no elections.
TERM = 1
# Handler threads per member: enough for a test's concurrent calls and stalled members.
GRPC_THREADS = 16
# How long stopping a member waits for its server to wind down.
STOP_WAIT_S = 5.0


# -- the node's answers: the one place that builds ProposeResult values ---------------------


def _applied(value: Any, index: int) -> ProposeResult:
    """What the state machine said (Applied or Rejected) at ``index``, as RaftNode reports it."""
    # A retry answered from the dedup table reports where its op_id first applied.
    index = getattr(value, "first_applied_index", 0) or index
    refused = isinstance(value, Rejected)
    return ProposeResult(Outcome.REFUSED if refused else Outcome.APPLIED, value=value, index=index)


def _not_applied(detail: str) -> ProposeResult:
    return ProposeResult(Outcome.NOT_APPLIED, detail=detail)


def _unknown(detail: str) -> ProposeResult:
    return ProposeResult(Outcome.UNKNOWN, detail=detail)


# -- one log shared by every node ----------------------------------------------------------


class SharedLog:
    """The replicated state every node sees at once: a state machine, its applied index, the
    stamp clock and which member the nodes name as leader."""

    def __init__(self) -> None:
        self.state_machine = FencingStateMachine()
        self.lock = threading.RLock()  # apply vs readers; re-entered by read(fn) callbacks
        self.applied_index = 0
        self.leader: str | None = None
        self._last_stamp_ms = 0
        self._timers: list[threading.Timer] = []
        self._closed = False

    def next_stamp_ms(self) -> int:
        """DESIGN I6, as RaftNode stamps: max(last + 1, wall clock, log clock)."""
        with self.lock:
            self._last_stamp_ms = max(
                self._last_stamp_ms + 1, time.time_ns() // 1_000_000, self.state_machine.log_clock_ms
            )
            return self._last_stamp_ms

    def append(self, command: bytes) -> ProposeResult:
        """Commit and apply ``command`` as the next entry."""
        with self.lock:
            self.applied_index += 1
            value = self.state_machine.apply(command, self.applied_index)
            return _applied(value, self.applied_index)

    def append_later(self, command: bytes, delay_s: float, done: Callable[[ProposeResult], None]) -> None:
        """Commit ``command`` after ``delay_s`` (a slow commit), unless the cluster closes first."""

        def commit() -> None:
            with self.lock:
                if self._closed:
                    return
            done(self.append(command))

        timer = threading.Timer(delay_s, commit)
        timer.daemon = True
        with self.lock:
            self._timers.append(timer)
        timer.start()

    def wait_slow_commits(self, timeout_s: float) -> bool:
        """Wait until every slow commit started so far has landed; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            timers = list(self._timers)
        for timer in timers:
            timer.join(max(0.0, deadline - time.monotonic()))
        return not any(timer.is_alive() for timer in timers)

    def close(self) -> None:
        with self.lock:
            self._closed = True
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()


@dataclasses.dataclass(frozen=True)
class _NodeConfig:
    self_address: str  # the member id (a Raft address in production)


class InMemoryNode:
    """One member's view of the shared log, with RaftNode's facade (no Raft, no pysyncobj)."""

    def __init__(self, log: SharedLog, faults: Faults, index: int, member_id: str) -> None:
        self.config = _NodeConfig(self_address=member_id)
        self.index = index
        self.log = log
        self._faults = faults

    @property
    def state_machine(self) -> FencingStateMachine:
        return self.log.state_machine

    def next_stamp_ms(self) -> int:
        return self.log.next_stamp_ms()

    def propose(
        self, command: bytes, timeout_s: float, *, max_bytes: int = limits.COMMAND_BYTES_MAX, batch_key: Any = None
    ) -> ProposeResult:
        """Apply ``command`` now, or let an injected fault decide its fate."""
        if len(command) > max_bytes:
            return _not_applied("command_too_large")
        fault = self._faults.take(self.index, ProposeFault)
        if fault is None:
            return self.log.append(command)
        return fault.decide(self, command, timeout_s)

    def read(self, fn: Callable[[FencingStateMachine], Any]) -> Any:
        with self.log.lock:
            return fn(self.log.state_machine)

    def status(self) -> dict[str, Any]:
        with self.log.lock:
            index, leader = self.log.applied_index, self.log.leader
        return {
            "self": self.config.self_address,
            "leader": leader,
            "is_leader": leader == self.config.self_address,
            "term": TERM,
            "commit_index": index,
            "last_applied": index,
            "has_quorum": leader is not None,
            "log_len": index,
            "ready": True,
        }

    def term_and_applied(self) -> tuple[int, int]:
        return TERM, self.log.applied_index

    def is_leader(self) -> bool:
        return self.log.leader == self.config.self_address

    def leader_address(self) -> str | None:
        return self.log.leader

    def close(self) -> None:
        """Nothing to release: the log belongs to the cluster."""


# -- faults ------------------------------------------------------------------------------------


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
    serve: Callable[[Any, grpc.ServicerContext, Callable[[Any, Any], Any], "Member"], Any]


Fault = ProposeFault | TransportFault


def no_leader(new_leader: int | None = None) -> ProposeFault:
    """NOT_APPLIED: the node has no leader. ``new_leader`` (a node index) is who leads now,
    so the NO_LEADER answer carries its address as the hint; None: nobody."""

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        with node.log.lock:
            node.log.leader = None if new_leader is None else member_id(new_leader)
        return _not_applied("no_leader")

    return ProposeFault("no_leader", decide)


def queue_full() -> ProposeFault:
    """NOT_APPLIED: the Raft command queue is full (back-pressure: the service says OVERLOADED)."""
    return ProposeFault("queue_full", lambda node, command, timeout_s: _not_applied("queue_full"))


def unknown_after_apply() -> ProposeFault:
    """The entry applied, then leadership was lost before the node heard: UNKNOWN."""

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        node.log.append(command)
        return _unknown("leader_changed")

    return ProposeFault("unknown_after_apply", decide)


def unknown_before_apply() -> ProposeFault:
    """Leadership was lost before the entry committed; it never applies: still UNKNOWN to the node."""
    return ProposeFault("unknown_before_apply", lambda node, command, timeout_s: _unknown("leader_changed"))


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
            return _unknown("deadline_exceeded")
        return box[0]

    return ProposeFault("slow_commit", decide)


def refuse(reason: Reason, message: str, **details: Any) -> ProposeFault:
    """The state machine refuses the entry with ``reason`` (and changes nothing)."""
    rejected = Rejected(op=None, reason=reason, message=message, details=details)

    def decide(node: InMemoryNode, command: bytes, timeout_s: float) -> ProposeResult:
        with node.log.lock:
            node.log.applied_index += 1
            return _applied(rejected, node.log.applied_index)

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


# -- the cluster ---------------------------------------------------------------------------------


def member_id(index: int) -> str:
    """Member ids look like production's Raft addresses; nothing listens there."""
    return f"member-{index}.inmemory:7000"


@dataclasses.dataclass
class Call:
    """One RPC that reached a member; once ``done`` is set, ``code`` is how it answered."""

    node: int
    method: str
    request: Any
    code: grpc.StatusCode | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)


class _EdgeInterceptor(grpc.ServerInterceptor):
    """Records each call and runs transport faults in place of the service."""

    def __init__(self, member: Member) -> None:
        self.member = member

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler is None or handler.unary_unary is None:
            self.member.cluster._record(Call(self.member.index, method, None))  # a stream: counted only
            return handler
        inner = handler.unary_unary
        member = self.member
        faults = member.cluster.faults

        def serve(request, context):
            call = Call(member.index, method, request)
            member.cluster._record(call)
            faults.serving(method)
            try:
                fault = faults.take(member.index, TransportFault)
                if fault is not None:
                    return fault.serve(request, context, inner, member)
                return inner(request, context)
            finally:
                faults.serving(None)
                call.code = context.code() or grpc.StatusCode.OK  # abort() set it; a return did not
                call.done.set()

        return handler._replace(unary_unary=serve)


class Member:
    """One member: its node, the real servicers in front of it, and its gRPC server."""

    def __init__(self, cluster: InMemoryCluster, index: int, config: ServerConfig) -> None:
        self.cluster = cluster
        self.index = index
        self.member_id = member_id(index)
        self.node = InMemoryNode(cluster.log, cluster.faults, index, self.member_id)
        self.metrics = Metrics()
        self.server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(GRPC_THREADS, thread_name_prefix=f"inmemory-{index}"),
            options=[
                ("grpc.max_receive_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
                ("grpc.so_reuseport", 0),
            ],
            interceptors=[_EdgeInterceptor(self), self.metrics.interceptor()],
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.running = False
        self.core: Core | None = None
        self.lease: LeaseServicer | None = None

    def wire(self, config: ServerConfig, members: dict[str, str]) -> None:
        """Build and register the servicers as coordinator/server/app.py's FencingServer does."""
        proposer = Proposer(
            self.node,
            inflight_max=config.inflight_proposals_max,
            timeout_max_s=config.propose_timeout_max_s,
            deadline_margin_s=config.propose_deadline_margin_s,
            members=members,
            metrics=self.metrics,
        )
        self.core = Core(self.node, proposer, members=members, authenticator=None, proof_signer=None)
        self.lease = LeaseServicer(self.core, acquire_wait_poll_s=config.acquire_wait_poll_ms / 1000)
        pb_grpc.add_LeaseServicer_to_server(self.lease, self.server)
        pb_grpc.add_FencedStoreServicer_to_server(FencedStoreServicer(self.core), self.server)
        pb_grpc.add_ClusterServicer_to_server(ClusterServicer(self.core), self.server)
        pb_grpc.add_AdminServicer_to_server(
            AdminServicer(self.core, admin_token=config.resolved_admin_token(), audit=audit_logger(config)),
            self.server,
        )

    def start(self) -> None:
        self.server.start()
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.server.stop(grace=0).wait(STOP_WAIT_S)
            if self.lease is not None:
                self.lease.close()


class InMemoryCluster:
    """``nodes`` members on one shared log, serving on 127.0.0.1 ports of their own. Use it
    as a context manager. Member 0 leads at first; set ``leader`` (an index, or None) to
    change what the members report. ``admin_token``: Admin RPCs then need it as a bearer
    token (empty: Admin is open, as on a dev cluster)."""

    def __init__(self, nodes: int = 3, *, admin_token: str = "") -> None:
        self.log = SharedLog()
        self.faults = Faults()
        self.closing = threading.Event()  # releases stalled handlers at close
        self.calls: list[Call] = []
        self._calls_lock = threading.Lock()
        config = ServerConfig(admin_token=admin_token)  # the production defaults otherwise
        self.members = [Member(self, i, config) for i in range(nodes)]
        api_addresses = {m.member_id: m.address for m in self.members}
        for member in self.members:
            member.wire(config, api_addresses)
        self.leader = 0
        for member in self.members:
            member.start()

    # -- what a test sees and changes ------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        return [m.address for m in self.members]

    @property
    def leader(self) -> int | None:
        leader = self.log.leader
        return None if leader is None else [m.member_id for m in self.members].index(leader)

    @leader.setter
    def leader(self, index: int | None) -> None:
        with self.log.lock:
            self.log.leader = None if index is None else self.members[index].member_id

    @property
    def state_machine(self) -> FencingStateMachine:
        return self.log.state_machine

    def inject(self, method: str, *faults: Fault, node: int | None = None) -> None:
        """Queue ``faults`` for the next calls of RPC ``method`` (on ``node``, or on any)."""
        self.faults.add(method, faults, node)

    def clear_faults(self) -> None:
        self.faults.clear()

    def calls_to(self, method: str) -> list[Call]:
        with self._calls_lock:
            return [call for call in self.calls if call.method == method]

    def stop_node(self, index: int) -> None:
        """The member goes down: its server stops (its node's state lives on in the log)."""
        self.members[index].stop()

    def close(self) -> None:
        self.closing.set()
        for member in self.members:
            member.stop()
        self.log.close()

    def __enter__(self) -> InMemoryCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _record(self, call: Call) -> None:
        with self._calls_lock:
            self.calls.append(call)

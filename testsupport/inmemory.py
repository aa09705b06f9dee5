"""An in-process fencing cluster for client and fencingctl tests: the REAL servicers over
in-memory Raft nodes.

Owns: ``InMemoryCluster`` (N gRPC servers on 127.0.0.1, each wired by
``coordinator/server/app.py``'s own ``add_services``: the real servicers, the errors
table, metrics and the admin token, in front of its own ``InMemoryNode`` on one shared log), the
interceptor at each server's edge that records every call (so "nothing was sent" is
checked, not assumed) and runs transport faults, and ``inject``. A node that is down is
its server stopped. The faults are in ``inmemory_faults``.
Must never: implement an RPC (the servicers do, once), import pysyncobj, or be shipped: it
lives in testsupport/, outside the wheel.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any

import grpc

from coordinator.core.state_machine import FencingStateMachine
from coordinator.server.app import GRPC_SERVER_OPTIONS, add_services, stream_admission
from coordinator.server.config import ServerConfig
from coordinator.server.metrics import Metrics
from coordinator.server.request_core import Core
from coordinator.server.service import LeaseServicer
from coordinator.server.watch_hub import WatchHub
from testsupport.inmemory_faults import Fault, Faults, ProposeFault, TransportFault
from testsupport.inmemory_node import InMemoryNode, SharedLog

# Handler threads per member: enough for a test's concurrent calls and stalled members.
GRPC_THREADS = 16
# How long stopping a member waits for its server to wind down.
STOP_WAIT_S = 5.0


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
        member = self.member
        faults = member.cluster.faults
        if handler is not None and handler.stream_unary is not None:
            inner_stream = handler.stream_unary

            def serve_stream(request_iterator, context):
                # A request stream (RestoreStream): counted, and its proposals take faults.
                member.cluster._record(Call(member.index, method, None))
                faults.serving(method)
                try:
                    return inner_stream(request_iterator, context)
                finally:
                    faults.serving(None)

            return handler._replace(stream_unary=serve_stream)
        if handler is None or handler.unary_unary is None:
            self.member.cluster._record(Call(self.member.index, method, None))  # a stream: counted only
            return handler
        inner = handler.unary_unary

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
        faults = cluster.faults
        self.node = InMemoryNode(cluster.log, index, lambda: faults.take(index, ProposeFault))
        self.member_id = self.node.config.self_address
        self.metrics = Metrics()
        self.server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(GRPC_THREADS, thread_name_prefix=f"inmemory-{index}"),
            options=GRPC_SERVER_OPTIONS,
            interceptors=[_EdgeInterceptor(self), self.metrics.interceptor(),
                          stream_admission(config, self.node, self.metrics)],
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.running = False
        self.core: Core | None = None
        self.lease: LeaseServicer | None = None
        self.watch: WatchHub | None = None

    def wire(self, config: ServerConfig, members: dict[str, str]) -> None:
        """Build and register the servicers with app.py's ``add_services``, as a member does."""
        services = add_services(self.server, self.node, config, members=members, metrics=self.metrics)
        self.core = services.core
        self.lease = services.lease
        self.watch = services.watch

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
    token (empty: Admin is open, as on a dev cluster). ``principals_file``: a principals file
    (coordinator/server/auth.py) every member authenticates against (empty: none)."""

    def __init__(self, nodes: int = 3, *, admin_token: str = "", principals_file: str = "") -> None:
        self.log = SharedLog()
        self.faults = Faults()
        self.closing = threading.Event()  # releases stalled handlers at close
        self.calls: list[Call] = []
        self._calls_lock = threading.Lock()
        # The production defaults otherwise.
        config = ServerConfig(admin_token=admin_token, principals_file=principals_file)
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

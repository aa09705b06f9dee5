"""``fencingd serve`` with its Raft node ticked from one asyncio event loop that also serves
Acquire, Release and Write: issue 17's lever "one event loop per member", for
``python -m bench compare --ours-client raw,loop``.

    python -m bench._loop_node serve --config node0.toml     (the fencingd command line)

Benchmark-only, a prototype measured against the shipped member; nothing in ``coordinator``
imports it. The member runs as fencingd does (every service on its thread-pool gRPC server at
``api_address``, so health, Status, the lease ticker and the test harness work unchanged),
with these changes inside this process only:

  * no Raft thread: the node is built with pysyncobj's ``autoTick=False`` and its poller is an
    epoll one whose descriptor the loop watches; the loop thread ticks the node (``doTick(0)``)
    whenever a Raft socket or pysyncobj's wake-up pipe is ready, right after a handler of its
    own proposes, and every ``TICK_INTERVAL_S`` (heartbeats, elections);
  * the leader's journal sync stays on its background thread (it wakes the loop when done),
    and snapshots stay on the writer thread, as in the shipped member;
  * a ``grpc.aio`` server on the API port + ``LOOP_PORT_OFFSET`` serves Acquire, Release and
    Write on that loop: a Write is checked, stamped and proposed there, and its
    result delivered there by the same tick that packs, replicates, commits and applies it.
    No thread hands the call to another between the socket and the reply.

Only what the write and acquire + release workloads need is served there; no principals, no lock queue (an Acquire
of a held resource is refused, not queued). Errors come back with the shipped rich status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import select
import sys
import threading

import grpc
from pysyncobj import syncobj as ps_syncobj
from pysyncobj.poller import POLL_EVENT_TYPE

from coordinator.raft import node as raft_node
from coordinator.raft import syncobj as raft_syncobj
from coordinator.raft.interface import ProposeOutcome
from coordinator.server import app as server_app
from coordinator.server import errors
from coordinator.server import fencingd
from coordinator.server.service import _checked_request
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc

from . import _prototype_rpcs as rpcs

# Where the loop's own gRPC server listens: the member's API port plus this.
LOOP_PORT_OFFSET = 1000
# The loop ticks at least this often with no socket ready: pysyncobj's timers (heartbeats at
# heartbeat_s, elections) are checked in ticks; the Raft thread's own idle poll is 0.1 s at most.
TICK_INTERVAL_S = 0.005
PROPOSE_TIMEOUT_S = 5.0
# A handler's proposal is ticked this long after it, so the proposals of calls arriving
# together share a tick and an entry (the Raft thread batches them while it is busy). 0: at
# once. Set by --loop-coalesce-us through the LOOP_COALESCE_US environment variable.
COALESCE_S = float(os.environ.get("LOOP_COALESCE_US", "500")) / 1e6


def command(config_path: str) -> list[str]:
    """The command line of a member of this kind (a GrpcCluster's ``command``)."""
    return [sys.executable, "-m", "bench._loop_node", "serve", "--config", config_path]


def loop_address(api_address: str) -> str:
    return rpcs.port_plus(api_address, LOOP_PORT_OFFSET)


class EpollPoller:
    """pysyncobj's poller interface on one epoll object, whose descriptor an event loop can watch."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._callbacks: dict[int, object] = {}
        self.dispatched = 0  # events the last poll handed to callbacks

    def fileno(self) -> int:
        return self._epoll.fileno()

    def subscribe(self, descr, callback, eventMask) -> None:
        mask = 0
        if eventMask & POLL_EVENT_TYPE.READ:
            mask |= select.EPOLLIN
        if eventMask & POLL_EVENT_TYPE.WRITE:
            mask |= select.EPOLLOUT
        if eventMask & POLL_EVENT_TYPE.ERROR:
            mask |= select.EPOLLERR
        fd = descr if isinstance(descr, int) else descr.fileno()
        if fd in self._callbacks:
            self._epoll.modify(fd, mask)
        else:
            self._epoll.register(fd, mask)
        self._callbacks[fd] = (descr, callback)

    def unsubscribe(self, descr) -> None:
        fd = descr if isinstance(descr, int) else descr.fileno()
        if self._callbacks.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass

    def poll(self, timeout) -> None:
        events = self._epoll.poll(max(0.0, timeout))
        self.dispatched = len(events)
        for fd, event in events:
            entry = self._callbacks.get(fd)
            if entry is None:
                continue
            mask = 0
            if event & select.EPOLLIN:
                mask |= POLL_EVENT_TYPE.READ
            if event & select.EPOLLOUT:
                mask |= POLL_EVENT_TYPE.WRITE
            if event & (select.EPOLLERR | select.EPOLLHUP):
                mask |= POLL_EVENT_TYPE.ERROR
            entry[1](entry[0], mask)


class LoopMember:
    """The event loop thread: ticks the node, serves Acquire, Release and Write on the loop port."""

    def __init__(self, server: server_app.FencingServer) -> None:
        self.server = server
        self.node = server.node
        self.node.loop_member = self  # its close() stops the loop's ticks first
        self.core = server.lease.core
        self.address = loop_address(server.config.bind_address)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_pending = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raft-loop", daemon=True)
        self.started = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        if not self.started.wait(30) or self.error is not None:
            raise RuntimeError(f"the loop member did not start: {self.error!r}")

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            self.error = exc
            self.started.set()
            raise

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._poller = self.node.syncobj._poller
        self._loop.add_reader(self._poller.fileno(), self._tick)
        aio = grpc.aio.server(options=server_app.GRPC_SERVER_OPTIONS)
        pb_grpc.add_LeaseServicer_to_server(rpcs.servicer(pb_grpc.LeaseServicer, _method(self)), aio)
        pb_grpc.add_FencedStoreServicer_to_server(rpcs.servicer(pb_grpc.FencedStoreServicer, _method(self)), aio)
        if aio.add_insecure_port(self.address) == 0:
            raise OSError(f"cannot listen on {self.address}")
        await aio.start()
        self.started.set()
        while not self._stopping.is_set():
            self._tick()
            await asyncio.sleep(TICK_INTERVAL_S)
        await aio.stop(1.0)

    def _tick(self) -> None:
        self._tick_pending = False
        self.node.tick(0.0)
        # pysyncobj's tick is its body (apply, commit, send) and then the poll that hands
        # messages to their handlers: what a poll brought in is acted on by the next body,
        # which the Raft thread runs at once. So does the loop.
        if self._poller.dispatched:
            self.schedule_tick()

    def schedule_tick(self, after_s: float = 0.0) -> None:
        if not self._tick_pending:
            self._tick_pending = True
            if after_s > 0:
                self._loop.call_later(after_s, self._tick)
            else:
                self._loop.call_soon(self._tick)

    async def propose(self, command: commands.Command):
        """The APPLIED result of ``command``, proposed and awaited on the loop; raises
        ServiceError as the shipped Proposer does."""
        stamped = dataclasses.replace(command, stamp_ms=self.node.next_stamp_ms())
        future = self._loop.create_future()

        def on_result(result, error) -> None:  # on this loop's thread: the tick runs here
            if not future.done():
                future.set_result((result, error))

        self.node.propose_async(stamped.encode(), on_result, batch_key=command.resource)
        self.schedule_tick(COALESCE_S)
        result, error = await asyncio.wait_for(future, PROPOSE_TIMEOUT_S)
        outcome = raft_node.RaftNode._result_of(result, error)
        if outcome.outcome is ProposeOutcome.APPLIED:
            return outcome
        if outcome.outcome is ProposeOutcome.REFUSED:
            raise errors.from_refusal(outcome.value, outcome.index)
        leader, leader_api = self.core.proposer.leader_hint()
        raise errors.from_propose_failure(outcome, leader, leader_api)

    async def serve(self, rpc: str, request, context):
        try:
            command = rpcs.build(rpc, _checked_request(rpc, request))
            applied = await self.propose(command)
            return rpcs.reply(rpc, self.core.header(applied.index), applied.value.result)
        except errors.ServiceError as error:
            await context.abort_with_status(errors.rich_status(error, self.core.trailing(error.index)))


def _method(member: LoopMember):
    def method(rpc):
        async def call(self, request, context):
            return await member.serve(rpc, request, context)

        return call

    return method


def install() -> None:
    """The changes listed in the module docstring, before fencingd builds anything."""
    ps_syncobj.createPoller = lambda _kind: EpollPoller()
    real_leader_sync = raft_syncobj.LeaderSync

    def leader_sync(*args, background, **kwargs):
        return real_leader_sync(*args, background=True, **kwargs)  # as with the Raft thread

    raft_syncobj.LeaderSync = leader_sync
    real_node = server_app.RaftNode

    def node_without_raft_thread(*args, **kwargs):
        node = real_node(*args, auto_tick=False, **kwargs)
        writer = node.syncobj._snapshot_writer()
        if writer is not None:
            writer.inline = False  # snapshots on the writer thread, as with the Raft thread
        real_close = node.close

        def close() -> None:
            member = getattr(node, "loop_member", None)
            if member is not None:
                member.stop()  # no tick may run while pysyncobj is torn down
            real_close()

        node.close = close
        return node

    server_app.RaftNode = node_without_raft_thread
    real_start = server_app.FencingServer.start

    def start(self) -> None:
        LoopMember(self).start()  # ticks first: the Raft port binds in a tick
        real_start(self)

    server_app.FencingServer.start = start


if __name__ == "__main__":
    install()
    sys.exit(fencingd.main())

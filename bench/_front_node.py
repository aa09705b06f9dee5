"""A member whose gRPC is served by front processes that feed its Raft process: issue 17's
lever "several front processes feeding one Raft process", for
``python -m bench compare --ours-client raw,front``.

    python -m bench._front_node serve --config node0.toml     (the fencingd command line)
    python -m bench._front_node front --socket PATH --listen HOST:PORT   (started by serve)

Benchmark-only, a prototype measured against the shipped member; nothing in ``coordinator``
imports it. The member runs as fencingd does (every service on its own gRPC server at
``api_address``, so health, Status and the test harness work unchanged), and also:

  * listens on a Unix socket in its data dir for front processes, and starts
    ``FRONT_PROCESSES`` of them (environment ``FRONT_PROCESSES``, default 2), each a
    thread-pool gRPC server on the API port + ``FRONT_PORT_OFFSET``, all bound to the same
    port (SO_REUSEPORT: the kernel spreads client connections over them), on every CPU;
  * a front serves Acquire, Release and Write: it parses and checks the request (the work it
    takes off the Raft process), sends the checked fields over its socket (msgpack, one frame
    per request) and waits for the answer; the Raft process builds, stamps and proposes the
    command, and the Raft thread writes the answer back on the socket when it is applied.

No principals, no lock queue (an Acquire of a held resource is refused, not queued). Errors
come back as the shipped rich status.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import itertools
import os
import socket
import subprocess
import sys
import threading

import grpc
import msgpack

from . import _prototype_rpcs as rpcs

FRONT_PORT_OFFSET = 2000
FRONT_THREADS = 16
FRONT_PROCESSES = int(os.environ.get("FRONT_PROCESSES", "2"))
SOCKET_NAME = "front.sock"
ANSWER_TIMEOUT_S = 5.0


def command(config_path: str) -> list[str]:
    """The command line of a member of this kind (a GrpcCluster's ``command``)."""
    return [sys.executable, "-m", "bench._front_node", "serve", "--config", config_path]


def front_address(api_address: str) -> str:
    return rpcs.port_plus(api_address, FRONT_PORT_OFFSET)


def children_of(pid: int) -> list[int]:
    """The processes ``pid``'s main thread started (its fronts), from /proc."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _send_frame(sock: socket.socket, lock: threading.Lock, message) -> None:
    data = msgpack.packb(message, use_bin_type=True)  # msgpack items delimit themselves
    with lock:
        sock.sendall(data)


def _frames(sock: socket.socket):
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=64 * 1024 * 1024)
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return
        unpacker.feed(data)
        yield from unpacker


# -- in the Raft process ---------------------------------------------------------------------


class FrontGate:
    """The Raft process's side: accepts fronts on a Unix socket, proposes what they send."""

    def __init__(self, server) -> None:
        self.server = server
        self.node = server.node
        self.core = server.lease.core
        self.path = os.path.join(server.config.data_dir, SOCKET_NAME)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(16)
        threading.Thread(target=self._accept, name="front-accept", daemon=True).start()
        address = front_address(server.config.bind_address)
        self.fronts = [
            subprocess.Popen([sys.executable, "-m", "bench._front_node", "front", "--socket", self.path,
                              "--listen", address])
            for _ in range(FRONT_PROCESSES)
        ]

    def close(self) -> None:
        for front in self.fronts:
            front.terminate()
        for front in self.fronts:
            try:
                front.wait(5)
            except subprocess.TimeoutExpired:
                front.kill()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="front-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        from coordinator.raft.node import RaftNode

        lock = threading.Lock()
        proposer = self.core.proposer
        try:
            for req_id, rpc, fields in _frames(conn):
                command = rpcs.build(rpc, fields)
                stamped = dataclasses.replace(command, stamp_ms=self.node.next_stamp_ms())

                def on_result(result, error, req_id=req_id):  # on the Raft thread
                    _send_frame(conn, lock, self._answer(req_id, RaftNode._result_of(result, error), proposer))

                self.node.propose_async(stamped.encode(), on_result, batch_key=command.resource)
        except OSError:
            pass
        finally:
            conn.close()

    def _answer(self, req_id: int, outcome, proposer) -> list:
        from coordinator.raft.interface import ProposeOutcome
        from coordinator.server import errors

        if outcome.outcome is ProposeOutcome.APPLIED:
            term, applied = self.node.term_and_applied()
            result = {k: v for k, v in outcome.value.result.items() if isinstance(v, (int, bool, str, bytes))}
            return [req_id, True, [self.core.member_id, term, outcome.index or applied, result]]
        if outcome.outcome is ProposeOutcome.REFUSED:
            error = errors.from_refusal(outcome.value, outcome.index)
        else:
            error = errors.from_propose_failure(outcome, *proposer.leader_hint())
        status = errors.rich_status(error, self.core.trailing(error.index))
        return [req_id, False, [status.code.value[0], status.details, [list(kv) for kv in status.trailing_metadata]]]


def install() -> None:
    """Start a FrontGate with the member's servers (fencingd builds the rest as usual)."""
    from coordinator.server import app as server_app

    real_start, real_stop = server_app.FencingServer.start, server_app.FencingServer.stop

    def start(self) -> None:
        real_start(self)
        self.front_gate = FrontGate(self)

    def stop(self) -> None:
        gate = getattr(self, "front_gate", None)
        if gate is not None:
            gate.close()
        real_stop(self)

    server_app.FencingServer.start, server_app.FencingServer.stop = start, stop


# -- a front process ---------------------------------------------------------------------------


class Front:
    """One front: a gRPC server whose Acquire, Release and Write go to the Raft process."""

    def __init__(self, socket_path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(socket_path)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, concurrent.futures.Future] = {}
        threading.Thread(target=self._read, name="front-reader", daemon=True).start()

    def _read(self) -> None:
        for req_id, ok, payload in _frames(self._sock):
            future = self._waiting.pop(req_id, None)
            if future is not None:
                future.set_result((ok, payload))
        os._exit(0)  # the Raft process went away: so does its front

    def call(self, rpc: str, request, context):
        from coordinator.server import errors
        from coordinator.server.service import _checked_request

        try:
            fields = _checked_request(rpc, request)
        except errors.ServiceError as error:
            context.abort_with_status(errors.rich_status(error))
        req_id = next(self._ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._waiting[req_id] = future
        _send_frame(self._sock, self._lock, [req_id, rpc, fields])
        try:
            ok, payload = future.result(ANSWER_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            self._waiting.pop(req_id, None)
            context.abort(grpc.StatusCode.UNAVAILABLE, "no answer from the Raft process")
        if not ok:
            code, details, trailing = payload
            status_code = next(c for c in grpc.StatusCode if c.value[0] == code)
            context.abort_with_status(errors._Status(status_code, details, tuple(tuple(kv) for kv in trailing)))
        return payload


def run_front(socket_path: str, listen: str) -> int:
    from coordinator.api.v1 import fencing_pb2 as pb
    from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
    from coordinator.server.app import GRPC_SERVER_OPTIONS

    os.sched_setaffinity(0, range(os.cpu_count() or 1))  # not the member's pinned CPU
    front = Front(socket_path)

    def method(rpc):
        def call(self, request, context):
            member_id, term, index, result = front.call(rpc, request, context)
            header = pb.ResponseHeader(member_id=member_id, raft_term=term, applied_index=index)
            return rpcs.reply(rpc, header, result)

        return call

    options = tuple(o for o in GRPC_SERVER_OPTIONS if o[0] != "grpc.so_reuseport") + (("grpc.so_reuseport", 1),)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(FRONT_THREADS, thread_name_prefix="front"),
                         options=options)
    pb_grpc.add_LeaseServicer_to_server(rpcs.servicer(pb_grpc.LeaseServicer, method), server)
    pb_grpc.add_FencedStoreServicer_to_server(rpcs.servicer(pb_grpc.FencedStoreServicer, method), server)
    if server.add_insecure_port(listen) == 0:
        print(f"front: cannot listen on {listen}", file=sys.stderr)
        return 1
    server.start()
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "front":
        parser = argparse.ArgumentParser(prog="python -m bench._front_node front")
        parser.add_argument("--socket", required=True)
        parser.add_argument("--listen", required=True)
        args = parser.parse_args(sys.argv[2:])
        sys.exit(run_front(args.socket, args.listen))
    from coordinator.server import fencingd

    install()
    sys.exit(fencingd.main())

"""Client processes of ``bench.grpc_bench``: each runs N client threads against one endpoint.

Benchmark-only. A worker process is started once (multiprocessing, spawn) and serves one
run after another over its pipe:

    parent -> {"cmd": "prepare", ...run spec...}   threads build their clients, acquire
                                                   their resource (fenced writes), connect
    worker -> {"ready": True, "setup_errors": {...}}
    parent -> {"cmd": "go", "t0": monotonic}       measured window: [t0 + warmup, t0 + warmup + seconds]
    worker -> {"latencies": bytes(array('d')), "errors": {...}, ...}
    parent -> {"cmd": "exit"}

Every client thread has its own client: a ``FencingClient`` (mode ``lib``) or a raw generated
stub on its own ``grpc.Channel`` (mode ``raw``), or, in mode ``mux``, the threads of a process
share one ``FencingClient(multiplex=True)``, so their concurrent writes, acquires and
releases travel as WriteMany, AcquireMany and ReleaseMany batches; with ``"system": "etcd"`` in the spec
(bench.compare) a ``bench._etcd_client.EtcdClient``, which does the same workloads against
etcd, so both systems run in the same processes, threads and timing loop. Only operations
*completed* inside the measured window are counted; their latency is end minus start of that
one operation (for a cycle: acquire + write + release). ``time.monotonic`` is CLOCK_MONOTONIC, shared
by all processes of the host, so the parent's ``t0`` means the same instant everywhere.
"""

from __future__ import annotations

import array
import collections
import os
import threading
import time
import traceback

from coordinator.core.names import ErrorReason as R

VALUE = b"v" * 64
RPC_TIMEOUT_S = 5.0
WRITE_TTL_MS = 120_000  # the fenced-write workload holds one lease for the whole run
CYCLE_TTL_MS = 5_000  # a cycle's lease is released at once; the TTL only matters after errors
KEY = "k"
SETUP_RETRY_S = 20.0
# Error kinds (``error_kind``: "Class/REASON" from the library, "CODE/REASON" from a raw
# stub) that setup waits out: an election or a busy machine, nothing applied.
SETUP_RETRYABLE = ("UNAVAILABLE", "ABORTED", "DEADLINE", R.OVERLOADED, "Unavailable")
# Reasons that say the write workload's lease is gone, so it takes a new token and goes on.
# The library's StaleToken and LeaseExpired come only from a server refusal, so their kind
# always carries the reason too.
LEASE_GONE = (R.STALE_TOKEN, R.LEASE_EXPIRED)


def _raw_error_kind(err) -> str:
    import grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    code = err.code() if callable(getattr(err, "code", None)) else None
    name = code.name if isinstance(code, grpc.StatusCode) else "?"
    try:
        status = rpc_status.from_call(err)
    except Exception:  # noqa: BLE001 - a malformed status is still an error of its code
        status = None
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return f"{name}/{info.reason}"
    return name


class _Client:
    """One benchmark client: the operations of one workload, raw or through the library."""

    def __init__(self, spec: dict, name: str) -> None:
        self.spec = spec
        self.mode = spec["mode"]
        self.workload = spec["workload"]
        self.resource = f"bench/{spec['run_id']}/{name}"
        self.holder = f"grpc-bench/{name}"
        self.token = spec.get("fixed_token") or 0
        # Per call; a failover probe (bench._failover) sets a shorter one.
        self.timeout_s = spec.get("rpc_timeout_s", RPC_TIMEOUT_S)
        target = spec["target"]
        if self.mode == "raw":
            import grpc

            from coordinator.api.v1 import fencing_pb2 as pb
            from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc

            self.pb = pb
            self.grpc = grpc
            self.channel = grpc.insecure_channel(target)
            grpc.channel_ready_future(self.channel).result(timeout=RPC_TIMEOUT_S)
            self.lease = pb_grpc.LeaseStub(self.channel)
            self.store = pb_grpc.FencedStoreStub(self.channel)
        else:
            from coordinator.client import FencingClient
            from coordinator.client.exceptions import FencingError

            self.error_types = (FencingError,)
            if self.mode == "mux":
                # The process's one multiplexing client (``_run`` made it): this thread's
                # writes, acquires and releases join the others' batches.
                self.client = spec["shared_client"]
            else:
                self.client = FencingClient([target])
                self.client.status()  # connect and learn the leader before the clock starts

    # -- setup / teardown (not timed) ------------------------------------------------------

    def setup(self) -> None:
        """Untimed: take the write workload's lease (a read's: and write the value it reads),
        retrying for a while (an election, a busy machine); raw stubs have no retry loop of
        their own."""
        if self.workload not in ("write", "read") or self.token:
            return
        deadline = time.monotonic() + SETUP_RETRY_S
        while True:
            try:
                self.token = self._acquire()
                if self.workload == "read":
                    self._write(self.token)
                return
            except Exception as exc:
                kind = self.error_kind(exc) or ""
                if time.monotonic() > deadline or not any(k in kind for k in SETUP_RETRYABLE):
                    raise
                time.sleep(0.2)

    def teardown(self) -> None:
        try:
            if self.workload in ("write", "read") and not self.spec.get("fixed_token") and self.token:
                self._release(self.token)
        except Exception:  # noqa: BLE001 - best effort
            pass
        if self.mode == "raw":
            self.channel.close()
        elif self.mode != "mux":  # the shared client is closed by ``_run`` after every thread
            self.client.close()

    # -- operations ------------------------------------------------------------------------

    def _acquire(self) -> int:
        if self.mode == "raw":
            pb = self.pb
            reply = self.lease.Acquire(
                pb.AcquireRequest(
                    resource=self.resource, holder=self.holder, op_id=os.urandom(16),
                    ttl_ms=self.ttl_ms(),
                ),
                timeout=self.timeout_s,
            )
            return reply.token
        return self.client.acquire(
            self.resource, holder=self.holder,
            ttl_ms=self.ttl_ms(),
        ).token

    def ttl_ms(self) -> int:
        return WRITE_TTL_MS if self.workload in ("write", "read") else CYCLE_TTL_MS

    def _write(self, token: int) -> None:
        if self.mode == "raw":
            self.store.Write(
                self.pb.WriteRequest(
                    resource=self.resource, key=KEY, value=VALUE, token=token, op_id=os.urandom(16)
                ),
                timeout=self.timeout_s,
            )
        else:
            self.client.write(self.resource, KEY, VALUE, token=token)

    def _release(self, token: int) -> None:
        if self.mode == "raw":
            self.lease.Release(
                self.pb.ReleaseRequest(resource=self.resource, token=token, op_id=os.urandom(16)),
                timeout=self.timeout_s,
            )
        else:
            self.client.release(self.resource, token)

    def _read(self) -> None:
        if self.mode == "raw":
            reply = self.store.Read(self.pb.ReadRequest(resource=self.resource, key=KEY), timeout=self.timeout_s)
            found = reply.found
        else:
            found = self.client.read(self.resource, KEY).found
        if not found:
            raise RuntimeError("read did not find the value setup wrote")

    def op(self) -> None:
        """One operation of the workload: ``write`` (fenced write with the held token),
        ``read`` (linearizable read), ``cycle`` (acquire -> write -> release) or ``acqrel``
        (acquire -> release)."""
        if self.workload == "write":
            self._write(self.token)
            return
        if self.workload == "read":
            self._read()
            return
        token = self._acquire()
        try:
            if self.workload == "cycle":
                self._write(token)
        finally:
            self._release(token)

    def acquire_then_write(self) -> None:
        """A failover probe's attempt: a lease on ``resource``, then a write with its token."""
        self._write(self._acquire())

    def recover(self, kind: str) -> None:
        """After a failed op of kind ``kind``: the write workload whose lease is gone takes a
        new token and goes on."""
        if self.workload == "write" and any(reason in kind for reason in LEASE_GONE):
            try:
                self.token = self._acquire()
            except Exception:  # noqa: BLE001
                time.sleep(0.01)

    def error_kind(self, exc: BaseException) -> str | None:
        """The kind of an expected RPC failure, None for anything else (a bench bug)."""
        if self.mode == "raw":
            if isinstance(exc, self.grpc.RpcError):
                return _raw_error_kind(exc)
            return None
        if isinstance(exc, self.error_types):
            reason = getattr(exc, "reason", None)
            return f"{type(exc).__name__}/{reason}" if reason else type(exc).__name__
        return None


def make_client(spec: dict, name: str):
    """The client of ``spec["system"]``: ours (default) or etcd."""
    if spec.get("system") == "etcd":
        from bench._etcd_client import EtcdClient

        return EtcdClient(spec, name)
    return _Client(spec, name)


def _client_thread(spec: dict, name: str, ready: threading.Barrier, go: threading.Event,
                   box: dict, out: dict, lock: threading.Lock) -> None:
    lat = array.array("d")
    errors: collections.Counter = collections.Counter()
    client = None
    try:
        client = make_client(spec, name)
        client.setup()
    except Exception as exc:  # noqa: BLE001 - reported as a setup error
        with lock:
            out["setup_errors"][f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
        client = None
    try:
        ready.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    go.wait()
    if client is None:
        return
    t0 = box["t0"]
    t_meas = t0 + spec["warmup"]
    t_end = t_meas + spec["seconds"]
    now = time.monotonic
    while now() < t0:
        time.sleep(0.001)
    while True:
        start = now()
        if start >= t_end:
            break
        try:
            client.op()
        except Exception as exc:  # noqa: BLE001 - classified below
            kind = client.error_kind(exc) or f"bench-bug/{type(exc).__name__}"
            end = now()
            if t_meas <= end <= t_end:
                errors[kind] += 1
            if kind.startswith("bench-bug") and errors[kind] == 1:
                traceback.print_exc()
            client.recover(kind)
            continue
        end = now()
        if t_meas <= end <= t_end:
            lat.append(end - start)
    client.teardown()
    with lock:
        out["latencies"].extend(lat)
        out["errors"].update(errors)


def _run(spec: dict, conn) -> None:
    threads_n = spec["threads"]
    shared = None
    if spec["mode"] == "mux":
        from coordinator.client import FencingClient

        shared = FencingClient([spec["target"]], multiplex=True)
        shared.status()  # connect and learn the leader before the clock starts
        spec = {**spec, "shared_client": shared}
    try:
        _run_threads(spec, conn, threads_n)
    finally:
        if shared is not None:
            shared.close()


def _run_threads(spec: dict, conn, threads_n: int) -> None:
    out = {"latencies": array.array("d"), "errors": collections.Counter(),
           "setup_errors": collections.Counter()}
    lock = threading.Lock()
    ready = threading.Barrier(threads_n + 1)
    go = threading.Event()
    box: dict = {}
    threads = [
        threading.Thread(
            target=_client_thread,
            args=(spec, f"p{spec['proc']}t{i}", ready, go, box, out, lock),
            name=f"client-{i}", daemon=True,
        )
        for i in range(threads_n)
    ]
    for t in threads:
        t.start()
    try:
        ready.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    conn.send({"ready": True, "setup_errors": dict(out["setup_errors"])})
    msg = conn.recv()
    box["t0"] = msg["t0"]
    cpu0 = os.times()
    go.set()
    for t in threads:
        t.join()
    cpu1 = os.times()
    conn.send({
        "latencies": out["latencies"].tobytes(),
        "errors": dict(out["errors"]),
        "setup_errors": dict(out["setup_errors"]),
        "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
    })


def worker_main(conn) -> None:
    """Entry point of one client process (multiprocessing target)."""
    import grpc  # noqa: F401 - import before the first run, not inside the timed part

    import coordinator.client  # noqa: F401

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg.get("cmd") == "exit":
            return
        if msg.get("cmd") == "prepare":
            try:
                _run(msg, conn)
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                conn.send({"fatal": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})

"""The etcd side of bench.compare: one benchmark client doing our workloads with etcd's API.

Benchmark-only. Owns: how each workload maps onto etcd v3 calls, through the generated stubs
of bench/etcdpb on one ``grpc.Channel`` per client (as our raw clients use theirs). Must
never: retry inside an operation or batch calls (an op is the calls listed, once each), so
that ops/s and latency mean the same for both systems. The timing loop, the processes and
threads are bench._grpc_worker's, shared with our clients.

    acquire  = LeaseGrant(TTL) + Txn(if lock key absent: put lock key with the lease);
               the fencing token is the revision of that Txn (etcd's own advice)
    write    = Txn(if hwm < token + 1: put hwm = token, put data): fenced by the stored hwm
    release  = LeaseRevoke (deletes the lock key)
    read     = Range(data key), linearizable (etcd's default, not serializable)

Tokens are stored as fixed-width decimals so etcd's byte-wise VALUE compare orders them as
numbers. Our acquire is one call where etcd's is two, and our release one like etcd's.
"""

from __future__ import annotations

import grpc

from bench.etcdpb import rpc_pb2 as epb
from bench.etcdpb import rpc_pb2_grpc as epb_grpc

RPC_TIMEOUT_S = 5.0
WRITE_TTL_S = 120  # the write and read workloads hold one lease for the whole run
CYCLE_TTL_S = 5  # a cycle's lease is revoked at once; the TTL only matters after errors
TOKEN_DIGITS = 20  # an int64 revision fits; fixed width makes byte order numeric order
VALUE = b"v" * 64  # = bench._grpc_worker.VALUE


class Refused(Exception):
    """etcd answered, and the Txn's compare failed: the lock is held, or the token is stale."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def token_bytes(token: int) -> bytes:
    return str(token).zfill(TOKEN_DIGITS).encode()


def _put(key: bytes, value: bytes, lease: int = 0) -> epb.RequestOp:
    return epb.RequestOp(request_put=epb.PutRequest(key=key, value=value, lease=lease))


class EtcdClient:
    """The interface bench._grpc_worker drives: setup, op, recover, error_kind, teardown."""

    def __init__(self, spec: dict, name: str) -> None:
        self.spec = spec
        self.workload = spec["workload"]
        self.resource = self.store = f"bench/{spec['run_id']}/{name}"
        self.holder = f"etcd-bench/{name}".encode()
        self.timeout_s = spec.get("rpc_timeout_s", RPC_TIMEOUT_S)
        self.channel = grpc.insecure_channel(spec["target"])
        grpc.channel_ready_future(self.channel).result(timeout=RPC_TIMEOUT_S)
        self.kv = epb_grpc.KVStub(self.channel)
        self.lease = epb_grpc.LeaseStub(self.channel)
        self.token = 0
        self.lease_id = 0

    # The lock key follows ``resource``, which a failover probe changes between attempts; the
    # hwm and data keys stay those of the client's first resource, so the hwm that setup put
    # is there for every attempt (a VALUE compare on a missing key is false), and tokens,
    # being revisions, only grow.
    def _key(self, what: str) -> bytes:
        return f"{self.resource if what == 'lock' else self.store}/{what}".encode()

    # -- the operations ------------------------------------------------------------------

    def acquire(self, ttl_s: int) -> tuple[int, int]:
        """(lease id, fencing token), or Refused("LOCK_HELD")."""
        grant = self.lease.LeaseGrant(epb.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s)
        lock = self._key("lock")
        txn = self.kv.Txn(epb.TxnRequest(
            compare=[epb.Compare(result=epb.Compare.EQUAL, target=epb.Compare.CREATE, key=lock, create_revision=0)],
            success=[_put(lock, self.holder, grant.ID)],
        ), timeout=self.timeout_s)
        if not txn.succeeded:
            raise Refused("LOCK_HELD")
        return grant.ID, txn.header.revision

    def write(self, token: int) -> None:
        hwm = self._key("hwm")
        txn = self.kv.Txn(epb.TxnRequest(
            compare=[epb.Compare(result=epb.Compare.LESS, target=epb.Compare.VALUE, key=hwm,
                                 value=token_bytes(token + 1))],
            success=[_put(hwm, token_bytes(token)), _put(self._key("data"), VALUE)],
        ), timeout=self.timeout_s)
        if not txn.succeeded:
            raise Refused("STALE_TOKEN")

    def release(self, lease_id: int) -> None:
        self.lease.LeaseRevoke(epb.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout_s)

    def read(self) -> None:
        reply = self.kv.Range(epb.RangeRequest(key=self._key("data")), timeout=self.timeout_s)
        if not reply.kvs:
            raise RuntimeError("read did not find the value setup wrote")

    # -- what the worker calls -------------------------------------------------------------

    def init_hwm(self) -> None:
        """A VALUE compare on a missing key is false: the fenced write needs an hwm to compare."""
        self.kv.Put(epb.PutRequest(key=self._key("hwm"), value=token_bytes(0)), timeout=self.timeout_s)

    def setup(self) -> None:
        """Untimed: the hwm key; for write and read a lease held for the run (read: and the
        value it reads). The worker retries nothing here; an election fails setup loudly."""
        self.init_hwm()
        if self.workload in ("write", "read"):
            self.lease_id, self.token = self.acquire(WRITE_TTL_S)
            if self.workload == "read":
                self.write(self.token)

    def op(self) -> None:
        if self.workload == "write":
            self.write(self.token)
            return
        if self.workload == "read":
            self.read()
            return
        lease_id, token = self.acquire(CYCLE_TTL_S)
        try:
            if self.workload == "cycle":
                self.write(token)
        finally:
            self.release(lease_id)

    def acquire_then_write(self) -> None:
        """A failover probe's attempt: a lease on ``resource``, then a write with its token."""
        self.write(self.acquire(CYCLE_TTL_S)[1])

    def recover(self, kind: str) -> None:
        """The held lease of the write workload expired (a stall longer than its TTL): the
        lock is free again, take it with a new token."""
        if self.workload == "write" and kind.endswith("STALE_TOKEN"):
            try:
                self.lease_id, self.token = self.acquire(WRITE_TTL_S)
            except (grpc.RpcError, Refused):
                pass

    def error_kind(self, exc: BaseException) -> str | None:
        if isinstance(exc, Refused):
            return f"etcd/{exc.reason}"
        if isinstance(exc, grpc.RpcError):
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            return f"etcd/{code.name if isinstance(code, grpc.StatusCode) else '?'}"
        return None

    def teardown(self) -> None:
        try:
            if self.lease_id:
                self.release(self.lease_id)
        except grpc.RpcError:
            pass  # best effort: the lease expires by itself
        self.channel.close()


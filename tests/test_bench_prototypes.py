"""The member prototypes ``bench compare --ours-client loop,front`` measures against the shipped
member (issue 17, point 3): bench/_loop_node.py (no Raft thread: pysyncobj ticked from the
asyncio loop that serves the calls) and bench/_front_node.py (front processes feeding the
Raft process). Three real members of each kind; their extra port answers Acquire, Write and
Release as the shipped API does, fencing included, while the shipped services keep working."""

from __future__ import annotations

import os

import grpc
import pytest
from grpc_status import rpc_status

from bench import _front_node, _loop_node
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.core.names import ErrorReason
from testsupport.grpc_cluster import GrpcCluster

RPC_TIMEOUT_S = 10.0


PROTOTYPES = {"loop": (_loop_node, _loop_node.loop_address), "front": (_front_node, _front_node.front_address)}


@pytest.fixture(scope="module", params=sorted(PROTOTYPES))
def prototype(tmp_path_factory, request):
    module, address_of = PROTOTYPES[request.param]

    class PrototypeCluster(GrpcCluster):
        def command(self, node) -> list[str]:
            return module.command(node.config_path)

    with PrototypeCluster(str(tmp_path_factory.mktemp(request.param))) as cluster:
        try:
            cluster.start_all()
        except BaseException:
            print(cluster.logs())
            raise
        yield cluster, address_of


def reason_of(error: grpc.RpcError) -> str:
    from google.rpc import error_details_pb2

    for detail in rpc_status.from_call(error).details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


def test_the_prototype_port_fences_writes_like_the_api(prototype):
    cluster, address_of = prototype
    leader = cluster.nodes[cluster.wait_ready()]
    # The front processes bind their port after the member is READY: the first call waits.
    with grpc.insecure_channel(address_of(leader.api_address)) as channel:
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_S)
        lease, store = pb_grpc.LeaseStub(channel), pb_grpc.FencedStoreStub(channel)
        first = lease.Acquire(pb.AcquireRequest(resource="loop/r", holder="a", ttl_ms=60_000, op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S)
        written = store.Write(pb.WriteRequest(resource="loop/r", key="k", value=b"1", token=first.token, op_id=os.urandom(16)),
                              timeout=RPC_TIMEOUT_S)
        assert written.hwm == first.token
        released = lease.Release(pb.ReleaseRequest(resource="loop/r", token=first.token), timeout=RPC_TIMEOUT_S)
        assert released.released
        second = lease.Acquire(pb.AcquireRequest(resource="loop/r", holder="b", ttl_ms=60_000, op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S)
        assert second.token > first.token
        with pytest.raises(grpc.RpcError) as stale:
            store.Write(pb.WriteRequest(resource="loop/r", key="k", value=b"old", token=first.token, op_id=os.urandom(16)),
                        timeout=RPC_TIMEOUT_S)
        assert stale.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(stale.value) == ErrorReason.STALE_TOKEN
    # The shipped services, beside the prototype's port, see what it wrote.
    with grpc.insecure_channel(leader.api_address) as channel:
        read = pb_grpc.FencedStoreStub(channel).Read(pb.ReadRequest(resource="loop/r", key="k"), timeout=RPC_TIMEOUT_S)
    assert (read.found, read.value, read.hwm) == (True, b"1", second.token)
    statuses = cluster.statuses()
    assert len(statuses) == 3 and {s.leader for s in statuses.values()} == {leader.raft_address}

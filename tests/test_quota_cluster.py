"""Quotas per principal and forgotten resources, on three real ``fencingd serve`` processes.

Issue 14 findings, reproduced through the API with a principals file: one tenant could fill
the cluster's resource limit for everyone (no quota, and released resources were never
forgotten), and one principal's 64 KiB writes grew every member without bound. Each quota is
reached here and answered RESOURCE_EXHAUSTED with ErrorInfo reason QUOTA_EXCEEDED naming it,
while another tenant is still served.
"""

from __future__ import annotations

import os
import queue

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.client.exceptions import QuotaExceeded
from coordinator.core.names import ErrorMeta, ErrorReason
from coordinator.server.auth import token_digest
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
TTL_MS = 60_000
VALUE_BYTES = 64 * 1024  # the largest value (limits.VALUE_BYTES_MAX), as in the finding
# name -> (bearer token, principals-file lines after name/token)
TENANTS = {
    "alpha": ("alpha-secret", 'prefixes = ["alpha/"]\nresources_max = 3'),
    "beta": ("beta-secret", 'prefixes = ["beta/"]'),  # the defaults
    "bulk": ("bulk-secret", f'prefixes = ["bulk/"]\nstored_bytes_max = {2 * VALUE_BYTES + 100}'),
    "churn": ("churn-secret", 'prefixes = ["churn/"]\nresources_max = 2'),
    "lapse": ("lapse-secret", 'prefixes = ["lapse/"]\nresources_max = 2'),
    "streamer": ("streamer-secret", 'prefixes = ["s/"]\nstreams_max = 2'),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("quota")
    path = base / "principals.toml"
    path.write_text(
        "\n".join(
            f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{token_digest(token)}"\n{lines}\n'
            for name, (token, lines) in TENANTS.items()
        )
    )
    yield from running_cluster(str(base), request, settings={"principals_file": str(path)})


def client(cluster, tenant: str) -> FencingClient:
    return FencingClient([n.api_address for n in cluster.nodes], bearer_token=TENANTS[tenant][0])


def bearer(tenant: str) -> tuple:
    return (("authorization", f"Bearer {TENANTS[tenant][0]}"),)


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)
    info = error_details_pb2.ErrorInfo()
    assert status is not None and status.details[0].Unpack(info)
    return info


def test_a_tenant_at_its_resource_quota_is_refused_while_another_still_acquires(cluster):
    node = cluster.nodes[0]
    with client(cluster, "alpha") as alpha, client(cluster, "beta") as beta:
        leases = [alpha.acquire(f"alpha/{n}", holder="h", ttl_ms=TTL_MS) for n in range(3)]
        # The raw answer: RESOURCE_EXHAUSTED, reason QUOTA_EXCEEDED, naming the quota.
        request = pb.AcquireRequest(resource="alpha/3", holder="h", ttl_ms=TTL_MS, op_id=os.urandom(16))
        with pytest.raises(grpc.RpcError) as caught:
            node.lease.Acquire(request, timeout=T, metadata=bearer("alpha"))
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(caught.value)
        assert info.reason == ErrorReason.QUOTA_EXCEEDED
        assert dict(info.metadata) == {ErrorMeta.QUOTA: "resources", ErrorMeta.MAX: "3", ErrorMeta.PRINCIPAL: "alpha"}
        # The client raises it as QuotaExceeded; nothing was applied.
        with pytest.raises(QuotaExceeded) as refused:
            alpha.acquire("alpha/3", holder="h", ttl_ms=TTL_MS)
        assert (refused.value.quota, refused.value.max) == ("resources", 3)
        assert alpha.describe("alpha/3").hwm == 0
        # Another tenant is not affected by alpha's quota.
        assert beta.acquire("beta/0", holder="h", ttl_ms=TTL_MS).token > leases[-1].token
        # Releasing one (no data: forgotten) gives alpha its slot back.
        alpha.release("alpha/0", token=leases[0].token)
        assert alpha.acquire("alpha/3", holder="h", ttl_ms=TTL_MS).token > 0


def test_a_tenant_writing_big_values_reaches_its_stored_bytes_quota(cluster):
    with client(cluster, "bulk") as bulk, client(cluster, "beta") as beta:
        lease = bulk.acquire("bulk/blob", holder="h", ttl_ms=TTL_MS)
        for n in range(2):
            bulk.write("bulk/blob", f"k{n}", os.urandom(VALUE_BYTES), token=lease.token)
        with pytest.raises(QuotaExceeded) as refused:
            bulk.write("bulk/blob", "k2", os.urandom(VALUE_BYTES), token=lease.token)
        assert (refused.value.quota, refused.value.max) == ("stored_bytes", 2 * VALUE_BYTES + 100)
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not bulk.read("bulk/blob", "k2").found
        # Overwriting in place and deleting stay possible; a delete frees room.
        bulk.write("bulk/blob", "k0", b"small", token=lease.token)
        bulk.write("bulk/blob", "k2", os.urandom(VALUE_BYTES), token=lease.token)
        other = beta.acquire("beta/blob", holder="h", ttl_ms=TTL_MS)
        beta.write("beta/blob", "k", os.urandom(VALUE_BYTES), token=other.token)


def test_released_resources_with_no_data_are_forgotten_and_no_longer_count(cluster):
    with client(cluster, "churn") as churn:
        tokens = []
        for n in range(6):  # three times churn's resources quota, one after another
            lease = churn.acquire(f"churn/job-{n}", holder="h", ttl_ms=TTL_MS)
            churn.release(f"churn/job-{n}", token=lease.token)
            tokens.append(lease.token)
            assert churn.describe(f"churn/job-{n}").hwm == 0  # no entry left
        assert tokens == sorted(set(tokens))
        # The global epoch still fences the old holders: a write with a forgotten token is
        # refused, whether the resource was acquired again or not.
        again = churn.acquire("churn/job-0", holder="h", ttl_ms=TTL_MS)
        assert again.token > tokens[-1]
        for resource, token in (("churn/job-0", tokens[0]), ("churn/job-1", tokens[1])):
            with pytest.raises(Exception) as caught:
                churn.write(resource, "k", b"v", token=token)
            assert getattr(caught.value, "reason", "") in (ErrorReason.STALE_TOKEN, ErrorReason.UNKNOWN_TOKEN)
            assert not churn.read(resource, "k").found


def test_expired_resources_are_forgotten_by_the_leaders_tick_without_a_release(cluster):
    # lapse fills its resources quota with short leases whose holders never come back. The
    # leader's TICK (every lease_tick_interval_s, 1 s by default) forgets them once they have
    # expired: before the leader proposed TICKs, each stayed stored (Describe: hwm 1) and kept
    # counting against RESOURCES_MAX until lapse itself reached its quota again.
    with client(cluster, "lapse") as lapse:
        first = [lapse.acquire(f"lapse/old-{n}", holder="h", ttl_ms=2_000) for n in range(2)]
        with pytest.raises(QuotaExceeded):
            lapse.acquire("lapse/while-held", holder="h", ttl_ms=TTL_MS)

        def all_forgotten():
            hwms = [lapse.describe(f"lapse/old-{n}").hwm for n in range(2)]
            return hwms if hwms == [0, 0] else None

        wait_until(all_forgotten, 15.0, interval_s=0.2, what="the TICK to forget expired resources")
        fresh = [lapse.acquire(f"lapse/new-{n}", holder="h", ttl_ms=TTL_MS) for n in range(2)]
        assert min(f.token for f in fresh) > max(f.token for f in first)
        # The forgotten holders stay fenced: a write with their token is refused.
        with pytest.raises(Exception) as caught:
            lapse.write("lapse/old-0", "k", b"v", token=first[0].token)
        assert getattr(caught.value, "reason", "") == ErrorReason.UNKNOWN_TOKEN


class _Stream:
    """One KeepAliveStream whose requests the test feeds one at a time."""

    def __init__(self, node, tenant: str, request: pb.KeepAliveRequest) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._request = request
        self.call = node.lease.KeepAliveStream(iter(self._requests.get, None), timeout=60, metadata=bearer(tenant))

    def renew(self) -> pb.KeepAliveResponse:
        self._requests.put(self._request)
        return next(self.call)

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def test_a_tenant_at_its_streams_quota_is_refused_another_stream_and_gets_it_back(cluster):
    node = cluster.nodes[0]  # streams are counted per member
    with client(cluster, "streamer") as streamer, client(cluster, "beta") as beta:
        mine = streamer.acquire("s/0", holder="h", ttl_ms=TTL_MS)
        theirs = beta.acquire("beta/streamed", holder="h", ttl_ms=TTL_MS)
    request = pb.KeepAliveRequest(resource="s/0", token=mine.token)
    open_streams = [_Stream(node, "streamer", request) for _ in range(2)]
    try:
        for stream in open_streams:
            assert stream.renew().token == mine.token  # the server holds both now
        third = _Stream(node, "streamer", request)
        with pytest.raises(grpc.RpcError) as caught:
            third.renew()
        third.close()
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(caught.value)
        assert (info.reason, info.metadata[ErrorMeta.QUOTA], info.metadata[ErrorMeta.MAX]) == (
            ErrorReason.QUOTA_EXCEEDED, "streams", "2"
        )
        # Another principal's stream is not affected.
        other = _Stream(node, "beta", pb.KeepAliveRequest(resource="beta/streamed", token=theirs.token))
        assert other.renew().token == theirs.token
        other.close()
        # Closing one gives the slot back (once the server has seen the stream end).
        open_streams.pop().close()

        def reopened():
            stream = _Stream(node, "streamer", request)
            try:
                stream.renew()
            except grpc.RpcError:
                stream.close()
                return None
            open_streams.append(stream)
            return stream

        wait_until(reopened, timeout_s=10, what="a stream slot given back")
    finally:
        for stream in open_streams:
            stream.close()

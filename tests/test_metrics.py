"""Prometheus metrics: the RPC interceptor on a real gRPC server, the config checks, and a
three-process cluster scraped over HTTP.

Figures are read back from the exposition text a scraper sees (prometheus_client's own
parser), not from the objects that produced them.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.raft.interface import ProposeOutcome
from coordinator.server import config as config_mod
from coordinator.server.metrics import PROPOSAL_OUTCOMES, Metrics, build_versions
from testsupport.grpc_cluster import RPC_TIMEOUT_S, metered_cluster
from testsupport.supervisor import DEFAULT_HOSTS, pick_ports, wait_until

T = RPC_TIMEOUT_S
WRITE = {"grpc_service": "fencing.v1.FencedStore", "grpc_method": "Write", "grpc_type": "unary"}
KEEPALIVE = {"grpc_service": "fencing.v1.Lease", "grpc_method": "KeepAliveStream", "grpc_type": "bidi_stream"}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


# -- the interceptor, on a real in-process gRPC server -----------------------------------


class _Store(pb_grpc.FencedStoreServicer):
    def Write(self, request, context):
        if request.token == 1:
            return pb.WriteResponse(version=1)
        if request.token == 2:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "stale")
        raise RuntimeError("handler bug")


class _Lease(pb_grpc.LeaseServicer):
    def KeepAliveStream(self, request_iterator, context):
        for request in request_iterator:
            if request.token == 0:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token 0")
            yield pb.KeepAliveResponse(token=request.token)


@pytest.fixture
def instrumented():
    metrics = Metrics()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4), interceptors=[metrics.interceptor()])
    pb_grpc.add_FencedStoreServicer_to_server(_Store(), server)
    pb_grpc.add_LeaseServicer_to_server(_Lease(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield metrics, channel
    finally:
        channel.close()
        server.stop(0)


def scrape_registry(metrics: Metrics) -> dict:
    from prometheus_client import generate_latest

    return samples(generate_latest(metrics.registry).decode())


def test_interceptor_counts_each_status_code_and_times_every_call(instrumented):
    metrics, channel = instrumented
    store = pb_grpc.FencedStoreStub(channel)
    for _ in range(3):
        store.Write(pb.WriteRequest(token=1), timeout=T)
    for token, code in ((2, grpc.StatusCode.FAILED_PRECONDITION), (3, grpc.StatusCode.UNKNOWN)):
        with pytest.raises(grpc.RpcError) as caught:
            store.Write(pb.WriteRequest(token=token), timeout=T)
        assert caught.value.code() is code
    found = scrape_registry(metrics)
    # go-grpc-prometheus's names, labels and code spellings: its dashboards work unchanged.
    assert value(found, "grpc_server_started_total", **WRITE) == 5
    assert value(found, "grpc_server_handled_total", **WRITE, grpc_code="OK") == 3
    assert value(found, "grpc_server_handled_total", **WRITE, grpc_code="FailedPrecondition") == 1
    assert value(found, "grpc_server_handled_total", **WRITE, grpc_code="Unknown") == 1
    assert value(found, "grpc_server_handling_seconds_count", **WRITE) == 5
    assert value(found, "grpc_server_handling_seconds_sum", **WRITE) > 0
    assert value(found, "grpc_server_msg_received_total", **WRITE) == 5
    assert value(found, "grpc_server_msg_sent_total", **WRITE) == 3  # a failed call sends no reply
    assert not any(name.endswith("_created") for name, _ in found)


def test_interceptor_counts_a_stream_once_with_its_final_code(instrumented):
    metrics, channel = instrumented
    lease = pb_grpc.LeaseStub(channel)
    replies = list(lease.KeepAliveStream(iter([pb.KeepAliveRequest(token=t) for t in (4, 5)]), timeout=T))
    assert [r.token for r in replies] == [4, 5]
    with pytest.raises(grpc.RpcError) as caught:
        list(lease.KeepAliveStream(iter([pb.KeepAliveRequest(token=t) for t in (6, 0, 7)]), timeout=T))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    found = scrape_registry(metrics)
    assert value(found, "grpc_server_started_total", **KEEPALIVE) == 2
    assert value(found, "grpc_server_handled_total", **KEEPALIVE, grpc_code="OK") == 1
    assert value(found, "grpc_server_handled_total", **KEEPALIVE, grpc_code="InvalidArgument") == 1
    assert value(found, "grpc_server_msg_received_total", **KEEPALIVE) == 4  # 4, 5; 6, 0 (7 never read)
    assert value(found, "grpc_server_msg_sent_total", **KEEPALIVE) == 3  # 4, 5; 6


def test_every_proposal_outcome_has_a_label():
    assert {o.value for o in ProposeOutcome} | {"overloaded"} == set(PROPOSAL_OUTCOMES)


# -- configuration ---------------------------------------------------------------------------


BASE = {
    "data_dir": "/tmp/unused",
    "raft_address": "127.0.0.1:7000",
    "members": ["127.0.0.1:7000=127.0.0.1:7100", "127.0.0.2:7000=127.0.0.2:7100", "127.0.0.3:7000=127.0.0.3:7100"],
}


def test_metrics_are_off_unless_an_address_is_given():
    assert config_mod.build(BASE, {}).metrics_address == ""
    assert config_mod.build(BASE, {"metrics_address": "127.0.0.1:9100"}).metrics_address == "127.0.0.1:9100"


@pytest.mark.parametrize(
    "address, fragment",
    [
        ("localhost", "not HOST:PORT"),
        ("127.0.0.1:0", "not HOST:PORT"),
        ("127.0.0.1:7000", "also raft_address"),
        ("127.0.0.1:7100", "also the gRPC address"),
    ],
)
def test_a_bad_metrics_address_is_refused_by_name(address, fragment):
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.build(BASE, {"metrics_address": address})
    assert "metrics_address" in str(caught.value) and fragment in str(caught.value)


# -- a real cluster, scraped over HTTP --------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from metered_cluster(str(tmp_path_factory.mktemp("metrics")), request)


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=T) as reply:
        assert reply.status == 200
        return samples(reply.read().decode())


def test_a_scrape_shows_rpcs_proposals_and_the_raft_state(cluster):
    leader = cluster.wait_ready()
    node = cluster.nodes[leader]
    before = scrape(cluster.metrics_urls[leader])
    resource = f"metrics/{os.urandom(4).hex()}"
    token = node.lease.Acquire(
        pb.AcquireRequest(resource=resource, holder="m", ttl_ms=60_000, op_id=os.urandom(16)), timeout=T
    ).token
    node.store.Write(
        pb.WriteRequest(resource=resource, key="k", value=b"v", token=token, op_id=os.urandom(16)), timeout=T
    )
    assert node.lease.Release(pb.ReleaseRequest(resource=resource, token=token), timeout=T).released
    node.lease.Acquire(  # a second holder: the first token is now stale
        pb.AcquireRequest(resource=resource, holder="m2", ttl_ms=60_000, op_id=os.urandom(16)), timeout=T
    )
    with pytest.raises(grpc.RpcError) as caught:
        node.store.Write(
            pb.WriteRequest(resource=resource, key="k", value=b"old", token=token, op_id=os.urandom(16)), timeout=T
        )
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    after = scrape(cluster.metrics_urls[leader])

    def grew(name, **labels):
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    assert grew("grpc_server_handled_total", **WRITE, grpc_code="OK") == 1
    assert grew("grpc_server_handled_total", **WRITE, grpc_code="FailedPrecondition") == 1
    assert grew("grpc_server_handling_seconds_count", **WRITE) == 2
    assert grew("fencing_proposals_total", outcome="applied") >= 4  # acquire, write, release, acquire
    assert grew("fencing_proposals_total", outcome="refused") == 1  # the stale write
    assert grew("fencing_proposal_duration_seconds_count") >= 5
    assert grew("fencing_journal_syncs_total") >= 1
    assert grew("fencing_journal_fsync_duration_seconds_count") >= 1
    assert value(after, "fencing_raft_leader_changes_seen_total") >= 1  # it saw itself elected
    assert value(after, "fencing_raft_has_leader") == 1
    assert value(after, "fencing_raft_refused_cluster_ids_total") == 0  # test_raft_overrides counts one
    assert value(after, "fencing_build_info", **build_versions()) == 1
    assert not any(name.endswith("_created") for name, _ in after)
    assert value(after, "fencing_raft_is_leader") == 1
    assert value(after, "fencing_raft_has_quorum") == 1
    assert value(after, "fencing_serving") == 1
    assert value(after, "fencing_epoch") >= token + 1
    assert value(after, "fencing_raft_applied_index") > value(before, "fencing_raft_applied_index")
    # No label that an election changes: the info series stays one series.
    assert value(after, "fencing_member_info", member_id=node.raft_address, api_address=node.api_address) == 1
    assert value(after, "process_resident_memory_bytes") > 0

    applied = value(after, "fencing_raft_applied_index")
    for i in range(3):
        if i == leader:
            continue
        # A follower serves metrics too: not the leader, and it applies the same log.
        wait_until(lambda i=i: value(scrape(cluster.metrics_urls[i]), "fencing_raft_applied_index") >= applied,
                   timeout_s=10, what=f"member {i} to apply index {applied}")
        assert value(scrape(cluster.metrics_urls[i]), "fencing_raft_is_leader") == 0


def test_connections_the_endpoint_refuses_are_counted(cluster):
    leader = cluster.wait_ready()
    url = cluster.metrics_urls[leader]
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    cap = config_mod.ServerConfig.__dataclass_fields__["metrics_connections_max"].default
    before = value(scrape(url), "fencing_metrics_connections_refused_total")
    held = []
    try:
        for _ in range(cap):  # every slot taken by a client that sends nothing yet
            held.append(socket.create_connection((host, int(port)), timeout=T))
        # The one past the cap is closed on arrival: an empty read, not a wait for the timeout.
        extra = socket.create_connection((host, int(port)), timeout=T)
        held.append(extra)
        assert closed_by_peer(extra)
    finally:
        for sock in held:
            sock.close()
    # The held connections end as the member reads their EOF: the scrape waits for a free slot.
    after = wait_until(lambda: scrape_or_none(url), timeout_s=T, what="a scrape once the held connections are gone")
    assert value(after, "fencing_metrics_connections_refused_total") - before >= 1


def closed_by_peer(sock: socket.socket) -> bool:
    """The far end closed ``sock``: an empty read (or a reset) before the socket's timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def scrape_or_none(url: str) -> dict | None:
    try:
        return scrape(url)
    except (urllib.error.URLError, ConnectionError):
        return None


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=T) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_only_metrics_and_readyz_are_served(cluster):
    leader = cluster.wait_ready()
    base = cluster.metrics_urls[leader].removesuffix("/metrics")
    for path in ("/", "/metric", "/metrics/extra", "/healthz"):
        assert http_get(base + path)[0] == 404, path
    wait_until(lambda: http_get(base + "/readyz") == (200, b"ok\n"), timeout_s=10, what="/readyz to say ok")
    status, body = http_get(base + "/metrics")
    assert status == 200 and b"grpc_server_handled_total" in body


def test_a_metrics_port_in_use_stops_the_member_with_a_clear_error(tmp_path):
    import socket
    import subprocess
    import sys

    raft_port, api_port = pick_ports(DEFAULT_HOSTS[:1])
    host = DEFAULT_HOSTS[0]
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        metrics_address = f"{host}:{taken.getsockname()[1]}"
        proc = subprocess.run(
            [sys.executable, "-m", "coordinator.server.fencingd", "serve", "--data-dir", str(tmp_path / "d"),
             "--raft-address", f"{host}:{raft_port}", "--members", f"{host}:{raft_port}={host}:{api_port}",
             "--metrics-address", metrics_address, "--log-level", "WARNING"],
            capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    assert f"fencingd: cannot start: [Errno 98] metrics_address {metrics_address}" in proc.stderr
    assert "Traceback" not in proc.stderr

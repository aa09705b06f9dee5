"""The proposal gate of rolling upgrades (DESIGN §8): a request that needs an entry level above
the cluster's is refused before anything is proposed, with FAILED_PRECONDITION naming both
levels; once the cluster's level is raised it applies. And a member announces its levels
through the health service, where a build of the release before levels answers NOT_FOUND.

In-process servers on one shared log (testsupport/inmemory.py): no member processes. The
rolling upgrade itself, from the previous release under load, is tests/test_rolling_upgrade.py.
"""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.client import FencingClient
from coordinator.client import exceptions as E
from coordinator.core import commands
from coordinator.core.names import ErrorMeta, ErrorReason
from coordinator.server import level_poller
from testsupport.inmemory import InMemoryCluster

FAST = dict(timeout_s=3.0, attempt_timeout_s=0.5, retry_backoff_s=0.01, retry_backoff_max_s=0.05)


def test_a_conditional_delete_is_refused_below_level_2_and_applies_at_it():
    with InMemoryCluster() as cluster, FencingClient(cluster.endpoints, **FAST) as client:
        lease = client.acquire("orders/7", ttl_ms=30_000, holder="a")
        version = client.write("orders/7", "k", b"v", token=lease.token).version
        entries = cluster.log.applied_index
        with pytest.raises(E.Refused) as info:
            client.delete("orders/7", "k", token=lease.token, expected_version=version)
        error = info.value
        assert error.reason == ErrorReason.CLUSTER_LEVEL_TOO_LOW
        assert error.metadata == {ErrorMeta.NEEDED_LEVEL: "2", ErrorMeta.CLUSTER_LEVEL: "1"}
        assert "needs entry level 2" in str(error) and "cluster is at level 1" in str(error)
        assert cluster.log.applied_index == entries  # nothing was proposed
        assert client.read("orders/7", "k").found  # and nothing deleted
        # An unconditional delete is level 1: it is never gated.
        assert client.write("orders/7", "j", b"w", token=lease.token).version

        cluster.log.append(commands.set_cluster_level(level=2, stamp_ms=0).encode())
        assert cluster.state_machine.cluster_level == 2
        with pytest.raises(E.VersionMismatch):
            client.delete("orders/7", "k", token=lease.token, expected_version=version + 5)
        assert client.delete("orders/7", "k", token=lease.token, expected_version=version).deleted
        assert not client.read("orders/7", "k").found


def _health_server(levels: list[str]) -> tuple[grpc.Server, health.HealthServicer, str]:
    """A gRPC server with the standard health service, SERVING the names ``levels``."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    for name in levels:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


def test_a_member_announces_its_levels_and_an_old_build_counts_as_level_1():
    # This build: what app.py serves from start (tests/test_rolling_upgrade.py reads it from
    # real member processes).
    assert level_poller.announced_services() == [f"fencing.entry_level.{n}" for n in (2, 3, 4)]
    new, new_health, new_address = _health_server(level_poller.announced_services())
    # The release before levels: a health service that knows nothing of them.
    old, _, old_address = _health_server([])
    try:
        assert level_poller.member_level(new_address, 1) == commands.ENTRY_LEVEL == 4
        assert level_poller.member_level(old_address, 1) == 1
        # Shutting down (NOT_SERVING): unknown, never taken for a level.
        new_health.enter_graceful_shutdown()
        assert level_poller.member_level(new_address, 1) is None
    finally:
        new.stop(0)
        old.stop(0)
    assert level_poller.member_level(old_address, 1, timeout_s=0.2) is None  # unreachable

"""Snapshots and restores larger than one gRPC message, on three real fencingd processes.

A backup of ~20 MiB (five times the old 4 MiB ceiling) and the fullest backup the limits
allow (~167 MB, testsupport.backups) are restored through the client (RestoreStream, then
RESTORE_BEGIN/CHUNK/COMMIT entries) and snapshotted back (SnapshotStream): the state that
comes back is the backup fenced as DESIGN I11 says, byte for byte but for the log clock, and
every member holds the same state. A backup the state machine would refuse is refused
before anything is proposed. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import time

import grpc
import msgpack
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.client import exceptions as E
from coordinator.core import limits
from coordinator.core.snapshot_format import SNAPSHOT_FORMAT_VERSION
from testsupport.backups import backup_of_size, fullest_backup
from testsupport.grpc_cluster import RPC_TIMEOUT_S, SERVING, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
# The fullest backup: ~160 entries of 1 MiB through three fsyncing members, each read as it is
# applied (~20 ms each here, ~1 s on a machine loaded many times over), then every member
# compacting the restored state; a generous bound, as the machine may be shared.
BACKUP_TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from running_cluster(str(tmp_path_factory.mktemp("backups")), request)


@pytest.fixture()
def client(cluster):
    with FencingClient(cluster.endpoints) as c:
        yield c


def fenced(backup: bytes, epoch: int, clock: int) -> bytes:
    """What a restore of ``backup`` at ``epoch`` leaves, as a backup: every resource at hwm
    ``epoch`` without a lease, that hwm one that only fenced it (a lease slot of false, format
    4: DESIGN I3), no dedup entries, the log clock ``clock`` (the cluster's)."""
    doc = msgpack.unpackb(backup, raw=False)
    for resource in doc[4]:
        resource[1], resource[3] = epoch, False
    doc[1] = SNAPSHOT_FORMAT_VERSION
    doc[2], doc[3], doc[5] = epoch, clock, []
    return msgpack.packb(doc, use_bin_type=True)


def restore_and_snapshot_back(cluster, client, backup: bytes) -> dict[str, float]:
    timings = {}
    floor = client.status().epoch + 10
    started = time.perf_counter()
    restored = client.restore(backup, epoch_floor=floor, timeout_s=BACKUP_TIMEOUT_S)
    timings["restore_s"] = time.perf_counter() - started
    assert restored.epoch >= floor
    started = time.perf_counter()
    snap = client.snapshot(timeout_s=BACKUP_TIMEOUT_S)
    timings["snapshot_s"] = time.perf_counter() - started
    # Byte for byte the backup as the restore fenced it, with the cluster's own log clock.
    assert snap.data == fenced(backup, restored.epoch, _log_clock(snap.data))
    assert snap.epoch == restored.epoch

    def agreed():
        local = [FencingClient([node.api_address]).__enter__() for node in cluster.nodes]
        try:
            copies = [c.snapshot(local=True, timeout_s=BACKUP_TIMEOUT_S) for c in local]
        finally:
            for c in local:
                c.close()
        same = {_strip_clock(copy.data) for copy in copies}
        return copies if len(same) == 1 else None

    started = time.perf_counter()
    copies = wait_until(agreed, BACKUP_TIMEOUT_S, what="every member to hold the restored state")
    timings["members_agree_s"] = time.perf_counter() - started
    assert _strip_clock(copies[0].data) == _strip_clock(snap.data)
    for node in cluster.nodes:
        node.check_running()
        assert node.health_status() == SERVING
    timings["bytes"] = len(snap.data)
    return timings


def _log_clock(data: bytes) -> int:
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data))
    unpacker.feed(data)
    unpacker.read_array_header()
    unpacker.skip(), unpacker.skip(), unpacker.skip()  # magic, version, epoch
    return unpacker.unpack()


def _strip_clock(data: bytes) -> bytes:
    doc = msgpack.unpackb(data, raw=False)
    doc[3] = 0
    return msgpack.packb(doc, use_bin_type=True)


def test_a_backup_five_times_the_unary_limit_is_restored_and_snapshotted_back(cluster, client):
    backup = backup_of_size(20 * 1024 * 1024)
    assert len(backup) > 4 * limits.RESTORE_SNAPSHOT_BYTES_MAX
    timings = restore_and_snapshot_back(cluster, client, backup)
    print(f"20 MiB backup: {timings}")
    # The unary call is refused with a pointer to the streaming one, not gRPC's size error.
    with pytest.raises(grpc.RpcError) as caught:
        cluster.nodes[0].admin.Snapshot(pb.SnapshotRequest(), timeout=T)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "SnapshotStream" in caught.value.details()


def test_the_fullest_backup_the_limits_allow_is_restored_and_snapshotted_back(cluster, client):
    started = time.perf_counter()
    backup = fullest_backup()
    built_s = time.perf_counter() - started
    timings = restore_and_snapshot_back(cluster, client, backup)
    print(f"fullest backup: {len(backup):,} bytes (bound {limits.BACKUP_BYTES_MAX:,}), built in"
          f" {built_s:.1f} s; {timings}")


def test_a_backup_the_state_machine_would_refuse_is_refused_before_it_is_proposed(cluster, client):
    before = client.status()
    poisoned = msgpack.packb(["fencing-coordinator/state", 2, 5, 0, [["r", 5, 2**64 - 1, None, []]], [], None])
    with pytest.raises(E.InvalidArgument) as caught:
        client.restore(poisoned, epoch_floor=before.epoch + 10)
    assert caught.value.field == "data" and "revision" in str(caught.value)
    # A floor in a later message than the first is refused too (the server reads it once).
    node = cluster.nodes[1]
    messages = iter([pb.RestoreStreamRequest(epoch_floor=before.epoch + 10, data=poisoned[:5]),
                     pb.RestoreStreamRequest(epoch_floor=1, data=poisoned[5:])])
    with pytest.raises(grpc.RpcError) as refused:
        node.admin.RestoreStream(messages, timeout=T)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = client.status()
    assert after.epoch == before.epoch
    for node in cluster.nodes:
        node.check_running()
        assert node.health_status() == SERVING

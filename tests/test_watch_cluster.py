"""Watch on a real three-process cluster (issue 29 point 3, "done when"): a watcher whose
member is SIGKILLed mid-stream resumes on another member from its last revision + 1 and
sees every acknowledged write exactly once, in log order, at the revision (log index) its
writer was told."""

from __future__ import annotations

import threading
import time

import pytest

from coordinator.client.sync import FencingClient

DEADLINE_S = 60.0
WRITES = 40
KILL_AFTER = 15


@pytest.fixture
def cluster(tmp_path, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path / "cluster"), request)


def test_a_watcher_that_loses_its_member_resumes_and_sees_every_write_once(cluster):
    eps = [n.api_address for n in cluster.nodes]
    leader = cluster.leader_index()
    streamed_from = (leader + 1) % 3  # a follower: the writes go on while it is down
    order = [eps[streamed_from], *(ep for i, ep in enumerate(eps) if i != streamed_from)]
    with FencingClient(eps) as writer, FencingClient(order) as reader:
        lease = writer.acquire("watched/a", ttl_ms=60_000, holder="w")
        watcher = reader.watch("watched/", start_revision=lease.header.applied_index)
        seen: list = []
        failed: list = []

        def read() -> None:
            try:
                for event in watcher:
                    seen.append(event)
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                failed.append(exc)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        acknowledged = []
        for n in range(WRITES):
            if n == KILL_AFTER:
                deadline = time.monotonic() + DEADLINE_S
                while len(seen) < KILL_AFTER + 1:  # the stream is live on that member
                    assert time.monotonic() < deadline and not failed, failed
                    time.sleep(0.05)
                cluster.kill(streamed_from)
            result = writer.write("watched/a", "k", str(n).encode(), token=lease.token)
            acknowledged.append((result.header.applied_index, result.version))
        deadline = time.monotonic() + DEADLINE_S
        while len(seen) < WRITES + 1 and not failed:
            assert time.monotonic() < deadline, f"saw {len(seen)} events of {WRITES + 1}"
            time.sleep(0.05)
        watcher.close()
        thread.join(DEADLINE_S)
    assert not failed, failed
    assert watcher.resumes >= 1
    assert seen[0].type == "ACQUIRED" and seen[0].revision == lease.header.applied_index
    writes = [(e.revision, e.version) for e in seen[1:]]
    assert writes == acknowledged  # every write once, in order, at its log index
    assert [e.value for e in seen[1:]] == [str(n).encode() for n in range(WRITES)]

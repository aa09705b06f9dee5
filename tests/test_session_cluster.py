"""Sessions on a real three-process cluster (issue 29 point 5): 1,000 leases in one
``client.session()`` stay alive past several TTLs on one thread; a force-released lease is
lost alone; closing the session releases every lease; a session that cannot reach the cluster
before its TTL runs out is lost with every lease in it, a lock taken in it included.
Figures: ``python -m bench session``.
"""

from __future__ import annotations

import threading
import time

import pytest

from coordinator.client import FencingClient
from coordinator.client import exceptions as E
from testsupport.supervisor import wait_until

LEASES = 1000
# 1,000 renewals in one KeepAliveMany take ~0.6 s on an idle 2-core machine (bench session):
# a 6 s TTL leaves each round 4 s before its oldest lease may expire, on a busy machine too.
TTL_MS = 6000


@pytest.fixture
def cluster(tmp_path, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path / "cluster"), request)


def test_a_thousand_session_leases_stay_alive_on_one_thread(cluster):
    with FencingClient([n.api_address for n in cluster.nodes], timeout_s=20) as client:
        client.status()  # the channels and gRPC's own threads exist before the count
        # Threads started since, by identity: threads of earlier tests in this process may
        # end meanwhile, which a bare count would take for the session's doing.
        before = set(threading.enumerate())

        def started_since() -> list[str]:
            return sorted(t.name for t in threading.enumerate() if t not in before)

        session = client.session(ttl_ms=TTL_MS)
        leases = [session.acquire(f"sess/{n}") for n in range(LEASES)]
        assert started_since() == [session._thread.name]  # the session's one thread

        # Past three TTLs: every lease renewed, none lost, the thread count constant.
        end = time.monotonic() + 3 * TTL_MS / 1000
        while time.monotonic() < end:
            assert not session.done.is_set(), session.lost_error
            assert started_since() == [session._thread.name]
            time.sleep(0.2)
        assert [lease.resource for lease in leases if lease.lost.is_set()] == []
        assert session.renewals >= 2 * LEASES and len(session) == LEASES
        not_held = [lease.resource for lease in leases
                    if (d := client.describe(lease.resource)).token != lease.token or not d.held]
        assert not_held == []

        # An operator's ForceRelease fences one lease: it alone is lost, the session goes on.
        fenced = leases[0]
        client.force_release(fenced.resource)
        assert wait_until(fenced.lost.is_set, 2 * TTL_MS / 1000, what="the fenced lease lost")
        assert isinstance(fenced.lost_error.cause, E.StaleToken)
        assert not session.done.is_set() and len(session) == LEASES - 1

        # Closing releases every lease left (ReleaseMany) and ends the thread.
        session.close()
        assert started_since() == []
        still_held = [lease.resource for lease in leases[1:] if client.describe(lease.resource).held]
        assert still_held == []


def test_a_session_that_cannot_reach_the_cluster_is_lost_with_its_leases(cluster):
    ttl_ms = 3000
    with FencingClient([n.api_address for n in cluster.nodes], timeout_s=5, attempt_timeout_s=1) as client:
        lost: list[E.LeaseLost] = []
        session = client.session(ttl_ms=ttl_ms, on_lost=lost.append)
        leases = [session.acquire(f"gone/{n}") for n in range(10)] + [session.lock("gone/lock", timeout_s=10)]
        paused_at = time.monotonic()
        for node in cluster.nodes:  # every member stops answering (SIGSTOP)
            cluster.pause(node.index)
        try:
            assert session.done.wait(ttl_ms / 1000 + 2.0), "the session outlived its TTL without renewals"
            assert time.monotonic() - paused_at <= ttl_ms / 1000 + 2.0
        finally:
            for node in cluster.nodes:
                cluster.resume(node.index)
        assert wait_until(lambda: lost, 5.0) == [session.lost_error]  # on_lost runs right after done
        assert all(lease.lost.is_set() and lease.lost_error.cause is session.lost_error for lease in leases)
        with pytest.raises(E.LeaseLost):
            session.acquire("gone/late")
        session.close()


def test_the_session_bench_reports_every_figure(tmp_path):
    """``python -m bench session`` runs end to end and prints what it says (no speed asserted)."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "session.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "session", "--leases", "20", "--ttl-ms", "1500", "--seconds", "3",
         "--json", str(out)], capture_output=True, text=True, timeout=180, cwd=root, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["lost"] == 0 and figures["held_in_sample"] == "20/20"
    assert figures["threads_held"]["python"] == figures["threads_before"]["python"] + 1
    assert figures["threads_after"]["python"] == figures["threads_before"]["python"]
    assert figures["renewals_in_window"] >= 20 and figures["client_cpu_s"] > 0
    assert set(figures["renewal_lag_ms"]) == {"p50", "p90", "p99", "max"}

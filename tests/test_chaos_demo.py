"""Why fencing: the client-GC-pause schedule against an unfenced store and against FencedStore.

Schedule (chaos.faults.gc_pause_schedule): a client acquires a lease, checks it is still live,
and stops (SIGSTOP, a "GC pause") between that check and its write. Its lease expires; a new
owner acquires (a larger token) and writes. The old client resumes and sends its write.

- Lease-only client + a store that ignores tokens: the stale write lands on top of the new
  owner's write — an update is lost.
- The same schedule against FencedStore: the stale write is refused with STALE_TOKEN and the
  new owner's value survives.

Starts three real ``fencingd serve`` processes on 127.0.0.2/.3/.4 (no root needed).
"""

from __future__ import annotations

import os

import pytest

from chaos.faults import gc_pause_schedule
from chaos.harness import ChaosCluster
from chaos.history import HistoryWriter
from chaos.workload import Recorder, UnfencedStore, make_client
from coordinator.core.names import ErrorReason as R


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("chaos-demo")
    with ChaosCluster(str(base / "cluster")) as c:
        c.start_all(timeout_s=60)
        yield c


@pytest.fixture
def owner(cluster, tmp_path):
    client = make_client(cluster.endpoints, timeout_s=8.0)
    with HistoryWriter(str(tmp_path / "owner.jsonl")) as writer:
        yield Recorder(client, writer, "owner")
    client.close()


def test_lease_only_client_on_unfenced_store_loses_an_update(cluster, owner, tmp_path):
    store = UnfencedStore()
    try:
        result = gc_pause_schedule(cluster, owner, "demo-unfenced", str(tmp_path / "victim.jsonl"),
                                   unfenced=store.address)
    finally:
        store.close()
    assert result["owner_token"] > result["victim_token"]  # the lease really moved on
    assert result["victim_write"] == "ok"  # nothing stopped the stale write...
    # ...so the new owner's acknowledged write is gone: the lost update.
    assert result["final_value"] == "gc-victim-demo-unfenced-stale"
    assert result["final_value"] != result["owner_value"]


def test_fenced_store_refuses_the_stale_write(cluster, owner, tmp_path):
    result = gc_pause_schedule(cluster, owner, "demo-fenced", str(tmp_path / "victim.jsonl"))
    assert result["owner_token"] > result["victim_token"]
    assert result["owner_write"] == "ok"
    assert result["victim_write"] == "refused"
    assert result["victim_reason"] == R.STALE_TOKEN
    assert result["final_value"] == result["owner_value"]  # the new owner's value survives
    # the victim recorded its refused write in the history format
    with open(tmp_path / "victim.jsonl") as f:
        lines = f.read()
    assert f'"reason":"{R.STALE_TOKEN}"' in lines and '"outcome":"refused"' in lines
    assert os.path.getsize(tmp_path / "owner.jsonl") > 0

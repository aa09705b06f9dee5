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


def test_an_operator_fencing_everything_before_the_owners_write_is_not_a_failure(cluster, owner, tmp_path):
    """The soak's operator fences every resource now and then (I11). Landing between the new
    owner's acquire and its write, it fenced the owner as well (soak, seed 839349636: gc4's owner
    wrote with token 114554 and got STALE_TOKEN after an epoch floor at the next index): the
    owner acquires again, and the schedule still shows the stale write refused."""
    fenced = []

    class FencedOnce:
        """The owner's recorder, with an operator's fence-all landing before its first write."""

        def __getattr__(self, name):
            return getattr(owner, name)

        def write(self, *args, **kwargs):
            if not fenced:
                epoch = int(owner.client.status().epoch)
                fenced.append(owner.client.set_epoch_floor(epoch + 10, fence_all=True).epoch)
            return owner.write(*args, **kwargs)

    result = gc_pause_schedule(cluster, FencedOnce(), "demo-refenced", str(tmp_path / "victim.jsonl"))
    assert fenced and result["owner_refenced"] == 1
    assert result["owner_token"] > fenced[0] > result["victim_token"]  # acquired again, above the floor
    assert result["owner_write"] == "ok"
    assert result["victim_write"] == "refused" and result["victim_reason"] == R.STALE_TOKEN
    assert result["final_value"] == result["owner_value"]

"""Lost disks on real processes (DESIGN I1): a member whose data dir was wiped never votes or
counts as its old self, so a wiped member and a stale one can never form a majority.

Three real ``fencingd serve`` processes (chaos.harness.ChaosCluster), a client recording every
call in the chaos history format, checked by the chaos checker at the end (zero acknowledged
loss, token order intact; refused and unknown calls are the unavailability it reports).

Schedule (the issue's): B is down; a lease is acquired (token T) and a write acknowledged by
A + C. A and C stop; A's data dir is wiped; A and B start. Before member identity, A (empty)
voted for B (stale), the pair was a majority, and the next acquire returned T again with the
acknowledged write gone. Now the pair must not serve at all; once C is back, B + C serve with
everything, and A waits, not counted, saying what an operator must do.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from chaos.check import check_file
from chaos.harness import ChaosCluster
from chaos.history import HistoryWriter
from chaos.workload import Recorder, make_client
from testsupport.raft_peer import secret_settings
from testsupport.supervisor import wait_until

A, B, C = 0, 1, 2
# How long the wiped + stale pair is given to (wrongly) serve: several election timeouts.
PAIR_WINDOW_S = 8.0


MEMBER_SECRET = "member-identity-test-secret-0123456789abcdef"
# With the peer secret too: each new incarnation binds its connections in the handshake
# (RAFT.md "Peer authentication"), which must let it join, catch up and be promoted.
@pytest.fixture(params=[False, True], ids=["no-secret", "secret"])
def cluster(tmp_path, request):
    settings = secret_settings(tmp_path, MEMBER_SECRET) if request.param else {}
    with ChaosCluster(str(tmp_path / "cluster"), settings=settings) as c:
        c.start_all(timeout_s=60)
        yield c


def _ok_token(outcome) -> int | None:
    status, res = outcome
    return res.token if status == "ok" else None


def test_a_wiped_member_and_a_stale_one_never_serve(cluster, tmp_path):
    history = str(tmp_path / "history.jsonl")
    with HistoryWriter(history) as writer:
        client = make_client(cluster.endpoints, timeout_s=4.0)
        rec = Recorder(client, writer, "client")
        try:
            cluster.wait_ready()
            cluster.stop(B)
            token = wait_until(
                lambda: _ok_token(rec.acquire("disk/a", ttl_ms=600_000, holder="h1")), 30, what="an acquire by A + C"
            )
            assert rec.write("disk/a", "k", "acked", token)[0] == "ok"

            cluster.stop(A)
            cluster.stop(C)
            shutil.rmtree(cluster.nodes[A].data_dir)
            os.makedirs(cluster.nodes[A].data_dir)
            cluster.start(A)
            cluster.start(B)
            # Both answer health (NOT_SERVING: neither may serve without a leader).
            wait_until(lambda: all(cluster.nodes[i].health_status() is not None for i in (A, B)), 30,
                       what="A and B answering")

            # The pair must not serve: every acquire fails (a token from it would be T again).
            deadline, refused = time.monotonic() + PAIR_WINDOW_S, 0
            while time.monotonic() < deadline:
                got = _ok_token(rec.acquire("disk/b", ttl_ms=600_000, holder="h2"))
                assert got is None, f"the wiped + stale pair served: token {got} (T was {token})"
                refused += 1

            # C is back: B + C hold everything A + C acknowledged.
            cluster.start(C)
            later = wait_until(
                lambda: _ok_token(rec.acquire("disk/c", ttl_ms=600_000, holder="h3")), 60, what="B + C serving"
            )
            assert later > token
            status, read = rec.read("disk/a", "k")
            assert status == "ok" and read.found and read.value == b"acked"
            print(f"wiped A + stale B: {refused} acquires in {PAIR_WINDOW_S} s, none granted (T was {token});"
                  f" B + C then granted {later} and read the acknowledged write back")
        finally:
            client.close()
    report = check_file(history)
    assert report.ok, report.to_dict()
    # A learned the configuration from B + C's log and says what an operator must do.
    wait_until(lambda: "is not in the configuration" in cluster.logs(tail=1_000_000), 30,
               what="the wiped member's waiting line")


def _log(node) -> str:
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _voters(cluster, i) -> dict[str, int]:
    """member id -> incarnation of every voter, as member ``i`` reports it (Cluster.Status)."""
    return {m.member_id: m.incarnation for m in cluster.nodes[i].status().members if m.voter}


def test_member_replace_brings_a_wiped_member_back_with_nothing_lost(cluster, tmp_path, capsys):
    """A's disk is lost; it restarts empty and waits. `fencingctl admin member replace m1` removes
    its old incarnation and adds the fresh one as a learner, which catches up and is promoted:
    then A + C serve without B, with everything acknowledged before."""
    from coordinator.client import fencingctl

    history = str(tmp_path / "history.jsonl")
    with HistoryWriter(history) as writer:
        client = make_client(cluster.endpoints, timeout_s=4.0)
        rec = Recorder(client, writer, "client")
        try:
            cluster.wait_ready()
            token = wait_until(lambda: _ok_token(rec.acquire("disk/a", ttl_ms=600_000, holder="h1")), 30,
                               what="an acquire")
            assert rec.write("disk/a", "k", "acked", token)[0] == "ok"
            old = _voters(cluster, B)["m1"]

            cluster.stop(A)
            shutil.rmtree(cluster.nodes[A].data_dir)
            os.makedirs(cluster.nodes[A].data_dir)
            cluster.start(A)
            wait_until(lambda: "is not in the configuration" in _log(cluster.nodes[A]), 30,
                       what="the wiped member's waiting line")
            assert "m1" in _voters(cluster, B) and _voters(cluster, B)["m1"] == old  # still the lost one

            endpoints = ",".join(cluster.endpoints)
            code = fencingctl.main(["admin", "member", "replace", "m1", "--endpoints", endpoints, "--output", "json"])
            printed = capsys.readouterr().out
            assert code == 0, printed

            def promoted():
                voters = _voters(cluster, B)
                return voters.get("m1") not in (None, old) and len(voters) == 3

            wait_until(promoted, 30, what="the fresh m1 promoted to a voter")
            # B goes: A (fresh, caught up) + C are a majority holding everything.
            cluster.stop(B)
            status, read = wait_until(
                lambda: (lambda r: r if r[0] == "ok" else None)(rec.read("disk/a", "k")), 60, what="A + C serving"
            )
            assert read.found and read.value == b"acked"
            later = wait_until(lambda: _ok_token(rec.acquire("disk/c", ttl_ms=600_000, holder="h3")), 30,
                               what="an acquire by A + C")
            assert later > token
            with capsys.disabled():
                print(f"replace m1: token {token} before the lost disk, {later} from the fresh A + C after it;"
                      " the acknowledged write read back")
        finally:
            client.close()
    report = check_file(history)
    assert report.ok, report.to_dict()
    assert "membership change (remove m1)" in cluster.logs(tail=1_000_000)
    assert "membership change (promote m1" in cluster.logs(tail=1_000_000)

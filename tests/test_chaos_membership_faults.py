"""chaos.membership_faults.DiskLoss on real processes: a follower's data dir is wiped, it restarts
empty and is not counted, heal replaces it (same id, same address) and it is a voter again with
its fresh incarnation; a workload client's history passes the chaos checker (no acknowledged
loss, token order intact), and the fault reports the unavailability it saw.

The gap arithmetic the fault reports with is checked on its own below.
"""

from __future__ import annotations

import os
import threading

from chaos.check import check_file
from chaos.harness import ChaosCluster
from chaos.membership_faults import DiskLoss, acknowledged_ends_ns, longest_gap_s
from chaos.workload import run_client
from testsupport.supervisor import wait_until


def _voter_incarnations(cluster, i) -> dict[str, int]:
    return {m.member_id: m.incarnation for m in cluster.nodes[i].status().members if m.voter}


def test_disk_loss_is_not_counted_until_replaced_then_votes_again(tmp_path):
    clients_dir = tmp_path / "clients"
    clients_dir.mkdir()
    history = str(clients_dir / "c0.jsonl")
    stop = threading.Event()
    with ChaosCluster(str(tmp_path / "cluster")) as cluster:
        cluster.start_all(timeout_s=60)
        worker = threading.Thread(
            target=run_client, args=("c0", cluster.endpoints, history, ["dl-r0", "dl-r1"], 7, stop)
        )
        worker.start()
        try:
            wait_until(lambda: len(acknowledged_ends_ns(str(clients_dir))) >= 20, 60, what="20 acknowledged ops")
            fault = DiskLoss(str(clients_dir), "follower")
            fault.inject(cluster)
            wiped = cluster.nodes[fault.i]
            other = next(n.index for n in cluster.nodes if n.index != fault.i)
            old, new = fault.info["old_incarnation"], fault.info["new_incarnation"]
            assert old != new and os.path.exists(os.path.join(wiped.data_dir, "member.identity"))
            # Not counted: the configuration still names the lost incarnation.
            assert _voter_incarnations(cluster, other)[fault.member_id] == old
            assert fault.not_counted(cluster)

            fault.heal(cluster)
            assert fault.info["ok"], fault.info
            assert _voter_incarnations(cluster, other)[fault.member_id] == new
            assert len(_voter_incarnations(cluster, other)) == 3
            assert fault.info["unavailable_s"] >= fault.info["unavailable_during_replace_s"] > 0
            print(f"disk loss: {fault.info}")
        finally:
            stop.set()
            worker.join(timeout=60)
    report = check_file(history)
    assert report.ok, report.to_dict()


def test_longest_gap_and_a_half_written_last_line(tmp_path):
    path = tmp_path / "c0.jsonl"
    ok = '{"type":"op","process":"c0","f":"read","outcome":"ok","invoke_ns":%d,"complete_ns":%d}\n'
    path.write_text(ok % (1, 2_000_000_000) + ok % (3, 2_500_000_000) + (ok % (4, 6_000_000_000))[:40])
    ends = acknowledged_ends_ns(str(tmp_path))
    assert ends == [2_000_000_000, 2_500_000_000]  # the cut line is not counted
    assert longest_gap_s(ends, 1_000_000_000, 5_000_000_000) == 2.5
    assert longest_gap_s(ends, 2_100_000_000, 2_200_000_000) == 0.1  # nothing inside: the whole window

"""The gRPC benchmark runs end to end and reports what it says it reports (no speed asserted).

A benchmark that breaks quietly (a sampler thread dying, say) still prints ops/s; this run
checks every column it fills, for both ways of placing members.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys


def test_grpc_bench_reports_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.grpc_bench", "--seconds", "0.5", "--warmup", "0.2", "--clients", "2",
         "--procs", "1", "--modes", "raw", "--workloads", "write", "--rounds", "1", "--compare-os-placement",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    systems = {row["system"] for row in report["rows"]}
    assert systems == {"baseline", "fencing", "fencing-os"}
    for row in report["rows"]:
        assert row["ops"] > 0 and not row["errors"], row
        for key in ("leader", "followers", "clients", "steal", "other", "host"):
            assert math.isfinite(row["cores"][key]), (row["system"], key, row["cores"])
    assert set(report["info"]["node_cpus"]) == {"0", "1", "2"}


class _Members:
    """What placement_after_free_run reads of a cluster: its members and who leads now."""

    def __init__(self, leader: int) -> None:
        self.nodes = [type("Node", (), {"index": i})() for i in range(3)]
        self._leader = leader

    def leader_index(self, timeout_s: float) -> int:
        return self._leader


def test_after_a_free_run_the_placement_follows_a_moved_leader():
    from bench.grpc_bench import Runner
    from coordinator import cpu_pin

    every = os.sched_getaffinity(0)
    before = {0: {min(every)}, 1: set(every), 2: set(every)}  # node 0 led and was pinned
    runner = Runner.__new__(Runner)  # only the placement logic: no cluster, no workers
    runner.node_cpus, runner.leader_index = before, 0
    runner.cluster = _Members(leader=0)
    assert runner.placement_after_free_run() == before  # no move: as read before the run
    runner.cluster = _Members(leader=2)
    after = runner.placement_after_free_run()
    want = cpu_pin.choose_cpu(cpu_pin.AUTO, 2, every)
    assert after[2] == ({want} if want is not None else every)
    assert after[0] == every and after[1] == every  # the old leader is not re-pinned

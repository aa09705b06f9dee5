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
    from coordinator.server import cpu_pin

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


def test_a_disturbed_run_is_measured_again_and_the_least_disturbed_kept(monkeypatch):
    import argparse

    import bench.grpc_bench as gb

    assert gb.disturbance({"steal": 0.05, "other": 0.1}) is None
    assert gb.disturbance({"steal": 0.3, "other": 0.0}) == "steal 0.30 cores"
    assert gb.disturbance({"steal": 0.0, "other": 0.4}) == "other processes 0.40 cores"

    def runner_measuring(*steals):
        runner = gb.Runner.__new__(gb.Runner)  # no cluster, no workers: only the retry logic
        runner.our_pids = lambda: []
        figures = iter(steals)

        def measure(system, mode, workload, clients):
            steal = next(figures)
            return {"ops_per_s": 1000 * (1 - steal), "cores": {"steal": steal, "other": 0.0}}

        runner.measure = measure
        return runner

    waits = []
    monkeypatch.setattr(gb, "wait_until_quiet", lambda deadline, ours: waits.append(deadline) or {})
    for retries, steals, kept_steal, attempts in (
        (2, (0.0,), 0.0, 1),              # undisturbed: one attempt
        (2, (0.4, 0.02), 0.02, 2),        # disturbed, then quiet: the quiet one
        (2, (0.4, 0.2, 0.3), 0.2, 3),     # disturbed every time: the least disturbed, flagged
        (0, (0.4,), 0.4, 1),              # no retries: the first attempt, flagged
    ):
        waits.clear()
        runner = runner_measuring(*steals)
        runner.args = argparse.Namespace(retries=retries, quiet_wait_s=1.0)
        row = runner.measure_undisturbed("fencing", "raw", "write", 16)
        assert (row["cores"]["steal"], row["attempts"], len(waits)) == (kept_steal, attempts, attempts - 1)
        assert (row["disturbed"] is None) == (kept_steal <= gb.STEAL_MAX_CORES)
        assert sorted(a["ops_per_s"] for a in row["set_aside"]) == sorted(
            1000 * (1 - s) for s in steals if s != kept_steal)


def test_the_quiet_probe_keeps_every_cpu_busy_and_does_not_count_its_spinners():
    import time

    import bench.grpc_bench as gb

    started = time.monotonic()
    cores = gb.wait_until_quiet(deadline=started, ours=[])  # one window, whatever it finds
    assert time.monotonic() - started >= gb.QUIET_WINDOW_S
    assert math.isfinite(cores["steal"]) and cores["steal"] >= 0
    # The spinners kept ~nproc cores busy; counted as "other" they would make every probe
    # look disturbed.
    assert 0 <= cores["other"] < 1.0, cores

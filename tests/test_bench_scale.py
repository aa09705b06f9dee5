"""``python -m bench scale`` runs end to end at a tiny N and fills every figure (no speed asserted).

The figures come from probes inside the members (bench/_scale_node.py) and from timestamps
matched across processes; a probe that stops recording after a change in the Raft layer would
leave a figure NaN or zero while the bench still prints a table, so each one is checked.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_scale_bench_reports_every_figure(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--resources", "200", "--window-s", "1", "--snapshots", "1",
         "--procs", "1", "--threads", "4", "--out", str(out), "--dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["load"]["loaded"] == 200 and not report["load"]["errors"], report["load"]
    figures = report["figures"]
    assert {f"rss_mib_member{i}" for i in range(3)} <= set(figures)
    for name, value in figures.items():
        assert isinstance(value, (int, float)) and math.isfinite(value), (name, value)
        if name != "rss_bytes_per_resource":  # at 200 resources, noise of either sign
            assert value > 0, (name, value)
    assert report["keepalive"]["writes_with_keepalive"]["keepalive"]["refused"] == 0
    for row in ("snapshot (leader)", "Raft-thread stall (outside)", "restart to SERVING", "leader CPU per renewal"):
        assert row in proc.stdout, proc.stdout


def test_scale_bench_in_process_reports_every_figure(tmp_path):
    out = tmp_path / "state.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--in-process", "--resources", "200", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())["in_process"]
    assert res["resources"] == 200 and res["state_bytes"] > 0
    for step in ("snapshot", "snapshot_write", "snapshot_read", "snapshot_decode", "restore"):
        assert math.isfinite(res[step]["ms"]) and res[step]["ms"] > 0, (step, res[step])
    assert math.isfinite(res["rss_bytes_per_resource"]), res  # at 200 resources, noise of either sign

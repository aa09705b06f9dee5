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

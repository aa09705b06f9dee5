"""``python -m bench probes`` runs and reports (issue 26's probes; figures only, no speed
asserted). The cheapest probe end to end -- 6, one ``fencingd serve`` with its API open to
the network -- and the argument check; the other six start clusters and run for minutes, so
they run as the benchmark, not here."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def probes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "probes", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_open_api_probe_prints_the_issues_figure_and_todays():
    out = probes("--only", "6")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.strip().startswith("issue (main then): API on 0.0.0.0") for line in lines), out.stdout
    now = [line for line in lines if line.strip().startswith("now:")]
    assert len(now) == 1 and "exit 2, 1 line(s) on stderr, no READY" in now[0] and "insecure_api" in now[0], now
    assert lines[-1].startswith("summary (") and lines[-1].endswith("6: holds"), lines[-1]


def test_an_unknown_probe_number_is_a_usage_error():
    out = probes("--only", "8")
    assert out.returncode == 2 and "--only" in out.stderr and "1, 2, 3, 4, 5, 6, 7" in out.stderr, out.stderr

"""``python -m chaos run`` on a machine that cannot mount the members' small data filesystems
(chaos/small_fs.py) says so in one line. Apart from test_chaos_exhaustion_faults.py, whose
module-wide cluster holds the network namespace's chaos claim (chaos/netns_claim.py) while its
tests run: a run started beside it is refused for that first."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_machine_that_cannot_mount_them_gets_one_line_not_a_traceback(tmp_path):
    # No mkfs.ext4 on the PATH (a container without e2fsprogs, say).
    env = {**os.environ, "PATH": str(tmp_path / "empty"), "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "chaos", "run", "--profile", "ci", "--out", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("chaos run: cannot mount the members' small data filesystems: mkfs.ext4")

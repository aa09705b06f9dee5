"""One chaos cluster at a time per network namespace (chaos/netns_claim.py): another process's
claim refuses a ChaosCluster and ``python -m chaos run`` before either touches anything, a
claim in another namespace (``unshare -n``) does not, and a holder's end frees the namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from chaos import netns_claim
from chaos.harness import ChaosCluster
from testsupport.supervisor import REPO_ROOT

HOLD = (
    "import sys\n"
    "from chaos import netns_claim\n"
    "netns_claim.claim()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


class Holder:
    """A process that claims its network namespace until its stdin closes."""

    def __init__(self, *prefix: str) -> None:
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", HOLD], cwd=REPO_ROOT,
                                     env={**os.environ, "PYTHONPATH": REPO_ROOT}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # blocks until it holds the claim or fails
        if line != "held\n":
            self.close()
            raise AssertionError(f"the holder did not claim: {line!r} {self.proc.stderr.read()!r}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_another_process_s_claim_refuses_a_cluster_naming_its_pid(tmp_path):
    holder = Holder()
    try:
        with pytest.raises(netns_claim.PacketFiltersBusy, match=rf"another chaos run \(pid {holder.proc.pid}\)"):
            ChaosCluster(str(tmp_path / "cluster"))
        assert not (tmp_path / "cluster").exists()  # refused before anything was made
    finally:
        holder.close()
    with ChaosCluster(str(tmp_path / "after")):  # the holder's end freed the namespace
        with pytest.raises(AssertionError, match="PacketFiltersBusy"):
            Holder()  # and now the cluster holds it against others


def test_chaos_run_refuses_in_one_line_and_makes_nothing(tmp_path):
    holder = Holder()
    try:
        out = tmp_path / "run"
        proc = subprocess.run([sys.executable, "-m", "chaos", "run", "--profile", "ci", "--out", str(out)],
                              cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT},
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"chaos run: another chaos run (pid {holder.proc.pid}) is using this network namespace")
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (util-linux) for a network namespace")
def test_a_claim_in_another_network_namespace_leaves_this_one_free(tmp_path):
    holder = Holder("unshare", "-n")
    try:
        cluster = ChaosCluster(str(tmp_path / "cluster"))
        cluster.close()
    finally:
        holder.close()


def test_claims_nest_within_a_process_and_the_last_release_frees():
    netns_claim.claim()
    netns_claim.claim()
    try:
        netns_claim.release()
        with pytest.raises(AssertionError, match="PacketFiltersBusy"):
            Holder()  # one claim still stands
    finally:
        netns_claim.release()
    Holder().close()
    netns_claim.release()  # one too many: nothing to give back, and it says nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file another owner")
def test_a_link_or_a_stranger_s_file_at_the_lock_path_is_refused_and_left_as_it_was(tmp_path, monkeypatch):
    """The lock file sits in a shared temporary directory and runs are root: a link planted
    there must not make a run truncate what it points to."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    lock = tmp_path / "lock"
    lock.symlink_to(target)
    monkeypatch.setattr(netns_claim, "claim_path", lambda: str(lock))
    with pytest.raises(OSError):  # O_NOFOLLOW: ELOOP
        netns_claim.claim()
    assert target.read_text() == "keep me" and not netns_claim.held()
    lock.unlink()
    lock.write_text("a stranger's")
    os.chown(lock, os.geteuid() + 1, -1)  # another user's file (root runs the chaos suite)
    with pytest.raises(netns_claim.PacketFiltersBusy, match="not a plain file of this user"):
        netns_claim.claim()
    assert lock.read_text() == "a stranger's" and not netns_claim.held()

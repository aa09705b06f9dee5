"""The exhaustion faults prove they did what they claim, on three real ``fencingd serve``
members whose data dirs are on small loop-mounted ext4 filesystems (chaos/exhaustion_faults.py,
chaos/small_fs.py):

- disk_full: a write in the member's data dir really fails with ENOSPC while it holds, and
  succeeds again after heal;
- fd_exhaustion: the member's descriptor limit (``/proc/PID/limits``) is really lowered, the
  connections are really held and accepted, and heal puts the limit back;
- the judge can fail: a member that dies other than through the fatal handler, or that holds a
  term its ``raft.meta`` does not, fails the fault;
- a member (the leader; a follower) comes out of a full disk, or of exhausted descriptors, with
  an election meanwhile, stopped cleanly or working, holding no term it did not save, with one
  leader per term in the members' own reports;
- the small filesystems are gone after the cluster closes, and a machine that cannot make them
  gets one line from ``python -m chaos run``.
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import zlib

import msgpack
import pytest

from chaos import check as chk
from chaos import exhaustion_faults as EF
from chaos import history as hist
from chaos.harness import ChaosCluster
from chaos.leader_reports import leader_reports
from chaos.small_fs import DATA_FS_BYTES
from coordinator.raft.journal import META_NAME

# Small: the tests' members write little, and a fill is then quick.
TEST_FS_BYTES = 16 * 1024 * 1024


def started(base_dir: str):
    with ChaosCluster(base_dir, small_fs_bytes=TEST_FS_BYTES) as c:
        try:
            c.start_all()
        except BaseException:
            print(c.logs())
            raise
        yield c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from started(str(tmp_path_factory.mktemp("exhaustion")))


@pytest.fixture
def fresh_cluster(tmp_path):
    """A cluster of its own: its members' logs hold this test's terms only."""
    yield from started(str(tmp_path / "c"))


def write_fails_with(directory: str) -> int | None:
    """The errno of writing (and fsyncing) a block to a new file in ``directory``, None if it
    succeeds."""
    path = os.path.join(directory, "test-probe")
    try:
        with open(path, "wb") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as exc:
        return exc.errno
    finally:
        if os.path.exists(path):
            os.unlink(path)


def mounted(path: str) -> bool:
    with open("/proc/mounts", encoding="utf-8") as f:
        return any(line.split()[1] == path for line in f)


def test_disk_full_really_refuses_writes_in_the_data_dir_until_heal(cluster):
    fault = EF.DiskFull("follower", provoke_election=False)
    try:
        fault.inject(cluster)
        data_dir = cluster.nodes[fault.i].data_dir
        assert write_fails_with(data_dir) == errno.ENOSPC
        assert os.statvfs(data_dir).f_bavail == 0
        assert fault.info["enospc_seen"] is True and fault.info["filled_bytes"] > 0
        # only the victim's filesystem is full
        other = next(n for n in cluster.nodes if n.index != fault.i)
        assert write_fails_with(other.data_dir) is None
    finally:
        fault.heal(cluster)
    assert write_fails_with(data_dir) is None
    assert fault.info["free_bytes_after_heal"] > 0
    assert fault.info["ok"] is True, fault.info
    cluster.wait_ready(30.0)


def test_fd_exhaustion_really_lowers_the_limit_and_holds_connections(cluster):
    fault = EF.FdExhaustion("follower", provoke_election=False)
    try:
        fault.inject(cluster)
        pid = cluster.nodes[fault.i].proc.pid
        soft, hard = EF.nofile_limit(pid)
        assert soft == fault.info["limit"] == fault.info["fds_before"] + EF.FD_HEADROOM
        assert hard == fault.info["old_limit"][1]  # only the soft limit moves
        assert fault.info["connections_held"] == EF.FD_HEADROOM + EF.FD_QUEUED_EXTRA
        assert fault.info["connections_refused"] == 0
        # the member accepted them: its descriptor count rose towards the limit
        assert EF.open_fds(pid) > fault.info["fds_before"]
    finally:
        fault.heal(cluster)
    # put back (or, had it stopped, started again with the limit it had)
    assert EF.nofile_limit(cluster.nodes[fault.i].proc.pid) == tuple(fault.info["old_limit"])
    assert fault.held == []
    assert fault.info["ok"] is True, fault.info
    cluster.wait_ready(30.0)


def test_a_member_that_dies_other_than_through_the_fatal_handler_fails_the_fault(cluster):
    fault = EF.DiskFull("follower", provoke_election=False)
    try:
        fault.inject(cluster)
        node = cluster.nodes[fault.i]
        node.proc.kill()  # not cluster.kill: nobody stopped it, as a crash
        node.proc.wait(timeout=10)
    finally:
        fault.heal(cluster)
    assert fault.info["outcome"] == "stopped" and fault.info["exit_code"] == -9
    assert fault.info["stopped_cleanly"] is False and fault.info["ok"] is False
    assert cluster.nodes[fault.i].alive  # heal started it again
    cluster.wait_ready(30.0)


def test_a_term_a_member_holds_but_never_saved_is_caught(cluster):
    cluster.wait_ready(30.0)
    node = next(n for n in cluster.nodes if n.index != cluster.named_leader())
    path = os.path.join(node.data_dir, META_NAME)
    with open(path, "rb") as f:
        saved = f.read()
    term = cluster.raft_term(node.index)
    # raft.meta one term behind the member's, as a swallowed write leaves it
    body = msgpack.packb([1, term - 1, None], use_bin_type=True)
    try:
        with open(path, "wb") as f:
            f.write(body + struct.pack("<I", zlib.crc32(body)))
        assert EF.unsaved_terms(cluster) == {node.raft_address: {"term": term, "meta_term": term - 1}}
    finally:
        with open(path, "wb") as f:
            f.write(saved)
    assert EF.unsaved_terms(cluster) == {}


@pytest.mark.parametrize("kind, role", [(EF.DiskFull, "leader"), (EF.FdExhaustion, "leader"),
                                        (EF.DiskFull, "follower")],
                         ids=["disk_full_leader", "fd_exhaustion_leader", "disk_full_follower"])
def test_a_member_comes_out_of_exhaustion_and_an_election_with_one_leader_per_term(fresh_cluster, kind, role):
    """What the CI profile runs (leader), and a soak too (follower). The member may keep
    working or stop cleanly; it must not go on with a term it could not save (a swallowed
    raft.meta write), and no term may have two leaders in the members' own reports."""
    fault = kind(role)
    try:
        fault.inject(fresh_cluster)
    finally:
        fault.heal(fresh_cluster)
    election = fault.info["election"]
    # With pre-vote a member stands only with a majority's yes. The leader cut off from both
    # followers steps down and they elect one of them: the term rises. An exhausted follower
    # (the soak's case) may stand itself, with the other's yes, and stop on the term it cannot
    # save; the other one then stands for nothing until the heal (the old leader's log is
    # ahead of its own and the old leader's packets to it are dropped).
    assert election["term_after"] > election["term_before"] or (
        role == "follower" and fault.info["outcome"] == "stopped"), fault.info
    assert fault.info["outcome"] in ("kept running", "stopped")
    fresh_cluster.wait_ready(30.0)
    reports = [r for n in fresh_cluster.nodes for r in leader_reports(n.log_path, n.raft_address)]
    report = chk.check_history(hist.History.of(reports))
    assert fault.info["ok"] is True and report.ok, (fault.info["summary"], [v.detail for v in report.violations])


def test_the_small_filesystems_are_unmounted_when_the_cluster_closes(tmp_path):
    with ChaosCluster(str(tmp_path / "c"), small_fs_bytes=DATA_FS_BYTES) as c:
        mountpoints = [fs.mountpoint for fs in c.small_fs.values()]
        assert all(mounted(m) for m in mountpoints)
        for node, fs in zip(c.nodes, c.small_fs.values(), strict=True):
            assert node.data_dir == fs.data_dir
            assert os.stat(node.data_dir).st_dev != os.stat(str(tmp_path)).st_dev
            with open(node.config_path, encoding="utf-8") as f:
                assert f'data_dir = "{fs.data_dir}"' in f.read()
    assert not any(mounted(m) for m in mountpoints)
    images = [str(tmp_path / "c" / f"node{i}.img") for i in range(3)]
    attached = subprocess.run(["losetup", "-a"], capture_output=True, text=True, timeout=10).stdout
    assert not any(image in attached for image in images)

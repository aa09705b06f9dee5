"""A real member that cannot save a new term stops: exit 71, one FATAL line naming the file and
the error, and ``raft.meta`` still at the term it held (issue 26, fencing coordinator point 2).

Three node processes (testsupport.cluster); one follower is exhausted, then the leader is
paused (SIGSTOP), so the followers hear no leader and a term change reaches the exhausted one
(its own election, or the other follower's vote request):
- EMFILE: its soft descriptor limit is lowered below what it holds (prlimit on the live
  process), so no file can be opened, ``raft.meta.tmp`` included;
- ENOSPC: its data dir is on a small ext4 filesystem of its own (chaos.small_fs, loop mount:
  needs root, as the chaos suite), filled until a write is refused.
On main, pysyncobj logged "failed _onTick" and the member went on in a term it never saved.
"""

from __future__ import annotations

import os
import resource

import pytest

from chaos.small_fs import SmallFs, write_refused_with_enospc
from coordinator.raft.fatal import EXIT_DISK_FAILED
from coordinator.raft.journal import META_NAME, read_meta
from testsupport.cluster import ProcessCluster, wait_until

# Descriptors below the count the member holds: the few a dropped connection frees meanwhile
# must not be enough to open a file.
FD_BELOW_HELD = 4
# 16 MiB fills in a fraction of a second and holds a test member's data dir many times over.
SMALL_FS_BYTES = 16 * 1024 * 1024
# An election needs raft_max_timeout_s (1 s here) and a vote round; a loaded machine more.
EXIT_TIMEOUT_S = 30.0
STRERROR = {"EMFILE": os.strerror(24), "ENOSPC": os.strerror(28)}


def _exhaust_descriptors(node) -> None:
    pid = node.proc.pid
    held = len(os.listdir(f"/proc/{pid}/fd"))
    _soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (held - FD_BELOW_HELD, hard))


@pytest.mark.parametrize("exhausted", ["EMFILE", "ENOSPC"])
def test_a_member_that_cannot_save_a_new_term_stops_with_one_line(tmp_path, exhausted):
    fs = None
    with ProcessCluster(str(tmp_path / "c")) as cluster:
        try:
            victim = cluster.nodes[2]
            if exhausted == "ENOSPC":
                fs = SmallFs(str(tmp_path / "fs.img"), str(tmp_path / "fs"), SMALL_FS_BYTES)
                fs.mount()
                victim.data_dir = fs.data_dir
            cluster.start_all()
            leader = cluster.wait_for_leader()
            if leader == victim.index:
                # The victim must be a follower: move leadership by pausing it once.
                cluster.pause(leader)
                leader = cluster.wait_for_leader(exclude=victim.index)
                cluster.resume(victim.index)
                wait_until(lambda: cluster.nodes[victim.index].call({"op": "status"})["term"]
                           == cluster.nodes[leader].call({"op": "status"})["term"], 15.0, what="the victim following")
            term = victim.call({"op": "status"})["term"]
            wait_until(lambda: (read_meta(os.path.join(victim.data_dir, META_NAME)) or (0,))[0] == term,
                       5.0, what="the victim's term saved")
            victim.disconnect()  # our control connection is not one of its descriptors to count on
            log_from = os.path.getsize(victim.log_path)
            if exhausted == "EMFILE":
                _exhaust_descriptors(victim)
            else:
                fs.fill()
                assert write_refused_with_enospc(victim.data_dir)

            cluster.pause(leader)
            code = victim.proc.wait(timeout=EXIT_TIMEOUT_S)

            with open(victim.log_path, encoding="utf-8", errors="replace") as f:
                f.seek(log_from)
                text = f.read()
            assert code == EXIT_DISK_FAILED, text
            fatal = [line for line in text.splitlines() if "FATAL" in line]
            assert len(fatal) == 1, text
            assert os.path.join(victim.data_dir, META_NAME) in fatal[0], fatal[0]
            assert STRERROR[exhausted] in fatal[0], fatal[0]
            assert "failed _onTick" not in text, text
            # It never held a term it had not saved: raft.meta is where it was.
            assert read_meta(os.path.join(victim.data_dir, META_NAME))[0] == term
        finally:
            cluster.close()
            if fs is not None:
                fs.umount()

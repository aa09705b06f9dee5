"""The configuration a member follows (membership.ConfigLog) survives what its log goes through.

The chaos soak lost its leader for good: two members wrote snapshots with no configuration
although the bootstrap CONFIG entry was committed long before, then refused every vote
("this candidate has no configuration and the voter has one"). Path: a member loads a snapshot
(at start or from the leader) that records the configuration at its index S; the log is then
[S-1, S, ...] and no CONFIG entry in it. When entries after S were truncated (a new leader
replacing the uncommitted tail of one that lost power), ConfigLog dropped every configuration
at or above the log head S-1, the snapshot's included, rescanned the log, found no CONFIG
entry, and the next compaction wrote config None. Chunked restores block compaction, so the
log head stayed at S long enough for that to happen.
"""

from __future__ import annotations

import pytest

from coordinator.raft import identity as member_identity
from coordinator.raft.member_gate import MemberGate
from coordinator.raft.membership import ConfigLog, Configuration, Member

CONFIG = Configuration("cluster-a", (Member("m1", "127.0.0.2:49500", 11), Member("m2", "127.0.0.3:49500", 12)))
NEWER = Configuration("cluster-a", (Member("m1", "127.0.0.2:49500", 11),))


def _entry(index: int, term: int, payload: bytes = b"\x01cmd") -> tuple[bytes, int, int]:
    return (payload, index, term)


def _after_snapshot(at: int = 100, term: int = 5) -> tuple[ConfigLog, list]:
    configs = ConfigLog()
    configs.set_snapshot(at, term, CONFIG)
    # What pysyncobj's log holds after loading it: the snapshot's previous and last entries.
    raft_log = [_entry(at - 1, term), _entry(at, term)]
    configs.sync(raft_log)
    return configs, raft_log


def test_a_snapshots_configuration_survives_a_truncated_tail():
    configs, raft_log = _after_snapshot()
    raft_log += [_entry(101, 5), _entry(102, 5)]
    configs.sync(raft_log)
    raft_log[1:] = [raft_log[1], _entry(101, 6)]  # a new leader replaced the uncommitted tail
    configs.sync(raft_log)
    assert configs.current() == CONFIG
    assert configs.at(100) == CONFIG
    assert configs.at(101) == CONFIG  # what a compaction at 101 writes


def test_a_snapshots_configuration_survives_a_shorter_log():
    configs, raft_log = _after_snapshot()
    raft_log += [_entry(101, 5), _entry(102, 5)]
    configs.sync(raft_log)
    del raft_log[2:]  # the uncommitted tail deleted, nothing appended yet
    configs.sync(raft_log)
    assert configs.current() == CONFIG


def test_a_truncated_config_entry_after_the_snapshot_is_undone_and_a_new_one_taken():
    configs, raft_log = _after_snapshot()
    raft_log += [_entry(101, 5, NEWER.encode_entry())]
    configs.sync(raft_log)
    assert configs.current() == NEWER
    raft_log[2:] = [_entry(101, 6)]  # Raft's single-server rule: truncated, so undone
    configs.sync(raft_log)
    assert configs.current() == CONFIG
    raft_log += [_entry(102, 6, NEWER.encode_entry())]
    configs.sync(raft_log)
    assert [configs.at(i) for i in (100, 101, 102)] == [CONFIG, CONFIG, NEWER]


class _Recorded(Exception):
    pass


class _Gate(MemberGate):
    """Only what MemberGate.config() reads of a HardenedSyncObj."""

    def __init__(self, tmp_path, cluster_id):
        self._identity = member_identity.Identity("m1", 11, cluster_id)
        self._identity_dir = str(tmp_path)
        self._configs = ConfigLog()
        self._SyncObj__raftLog = [_entry(1, 1), _entry(2, 1)]
        self._SyncObj__needLoadDumpFile = False
        self.fatal: list[str] = []

    def _on_fatal(self, message, exit_code):
        self.fatal.append(message)
        raise _Recorded(message)


def test_a_member_that_had_a_configuration_stops_rather_than_snapshot_without_one(tmp_path):
    gate = _Gate(tmp_path, cluster_id="cluster-a")
    with pytest.raises(_Recorded):
        gate.config_plain_at(2)  # what the snapshot writer asks for
    assert "lost its cluster configuration" in gate.fatal[0]


def test_a_member_that_never_had_one_carries_on_without(tmp_path):
    gate = _Gate(tmp_path, cluster_id=None)
    assert gate.config_plain_at(2) is None
    assert gate.fatal == []

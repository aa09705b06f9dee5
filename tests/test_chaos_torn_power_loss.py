"""The torn-power-loss fault's disk work (chaos/disk_clock_faults.py) against the real journal:
what it leaves must be exactly what a power cut mid-write leaves — a torn last record the
journal cuts with a warning, every synced record intact, the durable term and vote untouched
by the torn meta update — and never a complete record with a bad checksum (which would stop
the member and make the fault, not the member, the thing under test)."""

from __future__ import annotations

import logging
import random

import pytest

from chaos.disk_clock_faults import tear_journal_tail, tear_pending_updates
from coordinator.raft.journal import DurableJournal


def journal_with(tmp_path, synced: int, unsynced: int) -> str:
    j = DurableJournal(str(tmp_path), track_synced=True)
    j.setCurrentTerm(5, "127.0.0.3:7001")
    for i in range(1, synced + 1):
        j.add(b"synced-%d" % i, i, 5)
    j.sync()
    for i in range(synced + 1, synced + unsynced + 1):
        j.add(b"unsynced-%d" % i, i, 5)
    # no sync and no close: as the member was when it was killed
    return str(tmp_path)


@pytest.mark.parametrize("unsynced", [0, 1, 3])
@pytest.mark.parametrize("seed", range(6))
def test_a_torn_tail_is_cut_with_a_warning_and_synced_records_and_the_vote_survive(tmp_path, caplog, unsynced, seed):
    data_dir = journal_with(tmp_path, synced=4, unsynced=unsynced)
    rng = random.Random(seed)
    torn = tear_journal_tail(data_dir, rng)
    tear_pending_updates(data_dir, rng, term=5)
    assert torn["torn_source"] == ("unsynced" if unsynced else "fabricated")
    assert 0 < torn["torn_bytes"] < torn["torn_of"]
    with caplog.at_level(logging.WARNING):
        j = DurableJournal(data_dir, track_synced=True)
    assert "cutting torn tail" in caplog.text
    assert [bytes(j[k][0]) for k in range(len(j))] == [b"synced-%d" % i for i in range(1, 5)]
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (5, "127.0.0.3:7001")

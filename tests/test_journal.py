"""The durable journal: what survives, what is refused, what is cut."""

import os
import struct
import time

import pytest

from coordinator.raft.journal import (
    JOURNAL_NAME,
    META_NAME,
    DurableJournal,
    JournalCorrupt,
    cut_to_synced_length,
)


def _fill(j: DurableJournal, first: int, last: int, term: int = 1) -> None:
    for idx in range(first, last + 1):
        j.add(b"cmd-%d" % idx, idx, term)


def test_entries_survive_reopen_after_sync(tmp_path):
    j = DurableJournal(str(tmp_path))
    _fill(j, 1, 10)
    j.sync()
    j._destroy()
    j2 = DurableJournal(str(tmp_path))
    assert len(j2) == 10
    assert j2[0] == (b"cmd-1", 1, 1)
    assert j2[-1] == (b"cmd-10", 10, 1)
    assert j2[2:4] == [(b"cmd-3", 3, 1), (b"cmd-4", 4, 1)]


def test_sync_is_group_commit(tmp_path):
    calls = []
    j = DurableJournal(str(tmp_path), fdatasync=lambda fd: calls.append(fd))
    _fill(j, 1, 50)
    assert calls == []  # nothing synced per add
    j.sync()
    j.sync()  # clean: no second sync
    assert len(calls) == 1
    assert j.sync_count == 1
    assert j.synced_length == os.path.getsize(j.path)


def test_checksum_mismatch_stops_with_file_and_offset(tmp_path):
    j = DurableJournal(str(tmp_path))
    _fill(j, 1, 5)
    j.sync()
    third = j._offsets[2]
    j._destroy()
    path = tmp_path / JOURNAL_NAME
    raw = bytearray(path.read_bytes())
    raw[third + 8 + 16] ^= 0xFF  # flip a command byte of record 3
    path.write_bytes(bytes(raw))
    with pytest.raises(JournalCorrupt) as err:
        DurableJournal(str(tmp_path))
    assert str(path) in str(err.value)
    assert f"offset {third}" in str(err.value)
    # Nothing was cut: the damaged file is left for an operator to inspect.
    assert path.read_bytes() == bytes(raw)


def test_torn_last_record_is_cut_not_fatal(tmp_path):
    j = DurableJournal(str(tmp_path))
    _fill(j, 1, 5)
    j.sync()
    j._destroy()
    path = tmp_path / JOURNAL_NAME
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(struct.pack("<II", 100, 0) + b"partial")  # length says 100, 7 bytes follow
    j2 = DurableJournal(str(tmp_path))
    assert len(j2) == 5
    assert path.stat().st_size == good


def test_non_contiguous_index_is_corruption(tmp_path):
    j = DurableJournal(str(tmp_path))
    j.add(b"a", 1, 1)
    j.add(b"b", 3, 1)
    j.sync()
    j._destroy()
    with pytest.raises(JournalCorrupt, match="expected 2"):
        DurableJournal(str(tmp_path))


def test_compaction_keeps_tail_and_survives_reopen(tmp_path):
    j = DurableJournal(str(tmp_path))
    _fill(j, 1, 100)
    j.sync()
    j.deleteEntriesTo(40)  # keep entries 41..100
    assert j[0][1] == 41 and len(j) == 60
    assert j.getRaftCommitIndex() == 41  # the new head was applied before compaction
    j.add(b"more", 101, 2)
    j.sync()
    j._destroy()
    j2 = DurableJournal(str(tmp_path))
    assert [e[1] for e in j2[:]] == list(range(41, 102))
    assert j2.getRaftCommitIndex() == 41
    assert not os.path.exists(str(tmp_path / (JOURNAL_NAME + ".compact")))


def test_truncation_is_synced_immediately(tmp_path):
    j = DurableJournal(str(tmp_path), track_synced=True)
    _fill(j, 1, 10)
    j.sync()
    j.deleteEntriesFrom(5)  # drop 6..10
    assert j.synced_length == os.path.getsize(j.path)
    _fill(j, 6, 7, term=2)  # unsynced
    j._fd and os.close(j._fd)  # "crash": no sync
    j._fd = None
    cut_to_synced_length(str(tmp_path))
    j2 = DurableJournal(str(tmp_path))
    assert [e[1:] for e in j2[:]] == [(i, 1) for i in range(1, 6)]


def test_power_loss_drops_only_unsynced_entries(tmp_path):
    j = DurableJournal(str(tmp_path), track_synced=True)
    _fill(j, 1, 20)
    j.sync()
    _fill(j, 21, 30)  # written, never synced
    os.close(j._fd)
    j._fd = None
    old, new = cut_to_synced_length(str(tmp_path))
    assert new < old
    j2 = DurableJournal(str(tmp_path))
    assert len(j2) == 20 and j2[-1][1] == 20


def test_term_and_vote_are_durable_and_checksummed(tmp_path):
    j = DurableJournal(str(tmp_path))
    j.setCurrentTerm(7, "127.0.0.3:7001")
    j._destroy()
    j2 = DurableJournal(str(tmp_path))
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId()) == (7, "127.0.0.3:7001")
    j2._destroy()
    meta = tmp_path / META_NAME
    raw = bytearray(meta.read_bytes())
    raw[1] ^= 0x01
    meta.write_bytes(bytes(raw))
    with pytest.raises(JournalCorrupt, match="meta"):
        DurableJournal(str(tmp_path))


def test_vote_syncs_log_entries_first(tmp_path):
    j = DurableJournal(str(tmp_path), track_synced=True)
    _fill(j, 1, 3)
    j.setCurrentTerm(2, None)
    assert j.synced_length == os.path.getsize(j.path)


def test_commit_index_is_not_persisted(tmp_path):
    j = DurableJournal(str(tmp_path))
    _fill(j, 1, 10)
    j.setRaftCommitIndex(10)
    j.sync()
    j._destroy()
    # Raft's commit index is volatile: only a compaction point proves commitment.
    assert DurableJournal(str(tmp_path)).getRaftCommitIndex() == 1


def test_not_a_journal_is_refused(tmp_path):
    (tmp_path / JOURNAL_NAME).write_bytes(b"PYSYNCOBJ" + b"\0" * 40)
    with pytest.raises(JournalCorrupt, match="offset 0"):
        DurableJournal(str(tmp_path))


def test_compaction_copies_the_kept_records_as_encoding_them_would_write_them(tmp_path, monkeypatch):
    from coordinator.raft import journal as journal_module

    copied, encoded = tmp_path / "copied", tmp_path / "encoded"
    journals = []
    for where in (copied, encoded):
        j = DurableJournal(str(where))
        for idx in range(1, 51):
            j.add(b"cmd-%d" % idx * (idx % 7), idx, 1 + idx // 20)
        j.sync()
        journals.append(j)
    encodings = []
    real_encode = journal_module.encode_record
    monkeypatch.setattr(journal_module, "encode_record", lambda *a: encodings.append(a) or real_encode(*a))
    journals[0].deleteEntriesTo(30)
    assert encodings == [], "the kept records were copied, not encoded"
    journals[1]._rewrite(journals[1][30:], committed_through=31)  # what encoding the kept entries writes
    assert len(encodings) == 20
    for j in journals:
        j.add(b"after", 51, 3)
        j.sync()
    assert (copied / JOURNAL_NAME).read_bytes() == (encoded / JOURNAL_NAME).read_bytes()
    assert journals[0]._offsets == journals[1]._offsets
    for j in journals:
        j._destroy()
    reopened = DurableJournal(str(copied))
    assert [e[1] for e in reopened[:]] == list(range(31, 52))
    assert reopened[0] == (b"cmd-31" * 3, 31, 2) and reopened[-1] == (b"after", 51, 3)


# -- compaction prepared by the snapshot writer (prepare_compaction) -------------------------


def _filled(where, last: int = 50) -> DurableJournal:
    j = DurableJournal(str(where))
    for idx in range(1, last + 1):
        j.add(b"cmd-%d" % idx * (idx % 7), idx, 1 + idx // 20)
    j.sync()
    return j


def _same_journals(a_dir, a: DurableJournal, b_dir, b: DurableJournal) -> None:
    assert (a_dir / JOURNAL_NAME).read_bytes() == (b_dir / JOURNAL_NAME).read_bytes()
    assert a[:] == b[:] and a._offsets == b._offsets
    assert (a._end, a.synced_length, a.bytes_since_compaction) == (b._end, b.synced_length, b.bytes_since_compaction)


@pytest.mark.parametrize("appended_between", [0, 1, 9])
def test_a_prepared_compaction_leaves_the_file_an_unprepared_one_leaves(tmp_path, appended_between, monkeypatch):
    from coordinator.raft import journal as journal_module

    prepared_dir, plain_dir = tmp_path / "prepared", tmp_path / "plain"
    prepared, plain = _filled(prepared_dir), _filled(plain_dir)
    assert prepared.prepare_compaction(31) is True
    assert (prepared_dir / (JOURNAL_NAME + ".prepared")).exists()
    for j in (prepared, plain):
        for idx in range(51, 51 + appended_between):
            j.add(b"between-%d" % idx, idx, 3)
    # What the Raft thread reads at compaction: only the records appended since the prepare.
    reads = []
    real_read = journal_module.read_exactly
    monkeypatch.setattr(journal_module, "read_exactly",
                        lambda fd, size, off: reads.append(size) or real_read(fd, size, off))
    prepared.deleteEntriesTo(30)
    delta = sum(reads)
    assert delta == sum(len(journal_module.encode_record(*prepared[i])) for i in range(20, 20 + appended_between))
    plain.deleteEntriesTo(30)
    assert (prepared.prepared_compactions, plain.prepared_compactions) == (1, 0)
    assert not (prepared_dir / (JOURNAL_NAME + ".prepared")).exists()
    _same_journals(prepared_dir, prepared, plain_dir, plain)
    for j in (prepared, plain):
        j.add(b"after", 51 + appended_between, 3)
        j.sync()
    _same_journals(prepared_dir, prepared, plain_dir, plain)
    for j in (prepared, plain):
        j._destroy()
    reopened = DurableJournal(str(prepared_dir))
    assert [e[1] for e in reopened[:]] == list(range(31, 52 + appended_between))
    assert reopened.getRaftCommitIndex() == 31


def test_a_truncation_after_the_prepare_voids_it(tmp_path):
    prepared_dir, plain_dir = tmp_path / "prepared", tmp_path / "plain"
    prepared, plain = _filled(prepared_dir), _filled(plain_dir)
    assert prepared.prepare_compaction(31)
    for j in (prepared, plain):
        j.deleteEntriesFrom(40)  # entries 41.. replaced by a new leader's
        j.add(b"new-leader", 41, 4)
        j.deleteEntriesTo(30)
    assert prepared.prepared_compactions == 0
    _same_journals(prepared_dir, prepared, plain_dir, plain)
    assert prepared[-1] == (b"new-leader", 41, 4)


def test_a_compaction_to_another_point_voids_the_prepare(tmp_path):
    prepared_dir, plain_dir = tmp_path / "prepared", tmp_path / "plain"
    prepared, plain = _filled(prepared_dir), _filled(plain_dir)
    assert prepared.prepare_compaction(31)
    for j in (prepared, plain):
        j.deleteEntriesTo(20)  # keeps 21..
    assert prepared.prepared_compactions == 0
    _same_journals(prepared_dir, prepared, plain_dir, plain)


def test_nothing_is_prepared_for_a_point_the_file_does_not_hold(tmp_path):
    j = _filled(tmp_path)
    assert j.prepare_compaction(51) is False  # past the last entry
    assert j.prepare_compaction(0) is False  # before the first
    assert j.prepare_compaction(50) is True  # the last entry: kept alone
    j.deleteEntriesTo(49)
    assert j.prepared_compactions == 1 and j[:] == [(b"cmd-50" * 1, 50, 3)]


def test_appends_during_the_prepare_are_copied_at_the_compaction(tmp_path):
    """The writer thread prepares while the Raft thread appends: whatever the interleaving,
    the compacted journal holds every entry from the point on, once, in order."""
    import threading

    for round_ in range(5):
        where = tmp_path / f"round-{round_}"
        j = _filled(where, last=200)
        stop = threading.Event()
        appended = [200]

        def append(stop=stop, appended=appended, j=j):  # this round's, bound (the thread is joined in it)
            while not stop.is_set() and appended[0] < 5_000:
                appended[0] += 1
                j.add(b"x" * (appended[0] % 300), appended[0], 5)

        appender = threading.Thread(target=append)
        appender.start()
        try:
            assert j.prepare_compaction(101)
        finally:
            stop.set()
            appender.join(30)
        j.sync()
        j.deleteEntriesTo(100)
        assert j.prepared_compactions == 1
        assert [e[1] for e in j[:]] == list(range(101, appended[0] + 1))
        j._destroy()
        assert DurableJournal(str(where))[:] == j[:]


def test_dropped_entries_are_freed_off_the_compacting_thread(tmp_path, monkeypatch):
    """A compaction hands the lists it replaces and the replaced file's descriptor to the
    reaper (freed a slice at a time and closed on its own thread, not the Raft thread's); the
    journal keeps its own lists and file, and what it handed over is emptied and closed."""
    from coordinator.raft import journal as journal_module

    handed = []
    real_free = journal_module.REAPER.free
    monkeypatch.setattr(journal_module.REAPER, "free", lambda *lists: handed.extend(lists) or real_free(*lists))
    closed = []
    real_close = journal_module.REAPER.close
    monkeypatch.setattr(journal_module.REAPER, "close", lambda fd: closed.append(fd) or real_close(fd))
    j = _filled(tmp_path, last=20_000)
    before, old_fd = j._entries, j._fd
    j.deleteEntriesTo(19_990)
    assert handed[0] is before and all(h is not j._entries and h is not j._offsets for h in handed)
    assert closed == [old_fd] and j._fd != old_fd, "the replaced file is closed by the reaper"

    def old_fd_closed() -> bool:
        try:
            os.fstat(old_fd)
        except OSError:
            return True
        return False

    deadline = time.monotonic() + 10
    while (any(handed) or not old_fd_closed()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(handed), "the reaper left the dropped lists alive"
    assert old_fd_closed(), "the reaper left the replaced file open"
    assert [e[1] for e in j[:]] == list(range(19_991, 20_001))

"""The proposal sequence of one restore (coordinator/server/backups.py) against a fake proposer:
after a failure the staging is aborted, and the ABORT is retried through an election."""

from __future__ import annotations

import msgpack
import pytest

from coordinator.core import limits
from coordinator.core.commands import Op
from coordinator.core.results import RestoreAbortResult, RestoreBeginResult, RestoreChunkResult, RestoreResult
from coordinator.core.state_machine import FencingStateMachine
from coordinator.server import backups
from coordinator.server.errors import Failure, ServiceError
from testsupport.backups import backup_of_size

BACKUP = backup_of_size(2 * limits.BACKUP_CHUNK_BYTES)


class FakeRun:
    """Core.run as the restore sees it: ``fail`` maps an op to how many of its calls fail
    with NO_LEADER (as during an election), or to -1 for all of them."""

    def __init__(self, fail: dict[Op, int]):
        self.fail = dict(fail)
        self.calls: list[Op] = []

    def __call__(self, command, **kwargs):
        self.calls.append(command.op)
        left = self.fail.get(command.op, 0)
        if left:
            self.fail[command.op] = left - 1 if left > 0 else left
            raise ServiceError(Failure.NO_LEADER, "no leader reachable")
        return ANSWERS[command.op], 7


# What each step of a restore answers (only the COMMIT's is read).
ANSWERS = {
    Op.RESTORE_BEGIN: RestoreBeginResult(size=len(BACKUP)),
    Op.RESTORE_CHUNK: RestoreChunkResult(staged_bytes=0),
    Op.RESTORE_COMMIT: RestoreResult(epoch=11, resources=1),
    Op.RESTORE_ABORT: RestoreAbortResult(aborted=True),
}


def restore(run, **kwargs):
    return backups.restore(run, FencingStateMachine().check_backup, BACKUP, 10, 5.0, **kwargs)


def test_a_restore_proposes_begin_its_chunks_in_order_then_commit():
    run = FakeRun({})
    assert restore(run) == (RestoreResult(epoch=11, resources=1), 7)
    chunks = -(-len(BACKUP) // limits.BACKUP_CHUNK_BYTES)
    assert run.calls == [Op.RESTORE_BEGIN, *[Op.RESTORE_CHUNK] * chunks, Op.RESTORE_COMMIT]


def test_the_abort_after_a_failed_chunk_is_retried_through_an_election(monkeypatch):
    monkeypatch.setattr(backups, "RESTORE_ABORT_PAUSE_S", 0.0)
    run = FakeRun({Op.RESTORE_CHUNK: 1, Op.RESTORE_ABORT: 3})
    with pytest.raises(ServiceError):
        backups.restore(run, FencingStateMachine().check_backup, BACKUP, 10, 5.0)
    # One chunk failed; the ABORT found no leader three times, then went through.
    assert run.calls == [Op.RESTORE_BEGIN, Op.RESTORE_CHUNK, *[Op.RESTORE_ABORT] * 4]


def test_an_abort_that_never_finds_a_leader_is_given_up_after_its_deadline():
    run = FakeRun({Op.RESTORE_ABORT: -1})
    backups._abort(run, b"r" * limits.RESTORE_ID_BYTES, retry_s=0.05, pause_s=0.01)
    assert 1 <= run.calls.count(Op.RESTORE_ABORT) <= 6


def test_a_backup_the_state_machine_would_refuse_proposes_nothing():
    run = FakeRun({})
    bad = msgpack.packb(["fencing-coordinator/state", 2, 5, 0, [["r", 5, 2**64 - 1, None, []]], [], None])
    with pytest.raises(ServiceError) as caught:
        backups.restore(run, FencingStateMachine().check_backup, bad, 10, 5.0)
    assert caught.value.key is Failure.INVALID_INPUT
    assert run.calls == []

"""The chaos runner's check that a follower fault leaves the leader leading in its term
(chaos/runner.py ``Run.check_leadership_kept``; RAFT.md "Pre-vote"): it must catch a new
leader and a new term of the same leader, on follower faults only, and pass a fault that moved
nothing. The statuses come from a stand-in cluster; the runs themselves are the CI profile's."""

from __future__ import annotations

import types

import pytest

from chaos import faults as F
from chaos.runner import Run


class _Statuses:
    def __init__(self, answers):
        self.answers = answers  # list of (leader, term) per member

    def statuses(self):
        return {i: types.SimpleNamespace(leader=leader, term=term) for i, (leader, term) in enumerate(self.answers)}


def _run_with(answers) -> Run:
    run = object.__new__(Run)  # no cluster, no out dir: only the check is exercised
    run.cluster = _Statuses(answers)
    run.errors = []
    return run


BEFORE = [("a:1", 5), ("a:1", 5), ("a:1", 5)]


@pytest.mark.parametrize("after, changes", [
    ([("b:1", 6), ("b:1", 6), ("a:1", 5)], 1),  # another member leads, one term on
    ([("a:1", 8), ("a:1", 8), ("a:1", 8)], 3),  # the same member, re-elected three times
], ids=["new-leader", "same-leader-new-term"])
@pytest.mark.parametrize("fault", [F.Pause("follower"), F.KillRestart("follower"), F.Partition("follower"),
                                   F.Partition("bridge")], ids=repr)
def test_a_follower_fault_that_moved_the_leadership_is_an_error(fault, after, changes):
    run = _run_with(BEFORE)
    before = run.leadership()
    run.cluster.answers = after
    step: dict = {}
    run.check_leadership_kept(fault, step, before)
    assert step["leader_changes"] == changes
    assert len(run.errors) == 1 and "moved the leadership" in run.errors[0], run.errors


def test_a_follower_fault_that_moved_nothing_passes():
    run = _run_with(BEFORE)
    step: dict = {}
    run.check_leadership_kept(F.Pause("follower"), step, run.leadership())
    assert step["leader_changes"] == 0 and run.errors == []


@pytest.mark.parametrize("fault", [F.Pause("leader"), F.KillRestart("leader"), F.Partition("leader"), F.OneWay()],
                         ids=repr)
def test_a_leader_fault_may_move_it(fault):
    run = _run_with(BEFORE)
    before = run.leadership()
    run.cluster.answers = [("b:1", 6)] * 3
    step: dict = {}
    run.check_leadership_kept(fault, step, before)
    assert step["leader_changes"] == 1 and run.errors == []

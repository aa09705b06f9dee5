"""A slow convergence keeps what it waited on (chaos/convergence_trace.py): the runner's wait
notes each change of what stopped the cluster from counting as converged, a step slower than
SLOW_CONVERGENCE_S (or without convergence) keeps and prints the notes, and a fast one does not."""

from __future__ import annotations

import itertools
import types

import pytest

from chaos import convergence_trace as CT
from chaos import faults as F
from chaos.harness import ChaosCluster
from chaos.runner import Run


def test_a_note_is_kept_once_per_change_with_its_time():
    trace = CT.ConvergenceTrace(started=100.0)
    trace.note("no leader", now=100.5)
    trace.note("no leader", now=101.0)  # unchanged: not noted again
    trace.note("probe write unknown: OutcomeUnknown: lost", now=103.25)
    trace.note("no leader", now=104.0)  # back again: a change
    assert trace.record() == [[0.5, "no leader"], [3.25, "probe write unknown: OutcomeUnknown: lost"],
                              [4.0, "no leader"]]
    assert trace.render() == "0.5 s no leader; 3.2 s probe write unknown: OutcomeUnknown: lost; 4.0 s no leader"
    assert CT.ConvergenceTrace().render() == "nothing (converged at the first look)"


def test_a_long_wait_keeps_its_first_notes_and_its_latest():
    trace = CT.ConvergenceTrace(started=0.0)
    for k in range(CT.TRACE_NOTES_MAX + 15):
        trace.note(f"state {k}", now=float(k))
    kept = [what for _, what in trace.notes]
    assert len(kept) == CT.TRACE_NOTES_MAX
    half = CT.TRACE_NOTES_MAX // 2
    assert kept[:half] == [f"state {k}" for k in range(half)]
    assert kept[-1] == f"state {CT.TRACE_NOTES_MAX + 14}"
    assert "(15 notes left out)" in trace.render()


def _run_with(cluster, failures) -> Run:
    """A Run with only what wait_converged uses: a cluster, and a probe that fails with each
    of ``failures`` in turn (None: it succeeds), as Run.probe reports."""
    run = Run.__new__(Run)
    run.cluster = cluster
    run._probe = lambda: next(failures)
    return run


def test_the_wait_notes_each_member_s_view_and_the_probe_s_failure(tmp_path):
    with ChaosCluster(str(tmp_path / "cluster")) as c:
        c.start_all()
        c.pause(1)
        c.pause(2)
        # One member of three. A leader among them still answers Status for its lease (so the
        # members' check can pass at first), never once it lapses; the probe never passes.
        run = _run_with(c, itertools.repeat("probe acquire unknown: no quorum"))
        assert run.wait_converged(5.0) is None
        views = [what for _, what in run.convergence_trace.notes if "n1 paused, n2 paused" in what]
        assert views, run.convergence_trace.notes
        assert "n0 leader=" in views[0] and " term=" in views[0] and " applied=" in views[0], views
        c.resume(1)
        c.resume(2)
        run = _run_with(c, iter(["probe acquire unknown: OutcomeUnknown: the connection dropped", None]))
        assert run.wait_converged(30.0) is not None
        assert [what for _, what in run.convergence_trace.notes][-1] == \
            "probe acquire unknown: OutcomeUnknown: the connection dropped"


class _Quiet(F.Fault):
    kind = "quiet"

    def inject(self, c):
        pass

    def heal(self, c):
        pass


@pytest.mark.parametrize("convergence_s, kept", [(CT.SLOW_CONVERGENCE_S + 1.0, True), (None, True), (0.4, False)])
def test_a_slow_step_keeps_and_prints_its_trace_and_a_fast_one_does_not(convergence_s, kept, capsys):
    run = Run.__new__(Run)  # only run_fault's bookkeeping: no cluster, no clients
    run.errors, run.converge_timeout_s = [], 1.0
    run.cluster = types.SimpleNamespace(statuses=lambda: {})
    run.writer = types.SimpleNamespace(write=lambda record: None)

    def wait_converged(timeout_s):
        run.convergence_trace = CT.ConvergenceTrace(started=0.0)
        run.convergence_trace.note("members to agree on a leader [n0 leader=- term=3 applied=9]", now=0.2)
        return convergence_s

    run.wait_converged = wait_converged
    run.wait_workload_flowing = lambda since_ns, timeout_s: 0.0
    step = run.run_fault(_Quiet(), hold_s=0.0)
    printed = capsys.readouterr().out
    if kept:
        assert step["convergence_trace"] == [[0.2, "members to agree on a leader [n0 leader=- term=3 applied=9]"]]
        assert step["load_avg_1m"] >= 0.0
        line = f"[chaos]   convergence waited on (load average {step['load_avg_1m']}): 0.2 s members to agree"
        assert line in printed
    else:
        assert "convergence_trace" not in step
        assert "convergence waited on" not in printed


class _LeaderFault(_Quiet):
    kind = "quiet_leader"
    leader_fault = True


@pytest.mark.parametrize("failures, failover", [(["probe write unknown: x", None], True),
                                                (itertools.repeat("probe acquire refused: y"), False)])
def test_a_leader_fault_s_failover_is_the_first_acknowledged_probe_or_an_error(failures, failover, monkeypatch):
    """Run.probe answers True for an acknowledged write: a probe that answered the other way
    round once made every failover wait its whole bound and report None, with no error."""
    import chaos.runner as runner

    monkeypatch.setattr(runner, "FAILOVER_TIMEOUT_S", 0.5)
    run = Run.__new__(Run)
    run.errors, run.converge_timeout_s = [], 1.0
    run.cluster = types.SimpleNamespace(statuses=lambda: {})
    run.writer = types.SimpleNamespace(write=lambda record: None)
    answers = iter(failures)
    run._probe = lambda: next(answers)
    run.wait_converged = lambda timeout_s: 0.1
    run.wait_workload_flowing = lambda since_ns, timeout_s: 0.0
    step = run.run_fault(_LeaderFault(), hold_s=0.0)
    if failover:
        assert step["failover_s"] is not None and step["failover_s"] < 0.5
        assert run.errors == []
    else:
        assert step["failover_s"] is None
        assert run.errors == ["quiet_leader: no probe write acknowledged within 0.5 s of the fault (failover): "
                              "probe acquire refused: y"]

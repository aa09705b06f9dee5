"""The chaos report's longest gap between acknowledged operations during a fault
(chaos/report.py ``longest_ack_gap_s``): only ``ok`` answers close a gap, the window's edges
count as its ends, and each fault kind reports the worst of its steps."""

from __future__ import annotations

from chaos.history import History, Op
from chaos.report import ack_gaps_by_fault, longest_ack_gap_s

S = 1_000_000_000  # ns per second


def _op(complete_s: float, outcome: str = "ok") -> Op:
    done = int(complete_s * S)
    return Op(process="c1", op_id=None, f="write", resource="r", invoke_ns=done - 1, outcome=outcome, complete_ns=done)


def test_the_longest_stretch_without_an_ok_answer_is_reported():
    history = History(ops=[_op(1.0), _op(1.1), _op(1.9), _op(2.0)])
    assert longest_ack_gap_s(history, 1 * S, 2 * S) == 0.8


def test_refused_and_unknown_answers_do_not_close_a_gap_and_edges_do():
    history = History(ops=[_op(1.2), _op(1.5, "refused"), _op(1.6, "unknown"), _op(2.7)])
    # 1.2 -> 2.7 with nothing acknowledged in between; from 0.9 to 1.2 and 2.7 to 3.0 shorter.
    assert longest_ack_gap_s(history, int(0.9 * S), 3 * S) == 1.5
    # No acknowledgement at all inside the window: the whole window is one gap.
    assert longest_ack_gap_s(History(ops=[_op(5.0)]), 1 * S, 3 * S) == 2.0
    assert longest_ack_gap_s(history, 3 * S, 3 * S) is None


def test_each_fault_kind_reports_its_worst_step_and_steps_get_their_own_figure():
    history = History(ops=[_op(t / 10) for t in range(10, 31)] + [_op(4.0), _op(6.0)])
    steps = [
        {"kind": "pause_follower", "inject_t_ns": 1 * S, "heal_t_ns": 2 * S},
        {"kind": "pause_follower", "inject_t_ns": int(3.5 * S), "heal_t_ns": int(5.5 * S)},
        {"kind": "kill_leader", "inject_t_ns": 1 * S, "heal_t_ns": 3 * S},
        {"kind": "errored", "inject_t_ns": 1 * S},  # no heal recorded: no figure
    ]
    gaps = ack_gaps_by_fault(history, steps)
    assert gaps == {"pause_follower": 1.5, "kill_leader": 0.1}
    assert [s.get("longest_ack_gap_s") for s in steps] == [0.1, 1.5, 0.1, None]

"""A fault with a hard timeout (``Fault.timeout_s``, the exhaustion faults') stops the run when
its step overruns it, naming the fault; a step that ends in time leaves the run going."""

from __future__ import annotations

import threading

import pytest

from chaos import runner
from chaos.faults import Fault


class Stuck(Fault):
    """Its inject waits until released: a fault that hangs."""

    kind = "stuck"

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self.timeout_s = timeout_s
        self.release = threading.Event()

    def inject(self, c):
        self.release.wait(30)

    def heal(self, c):
        pass


@pytest.fixture
def run(tmp_path, monkeypatch):
    r = runner.Run(str(tmp_path / "run"), seed=1, converge_timeout_s=0.1)
    overran = threading.Event()
    r.overran_what = []

    def overrun(what="profile"):  # the real one tears down and exits the process
        r.overran_what.append(what)
        overran.set()

    monkeypatch.setattr(r, "_overrun", overrun)
    monkeypatch.setattr(r, "wait_converged", lambda timeout_s: 0.0)  # no members started
    r.overran = overran
    try:
        yield r
    finally:
        r.cluster.close()
        r.writer.close()


def test_a_fault_past_its_hard_timeout_stops_the_run_naming_it(run):
    fault = Stuck(timeout_s=0.2)
    threading.Thread(target=lambda: run.overran.wait(10) and fault.release.set(), daemon=True).start()
    run.run_fault(fault, hold_s=0.0)
    assert run.overran_what == ["stuck (its step)"]


def test_a_fault_within_its_timeout_leaves_the_run_going(run):
    fault = Stuck(timeout_s=5.0)
    fault.release.set()
    step = run.run_fault(fault, hold_s=0.0)
    assert step["kind"] == "stuck" and run.overran_what == []
    assert not run.overran.wait(5.5)  # the timer was cancelled, not merely not yet due

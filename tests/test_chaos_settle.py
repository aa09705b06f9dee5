"""The chaos runner waits, after convergence, until every workload client acknowledged again
(``Run.wait_workload_flowing``), so that a follower fault right after a whole-cluster one
measures its own gap, not the clients' backoff; ``last_ack_ns`` reads a client history's end."""

from __future__ import annotations

import json
import os
import types

from chaos import runner


def _op(complete_ns: int, outcome: str = "ok") -> str:
    return json.dumps({"type": "op", "f": "write", "outcome": outcome, "complete_ns": complete_ns},
                      separators=(",", ":")) + "\n"


def test_last_ack_is_the_last_ok_op_skipping_refusals_and_a_half_written_line(tmp_path):
    path = tmp_path / "c0.jsonl"
    path.write_text(_op(10) + _op(20) + _op(30, "refused") + '{"type":"op","outcome":"ok","complete_')
    assert runner.last_ack_ns(str(path)) == 20


def test_last_ack_reads_only_the_end_of_a_long_history(tmp_path):
    path = tmp_path / "c0.jsonl"
    filler = _op(5) * (2 * runner.HISTORY_TAIL_BYTES // len(_op(5)))
    path.write_text(filler + _op(99))
    assert os.path.getsize(path) > runner.HISTORY_TAIL_BYTES
    assert runner.last_ack_ns(str(path)) == 99


def test_no_history_or_no_ack_is_none(tmp_path):
    assert runner.last_ack_ns(str(tmp_path / "missing.jsonl")) is None
    (tmp_path / "c1.jsonl").write_text(_op(7, "refused"))
    assert runner.last_ack_ns(str(tmp_path / "c1.jsonl")) is None


def test_waits_for_every_client_and_gives_up_at_its_timeout(tmp_path):
    clients = tmp_path / "clients"
    clients.mkdir()
    (clients / "c0.jsonl").write_text(_op(200))
    (clients / "c1.jsonl").write_text(_op(50))  # nothing acknowledged since 100
    (clients / "cx.jsonl").write_text(_op(1))  # a hazard role's history: not a workload client
    run = types.SimpleNamespace(out=str(tmp_path))
    assert runner.Run.wait_workload_flowing(run, 100, 0.2) is None
    with open(clients / "c1.jsonl", "a") as f:
        f.write(_op(150))
    settled = runner.Run.wait_workload_flowing(run, 100, 5.0)
    assert settled is not None and settled < 5.0

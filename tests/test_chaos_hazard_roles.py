"""The hazard roles of chaos/hazards.py against the real servicers (testsupport's in-process
cluster): every hostile kind and malformed shape is sent, refused for the reason it was built
to trip, and changes nothing; the operator records each admin op with what the checker
needs to judge it (chaos/check.py checks 6 and 7). The recorded history then passes the
checker, which counts what was exercised."""

from __future__ import annotations

import json
import logging
import random
import threading

import pytest

from chaos import check as chk
from chaos import hazards as H
from chaos.history import HistoryWriter, read_history
from chaos.workload import Recorder, _attempt_log, attempt_log, make_client
from testsupport.inmemory import InMemoryCluster
from testsupport.supervisor import wait_until

# Why each hostile write must be refused: the reason the recorder takes from the refusal.
EXPECTED_REASON = {
    "hostile_never_issued": {"UNKNOWN_TOKEN"},  # hwm + 2**40 was never issued for the resource
    "hostile_foreign_token": {"UNKNOWN_TOKEN"},  # newer than the resource's hwm: not issued for it
    "hostile_huge_token": {"INVALID_ARGUMENT", "FAILED_PRECONDITION"},  # 2^63: out of range, or never issued
    "hostile_malformed": {"INVALID_ARGUMENT"},
}


class Pick(random.Random):
    """An rng whose choice among the malformed shapes is ``shape`` (else the first item)."""

    def __init__(self, shape: str) -> None:
        super().__init__(0)
        self.shape = shape

    def choice(self, seq):
        return self.shape if seq is H.MALFORMED_SHAPES else seq[0]


@pytest.fixture
def rec(tmp_path):
    with InMemoryCluster() as cluster, make_client(cluster.endpoints) as client:
        with HistoryWriter(str(tmp_path / "h.jsonl")) as writer:
            recorder = Recorder(client, writer, "hx")
            recorder.history_path = str(tmp_path / "h.jsonl")  # the writer flushes every line
            yield recorder


def records(rec: Recorder) -> list[dict]:
    with open(rec.history_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_each_hostile_kind_is_sent_refused_and_changes_nothing(rec):
    # hot0 as the contention leaves it: held once, written once.
    outcome, lease = rec.acquire("hot0", 5000, holder="cx")
    assert outcome == "ok"
    assert rec.write("hot0", H.KEY, "cx-1", lease.token)[0] == "ok"
    rec.release("hot0", lease.token)
    quiet = H.quiet_resource("hx")
    assert H._settle_quiet(rec, quiet, threading.Event())
    channels: dict = {}
    sent = []
    for kind in H.HOSTILE_KINDS:
        for shape in (H.MALFORMED_SHAPES if kind == "malformed" else (None,)):
            for resource, watch in (("hot0", False), (quiet, True)):
                value = f"hx-{kind}-{shape}-{resource}"
                outcome = H.hostile_op(rec, channels, kind, resource, value, Pick(shape or ""), watch=watch)
                assert outcome == "refused", (kind, shape, resource)
                sent.append(value)
    for ch in channels.values():
        ch.close()

    hostile = [r for r in records(rec) if r.get("hazard", "").startswith("hostile")]
    assert [r["value"] for r in hostile] == sent
    for r in hostile:
        assert r["outcome"] == "refused" and r["reason"] in EXPECTED_REASON[r["hazard"]], r
        r.setdefault("args", {})
    shapes = {r["args"]["shape"] for r in hostile if r["hazard"] == "hostile_malformed"}
    assert shapes == set(H.MALFORMED_SHAPES)
    watched = [r for r in hostile if r["args"].get("quiet") == quiet]
    assert len(watched) == len(hostile) // 2
    for r in watched:
        a = r["args"]
        assert (a["hwm_before"], a["version_before"]) == (a["hwm_after"], a["version_after"]), r
        assert a["hwm_before"] > 0 and a["version_before"] == 1
        assert a["watch_from_ns"] <= r["invoke_ns"] <= r["complete_ns"] <= a["watch_to_ns"]
    assert rec.client.read("hot0", H.KEY).value == b"cx-1"  # no refusal wrote

    report = chk.check_history(read_history(rec.history_path))
    assert report.ok, [v.to_dict() for v in report.violations]
    assert report.summary["hazards"]["refusals_watched"] == {"judged": len(watched), "not_judged": 0}
    assert set(report.summary["hazards"]["by_hazard"]) == set(EXPECTED_REASON)


def test_the_operator_records_each_admin_op_with_what_the_checker_needs(rec):
    outcome, lease = rec.acquire("hot0", 5000, holder="cx")
    assert rec.write("hot0", H.KEY, "cx-1", lease.token)[0] == "ok"
    stop = threading.Event()
    # Five rounds: five force-releases, a floor on the third, a restore on the fifth.
    role = threading.Thread(target=H.operator, args=(rec, ["hot0"], random.Random(3), stop, 0.01))
    role.start()
    try:
        wait_until(lambda: sum(rec.counts.values()) >= 2 + 5 + 2, 20.0, what="five operator rounds")
    finally:
        stop.set()
        role.join(10)
    ops = [r for r in records(rec) if r["process"] == "hx" and r["f"] in ("force_release", "set_epoch_floor",
                                                                           "restore")]
    by_f = {f: [r for r in ops if r["f"] == f] for f in ("force_release", "set_epoch_floor", "restore")}
    assert len(by_f["force_release"]) >= 5 and by_f["set_epoch_floor"] and by_f["restore"]
    assert all(r["outcome"] == "ok" for r in ops), ops
    for r in by_f["force_release"]:
        assert r["resource"] == "hot0" and r["result"]["hwm"] > lease.token and r["result"]["applied_index"] > 0
    floor = by_f["set_epoch_floor"][0]
    assert floor["resource"] == "*" and floor["args"]["fence_all"] is True
    assert floor["result"]["epoch"] >= floor["args"]["floor"]
    restore = by_f["restore"][0]
    assert restore["resource"] == "*" and restore["result"]["epoch"] >= restore["args"]["floor"]
    assert restore["args"]["backup"]["hot0"][H.KEY] == {"value": "cx-1", "version": 1}

    report = chk.check_history(read_history(rec.history_path))
    assert report.ok, [v.to_dict() for v in report.violations]
    admin = report.summary["hazards"]["admin"]
    assert set(admin) == {"force_release", "set_epoch_floor", "restore"}


def test_a_call_whose_attempts_failed_records_each_of_them(tmp_path):
    """The recorder keeps the client's failed attempts on the op's line: how the soak's write
    refused after a maybe-applied attempt would have said what that attempt met."""
    dead = "127.0.0.1:1"  # nothing listens there: every attempt on it fails at once
    path = str(tmp_path / "h.jsonl")
    with InMemoryCluster() as cluster, attempt_log():
        with HistoryWriter(path) as writer:
            with make_client(cluster.endpoints) as client:
                recorder = Recorder(client, writer, "c0")
                assert recorder.read("r0", "a")[0] == "ok"
                lease = client.acquire("r0", ttl_ms=5000, holder="other")
                assert recorder.acquire("r0", 5000, holder="c0")[0] == "refused"  # LeaseHeld, not retried
                client.release("r0", token=lease.token)
            with make_client([dead], timeout_s=2.0) as client:
                assert Recorder(client, writer, "c1").read("r0", "a")[0] == "refused"
    lines = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert [line["outcome"] for line in lines] == ["ok", "refused", "refused"]
    assert "attempts" not in lines[0]  # one attempt, and it answered
    assert lines[1]["reason"] == "LEASE_HELD" and "attempts" not in lines[1]  # one attempt: its reason says it
    attempts = lines[2]["attempts"]
    assert 2 <= len(attempts) <= 8, attempts
    assert all(f" on {dead}: " in a for a in attempts), attempts
    assert attempts[0].startswith("Read attempt 1 on ") and attempts[0].endswith("(retrying)"), attempts
    assert len(read_history(path).ops) == 3  # still a history the checker reads


def test_the_attempt_log_changes_no_other_handler_and_undoes_itself(tmp_path, caplog):
    """Inside ``attempt_log`` the client's DEBUG lines reach the attempt log only, its INFO and
    above reach the root's handlers as before; outside, the client logger is as it was (a test
    process that records calls must not change how every later test logs)."""
    caplog.set_level(logging.INFO)
    client_log = logging.getLogger("coordinator.client")
    root_levels = [h.level for h in logging.getLogger().handlers]
    before = client_log.level, client_log.propagate, list(client_log.handlers)
    with attempt_log():
        _attempt_log.start()
        client_log.debug("Read attempt 1 on x: Unavailable (retrying)")
        client_log.warning("a warning for everyone")
        assert _attempt_log.take() == ["Read attempt 1 on x: Unavailable (retrying)"]
    assert [r.getMessage() for r in caplog.records] == ["a warning for everyone"]
    assert (client_log.level, client_log.propagate, list(client_log.handlers)) == before
    assert [h.level for h in logging.getLogger().handlers] == root_levels
    _attempt_log.start()
    client_log.warning("after")
    assert _attempt_log.take() == []  # outside: nothing collected
    assert [r.getMessage() for r in caplog.records][-1] == "after"

"""The limiter of log lines about refused calls, and the shortening of caller-supplied values
(coordinator/server/log_limits.py), in-process with a manual clock."""

from __future__ import annotations

import json
import logging

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.server import log_limits
from coordinator.server.admin import audit_args
from coordinator.server.log_limits import Admitted, RefusedLines


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(clock, **kwargs) -> RefusedLines:
    settings = {"per_caller_max": 3, "total_max": 100, "window_s": 60, "callers_max": 8, **kwargs}
    return RefusedLines(clock=clock, **settings)


def test_a_caller_gets_its_lines_per_window_and_its_next_line_reports_the_rest():
    clock = ManualClock()
    lines = limiter(clock)
    got = [lines.admit("host ipv4:10.0.0.9") for _ in range(40)]
    assert got[:3] == [Admitted(0, 0)] * 3
    assert got[3:] == [None] * 37
    clock.now += 59.9  # still the same window
    assert lines.admit("host ipv4:10.0.0.9") is None
    clock.now += 0.1  # the window is over: the next line says how many were held back
    first = lines.admit("host ipv4:10.0.0.9")
    assert first == Admitted(suppressed=38)
    assert first.note() == " (38 similar suppressed)"
    assert first.fields() == {"suppressed": 38}
    assert lines.admit("host ipv4:10.0.0.9") == Admitted(0, 0)  # the count was reported once


def test_callers_are_counted_apart():
    clock = ManualClock()
    lines = limiter(clock)
    for _ in range(10):
        lines.admit("principal alice")
    assert lines.admit("principal alice") is None
    assert lines.admit("principal bob") == Admitted(0, 0)
    assert lines.admit("host ipv4:10.0.0.9") == Admitted(0, 0)


def test_the_member_wide_cap_holds_whatever_the_number_of_callers():
    clock = ManualClock()
    lines = limiter(clock, total_max=5, callers_max=1000)
    written = [key for key in (f"host ipv4:10.0.{i // 250}.{i % 250}" for i in range(500)) if lines.admit(key)]
    assert len(written) == 5
    clock.now += 60
    assert lines.admit("host ipv4:10.0.1.1") == Admitted(suppressed=1)


def test_the_table_of_callers_is_bounded_and_a_forgotten_callers_count_is_still_reported():
    clock = ManualClock()
    lines = limiter(clock, per_caller_max=1, callers_max=4)
    assert lines.admit("host a") and lines.admit("host a") is None  # a: one suppressed
    for key in ("host b", "host c", "host d", "host e"):  # e pushes a, the least recent, out
        lines.admit(key)
    assert lines.tracked() == 4
    for i in range(10_000):
        lines.admit(f"host x{i}")
    assert lines.tracked() == 4  # never more than callers_max, however many callers come
    clock.now += 60
    report = lines.admit("host new")
    assert report.forgotten >= 1  # a's suppressed line, and those of the x hosts pushed out
    assert "callers no longer tracked" in report.note()


def test_a_string_is_shown_by_its_prefix_and_length_beyond_the_prefix():
    out: dict = {}
    log_limits.field_summary("resource", "r" * 4_000_000, out)
    log_limits.field_summary("member_id", "m1", out)
    log_limits.field_summary("data", b"\0" * 4096, out)
    log_limits.field_summary("floor", 7, out)
    prefix = log_limits.AUDIT_FIELD_PREFIX_CHARS_MAX
    assert out == {"resource_prefix": "r" * prefix, "resource_chars": 4_000_000, "member_id": "m1",
                   "data_bytes": 4096, "floor": 7}
    assert log_limits.shown("10.0.0.1:7000") == "'10.0.0.1:7000'"
    assert log_limits.shown("x" * 1_000_000) == repr("x" * prefix) + "... (1000000 characters)"


def test_an_audit_lines_arguments_are_bounded_whatever_the_request_carries():
    request = pb.MemberAddRequest(member_id="\U0001f600" * 1_000_000, raft_address="a" * 4_000_000)
    line = json.dumps(audit_args(request))
    assert len(line.encode()) < 1024
    assert json.loads(line)["raft_address_chars"] == 4_000_000


def test_the_library_filter_lets_a_few_lines_through_and_counts_the_rest(caplog):
    clock = ManualClock()
    logger = logging.getLogger("test_log_limits.library")
    line_filter = log_limits.install_library_filter(limiter(clock, per_caller_max=2), (logger.name,))
    try:
        with caplog.at_level(logging.ERROR, logger=logger.name):
            for _ in range(50):
                logger.error("Exception deserializing request!")
            clock.now += 60
            logger.error("Exception deserializing request!")
    finally:
        logger.removeFilter(line_filter)
    messages = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert messages == ["Exception deserializing request!"] * 2 + [
        "Exception deserializing request! (48 similar suppressed)"]


def test_a_library_line_and_its_traceback_are_bounded(caplog):
    clock = ManualClock()
    logger = logging.getLogger("test_log_limits.library_exception")
    line_filter = log_limits.install_library_filter(limiter(clock), (logger.name,))
    value = "v" * 4_000_000  # what a caller sent, inside an exception's message
    try:
        with caplog.at_level(logging.ERROR, logger=logger.name):
            try:
                raise ValueError(f"bad field {value}")
            except ValueError as exc:
                logger.exception("Exception calling application: {}".format(exc))
    finally:
        logger.removeFilter(line_filter)
    (record,) = [r for r in caplog.records if r.name == logger.name]
    text = logging.Formatter().format(record)
    assert len(text) <= log_limits.LIBRARY_LINE_CHARS_MAX + 100
    assert text.startswith("Exception calling application: bad field vvv")
    assert "characters left out" in text and "ValueError" in text

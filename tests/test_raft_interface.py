"""What the Raft layer hands its callers, checked where it crosses into the server.

``propose()`` answers with a ``ProposeOutcome`` and, when not applied, a typed
``ProposeFailure``; the server maps the enum (never a parsed string) to a status. Every
member must map, definite failures must never read as "unknown" (nor the reverse: a
client would retry anywhere something that may still apply), and the ``detail`` strings
clients see in ErrorInfo metadata stay what they were.
"""

from __future__ import annotations

import inspect

import grpc
import pytest
from pysyncobj.config import FAIL_REASON

from coordinator.core.names import ErrorReason as R
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft.interface import ProposeFailure, ProposeOutcome, ProposeResult, StateMachine
from coordinator.raft.node import failure_of
from coordinator.server import errors

# The detail strings on the wire before failures were typed: clients and dashboards read them.
WIRE_DETAILS = {
    ProposeFailure.QUEUE_FULL: "queue_full",
    ProposeFailure.NO_LEADER: "no_leader",
    ProposeFailure.NOT_LEADER: "not_leader",
    ProposeFailure.REQUEST_DENIED: "request_denied",
    ProposeFailure.DISCARDED: "discarded",
    ProposeFailure.COMMAND_TOO_LARGE: "command_too_large",
    ProposeFailure.LEADER_CHANGED: "leader_changed",
    ProposeFailure.UNKNOWN_OUTCOME: "unknown_outcome",
    ProposeFailure.DEADLINE_EXCEEDED: "deadline_exceeded",
}

DEFINITE = {
    ProposeFailure.QUEUE_FULL, ProposeFailure.NO_LEADER, ProposeFailure.NOT_LEADER,
    ProposeFailure.REQUEST_DENIED, ProposeFailure.DISCARDED, ProposeFailure.COMMAND_TOO_LARGE,
}


@pytest.mark.parametrize("failure", list(ProposeFailure), ids=lambda f: f.name)
def test_every_propose_failure_maps_to_a_status_that_keeps_its_meaning(failure):
    assert failure in errors.PROPOSE_FAILURES
    error = errors.from_propose_failure(ProposeResult.failed(failure), "10.0.0.1:7000", "10.0.0.1:7100")
    definite = failure in DEFINITE
    assert (failure.outcome is ProposeOutcome.NOT_APPLIED) == definite
    # Only OUTCOME_UNKNOWN tells a client to retry with the same op_id; anything else it
    # may retry anywhere, so a failure that may still apply must never map elsewhere.
    assert (error.reason == R.OUTCOME_UNKNOWN) == (not definite)
    assert error.code is errors.STATUS_TABLE[errors.PROPOSE_FAILURES[failure]][0]
    assert error.metadata["detail"] == failure.value


def test_detail_strings_on_the_wire_are_unchanged():
    assert {f: f.value for f in ProposeFailure if f is not ProposeFailure.UNRECOGNIZED} == WIRE_DETAILS


@pytest.mark.parametrize(
    "code", [v for k, v in vars(FAIL_REASON).items() if k.isupper() and k != "SUCCESS"]
)
def test_every_pysyncobj_fail_code_is_typed(code):
    failure, detail = failure_of(code)
    assert failure is not ProposeFailure.UNRECOGNIZED and detail == failure.value


def test_an_unknown_fail_code_is_unknown_and_keeps_its_number():
    failure, detail = failure_of(99)
    result = ProposeResult.failed(failure, detail)
    assert (result.outcome, result.failure, result.detail) == (
        ProposeOutcome.UNKNOWN, ProposeFailure.UNRECOGNIZED, "fail_reason_99")
    error = errors.from_propose_failure(result)
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, R.OUTCOME_UNKNOWN)
    assert error.metadata["detail"] == "fail_reason_99"


@pytest.mark.parametrize("outcome, failure", [
    (ProposeOutcome.APPLIED, ProposeFailure.NO_LEADER),
    (ProposeOutcome.NOT_APPLIED, None),
    (ProposeOutcome.NOT_APPLIED, ProposeFailure.LEADER_CHANGED),
    (ProposeOutcome.UNKNOWN, ProposeFailure.QUEUE_FULL),
])
def test_a_result_cannot_contradict_its_failure(outcome, failure):
    with pytest.raises(ValueError):
        ProposeResult(outcome, failure=failure)


def test_the_fencing_state_machine_implements_the_protocol():
    sm = FencingStateMachine()
    methods = [name for name, member in vars(StateMachine).items() if callable(member) and not name.startswith("_")]
    assert {"apply", "snapshot", "restore", "digest"} <= set(methods)
    for name in methods:
        wanted = list(inspect.signature(vars(StateMachine)[name]).parameters)[1:]  # without self
        inspect.signature(getattr(sm, name)).bind(*wanted)  # the Replica calls them positionally
    assert isinstance(sm.log_clock_ms, int)


@pytest.mark.parametrize("failure", [f for f in ProposeFailure if f.outcome is ProposeOutcome.UNKNOWN],
                         ids=lambda f: f.name)
def test_a_member_change_of_unknown_outcome_points_at_the_member_list_not_an_op_id(failure):
    from coordinator.raft.interface import MemberChangeResult

    error = errors.from_member_change(MemberChangeResult(ProposeOutcome.UNKNOWN, failure=failure))
    assert error.reason == R.OUTCOME_UNKNOWN
    assert "member list" in error.message and "op_id" not in error.message
    entry = errors.from_propose_failure(ProposeResult.failed(failure))
    assert "retry with the same op_id" in entry.message

"""ReadRounds: which read-index reads a majority confirmed (coordinator/raft/read_rounds.py)."""

from __future__ import annotations

import pytest

from coordinator.raft.read_rounds import ReadRounds

PEERS = ("b", "c")


def rounds(term: int = 5) -> ReadRounds:
    r = ReadRounds()
    r.reset(term)
    return r


def test_a_read_is_confirmed_by_one_follower_of_three_echoing_its_round():
    r = rounds()
    assert r.add(5, "r1") == 1
    assert r.round_due()
    assert r.start_round() == 1
    assert r.take_confirmed(PEERS, True, 3) == []  # the leader alone is no majority
    r.echo(5, "b", 1)
    assert r.take_confirmed(PEERS, True, 3) == ["r1"]
    assert r.waiting == 0


def test_a_round_sent_before_the_read_arrived_never_confirms_it():
    r = rounds()
    r.add(5, "early")
    r.start_round()
    late = r.add(5, "late")
    assert late == 2  # waits on the next round, not the one in flight
    r.echo(5, "b", 1)
    r.echo(5, "c", 1)
    assert r.take_confirmed(PEERS, True, 3) == ["early"]
    assert r.round_due()
    r.start_round()
    r.echo(5, "c", 2)
    assert r.take_confirmed(PEERS, True, 3) == ["late"]


def test_reads_arriving_while_a_round_is_in_flight_share_the_next_round():
    r = rounds()
    r.add(5, "a")
    r.start_round()
    for name in ("x", "y", "z"):
        assert r.add(5, name) == 2
    assert not r.round_due()  # round 1 is in flight: the batch waits for it
    r.echo(5, "b", 1)
    assert r.take_confirmed(PEERS, True, 3) == ["a"]
    assert r.round_due()
    assert r.start_round() == 2  # one round for the whole batch
    r.echo(5, "b", 2)
    assert r.take_confirmed(PEERS, True, 3) == ["x", "y", "z"]
    assert not r.round_due()


def test_echoes_of_another_term_or_of_an_unsent_round_prove_nothing():
    r = rounds()
    r.add(5, "r")
    r.start_round()
    r.echo(4, "b", 1)  # an earlier term's leader (or our own earlier term)
    r.echo(6, "c", 1)
    r.echo(5, "c", 7)  # a round this leader never sent in this term
    assert r.take_confirmed(PEERS, True, 3) == []
    r.echo(5, "c", 1)
    assert r.take_confirmed(PEERS, True, 3) == ["r"]


def test_only_counted_voters_count():
    r = rounds()
    r.add(5, "r")
    r.start_round()
    r.echo(5, "learner", 1)
    r.echo(5, "stale-incarnation", 1)
    assert r.take_confirmed(PEERS, True, 3) == []
    # A leader the configuration no longer names as a voter does not count itself.
    r.echo(5, "b", 1)
    assert r.take_confirmed(PEERS, False, 3) == []
    r.echo(5, "c", 1)
    assert r.take_confirmed(PEERS, False, 3) == ["r"]


def test_five_voters_need_three():
    r = rounds()
    r.add(5, "r")
    r.start_round()
    peers = ("b", "c", "d", "e")
    r.echo(5, "b", 1)
    assert r.take_confirmed(peers, True, 5) == []
    r.echo(5, "e", 1)
    assert r.take_confirmed(peers, True, 5) == ["r"]


def test_a_single_member_confirms_on_sending():
    r = rounds()
    r.add(5, "r")
    r.start_round()
    assert r.take_confirmed((), True, 1) == ["r"]


def test_reset_hands_back_the_waiting_reads_and_forgets_the_term():
    r = rounds()
    r.add(5, "r1")
    r.start_round()
    r.echo(5, "b", 1)
    r.add(5, "r2")
    assert r.reset(6) == ["r1", "r2"]
    assert r.term == 6 and r.sent == 0 and r.waiting == 0
    r.add(6, "r3")
    r.start_round()
    assert r.take_confirmed(PEERS, True, 3) == []  # b's echo was of term 5
    with pytest.raises(ValueError):
        r.add(5, "old")


def test_a_read_missing_its_deadline_says_it_changed_nothing():
    import grpc

    from coordinator.server import errors

    exc = errors.read_not_confirmed()
    assert exc.key is errors.Failure.OUTCOME_UNKNOWN  # the status clients already retry
    assert exc.code == grpc.StatusCode.ABORTED
    assert "safe to retry" in str(exc) and "op_id" not in str(exc)

"""The Raft layer's name lookups (addresses.Resolver) and its connect / quorum log (peer_log.PeerLog).

The lookup function is injected: these tests are about when a name is looked up, how long the
caller may wait, and what is logged; tests/test_raft_addresses.py runs real members on names
in /etc/hosts.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from coordinator.raft import limits as raft_limits
from coordinator.raft.addresses import Resolver, lookup_address
from coordinator.raft.peer_log import PeerLog
from testsupport.supervisor import wait_until


class Answers:
    """A lookup whose answers the test sets; ``gate`` (when cleared) holds every lookup."""

    def __init__(self, **answers):
        self.answers = dict(answers)
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, host: str) -> str:
        self.calls += 1
        self.gate.wait()
        answer = self.answers[host]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def warnings():
    """A warn callable for resolvers whose failure lines a test does not read."""
    return lambda message, *args: None


def test_every_call_looks_the_name_up_again(warnings):
    answers = Answers(peer="10.0.0.1")
    resolver = Resolver(warnings, lookup=answers)
    try:
        assert resolver.resolve("peer") == "10.0.0.1"
        answers.answers["peer"] = "10.0.0.2"  # the member came back under a new address
        assert resolver.resolve("peer") == "10.0.0.2"  # pysyncobj answered 10.0.0.1 for 10 minutes
        assert answers.calls == 2
    finally:
        resolver.close()


def test_an_ip_literal_is_never_looked_up(warnings):
    answers = Answers()
    resolver = Resolver(warnings, lookup=answers)
    assert resolver.resolve("127.0.0.3") == "127.0.0.3"
    assert resolver.resolve("::1") == "::1"
    assert answers.calls == 0


def test_a_slow_lookup_stalls_the_caller_at_most_the_bound_and_only_once(warnings):
    answers = Answers(peer="10.0.0.1")
    resolver = Resolver(warnings, lookup=answers)
    try:
        assert resolver.resolve("peer") == "10.0.0.1"
        answers.answers["peer"] = "10.0.0.2"
        answers.gate.clear()  # the resolver hangs, as a DNS server that does not answer
        started = time.monotonic()
        assert resolver.resolve("peer") == "10.0.0.1"  # the last address, after the bound
        waited = time.monotonic() - started
        assert raft_limits.RAFT_RESOLVE_WAIT_MS / 1000 <= waited < raft_limits.RAFT_RESOLVE_WAIT_MS / 1000 + 0.5
        started = time.monotonic()
        assert resolver.resolve("peer") == "10.0.0.1"  # its lookup still runs: no second wait
        assert time.monotonic() - started < raft_limits.RAFT_RESOLVE_WAIT_MS / 1000
        assert answers.calls == 2  # and no second lookup of the same name
        answers.gate.set()
        wait_until(lambda: resolver.resolve("peer") == "10.0.0.2", 5.0, what="the late answer to be used")
    finally:
        answers.gate.set()
        resolver.close()


def test_failures_are_logged_once_per_change_and_keep_the_last_address(caplog):
    lines = []
    answers = Answers(peer="10.0.0.1")
    resolver = Resolver(lambda m, *a: lines.append(m % a), lookup=answers)
    caplog.set_level(logging.INFO, logger="coordinator.raft.addresses")
    try:
        resolver.resolve("peer")
        answers.answers["peer"] = OSError("Name or service not known")
        for _ in range(5):  # five connection attempts while the name is gone
            assert resolver.resolve("peer") == "10.0.0.1"
        answers.answers["peer"] = "10.0.0.3"
        assert resolver.resolve("peer") == "10.0.0.3"
        assert resolver.resolve("peer") == "10.0.0.3"
    finally:
        resolver.close()
    assert lines == [
        "raft: peer peer does not resolve (Name or service not known); still using its last address "
        "10.0.0.1; looking it up again on every connection attempt"
    ]
    infos = [r.getMessage() for r in caplog.records]
    assert infos == ["raft: peer peer resolves to 10.0.0.1", "raft: peer peer resolves again, to 10.0.0.3"]


def test_a_move_is_logged_once(warnings, caplog):
    answers = Answers(peer="10.0.0.1")
    resolver = Resolver(warnings, lookup=answers)
    caplog.set_level(logging.INFO, logger="coordinator.raft.addresses")
    try:
        resolver.resolve("peer")
        answers.answers["peer"] = "10.0.0.2"
        for _ in range(3):
            resolver.resolve("peer")
    finally:
        resolver.close()
    moved = [r.getMessage() for r in caplog.records if "moved" in r.getMessage()]
    assert moved == ["raft: peer peer moved from 10.0.0.1 to 10.0.0.2"]


def test_lookup_address_prefers_ipv4_and_says_when_there_is_none():
    assert lookup_address("localhost") == "127.0.0.1"
    with pytest.raises(OSError):
        lookup_address("no-such-member.invalid")


def test_peer_log_one_line_per_transition(caplog):
    caplog.set_level(logging.INFO, logger="test.peers")
    peers = PeerLog(2, lambda: "follower, term 3", logging.getLogger("test.peers"))
    peers.on_disconnected("b:1")  # a failed connection attempt: it was never up
    peers.on_connected("b:1", "10.0.0.2:1")
    peers.on_connected("c:1", "10.0.0.3:1")
    peers.on_disconnected("b:1")
    peers.on_disconnected("b:1")  # retries that fail say nothing
    peers.on_disconnected("c:1")
    peers.on_connected("c:1", "10.0.0.4:1")
    assert [r.getMessage() for r in caplog.records] == [
        "raft: peer b:1 connected (10.0.0.2:1)",
        "raft: quorum reached: 1 of 2 peers connected (follower, term 3)",
        "raft: peer c:1 connected (10.0.0.3:1)",
        "raft: peer b:1 lost (was 10.0.0.2:1)",
        "raft: peer c:1 lost (was 10.0.0.3:1)",
        "raft: quorum lost: 0 of 2 peers connected (follower, term 3)",
        "raft: peer c:1 connected (10.0.0.4:1)",
        "raft: quorum regained: 1 of 2 peers connected (follower, term 3)",
    ]
    assert peers.connected == {"c:1"}

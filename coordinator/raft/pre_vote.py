"""Pre-vote: a member raises its term only when a majority would elect it.

Owns: ``PreVote``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that holds
pysyncobj's election back until a pre-vote round is won, answers other members' pre-vote
requests, and catches a member up to the term a refusal names. RAFT.md "Pre-vote" says why.
Must never: change this member's term, vote or election timer while answering a pre-vote, grant
one while it leads or hears a live leader, grant a vote of a later term while it hears a live
leader (unless the candidate stands at a leader's transfer), or count a grant from an
incarnation the configuration does not name as a voter. The vote window (``vote_window_s``)
is what the leader's read lease rests on (read_lease.py, RAFT.md "Lease reads").

pysyncobj stands for election by raising its term (syncobj.py:636-650), and any member that
receives a vote request with a higher term steps down to it (syncobj.py:920-924). A member cut
off for a while (paused, partitioned, or removed before it heard of its removal) kept raising
its term alone; back in touch it deposed a healthy leader, or, when the configuration no longer
counted its votes (member_gate.py drops them unseen), it ignored every append of the lower
term for good (syncobj.py:945): a removed member added again was never caught up (seen in CI,
test_member_changes "m3 promoted again"). Here a member first asks the voters whether they
would grant it a vote in the next term, without changing anything on their side; it stands
only once a majority said yes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pysyncobj.syncobj as _ps

from coordinator.raft.transport import peer_warnings

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object

log = logging.getLogger("coordinator.raft.terms")

PRE_VOTE = "pre_vote"
PRE_VOTE_RESPONSE = "pre_vote_response"
TERM_NOTICE = "term_notice"
PRE_VOTE_TYPES = frozenset({PRE_VOTE, PRE_VOTE_RESPONSE, TERM_NOTICE})


class PreVote(_Host):
    """Mixed into HardenedSyncObj (after MemberGate, whose checks it reuses); ``_init_pre_vote``
    runs before SyncObj.__init__."""

    _SyncObj__raftElectionDeadline: float  # pysyncobj's (untyped), pushed back here

    def _init_pre_vote(self, enabled: bool, leader_lost_election_s: float) -> None:
        self._pre_vote_on = enabled
        self._leader_lost_election_s = leader_lost_election_s
        self._pre_vote_term: int | None = None  # the term the running round asks for
        self._pre_vote_grants: set[str] = set()  # addresses that granted it (self included)
        self._pre_vote_won: int | None = None  # a won round's term: pysyncobj may stand in it
        self._pre_vote_grants_won: frozenset[str] = frozenset()  # who granted that round
        # Monotonic time of the last append from our leader, and who sent it. A start counts as
        # hearing one: a member that restarts right after acknowledging a leader's round must
        # not vote against that leader's lease (read_lease.py) any sooner than if it had not.
        self._leader_heard_at = _ps.monotonicTime()
        self._heard_from = None
        self._transfer_term: int | None = None  # the term this member stands in at a leader's transfer
        self.votes_refused_leader_heard = 0  # vote requests of a later term dropped: a live leader was heard
        self.pre_votes_started = 0
        self.pre_votes_won = 0
        self.pre_votes_refused = 0  # pre-vote requests this member answered with no
        self.term_notices_adopted = 0  # later terms learned from a member's answer to an append
        self._handling: tuple[str, str] | None = None  # (message type, sender) being handled
        self._election_held: float | None = None  # the deadline hidden from pysyncobj this tick
        self.elections_without_pre_vote = 0  # stood with no won round: bootstrap, pre-vote off, or a defect

    # -- asking ---------------------------------------------------------------------

    def hold_election_for_pre_vote(self) -> None:
        """Before pysyncobj's tick: where it would stand for election now, run a pre-vote round
        instead (its timer moves on a whole election timeout), unless a round was just won.

        pysyncobj decides with its own clock reading, later in the same tick (syncobj.py:635):
        a deadline still ahead here may pass before that, and it stood with no round (seen in
        the soak: a partitioned follower raised its term, and back in touch deposed the
        leader). So where this member may not stand, the deadline is hidden from that check
        for this tick (kept in ``_election_held``; ``release_election_hold`` puts it back after the tick)
        and a deadline that passes meanwhile starts a round at the next tick."""
        if not self._pre_vote_on or self._SyncObj__selfNode is None:
            return
        if self._SyncObj__raftState == _ps._RAFT_STATE.LEADER:
            return
        if not self._loaded():
            # The snapshot loads in this very tick, before pysyncobj's election check: what a
            # member with a snapshot or a configuration in its journal may do is known only at
            # the next. A new member with neither stands as the unanimous bootstrap does.
            dump = self._SyncObj__conf.fullDumpFile
            if self.config() is not None or (dump is not None and os.path.isfile(dump)):
                self._hide_election_deadline()
            return
        now = _ps.monotonicTime()
        due = self._SyncObj__raftElectionDeadline < now and self._SyncObj__connectedToAnyone()
        if self._SyncObj__transferInProgress:
            # The leader handed over (timeout_now): the voters expect this election, and grant
            # its votes even while they hear that leader (refuse_vote). pysyncobj clears its
            # flag before the vote requests go out, so the term is kept for outgoing_fields.
            if due:
                self._transfer_term = self.raftCurrentTerm + 1
            return
        if not self.is_voter() or self.config() is None:
            # Not a voter: hold_election_if_not_voter holds it. No configuration: the unanimous
            # bootstrap counts real votes of every initial member (member_gate.py).
            return
        term = self.raftCurrentTerm + 1
        if self._pre_vote_won == term:
            return  # won: pysyncobj stands in this very tick
        if due:
            self._start_pre_vote_round(term, now)
        self._hide_election_deadline()

    def _start_pre_vote_round(self, term: int, now: float) -> None:
        self._pre_vote_term = term
        self._pre_vote_grants = {self._self_address()}
        self.pre_votes_started += 1
        # The round lasts until the next election deadline; a round not won by then starts over.
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        request = {
            "type": PRE_VOTE,
            "term": term,
            "last_log_index": self._SyncObj__getCurrentLogIndex(),
            "last_log_term": self._SyncObj__getCurrentLogTerm(),
        }
        for node in self._SyncObj__otherNodes:
            self._SyncObj__transport.send(node, request)
        self._pre_vote_check_won()

    def _hide_election_deadline(self) -> None:
        self._election_held = self._SyncObj__raftElectionDeadline
        self._SyncObj__raftElectionDeadline = math.inf

    def release_election_hold(self) -> None:
        """After pysyncobj's tick: the deadline ``hold_election_for_pre_vote`` hid is back,
        unless the tick set another (a leader's append, a vote granted, a won round, a closed
        leader connection: each a newer decision)."""
        held, self._election_held = self._election_held, None
        if held is not None and self._SyncObj__raftElectionDeadline == math.inf:
            self._SyncObj__raftElectionDeadline = held

    def election_deadline(self) -> float:
        """The election deadline in effect, also while it is hidden for a tick."""
        held = self._election_held
        return held if held is not None else self._SyncObj__raftElectionDeadline

    def _pre_vote_check_won(self) -> None:
        # pysyncobj's own count (syncobj.py:650, 1066): learners are among its nodes, so a round
        # that passes here is one whose election can pass too.
        if len(self._pre_vote_grants) > (len(self._SyncObj__otherNodes) + 1) / 2:
            self._pre_vote_won, self._pre_vote_term = self._pre_vote_term, None
            self._pre_vote_grants_won = frozenset(self._pre_vote_grants)
            self.pre_votes_won += 1
            self._SyncObj__raftElectionDeadline = 0  # stand at the next tick
            self._wake_raft_thread()

    def count_pre_vote_response(self, node, message: dict) -> None:
        config = self.config()
        if config is None or not config.counts(node.address, message.get("incarnation")):
            return  # neither its yes nor its term counts: it is no voter the configuration names
        theirs = message["current_term"]
        if theirs > self.raftCurrentTerm and self._SyncObj__raftState != _ps._RAFT_STATE.LEADER:
            # Raft's rule for any message of a later term: adopt it (saved first, durable_term.py).
            # A member behind the voters' term would otherwise ask for terms they refuse for good.
            with self.handling(node, message):
                self._SyncObj__setCurrentTerm(theirs, None)
            self._SyncObj__setState(_ps._RAFT_STATE.FOLLOWER)
            self._SyncObj__raftLeader = None
            self._pre_vote_term = None
            return
        if not message["granted"] or self._pre_vote_term is None or message["term"] != self._pre_vote_term:
            return
        self._pre_vote_grants.add(node.address)
        self._pre_vote_check_won()

    # -- a member ahead of its leader's term ----------------------------------------------

    def answer_stale_append(self, node, message: dict) -> None:
        """Before pysyncobj drops an append of a lower term than this member's, unanswered
        (syncobj.py:945): tell its sender this member's term. A member can be a term ahead of a
        majority that has a live leader (it won a pre-vote round, and its vote requests were
        lost while that leader came back): the leader never heard of the later term, the
        member ignored every append, and its pre-votes were refused for good, as the others
        heard the leader (the simulation, crashy seed 751). Raft's rule then deposes the leader
        (count_term_notice), and the next election reaches every member. etcd answers such an
        append the same way."""
        if self._pre_vote_on and message["term"] < self.raftCurrentTerm:
            self._SyncObj__transport.send(node, {"type": TERM_NOTICE, "term": self.raftCurrentTerm})

    def count_term_notice(self, node, message: dict) -> None:
        if message["term"] <= self.raftCurrentTerm:
            return
        config = self.config()
        member = config.by_address(node.address) if config is not None else None
        # A voter counts with the incarnation the configuration names; a learner (bound only
        # when promoted) by its address: one whose term ran ahead must be reachable too.
        if member is None or (member.voter and member.incarnation != message.get("incarnation")):
            return
        self.term_notices_adopted += 1
        # Rate-limited like the refusals: without the peer secret a stranger naming a learner's
        # address could send these (as it could an append of a higher term: RAFT.md "Not closed here").
        peer_warnings.warning("raft: %s is in term %d, above this member's %d: adopting it (a leader steps down)",
                              node.address, message["term"], self.raftCurrentTerm)
        with self.handling(node, message):
            self._SyncObj__setCurrentTerm(message["term"], None)  # saved first (durable_term.py)
        self._SyncObj__setState(_ps._RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None

    # -- why the term went up -------------------------------------------------------------

    @contextlib.contextmanager
    def handling(self, node, message: dict) -> Iterator[None]:
        """Around the handling of ``message``: a term it raises names its cause. (Every Raft
        message sets ``_handling`` itself, in HardenedSyncObj's try/finally: no generator
        per message on the write path.)"""
        self._handling = (str(message.get("type", "?")), getattr(node, "address", str(node)))
        try:
            yield
        finally:
            self._handling = None

    def note_term_raised(self, before: int, term: int, voted_for) -> None:
        """One line per raised term, saying why: every leader change starts with one, and a
        follower fault that moved the leadership (a CI failure) must be traceable from the
        members' logs alone. A term is raised only by a configured member's message (the member
        gate drops the rest first) or by this member's own election, so the lines are bounded
        by elections."""
        self_node = self._SyncObj__selfNode
        if self._handling is not None:
            kind, sender = self._handling
            why = f"{sender}'s {kind} names it"
        elif self_node is not None and voted_for == self_node.id:
            if self._pre_vote_won == term:
                why = f"standing for election: pre-vote round won ({', '.join(sorted(self._pre_vote_grants_won))})"
            elif self._transfer_term == term:
                why = "standing for election at the leader's transfer"
            else:
                self.elections_without_pre_vote += 1
                if not self._pre_vote_on:
                    cause = "pre-vote off"
                elif self._configs.current() is None:
                    cause = "bootstrap: no configuration yet"
                else:
                    cause = "none won: a defect, RAFT.md Pre-vote"
                why = f"standing for election without a pre-vote round ({cause})"
        else:
            why = "adopted"
        log.info("raft: term %d -> %d: %s", before, term, why)

    # -- answering ------------------------------------------------------------------

    def answer_pre_vote(self, node, message: dict) -> None:
        why = self._why_not_grant(self.config(), node.address, message.get("cluster"), message.get("incarnation"))
        if why:
            # Counted and logged as a refused vote: the configuration does not count the asker
            # (or this member), which an operator may have to act on.
            self.refused_votes += 1
            peer_warnings.warning("raft: refused a pre_vote from %s (incarnation %s): %s",
                                  node.address, message.get("incarnation"), why)
        else:
            why = self._why_not_pre_vote(message)
        if why:
            self.pre_votes_refused += 1
        self._SyncObj__transport.send(node, {
            "type": PRE_VOTE_RESPONSE,
            "term": message["term"],
            "granted": not why,
            "current_term": self.raftCurrentTerm,
        })

    def _why_not_pre_vote(self, message: dict) -> str | None:
        """None: this member would grant the vote the request asks about; else why not."""
        if message["term"] <= self.raftCurrentTerm:
            return "its term is not ahead of this member's"
        if self._SyncObj__raftState == _ps._RAFT_STATE.LEADER:
            return "this member leads"
        if self._hears_leader():
            return "this member hears a live leader"
        last_term = self._SyncObj__getCurrentLogTerm()
        if message["last_log_term"] < last_term or (
            message["last_log_term"] == last_term and message["last_log_index"] < self._SyncObj__getCurrentLogIndex()
        ):
            return "its log is behind this member's"
        return None

    def vote_window_s(self) -> float:
        """How long after its leader's last append (or its own start) this member grants no vote:
        the shortest election timeout while the connection to that leader is open, else
        ``leader_lost_election_s`` (a leader whose process died closed it: the followers stand
        after 1-2x that, RAFT.md "A closed leader connection", and grant each other then)."""
        shortest = self._SyncObj__conf.raftMinTimeout
        heard = self._heard_from
        if heard is not None and heard in self._SyncObj__connectedNodes:
            return shortest
        return min(shortest, self._leader_lost_election_s or shortest)

    def _hears_leader(self) -> bool:
        """A leader's append arrived (or this member started) within ``vote_window_s``."""
        now = _ps.monotonicTime()
        if now < self._leader_heard_at:
            # The clock went back (CLOCK_MONOTONIC does not; a faked one can): count the window
            # from now, never for as long as the step.
            self._leader_heard_at = now
        return now - self._leader_heard_at < self.vote_window_s()

    def refuse_vote(self, node, message: dict) -> bool:
        """Before pysyncobj handles a vote request: True to drop it. A vote of a later term is
        refused while this member hears a live leader (etcd's check-quorum does the same), or
        that leader's lease (read_lease.py) could be outlived by a leader it never heard of; a
        pre-vote round keeps such requests rare, but one won just before the leader was heard
        again still sends them. A candidate standing at its leader's transfer is expected (that
        leader gave up its lease first, read_index.py transferLeadership)."""
        if not self._pre_vote_on or message.get("transfer") or message["term"] <= self.raftCurrentTerm:
            return False
        if self._SyncObj__raftState == _ps._RAFT_STATE.LEADER or not self._hears_leader():
            return False  # a leader steps down and may vote: its lease ends first (syncobj.py _state_changed)
        self.votes_refused_leader_heard += 1
        return True

    def outgoing_fields(self, message: dict) -> dict:
        fields = super().outgoing_fields(message)
        if message["type"] == "request_vote" and message["term"] == self._transfer_term:
            fields["transfer"] = True
        return fields

    def note_leader_heard(self, node) -> None:
        """After pysyncobj handled an append: from the leader it follows, it is alive."""
        if node == self._SyncObj__raftLeader:
            self._leader_heard_at = _ps.monotonicTime()
            self._heard_from = node
            # A round won before this leader was heard is stale: the next election asks again.
            self._pre_vote_won = self._pre_vote_term = None

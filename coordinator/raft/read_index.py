"""Read-index reads on the leader (Raft dissertation §6.4): a linearizable read without a log entry.

Owns: ``ReadIndex``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that takes
read requests from any thread, and on the Raft thread: records the commit index C of each (only
once this leader committed an entry of its own term), sends a confirmation round (the appends
carry ``read_seq``, wire.py) as soon as one is due, has followers echo the term and round of the
append each acknowledgement answers, counts echoes of the configuration's counted voters only
(``ReadRounds``, read_rounds.py), and answers a read once a majority confirmed its round and this
member applied C. RAFT.md "Read-index reads" says why each step is there.
With a lease (``ReadLease``, read_lease.py; RAFT.md "Lease reads"), rounds also go out with the
leader's appends while no read waits, each confirmed round extends the lease, and a read that
arrives while the lease holds takes C at once, with no round of its own (``lease_read_index``).
Must never: answer a read before a round sent after it arrived was confirmed by a majority in
the same term (or, by lease, before the lease that holds when it arrived was earned by such a
round), count a learner's or an uncounted incarnation's echo, keep a lease across a change of
term, leadership or configuration or a leadership transfer, or block the Raft thread.
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING

import pysyncobj.syncobj as _ps

from coordinator.raft import limits as raft_limits
from coordinator.raft.read_lease import ReadLease
from coordinator.raft.read_rounds import ReadRounds

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object


class ReadIndexOutcome(enum.Enum):
    CONFIRMED = "confirmed"  # a majority confirmed this leader after the read arrived; C applied here
    NOT_LEADER = "not_leader"  # not (or no longer) the leader of the read's term: use the log
    NOT_READY = "not_ready"  # no entry of this leader's term committed yet: use the log
    BUSY = "busy"  # too many reads waiting already: use the log


class PendingRead:
    """One read's wait: ``done`` is set once ``outcome`` is known; ``index`` is its C."""

    __slots__ = ("done", "outcome", "index")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.outcome: ReadIndexOutcome | None = None
        self.index = 0

    def finish(self, outcome: ReadIndexOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.done.set()


class ReadIndex(_Host):
    """Mixed into HardenedSyncObj; ``_init_read_index`` runs before SyncObj.__init__."""

    def _init_read_index(self, lease_s: float, heartbeat_s: float) -> None:
        """``lease_s``: how long a confirmed round's lease lasts (0: no lease reads)."""
        # pysyncobj's clock, looked up at each call: the simulation replaces it with its own.
        self._lease = ReadLease(lease_s, lambda: _ps.monotonicTime()) if lease_s > 0 else None
        # A round rides on the leader's appends at most this often while no read waits: the
        # lease stays fresh (a heartbeat renews it) and rounds stay few under a write load.
        self._lease_round_every_s = heartbeat_s / 4
        self._lease_round_at = float("-inf")  # when the last round started (monotonic)
        self._lease_config_index: int | None = None  # the CONFIG entry the lease was earned under
        self._lease_blocked_term: int | None = None  # a term this leader handed over: no lease in it
        self._read_rounds = ReadRounds()
        self._read_inbox_lock = threading.Lock()
        self._read_inbox: list[PendingRead] = []
        self._reads_open = 0  # requested and not finished (under _read_inbox_lock)
        self._read_applying: list[PendingRead] = []  # confirmed, waiting for this member to apply C
        # (term, read_seq) of the append being handled, for its acknowledgement
        self._echo_now: tuple[int, int] | None = None
        self._echo_sending = None  # (term, read_seq) of the acknowledgement being sent
        self.read_index_rounds = 0  # confirmation rounds sent (status: reads per round)

    # -- any thread --------------------------------------------------------------

    def request_read_index(self) -> PendingRead:
        """A read arriving now; the Raft thread is woken so its round goes out at once."""
        pending = PendingRead()
        with self._read_inbox_lock:
            busy = self._reads_open >= raft_limits.RAFT_READ_INDEX_WAITING_MAX
            if not busy:
                self._reads_open += 1
                self._read_inbox.append(pending)
        if busy:
            pending.finish(ReadIndexOutcome.BUSY)
            return pending
        self._wake_raft_thread()
        return pending

    def lease_read_index(self) -> int | None:
        """C, if this leader's lease holds now: every write acknowledged before this call is at
        or below it; None: no lease (the read takes a round). The commit index is read first,
        then the lease: a lease still held then was not voided when C was read, so C was the
        commit index of this leader, and no later leader existed (RAFT.md "Lease reads")."""
        lease = self._lease
        if lease is None:
            return None
        commit = self._SyncObj__raftCommitIndex
        return commit if lease.holds(count=True) else None

    def lease_void(self) -> None:
        """Leadership lost (on the Raft thread, before anything this member sends afterwards,
        a vote included: syncobj.py _state_changed)."""
        if self._lease is not None:
            self._lease.void()

    def transferLeadership(self, node=None, callback=None):  # pysyncobj's name
        # The member it hands over to stands with ``transfer`` set, and voters grant that vote
        # even while they hear this leader (pre_vote.py): no lease of this term may hold again.
        self._lease_blocked_term = self.raftCurrentTerm
        self.lease_void()
        return super().transferLeadership(node, callback)

    def _finish_read(self, pending: PendingRead, outcome: ReadIndexOutcome) -> None:
        with self._read_inbox_lock:
            self._reads_open -= 1
        pending.finish(outcome)

    # -- the Raft thread -----------------------------------------------------------

    def read_index_tick(self) -> bool:
        """Take new reads, drop those of a past term, answer applied ones; True: a round is due."""
        leading = self._isLeader()
        term = self.raftCurrentTerm
        rounds = self._read_rounds
        if rounds.term != (term if leading else None):
            # A new term or leadership lost: no round of the old term can confirm anything now.
            for pending in rounds.reset(term if leading else None):
                self._finish_read(pending, ReadIndexOutcome.NOT_LEADER)
            self.lease_void()
        lease_round = leading and self._lease_tick(term)
        with self._read_inbox_lock:
            arrived, self._read_inbox = self._read_inbox, []
        for pending in arrived:
            if not leading:
                self._finish_read(pending, ReadIndexOutcome.NOT_LEADER)
                continue
            commit = self._SyncObj__raftCommitIndex
            if self._local_term(commit) != term:
                # Until an entry of its own term commits, a new leader's commit index may lag
                # what earlier leaders committed (dissertation §6.4 step 1).
                self._finish_read(pending, ReadIndexOutcome.NOT_READY)
                continue
            pending.index = commit
            rounds.add(term, pending)
        self._confirm_reads()
        return leading and (rounds.round_due() or lease_round)

    def _lease_tick(self, term: int) -> bool:
        """Void the lease if the configuration changed; True: the lease runs short and no
        append is going out to renew it, so a round goes out now."""
        if self._lease is None:
            return False
        self.config()  # brings the configuration log up to date
        index = self._configs.current_index()
        if index != self._lease_config_index:
            # Another configuration counts other voters: only rounds started under it count.
            self._lease_config_index = index
            self._lease.void()
        # remaining_s reads the clock every tick: a clock gone back is seen within a tick.
        return self._lease.remaining_s() < self._lease.duration_s / 2 and self._lease_round_may_start(term)

    def _lease_round_may_start(self, term: int) -> bool:
        rounds = self._read_rounds
        if self._lease is None or self._lease_blocked_term == term or rounds.in_flight:
            return False
        since = _ps.monotonicTime() - self._lease_round_at
        return since >= self._lease_round_every_s or since < 0  # < 0: the clock went back

    def lease_round_rides(self) -> bool:
        """An append is about to go out anyway: True if it should carry a new round."""
        return self._isLeader() and self._lease_round_may_start(self.raftCurrentTerm)

    def start_read_round(self) -> None:
        """The appends about to go out carry a new round (the tick's send, syncobj.py)."""
        rounds = self._read_rounds
        if rounds.waiting:
            self.read_index_rounds += 1
        seq = rounds.start_round()
        if self._lease is not None:
            self._lease_round_at = _ps.monotonicTime()
            self._lease.round_started(seq)

    def read_round_sent(self) -> None:
        self._confirm_reads()  # a member alone is its own majority

    def read_echo(self, node, message: dict) -> None:
        """A follower's acknowledgement echoed the term and round of the append it answers."""
        if "read_seq" not in message or not self._isLeader():
            return
        self._read_rounds.echo(message["read_term"], node.address, message["read_seq"])
        self._confirm_reads()

    def _confirm_reads(self) -> None:
        rounds = self._read_rounds
        if (rounds.waiting or rounds.in_flight) and self._isLeader() and rounds.term == self.raftCurrentTerm:
            config = self.config()
            if config is not None:
                own = self._self_address()
                voters = [m for m in config.members if m.voter]
                counted = [
                    m.address for m in voters
                    if m.address != own and config.counts(m.address, self._peer_incarnation.get(m.address))
                ]
                self_counts = config.counts(own, self._identity.incarnation)
                self._read_applying.extend(rounds.take_confirmed(counted, self_counts, len(voters)))
                self._lease_confirmed()
        if self._read_applying:
            applied = self.raftLastApplied
            waiting = []
            for pending in self._read_applying:
                if applied >= pending.index:
                    self._finish_read(pending, ReadIndexOutcome.CONFIRMED)
                else:
                    waiting.append(pending)
            self._read_applying = waiting

    def _lease_confirmed(self) -> None:
        """A lease only once an entry of this term is committed (before that the commit index
        may lag what earlier leaders committed, dissertation §6.4 step 1), never in a term this
        leader handed over."""
        lease, term = self._lease, self.raftCurrentTerm
        if lease is None or self._lease_blocked_term == term or not self._read_rounds.confirmed:
            return
        if self._local_term(self._SyncObj__raftCommitIndex) == term:
            lease.confirmed(self._read_rounds.confirmed)

    # -- fields on the wire (the stamping transport asks, on the Raft thread) -----------

    def outgoing_fields(self, message: dict) -> dict:
        fields = super().outgoing_fields(message)
        kind = message["type"]
        if kind == "append_entries":
            rounds = self._read_rounds
            # Only once a round was sent in this term: with read_index off, or before any
            # read, the frame is the one members before read-index read (wire.py _TRAILING).
            if rounds.sent and rounds.term == message["term"]:
                fields["read_seq"] = rounds.sent
        elif kind == "next_node_idx" and self._echo_sending is not None:
            fields["read_term"], fields["read_seq"] = self._echo_sending
        return fields

    def note_append_for_echo(self, message: dict) -> None:
        """Before pysyncobj handles an append: what its acknowledgement echoes. Only an append
        of this member's term or a later one is accepted (and so answered at all)."""
        if "read_seq" in message and message["term"] >= self.raftCurrentTerm:
            self._echo_now = (message["term"], message["read_seq"])
        else:
            self._echo_now = None

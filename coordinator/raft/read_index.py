"""Read-index reads on the leader (Raft dissertation §6.4): a linearizable read without a log entry.

Owns: ``ReadIndex``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that takes
read requests from any thread, and on the Raft thread: records the commit index C of each (only
once this leader committed an entry of its own term), sends a confirmation round (the appends
carry ``read_seq``, wire.py) as soon as one is due, has followers echo the term and round of the
append each acknowledgement answers, counts echoes of the configuration's counted voters only
(``ReadRounds``, read_rounds.py), and answers a read once a majority confirmed its round and this
member applied C. RAFT.md "Read-index reads" says why each step is there.
Must never: answer a read before a round sent after it arrived was confirmed by a majority in
the same term, count a learner's or an uncounted incarnation's echo, or block the Raft thread.
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING

from coordinator.raft import limits as raft_limits
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

    def _init_read_index(self) -> None:
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
        return leading and rounds.round_due()

    def start_read_round(self) -> None:
        """The appends about to go out carry a new round (the tick's send, syncobj.py)."""
        self._read_rounds.start_round()
        self.read_index_rounds += 1

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
        if rounds.waiting and self._isLeader() and rounds.term == self.raftCurrentTerm:
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
        if self._read_applying:
            applied = self.raftLastApplied
            waiting = []
            for pending in self._read_applying:
                if applied >= pending.index:
                    self._finish_read(pending, ReadIndexOutcome.CONFIRMED)
                else:
                    waiting.append(pending)
            self._read_applying = waiting

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

"""Group commit and coalesced sends: one journal sync per tick, acks and commit votes only for durable entries.

Owns: ``GroupCommit``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that
holds pysyncobj's per-command appends and its followers' acks for the end of the tick
(``_flush_tick``: one send to each follower per tick, one journal sync for everything appended,
acks only after it), holds back an append that only announces a commit index for
``commit_notify_delay_s``, starts the leader's background journal sync (leader_sync.py), and
caps the commit count so that it sees only durable copies (``_cap_commit_votes``). RAFT.md
"Durability" and "Group commit" say why.
Must never: acknowledge an entry, or count the leader's own copy toward a commit, before it is
fsynced; send a follower's ack before the sync that covers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj

from coordinator.raft.fatal import EXIT_DISK_FAILED
from coordinator.raft.leader_sync import LeaderSync

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object


class GroupCommit(_Host):
    """Mixed into HardenedSyncObj; ``_init_group_commit`` runs before SyncObj.__init__ and
    ``_start_group_commit`` after it. Needs ``self._journal``, ``self._on_fatal``, ``self._has``,
    ``self._wake_raft_thread`` and the read-index hooks (read_index.py)."""

    def _init_group_commit(self, commit_notify_delay_s: float) -> None:
        self._pending_acks: list[tuple] = []
        self._append_pending = False
        self._commit_notify_delay_s = commit_notify_delay_s
        self._commit_notify_at: float | None = None  # when a held-back commit-only append must go out
        self.commit_only_sends = 0  # appends sent that carried no entry to anyone
        # Set once the transport's pipe notifier exists (_start_group_commit).
        self._leader_sync: LeaderSync | None = None
        self._true_match: dict = {}  # follower -> highest index it acked, this term
        self._true_match_term = -1
        self._match_capped = False  # some follower's matchIndex is shown below its ack

    def _start_group_commit(self, journal, *, background_sync: bool) -> None:
        """After SyncObj.__init__: the leader's sync thread (it wakes the Raft thread through
        pysyncobj's pipe notifier, which exists only now) and the end-of-tick flush."""
        if self._has("durable_journal"):
            self._leader_sync = LeaderSync(
                journal,
                background=background_sync,
                wake=self._wake_raft_thread,
                on_fatal=self._on_fatal,
                exit_code=EXIT_DISK_FAILED,
            )
        self.addOnTickCallback(self._flush_tick)

    def _SyncObj__sendAppendEntries(self):
        # With appendEntriesUseBatch=False pysyncobj sends after every single
        # command (syncobj.py:541, 692); remember and send once per tick instead.
        self._append_pending = True

    def _SyncObj__sendNextNodeIdx(self, node, reset=False, nextNodeIdx=None, success=False):
        # A follower acks right after writing its journal (syncobj.py:1005-1019).
        # Queue the ack; _flush_tick syncs the journal once, then sends them all.
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        if reset and not success and self._conflict_hint is not None:
            nextNodeIdx = min(nextNodeIdx, self._conflict_hint)
        # The term and round of the append being answered, echoed for read-index reads.
        self._pending_acks.append((node, reset, nextNodeIdx, success, self._echo_now))

    def _flush_tick(self):
        """Runs once per tick, after commands were appended and before polling.

        One sync covers every entry appended this tick (leader and follower), so a
        leader counts itself in the next commit computation (syncobj.py:528, 660)
        only for durable entries, and a follower acks only durable entries.

        Order matters. The leader sends first and syncs second, so its fsync runs in
        parallel with the followers' (Raft allows it: the leader's own vote in the
        commit count is taken at the start of the next tick, after this sync; an
        entry appended later, during poll, cannot be acked before it is sent here,
        after which it is synced). Follower acks go out only after the sync.
        """
        # Reads waiting on a round nobody sent yet, or a lease running short: the round goes
        # out now, not at the next heartbeat (read_index.py).
        read_round = self.read_index_tick()
        if (self._append_pending or read_round) and not self._snapshot_blocks_sends():
            # While a snapshot's result is not yet collected (pysyncobj does that at
            # the compaction check once the writer is done), a follower needing a snapshot
            # gets nothing to send and __sendAppendEntries spins for a whole
            # appendEntriesPeriod (syncobj.py:1266-1330). Wait for the result instead;
            # followers that need entries only are sent them meanwhile.
            if not self._isLeader():
                self._append_pending = False
            elif read_round or self._append_worth_sending():
                self._append_pending = False
                self._commit_notify_at = None
                # With lease reads, appends going out anyway carry a round now and then: each
                # one confirmed renews the lease (read_index.py lease_round_rides).
                read_round = read_round or self.lease_round_rides()
                if read_round:
                    self.start_read_round()
                SyncObj._SyncObj__sendAppendEntries(self)
                if read_round:
                    self.read_round_sent()
        # The leader's sync thread, while this member leads (None: a follower, or no durable journal).
        leader_sync = self._leader_sync if self._leader_sync is not None and self._isLeader() else None
        if self._pending_acks or leader_sync is None:
            self._sync_then_ack()
        if leader_sync is not None:
            # Ask for our own sync and go on: _cap_commit_votes counts us only up to it.
            leader_sync.request(self.raftCurrentTerm, self._SyncObj__getCurrentLogIndex())

    def _sync_then_ack(self) -> None:
        """One journal sync for everything appended so far, then the acks that wait on it."""
        try:
            if self._has("durable_journal"):
                self._journal.sync()
        except BaseException as exc:  # a sync failing in any way leaves durability unknown: fatal, re-raised
            self._on_fatal(f"journal sync failed: {exc!r}", EXIT_DISK_FAILED)
            raise
        acks, self._pending_acks = self._pending_acks, []
        try:
            for node, reset, index, success, echo in acks:
                self._echo_sending = echo  # outgoing_fields (read_index.py) adds it
                SyncObj._SyncObj__sendNextNodeIdx(self, node, reset=reset, nextNodeIdx=index, success=success)
        finally:
            self._echo_sending = None

    def _append_worth_sending(self) -> bool:
        """Send now: entries for someone, a heartbeat due, or a commit notice held long enough."""
        last = self._SyncObj__getCurrentLogIndex()
        next_index = self._SyncObj__raftNextIndex
        if any(next_index.get(node, 0) <= last for node in self._SyncObj__otherNodes):
            return True  # new entries (or a snapshot) to send: they carry the commit index
        now = _ps.monotonicTime()
        if self._commit_notify_delay_s <= 0 or now >= self._SyncObj__newAppendEntriesTime:
            self.commit_only_sends += 1
            return True
        if self._commit_notify_at is None:
            # pysyncobj asks for a send after every apply (syncobj.py:731-733) only to
            # announce the new commit index: hold it, the next command usually carries it.
            self._commit_notify_at = now + self._commit_notify_delay_s
            return False
        if now >= self._commit_notify_at:
            self.commit_only_sends += 1
            return True
        return False

    def _cap_commit_votes(self) -> None:
        """Let pysyncobj's commit count (leader = 1, syncobj.py:655-672) see only durable copies.

        The leader's own copy is durable up to what its sync thread published for this term.
        Commit bound C = the quorum-th largest of {followers' acked indexes, our durable
        index}; every follower's matchIndex is shown to pysyncobj as min(acked, C). Then
        1 + #(shown >= i) reaches a quorum exactly for i <= C. The true acked indexes are
        kept aside (pysyncobj only ever raises matchIndex, and resets it on election).
        """
        if self._leader_sync is None or not self._isLeader():
            return
        term = self.raftCurrentTerm
        if self._true_match_term != term:
            self._true_match, self._true_match_term = {}, term
            self._match_capped = False
        synced_term, synced_index = self._leader_sync.synced
        own = synced_index if synced_term == term else 0
        match = self._SyncObj__raftMatchIndex
        if not self._match_capped and all(acked <= own for acked in match.values()):
            # The usual case, checked without hashing a node (pysyncobj's nodes hash in
            # Python): our durable copy covers every ack, so pysyncobj's count is exact.
            return
        others = list(self._SyncObj__otherNodes)
        true = self._true_match
        for node in others:
            true[node] = max(true.get(node, 0), match.get(node, 0))
        durable = sorted([true[node] for node in others] + [own], reverse=True)
        bound = durable[(len(others) + 1) // 2]  # quorum = n // 2 + 1; 0-based position
        capped = False
        for node in others:
            shown = min(true[node], bound)
            match[node] = shown
            capped = capped or shown < true[node]
        self._match_capped = capped

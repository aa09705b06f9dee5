"""pysyncobj's SyncObj with the durability, safety and liveness holes RAFT.md lists closed.

Owns: ``HardenedSyncObj`` (every override of SyncObj internals: group commit and coalesced
sends, the leader's background sync and commit-vote cap, shared entries, append sanitizing,
snapshot install, entry admission) and the fix names (``ALL_FIXES``) that switch them off
one by one for tests (``RaftConfig.fixes``).
Must never: be used without ``patches.install()`` (``RaftNode`` calls it first), interpret a
command, or acknowledge an entry before it is fsynced.

Every override names the upstream line it fixes (syncobj.py:N is pysyncobj 0.3.17). Fix names:
  durable_journal      own fsynced journal + group commit (journal.py, _flush_tick)
  keep_tail            keep the journal tail on restart (syncobj.py:1489-1495)
  next_index_forward   success acks never move nextIndex back (syncobj.py:1079-1082)
  truncate_on_conflict truncate only on a real term conflict (syncobj.py:991-1004)
  no_old_snapshot      never install a snapshot older than lastApplied (syncobj.py:1021-1025)
  commit_needs_match   commit only what this message proved matches (syncobj.py:1027-1035)
  fast_backup          a follower answers a term conflict with the first index of its
                       conflicting term, and the leader resends at its next tick
                       (syncobj.py:988-989, 1077-1078: one index per heartbeat, which
                       pipelined sends keep undoing: a divergent follower never caught up)
  pre_vote             stand for election only after a majority said it would vote
                       (pre_vote.py; syncobj.py:636-650, 920-924, 945)

Batching: commands proposed with a ``batch_key`` while the tick thread is busy share one
Raft entry (``raft_wire.encode_shared_entry``), applied one by one in order under one
index. Two commands with the same key never share an entry, so per key (the service uses
the resource name) every command still has an index of its own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import FAIL_REASON

from coordinator.raft import limits as raft_limits
from coordinator.raft import snapshot_file
from coordinator.raft import wire as raft_wire
from coordinator.raft.durable_term import DurableTerm
from coordinator.raft.fatal import EXIT_APPLY_FAILED, EXIT_DISK_FAILED, FatalHandler, once
from coordinator.raft.journal import fsync_directory
from coordinator.raft.leader_sync import LeaderSync
from coordinator.raft.member_changes import MemberChanges
from coordinator.raft.member_gate import STAMPED_TYPES, MemberGate, stamping_transport
from coordinator.raft.peer_keys import PeerKeys
from coordinator.raft.pre_vote import PRE_VOTE, PRE_VOTE_RESPONSE, PreVote
from coordinator.raft.read_index import ReadIndex
from coordinator.raft.replica import Replica
from coordinator.raft.transport import peer_warnings

if TYPE_CHECKING:
    from coordinator.raft.node import RaftConfig

log = logging.getLogger(__name__)

# How long closing a node waits for a snapshot write still running: the longest measured
# (1,000,000 resources, bench/README.md) takes a few seconds; a disk slower than this is
# reported and left behind.
_SNAPSHOT_WRITER_JOIN_S = 60.0

ALL_FIXES = frozenset(
    {
        "durable_journal",
        "keep_tail",
        "next_index_forward",
        "truncate_on_conflict",
        "no_old_snapshot",
        "commit_needs_match",
        "fast_backup",
        "pre_vote",
    }
)

# An entry's first byte is its pysyncobj command type (syncobj.py:56-60, 497); the typed entry
# format (wire.py, which may not import pysyncobj) names the two we write by value.
assert raft_wire.ENTRY_TYPE_REGULAR == _ps._COMMAND_TYPE.REGULAR
assert raft_wire.NO_OP_ENTRY == _ps._bchr(_ps._COMMAND_TYPE.NO_OP)


class HardenedSyncObj(DurableTerm, ReadIndex, MemberChanges, PreVote, MemberGate, SyncObj):
    """pysyncobj with the durability and safety holes RAFT.md lists closed."""

    # pysyncobj's own state that this class replaces (pysyncobj itself is untyped).
    _SyncObj__commandsWaitingReply: dict[Any, Any]
    _SyncObj__forceLogCompaction: bool

    def __init__(
        self,
        config: RaftConfig,
        replica: Replica,
        journal,
        on_fatal: FatalHandler,
        on_leadership: Callable[[bool], None] | None = None,
        *,
        identity,
        member_ids: dict[str, str],
        **kwargs,
    ):
        # Set before SyncObj.__init__: the tick thread starts inside it.
        self._on_leadership = on_leadership
        self._fixes = config.fixes
        self._journal = journal
        # Only the first fatal acts (RaftNode hands the same once-wrapped handler to the
        # replica; once() returns a wrapped handler as it is).
        on_fatal = self._on_fatal = once(on_fatal)
        # Anything escaping a tick of the auto-tick thread stops the member (durable_term.py).
        self._guard_ticks = kwargs.get("autoTick", True)
        self._pending_acks: list[tuple] = []
        self._append_pending = False
        self._append_has_new_entries = True
        self._replica = replica
        self._queued_lock = threading.Lock()
        self._queued: list[tuple[bytes, Any, Callable]] = []  # (command, batch key, callback)
        self._queued_max = config.commands_queue_size
        self._packing = False
        self.shared_entries = 0  # entries that carried more than one command
        self._commit_notify_delay_s = config.commit_notify_delay_s
        self._commit_notify_at = None  # when a held-back commit-only append must go out
        self.commit_only_sends = 0  # appends sent that carried no entry to anyone
        self.truncated_applied = 0  # times an applied entry would have been truncated
        self.refused_old_snapshots = 0
        # Peer input no member of ours sends: connections that did not name a member (or not in
        # time, or past the bound on waiting ones), frames over the size bound, and split
        # transmissions (frames that call anything are dropped by the frame reader before we
        # see them).
        self.refused_peer_messages = 0
        # Kept here, not on the transport, so status reads the same fields whatever transport
        # runs (tests give their own): reason -> handshakes and bound messages refused, and
        # established connections a newly bound one took the place of.
        self.refused_bindings: dict[str, int] = {}
        self.peer_connections_replaced = 0
        # The peer secrets, in place of pysyncobj's one Fernet (password=, syncobj.py:123-128):
        # the ``encryptor`` every connection is given (below), replaceable on SIGHUP.
        self.peer_keys = PeerKeys(config.secrets) if config.secrets else None
        self.refused_entries = 0  # committed entries no member of ours writes: skipped everywhere
        self.leader_commit_seen = None  # commit index announced to this process by a leader
        self._leader_sync: LeaderSync | None = None  # set once the transport's pipe notifier exists (below)
        self._true_match: dict = {}  # follower -> highest index it acked, this term
        self._true_match_term = -1
        self._match_capped = False  # some follower's matchIndex is shown below its ack
        self._conflict_hint: int | None = None  # where to resume, for the append being handled
        self._compaction_bytes = config.log_compaction_min_bytes
        self._leader_lost_election_s = config.leader_lost_election_s
        self._init_gate(identity, config.data_dir, config.bootstrap, member_ids)
        self._init_pre_vote("pre_vote" in self._fixes)
        self._init_read_index()
        self._init_changes(config.peer_addresses)
        replica.config_at = self.config_plain_at
        replica.on_snapshot_config = self.snapshot_config_loaded
        kwargs["transportClass"] = stamping_transport(kwargs["transportClass"], self)
        conf = SyncObjConf(
            autoTick=kwargs.pop("autoTick", True),
            # Send one append per new entry (not every 100 ms) and coalesce them
            # into one send per tick below: 1 ms latency instead of 100 ms.
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_s,
            # Far above limits.COMMAND_BYTES_MAX and above the largest admin entry
            # (RESTORE_COMMAND_BYTES_MAX), so the split-transmission path with its
            # length bug (syncobj.py:1276-1281) is never used.
            appendEntriesBatchSizeBytes=raft_limits.RAFT_BATCH_BYTES,
            raftMinTimeout=config.raft_min_timeout_s,
            raftMaxTimeout=config.raft_max_timeout_s,
            connectionTimeout=max(3.5, config.raft_max_timeout_s),
            connectionRetryTime=config.connection_retry_s,
            leaderFallbackTimeout=config.leader_fallback_timeout_s,
            # Fail fast with MISSING_LEADER instead of queueing behind an election.
            commandsWaitLeader=False,
            commandsQueueSize=config.commands_queue_size,
            journalFile=journal,
            fullDumpFile=os.path.join(config.data_dir, snapshot_file.DUMP_NAME),
            serializer=replica.serialize,
            deserializer=replica.deserialize,
            useFork=False,  # never fork() a process that runs gRPC threads
            # Snapshot chunks on the wire: the typed wire refuses longer ones.
            logCompactionBatchSize=raft_limits.RAFT_SNAPSHOT_CHUNK_BYTES,
            logCompactionMinEntries=config.log_compaction_min_entries,
            logCompactionMinTime=config.log_compaction_min_time_s,
            bindAddress=config.self_address,
            dynamicMembershipChange=False,
            password=None,  # self.peer_keys encrypts instead (the encryptor property below)
            onStateChanged=self._state_changed,
        )
        super().__init__(
            config.self_address,
            list(config.peer_addresses),
            conf=conf,
            consumers=[replica],
            **kwargs,
        )
        if self._has("durable_journal"):
            self._leader_sync = LeaderSync(
                journal,
                background=config.leader_sync_in_background and conf.autoTick,
                wake=self._wake_raft_thread,
                on_fatal=on_fatal,
                exit_code=EXIT_DISK_FAILED,
            )
        self.addOnTickCallback(self._flush_tick)
        writer = self._snapshot_writer()
        if writer is not None and not conf.autoTick:
            writer.inline = True  # ticked by hand (the simulation): stay deterministic
        if writer is not None and self._has("durable_journal") and hasattr(journal, "prepare_compaction"):
            writer.on_durable = journal.prepare_compaction  # the writer made the rename durable

    @property
    def encryptor(self):
        """What pysyncobj hands every connection (transport.py:325-327, 529) and checks for
        "encrypted?": our PeerKeys, shared by all of them, so a SIGHUP's new secrets reach
        established connections too. With one secret it sends and accepts exactly what
        pysyncobj's own Fernet did (the same key derivation, peer_keys.py)."""
        return self.peer_keys

    def _has(self, fix: str) -> bool:
        return fix in self._fixes

    def _state_changed(self, old_state, new_state) -> None:
        # pysyncobj calls this on the Raft thread for every state change (syncobj.py:1239-1244).
        was, now = old_state == _ps._RAFT_STATE.LEADER, new_state == _ps._RAFT_STATE.LEADER
        if self._on_leadership is None or was == now:
            return
        try:
            self._on_leadership(now)
        except Exception:  # the observer is the caller's code: any type, logged, never raised here
            log.exception("raft: the leadership observer failed")

    # -- shared entries -----------------------------------------------------------

    def queue_command(self, command: bytes, batch_key, callback) -> None:
        """Queue ``command`` for the next tick, which packs queued commands into entries.

        Replaces pysyncobj's own queue for our commands (same bound: commands_queue_size),
        so commands keep their arrival order whether they share an entry or not.
        """
        with self._queued_lock:
            full = len(self._queued) >= self._queued_max
            if not full:
                self._queued.append((command, batch_key, callback))
                wake = len(self._queued) == 1
        if full:
            callback(None, FAIL_REASON.QUEUE_FULL)
            return
        if wake:
            self._wake_raft_thread()  # what pysyncobj's _applyCommand does (syncobj.py:498-499)

    def _wake_raft_thread(self) -> None:
        """End the Raft thread's poll early, from any thread (pysyncobj's pipe notifier)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return
        try:
            notifier.notify()
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending already

    def _checkCommandsToApply(self):
        # pysyncobj takes queued commands here (syncobj.py:503); ours go first, packed.
        self._packing = True
        try:
            # Membership changes first: each is decided against the log as it is right now.
            self.decide_member_changes()
            self._pack_queued()
        finally:
            self._packing = False
        if self._leader_unreachable():
            self._fail_unsent_commands()
        SyncObj._checkCommandsToApply(self)

    # -- forwarding to a leader that is gone ------------------------------------------

    def _leader_unreachable(self) -> bool:
        """A follower knows a leader but has no connection to it (a leader killed, or its
        connection dropped): pysyncobj keeps that leader until the election timeout fires."""
        leader = self._SyncObj__raftLeader
        return (
            leader is not None
            and self._SyncObj__raftState != _ps._RAFT_STATE.LEADER
            and leader not in self._SyncObj__connectedNodes
        )

    def _fail_unsent_commands(self) -> None:
        # pysyncobj would "forward" each queued command to that leader (syncobj.py:554-566):
        # transport.send drops it unsent and returns False, which pysyncobj ignores, so the
        # command waited for the next election (LEADER_CHANGED, outcome unknown) or the
        # caller's deadline (1-2 s of 'outcome unknown' in a failover). Nothing was sent, so
        # nothing can apply: a definite MISSING_LEADER (NOT_LEADER to a member that forwarded
        # one to us, as pysyncobj answers it), and the caller retries elsewhere at once.
        queue = self._SyncObj__commandsQueue
        while True:
            try:
                _, callback = queue.get_nowait()
            except _ps.Queue.Empty:
                return
            reason = FAIL_REASON.NOT_LEADER if isinstance(callback, tuple) else FAIL_REASON.MISSING_LEADER
            self._SyncObj__callErrCallback(reason, callback)

    def _SyncObj__onNodeDisconnected(self, node):
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        if node != self._SyncObj__raftLeader or self._SyncObj__raftState == _ps._RAFT_STATE.LEADER:
            return
        self._stand_soon()
        # Commands forwarded to the leader wait for its answer on this connection
        # (syncobj.py:1044-1061), which is gone: they waited for the next election or the
        # caller's deadline. They may have reached the leader and may still apply, so their
        # outcome is unknown (LEADER_CHANGED, as pysyncobj reports them at the election),
        # reported now so the caller retries with the same op_id without waiting.
        waiting = self._SyncObj__commandsWaitingReply
        self._SyncObj__commandsWaitingReply = {}
        for request_id in sorted(waiting):
            waiting[request_id](None, FAIL_REASON.LEADER_CHANGED)

    def _stand_soon(self) -> None:
        """The connection to our leader closed: stand for election after 1-2x
        ``leader_lost_election_s`` unless the leader is heard from first."""
        # pysyncobj waits out the election timeout from the last heartbeat (syncobj.py:635),
        # 1-2 s, although a leader whose process died had its sockets closed by the kernel and
        # we saw it at once. A connection that merely dropped is dialled again at once (the
        # last attempt is long past: connection_retry_s) and the leader's next heartbeat,
        # within heartbeat_s, resets the timer (syncobj.py:952) before this fires. A leader
        # that stops answering but keeps its sockets (SIGSTOP, a partition) is still found by
        # the election timeout alone. Randomised like pysyncobj's own timeout (its ``random``,
        # so the simulation's seeded one), so both followers rarely stand at once.
        lost_s = self._leader_lost_election_s
        if not lost_s:
            return
        deadline = _ps.monotonicTime() + _ps.random.uniform(lost_s, 2 * lost_s)
        if deadline < self._SyncObj__raftElectionDeadline:
            self._SyncObj__raftElectionDeadline = deadline

    def _applyCommand(self, command, callback, commandType=None):
        if not self._packing:
            return SyncObj._applyCommand(self, command, callback, commandType)
        # syncobj.py:492-501 without its pipe notify: on the Raft thread, right before
        # the queue is read, a wake-up would only cost one more (empty) tick per entry.
        if commandType is not None:
            command = _ps._bchr(commandType) + command
        try:
            self._SyncObj__commandsQueue.put_nowait((command, callback))
        except _ps.Queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)

    def _pack_queued(self) -> None:
        with self._queued_lock:
            queued, self._queued = self._queued, []
        group: list[tuple[bytes, Any, Callable]] = []
        keys: set = set()
        size = 0
        for item in queued:
            command, key, _ = item
            if key is None:
                # Commands without a key keep their place in line, each in an entry of its own.
                if group:
                    self._propose_group(group)
                    group, keys, size = [], set(), 0
                self._propose_group([item])
                continue
            if group and (
                key in keys
                or len(group) >= raft_limits.RAFT_ENTRY_COMMANDS_MAX
                or size + len(command) > raft_limits.RAFT_ENTRY_BYTES_MAX
            ):
                self._propose_group(group)
                group, keys, size = [], set(), 0
            group.append(item)
            keys.add(key)
            size += len(command)
        if group:
            self._propose_group(group)

    def _propose_group(self, group: list[tuple[bytes, Any, Callable]]) -> None:
        if len(group) == 1:
            command, _, callback = group[0]
            self._applyCommand(raft_wire.encode_entry(command), callback)
            return
        callbacks = [callback for _, _, callback in group]

        def fan_out(result, error):
            if error != FAIL_REASON.SUCCESS:
                for callback in callbacks:
                    callback(None, error)
                return
            index, outcomes = result
            if not isinstance(outcomes, list) or len(outcomes) != len(callbacks):
                # Only a shared entry we did not build could get here; never guess.
                self._on_fatal(f"shared entry at {index} answered {outcomes!r}", EXIT_APPLY_FAILED)
                return
            for callback, outcome in zip(callbacks, outcomes, strict=True):
                callback((index, outcome), error)

        self.shared_entries += 1
        shared = raft_wire.encode_shared_entry([command for command, _, _ in group])
        self._applyCommand(raft_wire.encode_entry(shared), fan_out)

    # -- group commit and coalesced sends --------------------------------------

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
        # Reads waiting on a round nobody sent yet: the round goes out now, not at the
        # next heartbeat (read_index.py).
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
                if read_round:
                    self.start_read_round()
                SyncObj._SyncObj__sendAppendEntries(self)
                if read_round:
                    self.read_round_sent()
        leader_sync = self._leader_sync
        leading = leader_sync is not None and self._isLeader()
        if self._pending_acks or not leading:
            self._sync_then_ack()
        if leader_sync is not None and leading:
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

    def _onTick(self, timeToWait=0.0):
        return self._guarded_tick(self._tick, timeToWait)

    def _tick(self, timeToWait):
        self.follow_configuration()
        self.hold_election_if_not_voter()
        self.hold_election_for_pre_vote()
        self.show_counted_acks()
        self._cap_commit_votes()
        # A held-back commit notice bounds the poll wait, so it goes out on time.
        due = self._commit_notify_at
        if due is not None and timeToWait > 0:
            timeToWait = max(0.0, min(timeToWait, due - _ps.monotonicTime()))
        SyncObj._onTick(self, timeToWait)
        if self._pending_acks:
            # A follower queued acks while handling appends in the poll that ends a tick:
            # sync and answer now, not after the next tick body (which applies entries
            # first). The leader's critical path is one follower's round trip.
            self._sync_then_ack()

    # -- message handling --------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries" and "transmission" in message:
            # An entry split over several messages, unpickled whole (syncobj.py:977). Ours never
            # split (appendEntriesBatchSizeBytes is above any entry we make, see __init__).
            self.refused_peer_messages += 1
            peer_warnings.warning("raft: dropped a split append from %s; members of ours never send one", node)
            return
        if kind in STAMPED_TYPES and not self.admit_member_message(node, message):
            return
        if kind == "apply_command" and message["command"][:2] == raft_wire.CONFIG_ENTRY_HEAD:
            # A forwarded CONFIG entry would be appended unchecked (syncobj.py:958-963): only the
            # leader writes them, after its own checks (member_changes.py). No member forwards one.
            self.refused_peer_messages += 1
            peer_warnings.warning("raft: dropped a forwarded configuration from %s; only the leader writes one", node)
            return
        if kind == PRE_VOTE:
            self.answer_pre_vote(node, message)
            return
        if kind == PRE_VOTE_RESPONSE:
            self.count_pre_vote_response(node, message)
            return
        if kind == "append_entries":
            message = self._sanitize_append(message)
            self.note_append_for_echo(message)
        next_index_before = None
        if kind == "next_node_idx" and message.get("success") and self._has("next_index_forward"):
            next_index_before = self._SyncObj__raftNextIndex.get(node)
        if kind == "next_node_idx" and message.get("reset") and self._has("fast_backup"):
            # A rejected append: resend from the new nextIndex at the next tick, not
            # at the next heartbeat (pysyncobj waits for one, syncobj.py:1077-1078).
            self._append_pending = True
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            self._conflict_hint = None
            self._echo_now = None
        if kind == "next_node_idx":
            self.read_echo(node, message)
        elif kind == "append_entries":
            self.note_leader_heard(node)
        if next_index_before is not None and self._isLeader():
            # A late ack for an earlier batch set nextIndex back (syncobj.py:1079-1082),
            # re-sending entries the follower has and, across the compacted head,
            # an old snapshot that rolled the follower back.
            nxt = self._SyncObj__raftNextIndex
            if node in nxt and nxt[node] < next_index_before:
                nxt[node] = next_index_before

    # -- snapshots written off the Raft thread (snapshot_writer.py) -------------------

    def _snapshot_writer(self):
        """The BackgroundSerializer, or None where pysyncobj's stock one is in place."""
        serializer = self._SyncObj__serializer
        return serializer if hasattr(serializer, "capturing") else None

    def _SyncObj__applyLogEntries(self):
        # From the moment the Raft thread starts a snapshot until the writer thread has read
        # its first piece (which fixes the state it holds; the state machine keeps what later
        # entries change as it was) nothing is applied: the pieces then describe the state at
        # the snapshot's last index exactly. Committed entries wait in the journal meanwhile;
        # elections, heartbeats, appends and commits go on.
        writer = self._snapshot_writer()
        if writer is not None and writer.capturing:
            return False
        return SyncObj._SyncObj__applyLogEntries(self)

    def _snapshot_blocks_sends(self) -> bool:
        """Whether a snapshot's result is still uncollected (and, while the writer thread still
        runs, a follower needs a snapshot sent): pysyncobj has nothing to send it then
        (getTransmissionData), and sending on every tick would spin (see _flush_tick). While a
        write runs (hundreds of ms), followers that need entries only are still sent them."""
        serializer = self._SyncObj__serializer
        if serializer._Serializer__pid == 0:
            return False
        writer = self._snapshot_writer()
        if writer is None or not writer.writing():
            return True  # a result waiting for the next check: one tick, as pysyncobj's inline path
        log_ = self._SyncObj__raftLog
        first = log_[0][1] if len(log_) else 0
        nxt = self._SyncObj__raftNextIndex
        return any(nxt.get(node, first + 1) <= first for node in self._SyncObj__otherNodes)

    def _doDestroy(self):
        writer = self._snapshot_writer()
        # A write still running would rename its file into a data dir the next process may
        # already use; a snapshot write takes seconds at most (RAFT.md), so this waits long.
        if writer is not None and not writer.wait(timeout_s=_SNAPSHOT_WRITER_JOIN_S):
            log.warning("raft: the snapshot writer is still running at shutdown")
        if writer is not None:
            writer.stop()
        SyncObj._doDestroy(self)

    def _SyncObj__doApplyCommand(self, command):
        # Every entry a member of ours writes is a NO_OP (a new leader's first entry) or a typed
        # entry carrying commands for Replica.apply_entry (wire.py "log entries"); the wire
        # refuses anything else from peers, and the journal holds only what this member wrote
        # or accepted (RAFT.md "No pickle on disk either"). pysyncobj would unpickle an entry (syncobj.py:874, 894,
        # 1419) and call whatever method id it names with whatever arguments. Anything else is
        # skipped, by every member alike, so replicas stay equal.
        try:
            payload = raft_wire.entry_command(command)
        except ValueError as exc:
            return self._skip_entry(str(exc))
        if payload is None:
            return None  # a NO_OP
        return self._replica.apply_entry(payload)

    def _skip_entry(self, why: str) -> None:
        self.refused_entries += 1
        log.error("raft: skipped entry %d, which no member of ours writes: %s", self.raftLastApplied + 1, why)
        return None

    def _SyncObj__getEntries(self, fromIDx, count=None, maxSizeBytes=None):
        # Only the append sender passes a size (syncobj.py:1272); there the count is capped
        # too, so an append of many tiny entries stays within raft_limits.RAFT_MESSAGE_BYTES_MAX.
        if maxSizeBytes is not None:
            count = (
                raft_limits.RAFT_APPEND_ENTRIES_MAX
                if count is None
                else min(count, raft_limits.RAFT_APPEND_ENTRIES_MAX)
            )
        return SyncObj._SyncObj__getEntries(self, fromIDx, count, maxSizeBytes)

    def _sanitize_append(self, message: dict) -> dict:
        if message.get("term", -1) < self.raftCurrentTerm:
            return message  # pysyncobj ignores it
        message = dict(message)
        # What the leader says is committed, before we clamp it: readiness target.
        self.leader_commit_seen = message.get("commit_index", 0)
        if message.get("prevLogIdx", 0) is None:
            # A leader whose nextIndex ran past its own log sends prevLogIdx=None;
            # pysyncobj answers it with a reset. Found by the simulation (seed 22).
            return message
        if "prevLogIdx" in message and "transmission" not in message:
            entries = list(message.get("entries", []))
            prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
            local_prev_term = self._local_term(prev_idx)
            if self._has("fast_backup") and local_prev_term is not None and local_prev_term != prev_term:
                # pysyncobj will reject with nextIndex = prevLogIdx, one entry back per round
                # trip. Raft's usual shortcut: skip our whole conflicting term at once.
                self._conflict_hint = self._first_index_of_term(prev_idx, local_prev_term)
            if self._has("truncate_on_conflict") and local_prev_term == prev_term:
                # Skip the entries we already hold with the same term; pysyncobj
                # would otherwise delete everything after prevLogIdx, even a
                # matching tail that was acknowledged (syncobj.py:991-1004).
                skip = 0
                while skip < len(entries) and self._local_term(entries[skip][1]) == entries[skip][2]:
                    skip += 1
                if skip:
                    prev_idx, prev_term = entries[skip - 1][1], entries[skip - 1][2]
                    entries = entries[skip:]
                    message["prevLogIdx"], message["prevLogTerm"] = prev_idx, prev_term
                    message["entries"] = entries
            self._append_has_new_entries = bool(entries)
            if self._has("commit_needs_match"):
                # Raft: commitIndex = min(leaderCommit, index of last *new* entry);
                # pysyncobj uses its own log end (syncobj.py:1032), which may hold
                # unverified entries from an older term.
                proven = prev_idx + len(entries)
                message["commit_index"] = min(message["commit_index"], proven)
        else:
            self._append_has_new_entries = True
            if "serialized" in message and self._has("commit_needs_match"):
                # A snapshot chunk proves nothing about our log (syncobj.py:1021-1035).
                message["commit_index"] = min(message["commit_index"], self.raftCommitIndex)
        return message

    def _local_term(self, index: int):
        log_ = self._journal_obj()
        if not len(log_):
            return None
        pos = index - log_[0][1]
        if 0 <= pos < len(log_):
            return log_[pos][2]
        return None

    def _first_index_of_term(self, index: int, term: int) -> int:
        """The first index of our run of ``term`` entries ending at ``index`` (never the log head)."""
        log_ = self._journal_obj()
        pos = index - log_[0][1]
        # log_[0] is the snapshot point: committed, so it matches the leader's log.
        while pos > 1 and log_[pos - 1][2] == term:
            pos -= 1
        return log_[max(pos, 1)][1] if len(log_) > 1 else index

    def _journal_obj(self):
        return self._SyncObj__raftLog

    def _SyncObj__deleteEntriesFrom(self, fromIDx):
        # Only called from append_entries (syncobj.py:1004). With our sanitizing,
        # a message whose entries all matched has none left: nothing conflicts.
        if self._has("truncate_on_conflict") and not self._append_has_new_entries:
            return
        if fromIDx <= self.raftLastApplied:
            self.truncated_applied += 1
            if self._has("truncate_on_conflict"):
                self._on_fatal(
                    f"leader asked to truncate applied entries from {fromIDx} "
                    f"(last applied {self.raftLastApplied}): refusing to diverge",
                    EXIT_APPLY_FAILED,
                )
                return
        SyncObj._SyncObj__deleteEntriesFrom(self, fromIDx)

    def _SyncObj__tryLogCompaction(self):
        """Compact by bytes as well: stock pysyncobj compacts after logCompactionMinEntries
        entries or logCompactionMinTime seconds only (syncobj.py:1436-1439), so 64 KiB writes
        grew every member's journal, in memory and on disk, to 50,000 x 64 KiB. Once the
        journal has grown by ``log_compaction_min_bytes`` since its last compaction, the stock
        method is told to compact now (its force flag; it resets it when it starts).

        No compaction starts while the state machine says a snapshot would free nothing
        (``Replica.snapshot_deferred``: a restore staged in chunks, whose chunks a snapshot
        holds as the journal does); one already written is still collected."""
        if self._replica.snapshot_deferred() and self._SyncObj__serializer._Serializer__pid == 0:
            return None
        grown = getattr(self._journal, "bytes_since_compaction", 0)  # the stock journal: count only
        if self._compaction_bytes and grown > self._compaction_bytes and not self._SyncObj__forceLogCompaction:
            self._SyncObj__forceLogCompaction = True
        return SyncObj._SyncObj__tryLogCompaction(self)

    def _SyncObj__loadDumpFile(self, clearJournal):
        path = self.conf.fullDumpFile
        installing = clearJournal
        try:
            index, term = snapshot_file.verify(path)
        except (OSError, ValueError) as exc:
            if installing:
                log.warning("ignoring damaged snapshot from leader: %s", exc)
                return None
            # pysyncobj would log and carry on without the snapshot (syncobj.py:1510),
            # replaying a compacted journal onto empty state: a silent divergence.
            self._on_fatal(f"cannot load snapshot at startup: {exc}", EXIT_DISK_FAILED)
            return None
        if installing:
            if self._has("no_old_snapshot") and index <= self.raftLastApplied:
                # An old snapshot would move applied state backwards (RAFT.md "Durability":
                # measured 14972 -> 14772). Keep ours; the ack reports our log end.
                self.refused_old_snapshots += 1
                log.warning("refusing snapshot at %d: already applied %d", index, self.raftLastApplied)
                return None
            if self._has("durable_journal"):
                # pysyncobj renamed the received file into place without fsync
                # (serializer.py:198); make it durable before the journal is cleared.
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                fsync_directory(os.path.dirname(os.path.abspath(path)))
        if self._has("keep_tail") and self._align_journal_head(index, term):
            # The journal holds the snapshot point: keep everything after it.
            # Stock code clears the whole journal when its head is older than the
            # dump (syncobj.py:1489-1495), dropping acknowledged entries.
            clearJournal = False
        loaded = SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        # The election timer restarts once the state is loaded. Installing: it started when the
        # leader's message arrived (syncobj.py:952), and a follower that spent the restore on
        # the leader's own snapshot must not then depose it. Starting: pysyncobj set it in
        # __init__ (syncobj.py:162) and loads in the first tick; a load that outlasts it (~7 s
        # at a million resources, RAFT.md) would call an election the moment it ends and,
        # with no pre-vote, depose a healthy leader at every restart.
        self._SyncObj__raftElectionDeadline = _ps.monotonicTime() + self._SyncObj__generateRaftTimeout()
        return loaded

    def _align_journal_head(self, index: int, term: int) -> bool:
        log_ = self._journal_obj()
        if not len(log_):
            return False
        pos = index - log_[0][1]
        if pos < 1 or pos >= len(log_) or log_[pos][2] != term:
            return False
        if pos > 1:
            log_.deleteEntriesTo(pos - 1)  # head becomes [prev, last] of the snapshot
        return True

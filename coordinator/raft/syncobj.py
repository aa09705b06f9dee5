"""pysyncobj's SyncObj with the durability, safety and liveness holes RAFT.md lists closed.

Owns: ``HardenedSyncObj``, which puts the mixins together (each owns one family of overrides:
durable_term, member_gate, member_changes, pre_vote, read_index, shared_entries, group_commit,
snapshot_install) and itself overrides entry admission (peer messages no member of ours sends,
entries no member writes), append sanitizing, forwarding to a leader that is gone, and the
tick; ``syncobj_conf``, the SyncObjConf it runs with; and the fix names (``ALL_FIXES``) that
switch the fixes off one by one for tests (``RaftConfig.fixes``).
Must never: be used without ``patches.install()`` (``RaftNode`` calls it first), interpret a
command, or acknowledge an entry before it is fsynced.

Every override names the upstream line it fixes (syncobj.py:N is pysyncobj 0.3.17). Fix names:
  durable_journal      own fsynced journal + group commit (journal.py, group_commit.py _flush_tick)
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

Batching (shared_entries.py): commands proposed with a ``batch_key`` while the tick thread is
busy share one Raft entry, applied one by one in order under one index; two commands with the
same key never share an entry.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import FAIL_REASON

from coordinator.raft import limits as raft_limits
from coordinator.raft import snapshot_file
from coordinator.raft import wire as raft_wire
from coordinator.raft.durable_term import DurableTerm
from coordinator.raft.fatal import EXIT_APPLY_FAILED, FatalHandler, once
from coordinator.raft.group_commit import GroupCommit
from coordinator.raft.member_changes import MemberChanges
from coordinator.raft.member_gate import STAMPED_TYPES, MemberGate, stamping_transport
from coordinator.raft.peer_keys import PeerKeys
from coordinator.raft.pre_vote import PRE_VOTE, PRE_VOTE_RESPONSE, TERM_NOTICE, PreVote
from coordinator.raft.read_index import ReadIndex
from coordinator.raft.replica import Replica
from coordinator.raft.shared_entries import SharedEntries
from coordinator.raft.snapshot_install import SnapshotInstall
from coordinator.raft.transport import peer_warnings

if TYPE_CHECKING:
    from coordinator.raft.node import RaftConfig

log = logging.getLogger(__name__)

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


def syncobj_conf(
    config: RaftConfig, journal, replica: Replica, *, auto_tick: bool, on_state_changed: Callable
) -> SyncObjConf:
    """The SyncObjConf a HardenedSyncObj runs with: pysyncobj's settings from ``config``."""
    return SyncObjConf(
        autoTick=auto_tick,
        # Send one append per new entry (not every 100 ms) and coalesce them
        # into one send per tick (group_commit.py): 1 ms latency instead of 100 ms.
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
        password=None,  # HardenedSyncObj.peer_keys encrypts instead (its encryptor property)
        onStateChanged=on_state_changed,
    )


class HardenedSyncObj(
    DurableTerm, ReadIndex, MemberChanges, PreVote, MemberGate, SharedEntries, GroupCommit, SnapshotInstall, SyncObj
):
    """pysyncobj with the durability and safety holes RAFT.md lists closed."""

    # pysyncobj's own state that this class replaces (pysyncobj itself is untyped).
    _SyncObj__commandsWaitingReply: dict[Any, Any]

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
        self._on_fatal = once(on_fatal)
        # Anything escaping a tick of the auto-tick thread stops the member (durable_term.py).
        self._guard_ticks = kwargs.get("autoTick", True)
        self._replica = replica
        self._init_shared_entries(config.commands_queue_size)
        self._init_group_commit(config.commit_notify_delay_s)
        self._init_snapshots(config.log_compaction_min_bytes)
        self._init_admission(config.secrets)
        self._init_appends()
        self._init_gate(identity, config.data_dir, config.bootstrap, member_ids)
        self._init_pre_vote("pre_vote" in self._fixes, config.leader_lost_election_s)
        self._init_read_index(config.read_lease_s, config.heartbeat_s)
        self._init_changes(config.peer_addresses)
        replica.config_at = self.config_plain_at
        replica.on_snapshot_config = self.snapshot_config_loaded
        kwargs["transportClass"] = stamping_transport(kwargs["transportClass"], self)
        auto_tick = kwargs.pop("autoTick", True)
        conf = syncobj_conf(config, journal, replica, auto_tick=auto_tick, on_state_changed=self._state_changed)
        super().__init__(
            config.self_address,
            list(config.peer_addresses),
            conf=conf,
            consumers=[replica],
            **kwargs,
        )
        self._start_group_commit(journal, background_sync=config.leader_sync_in_background and conf.autoTick)
        self._init_snapshot_writer(journal, auto_tick=conf.autoTick)

    def _init_admission(self, secrets) -> None:
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
        # the ``encryptor`` every connection is given (the property below), replaceable on SIGHUP.
        self.peer_keys = PeerKeys(secrets) if secrets else None
        self.refused_entries = 0  # committed entries no member of ours writes: skipped everywhere

    def _init_appends(self) -> None:
        self._append_has_new_entries = True
        self.truncated_applied = 0  # times an applied entry would have been truncated
        self.leader_commit_seen = None  # commit index announced to this process by a leader
        self._conflict_hint: int | None = None  # where to resume, for the append being handled

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
        if was and not now:
            # Before anything sent afterwards: a vote this member grants as it steps down
            # (syncobj.py:920-940) could elect a leader while its lease still held.
            self.lease_void()
        if self._on_leadership is None or was == now:
            return
        try:
            self._on_leadership(now)
        except Exception:  # an observer must never break the Raft thread; logged below
            log.exception("raft: the leadership observer failed")

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
        if deadline < self.election_deadline():  # the one in effect, also while hidden for a tick
            self._SyncObj__raftElectionDeadline = deadline

    def _onTick(self, timeToWait=0.0):
        return self._guarded_tick(self._tick, timeToWait)

    def _tick(self, timeToWait):
        self.follow_configuration()
        self.hold_election_if_not_voter()
        self.hold_election_for_pre_vote()
        try:
            self.show_counted_acks()
            self._cap_commit_votes()
            # A held-back commit notice bounds the poll wait, so it goes out on time.
            due = self._commit_notify_at
            if due is not None and timeToWait > 0:
                timeToWait = max(0.0, min(timeToWait, due - _ps.monotonicTime()))
            SyncObj._onTick(self, timeToWait)
        finally:
            self.release_election_hold()
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
            # split (appendEntriesBatchSizeBytes is above any entry we make, see syncobj_conf).
            self.refused_peer_messages += 1
            peer_warnings.warning("raft: dropped a split append from %s; members of ours never send one", node)
            return
        if kind in STAMPED_TYPES and not self.admit_member_message(node, message):
            return
        if kind == "request_vote" and self.refuse_vote(node, message):
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
        if kind == TERM_NOTICE:
            self.count_term_notice(node, message)
            return
        if kind == "append_entries":
            self.answer_stale_append(node, message)
            message = self._sanitize_append(message)
            self.note_append_for_echo(message)
        next_index_before = None
        if kind == "next_node_idx" and message.get("success") and self._has("next_index_forward"):
            next_index_before = self._SyncObj__raftNextIndex.get(node)
        if kind == "next_node_idx" and message.get("reset") and self._has("fast_backup"):
            # A rejected append: resend from the new nextIndex at the next tick, not
            # at the next heartbeat (pysyncobj waits for one, syncobj.py:1077-1078).
            self._append_pending = True
        # A term this message raises names it as its cause (pre_vote.note_term_raised).
        self._handling = (str(kind), getattr(node, "address", str(node)))
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            self._handling = None
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
            cap = raft_limits.RAFT_APPEND_ENTRIES_MAX
            count = cap if count is None else min(count, cap)
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

"""One Raft replica of a state machine: the facade the server (and the harness) use.

Owns: ``RaftConfig`` and ``RaftNode``: building a hardened pysyncobj node (``patches.install()``
first, then journal, replica, transport, SyncObj), ``propose()``, which reports what happened
to a command as a ``ProposeResult`` (``interface.py``) and never guesses, and local reads.
Must never: decide domain rules (the state machine does), patch pysyncobj itself
(``patches.py`` does, from here, before anything is built), or acknowledge a command before
it is durable on a majority.

The package's modules are mapped in its ``__init__`` docstring; RAFT.md says what each fix
does and why.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any, Callable

from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON
from pysyncobj.journal import FileJournal

from coordinator.core import limits
from coordinator.raft import identity, patches
from coordinator.raft import limits as raft_limits
from coordinator.raft.fatal import FatalHandler, default_fatal, once
from coordinator.raft.interface import (
    MemberChangeResult,
    MemberRefusal,
    ProposeFailure,
    ProposeOutcome,
    ProposeResult,
    StateMachine,
)
from coordinator.raft.journal import JOURNAL_NAME, DurableJournal
from coordinator.raft.leader_log import LeaderLog
from coordinator.raft.membership import initial_member_id
from coordinator.raft.read_index import ReadIndexOutcome
from coordinator.raft.replica import Replica
from coordinator.raft.stamp_clock import StampClock, monotonic_ms
from coordinator.raft.syncobj import ALL_FIXES, HardenedSyncObj
from coordinator.raft.transport import BoundTCPTransport

log = logging.getLogger(__name__)

# pysyncobj's fail codes (config.py) as our typed failures. Whether each is definite
# (RAFT.md "Call semantics") is ProposeFailure's to say; codes not listed here are
# ProposeFailure.UNRECOGNIZED: outcome unknown.
FAILURE_OF_FAIL_REASON: dict[int, ProposeFailure] = {
    FAIL_REASON.QUEUE_FULL: ProposeFailure.QUEUE_FULL,
    FAIL_REASON.MISSING_LEADER: ProposeFailure.NO_LEADER,
    FAIL_REASON.NOT_LEADER: ProposeFailure.NOT_LEADER,
    FAIL_REASON.REQUEST_DENIED: ProposeFailure.REQUEST_DENIED,
    FAIL_REASON.DISCARDED: ProposeFailure.DISCARDED,
    FAIL_REASON.LEADER_CHANGED: ProposeFailure.LEADER_CHANGED,
    FAIL_REASON.UNKNOWN_OUTCOME: ProposeFailure.UNKNOWN_OUTCOME,
}


def failure_of(fail_reason: int) -> tuple[ProposeFailure, str]:
    """A pysyncobj fail code (not SUCCESS) as (typed failure, detail)."""
    failure = FAILURE_OF_FAIL_REASON.get(fail_reason)
    if failure is None:
        return ProposeFailure.UNRECOGNIZED, f"fail_reason_{fail_reason}"
    return failure, failure.value


@dataclasses.dataclass(frozen=True)
class RaftConfig:
    self_address: str  # "host:port"; the node binds this for listening and outgoing
    peer_addresses: tuple[str, ...]  # the other members (static membership)
    data_dir: str
    # Election timeout window. 1-2 s keeps spurious elections rare on a loaded
    # 2-core machine (RAFT.md "Performance and settings"); tests lower it.
    raft_min_timeout_s: float = 1.0
    raft_max_timeout_s: float = 2.0
    # An isolated leader steps down after this long without a majority answering
    # (stock default 30 s would let it claim leadership for half a minute).
    leader_fallback_timeout_s: float = 1.5
    # How soon a dropped peer connection is retried.
    connection_retry_s: float = 0.5
    # A follower whose connection to its leader closes (the leader's process died: the kernel
    # closed its sockets) stands for election after 1-2x this instead of its 1-2 s election
    # timeout; a connection that merely dropped is dialled again at once and the leader's next
    # heartbeat resets the timer first. 0: wait for the election timeout (RAFT.md).
    leader_lost_election_s: float = 0.3
    # Heartbeat period; also the longest a leader waits before resending.
    heartbeat_s: float = 0.1
    # Lease reads (RAFT.md "Lease reads"): a leader a majority confirmed within the last
    # read_lease_s answers a linearizable read with no round trip. Needs the pre_vote fix (its
    # voters refuse votes while they hear a live leader: the lease rests on that).
    lease_reads: bool = True
    # How much slower the leader's monotonic clock may run than a voter's over one vote window
    # (vote_window_s, 0.3 s by default), subtracted from the lease. NTP slews CLOCK_MONOTONIC by
    # at most 500 ppm (0.15 ms over 0.3 s); 50 ms is ~300x that, and also covers a small step
    # back of a leader's clock between two of its reads (read_lease.py).
    lease_read_clock_drift_s: float = 0.05
    # The leader runs its own journal fdatasync on a thread of its own, so the Raft thread
    # keeps handling acks and new commands meanwhile (it counts itself toward a commit
    # only once its copy is durable). False: sync inline, once per tick.
    leader_sync_in_background: bool = True
    # A commit index advance with no new entry to carry it is announced to followers
    # after at most this long (0 = at once, stock behaviour). In a stream of commands
    # the next append carries it for free; announcing each commit on its own costs the
    # leader one send and each follower one receive, one tick and one ack per op
    # (about half of a follower's CPU per op when commands come one at a time). Only
    # followers' apply lags by it (their own proposals and local reads), never commits.
    commit_notify_delay_s: float = 0.002
    # Bounded queue of proposals waiting for the tick thread; beyond it, QUEUE_FULL.
    commands_queue_size: int = 10_000
    # Snapshot + compact after this many entries or this many seconds. A snapshot runs
    # on the tick thread (~40 ms with a full dedup table), so rarer is smoother; 50k
    # entries keep the in-memory log near 10 MB and a replay on restart around a second.
    log_compaction_min_entries: int = 50_000
    log_compaction_min_time_s: float = 300.0
    # ... or once the journal has grown by this many bytes since its last compaction
    # (raft_limits.RAFT_COMPACTION_BYTES_DEFAULT says why); 0: by count and time only.
    log_compaction_min_bytes: int = raft_limits.RAFT_COMPACTION_BYTES_DEFAULT
    # Test switches: which fixes are on (default all), and whether the journal
    # records its synced length for power-loss simulation.
    fixes: frozenset[str] = ALL_FIXES
    track_synced: bool = False
    # Shared secret of member-to-member traffic: pysyncobj's Fernet (AES-CBC + HMAC,
    # encryptor.py), so a peer without it is disconnected before anything it sent is
    # unpickled. None: plaintext, and whoever reaches the Raft port can pose as a member.
    # Several (a rotation, peer_keys.py): frames are sent under the first, any is accepted.
    secret: str | tuple[str, ...] | None = dataclasses.field(default=None, repr=False)
    # This member's stable id (membership.py); None: derived from its place among the initial
    # members (self_address and peer_addresses), the same on every member.
    member_id: str | None = None
    # A member with no configuration may vote for, and become, the leader that writes a new
    # cluster's first configuration, which needs every initial member's vote (RAFT.md "Member
    # identity"). False: it waits to be added to an existing cluster.
    bootstrap: bool = True

    @property
    def vote_window_s(self) -> float:
        """The shortest time a voter grants no vote after its leader's append (pre_vote.py)."""
        return min(self.raft_min_timeout_s, self.leader_lost_election_s or self.raft_min_timeout_s)

    @property
    def read_lease_s(self) -> float:
        """How long a confirmed round's lease lasts; 0: no lease reads."""
        if not self.lease_reads or "pre_vote" not in self.fixes:
            return 0.0
        return self.vote_window_s - self.lease_read_clock_drift_s

    @property
    def secrets(self) -> tuple[str, ...]:
        """``secret`` as a set, the sending one first; () without one."""
        if not self.secret:
            return ()
        return (self.secret,) if isinstance(self.secret, str) else tuple(self.secret)

    def __post_init__(self):
        unknown = set(self.fixes) - ALL_FIXES
        if unknown:
            raise ValueError(f"unknown raft fixes: {sorted(unknown)}")
        if not (0 < self.raft_min_timeout_s < self.raft_max_timeout_s):
            raise ValueError("need 0 < raft_min_timeout_s < raft_max_timeout_s")
        if not (0 <= self.commit_notify_delay_s < self.heartbeat_s):
            raise ValueError("need 0 <= commit_notify_delay_s < heartbeat_s")
        if self.raft_min_timeout_s <= 3 * self.heartbeat_s:
            # pysyncobj's own rule (config.py:174): several heartbeats per timeout.
            raise ValueError("raft_min_timeout_s must exceed 3 * heartbeat_s")
        if self.leader_lost_election_s and not (
            self.heartbeat_s <= self.leader_lost_election_s < self.raft_min_timeout_s
        ):
            raise ValueError("need leader_lost_election_s 0, or heartbeat_s <= it < raft_min_timeout_s")
        if self.lease_reads and not (0 <= self.lease_read_clock_drift_s < self.vote_window_s):
            raise ValueError(
                f"need 0 <= lease_read_clock_drift_s < {self.vote_window_s:g} s (the vote window: the smaller of"
                " raft_min_timeout_s and a nonzero leader_lost_election_s)"
            )


class RaftNode:
    """A replica: start it, propose commands with a deadline, read under a lock."""

    def __init__(
        self,
        config: RaftConfig,
        state_machine: StateMachine,
        *,
        on_fatal: FatalHandler = default_fatal,
        transport_class=None,
        auto_tick: bool = True,
        journal_fsync: Callable[[int], None] | None = None,
        monotonic_ms: Callable[[], int] = monotonic_ms,
        on_leadership: Callable[[bool], None] | None = None,
    ) -> None:
        """``on_leadership(is_leader)`` runs on the Raft thread whenever this node becomes or
        stops being the leader; it must be quick and must not propose or wait.
        ``monotonic_ms``: the clock command stamps advance by (DESIGN I6); never a wall clock."""
        patches.install()  # refuses any pysyncobj but the pinned one, before anything is built
        self.config = config
        self.state_machine = state_machine
        self._stamp_clock = StampClock(monotonic_ms)
        self._ready_latched = False
        os.makedirs(config.data_dir, exist_ok=True)
        if "durable_journal" in config.fixes:
            sync_kwargs = {}
            if journal_fsync is not None:
                sync_kwargs = {"fsync": journal_fsync, "fdatasync": journal_fsync}
            journal = DurableJournal(config.data_dir, track_synced=config.track_synced, **sync_kwargs)
        else:
            journal = FileJournal(os.path.join(config.data_dir, JOURNAL_NAME + ".stock"))
        self.journal = journal
        # One handler for the whole node, acting on its first fatal only (fatal.once).
        on_fatal = once(on_fatal)
        self._replica = Replica(state_machine, on_fatal)
        initial = (config.self_address, *config.peer_addresses)
        member_ids = {address: initial_member_id(address, initial) for address in initial}
        # Created and fsynced before anything can vote or acknowledge (identity.py).
        self.identity, created = identity.load_or_create(
            config.data_dir, config.member_id or member_ids[config.self_address]
        )
        if created:
            log.warning(
                "raft: new identity for member %s: incarnation %d", self.identity.member_id, self.identity.incarnation
            )
        kwargs = {"transportClass": transport_class or BoundTCPTransport}
        if not auto_tick:
            kwargs["autoTick"] = False
        self._syncobj = HardenedSyncObj(
            config, self._replica, journal, on_fatal, on_leadership,
            identity=self.identity, member_ids=member_ids, **kwargs,
        )
        self.leader_log = LeaderLog()
        self._syncobj.addOnTickCallback(self._watch_leader)

    def _watch_leader(self) -> None:
        leader = self._syncobj._getLeader()  # on the Raft thread: no race with the tick
        self.leader_log.observe(leader.address if leader is not None else None, self._syncobj.raftCurrentTerm)

    # -- proposing -----------------------------------------------------------

    def next_stamp_ms(self) -> int:
        """DESIGN I6: the stamp of a command proposed here now (``stamp_clock.py`` has the rule:
        0 unless this member leads; the leader's monotonic time, bounded per stamp)."""
        so = self._syncobj
        # Leadership first, then the term: a term read before an election could pair a
        # leadership of the new term with the stamp chain of the old one.
        leading = so._isLeader()
        term = so.raftCurrentTerm
        return self._stamp_clock.stamp(term=term, leading=leading, log_clock_ms=self.state_machine.log_clock_ms)

    def propose(
        self,
        command: bytes,
        timeout_s: float,
        *,
        max_bytes: int = limits.COMMAND_BYTES_MAX,
        batch_key: Any = None,
    ) -> ProposeResult:
        """Replicate ``command``; wait at most ``timeout_s`` for its fate.

        ``max_bytes`` caps the encoded command; only admin restore raises it, never above
        ``limits.RESTORE_COMMAND_BYTES_MAX`` (the Raft batch size is kept above that).
        ``batch_key``: see ``propose_async``.
        """
        assert max_bytes <= limits.RESTORE_COMMAND_BYTES_MAX, "no entry may reach the split path"
        if not isinstance(command, (bytes, bytearray)) or len(command) > max_bytes:
            return ProposeResult.failed(ProposeFailure.COMMAND_TOO_LARGE)
        done = threading.Event()
        box: list = []

        def on_result(result, error):
            box.append((result, error))
            done.set()

        self.propose_async(bytes(command), on_result, batch_key=batch_key)
        if not done.wait(max(0.0, timeout_s)):
            # The entry may still commit later: only the caller's op_id can tell.
            return ProposeResult.failed(ProposeFailure.DEADLINE_EXCEEDED)
        result, error = box[0]
        return self._result_of(result, error)

    def propose_async(self, command: bytes, callback: Callable[[Any, int], None], *, batch_key: Any = None) -> None:
        """Queue ``command``; ``callback(result, fail_reason)`` runs on the Raft thread.

        With a ``batch_key`` (any hashable but None) the command may share a Raft entry with
        others proposed meanwhile, never with one of the same key; without one it gets an
        entry of its own. Sizes are the caller's to check (``propose`` does).
        """
        if len(command) > limits.COMMAND_BYTES_MAX:
            batch_key = None  # an admin restore: always alone
        self._syncobj.queue_command(command, batch_key, callback)

    def propose_async_result(
        self, command: bytes, on_result: Callable[[ProposeResult], None], *, batch_key: Any = None
    ) -> None:
        """``propose_async`` whose callback gets the typed ``ProposeResult`` (as ``propose``
        returns it), on the Raft thread; for callers that wait for many proposals at once."""
        self.propose_async(command, lambda result, error: on_result(self._result_of(result, error)),
                           batch_key=batch_key)

    @staticmethod
    def _result_of(result, error) -> ProposeResult:
        """Turn a pysyncobj callback's (result, fail reason) into a ProposeResult."""
        if error == FAIL_REASON.SUCCESS:
            index, value = result
            # A retry answered from the dedup table reports where its op_id first applied.
            index = getattr(value, "first_applied_index", 0) or index
            refused = getattr(value, "reason", None) is not None
            outcome = ProposeOutcome.REFUSED if refused else ProposeOutcome.APPLIED
            return ProposeResult(outcome, value=value, index=index)
        return ProposeResult.failed(*failure_of(error))

    # -- membership (RAFT.md "Membership changes") -----------------------------

    def members(self) -> dict:
        """The configuration in effect and what this member knows of each member (status)."""
        return self._syncobj.membership_status()

    def add_member(self, member_id: str, address: str, timeout_s: float) -> MemberChangeResult:
        """Propose ``member_id`` at ``address`` as a learner; the leader promotes it to a voter
        once it has caught up. APPLIED once the CONFIG entry that adds it committed."""
        return self._member_change("add", member_id, address, timeout_s)

    def remove_member(self, member_id: str, timeout_s: float) -> MemberChangeResult:
        """Propose the configuration without ``member_id`` (one voter out, or the learner)."""
        return self._member_change("remove", member_id, None, timeout_s)

    def replace_member(self, member_id: str, address: str | None, timeout_s: float) -> MemberChangeResult:
        """Remove ``member_id``'s incarnation, then add a fresh learner under the same id at
        ``address`` (default: the same address): two changes, the second once the first
        committed. A retry after the first committed finds the id gone and only adds."""
        deadline = time.monotonic() + timeout_s
        listed = self.members()
        known = {m["member_id"]: m for m in listed["members"]}
        current = known.get(member_id)
        if address is None:
            if current is None:
                return MemberChangeResult.refused(
                    MemberRefusal.UNKNOWN_MEMBER, f"no member {member_id}: give the address to add it at"
                )
            address = current["address"]
        if current is not None:
            removed = self.remove_member(member_id, max(0.0, deadline - time.monotonic()))
            if removed.outcome is not ProposeOutcome.APPLIED:
                return removed
        return self.add_member(member_id, address, max(0.0, deadline - time.monotonic()))

    def _member_change(self, kind: str, member_id: str, address: str | None, timeout_s: float) -> MemberChangeResult:
        done = threading.Event()
        box: list = []

        def on_done(outcome):
            box.append(outcome)
            done.set()

        self._syncobj.request_member_change(kind, member_id, address, on_done)
        if not done.wait(max(0.0, timeout_s)):
            # Decided or appended, the entry may still commit: only members() can tell.
            return MemberChangeResult.failed(ProposeFailure.DEADLINE_EXCEEDED)
        outcome = box[0]
        if isinstance(outcome, MemberChangeResult):
            return outcome
        index, fail_reason = outcome
        if fail_reason == FAIL_REASON.SUCCESS:
            return MemberChangeResult(ProposeOutcome.APPLIED, index=index)
        return MemberChangeResult.failed(*failure_of(fail_reason))

    # -- observing -----------------------------------------------------------

    def read(self, fn: Callable[[Any], Any]):
        """Run ``fn(state_machine)`` under the apply lock (a local, possibly stale read)."""
        with self._replica.lock:
            return fn(self.state_machine)

    def read_index(self, fn: Callable[[Any], Any], timeout_s: float) -> tuple[ReadIndexOutcome | None, Any, int]:
        """A linearizable read without a log entry (read_index.py): on the leader, once a
        majority confirmed its leadership after this call began (or, at once, while its read
        lease holds: read_lease.py) and this member applied the commit index of that moment,
        ``fn(state_machine)`` under the apply lock.

        Returns (CONFIRMED, fn's value, index read at), or (another outcome, None, 0): then
        nothing was read and the caller goes through the log; (None, None, 0): ``timeout_s``
        passed first (nothing was read; a read changes nothing, so its outcome is no mystery).
        """
        lease_index = self._syncobj.lease_read_index()
        if lease_index is not None:
            # The lease held after the call began (read_lease.py): C without a round.
            replica = self._replica
            with replica.applied:
                if not replica.applied.wait_for(lambda: replica.last_applied_index >= lease_index,
                                                max(0.0, timeout_s)):
                    return None, None, 0
                return ReadIndexOutcome.CONFIRMED, fn(self.state_machine), replica.last_applied_index
        pending = self._syncobj.request_read_index()
        if not pending.done.wait(max(0.0, timeout_s)):
            return None, None, 0
        if pending.outcome is not ReadIndexOutcome.CONFIRMED:
            return pending.outcome, None, 0
        with self._replica.lock:
            # Applied >= C (the Raft thread checked): the state holds every write
            # acknowledged before the read arrived, and perhaps later ones.
            return pending.outcome, fn(self.state_machine), max(pending.index, self._replica.last_applied_index)

    def wait_applied(self, fn: Callable[[Any], Any], timeout_s: float) -> Any:
        """``fn(state_machine)`` under the apply lock, again after every entry applied here,
        until it returns something truthy or ``timeout_s`` passes; its last value. The lock
        is not held while waiting, so apply never waits for a reader."""
        with self._replica.applied:
            return self._replica.applied.wait_for(lambda: fn(self.state_machine), max(0.0, timeout_s))

    def watch_applied(self, on_applied: Callable[[int, Any], None], on_loaded: Callable[[int], None]) -> int:
        """Have ``on_applied(index, outcome)`` called after every entry applied here (in log
        order, under the apply lock; ``outcome`` is a list for a shared entry) and
        ``on_loaded(index)`` after a snapshot replaced the state: Watch's feed. Both must be
        quick and never block. Returns the last index applied before the first call."""
        return self._replica.watch_applied(on_applied, on_loaded)

    def wake_waiters(self) -> None:
        """Make every ``wait_applied`` check its ``fn`` again now, with no entry applied: for
        a waiter whose ``fn`` also reads something outside the state (its RPC was cancelled)."""
        with self._replica.applied:
            self._replica.applied.notify_all()

    def digest(self) -> tuple[int, str]:
        with self._replica.lock:
            return self._replica.last_applied_index, self.state_machine.digest()

    def replace_peer_secrets(self, secrets) -> None:
        """Send under ``secrets[0]`` and accept any of ``secrets`` from every connection's next
        frame on (peer_keys.PeerKeys.replace). ValueError, and nothing changes, for a set
        PeerKeys refuses or a member started without a secret: its connections carry no
        encryption to switch (pysyncobj decides that per connection when it makes one)."""
        keys = self._syncobj.peer_keys
        if keys is None:
            raise ValueError("this member started without a peer secret; a restart adds one")
        keys.replace(secrets)

    def status(self) -> dict:
        so = self._syncobj
        for _ in range(10):
            try:
                raw = so.getStatus()  # races with the tick thread (syncobj.py:819-849)
                break
            except RuntimeError:
                continue
        else:
            raw = {}
        leader = raw.get("leader")
        return {
            "self": self.config.self_address,
            "leader": leader.address if leader is not None else None,
            "is_leader": so._isLeader(),
            "term": raw.get("raft_term", so.raftCurrentTerm),
            "commit_index": raw.get("commit_idx", so.raftCommitIndex),
            "last_applied": raw.get("last_applied", so.raftLastApplied),
            "has_quorum": raw.get("has_quorum", False),
            "log_len": raw.get("log_len", 0),
            "ready": self._caught_up(),
            "journal_syncs": getattr(self.journal, "sync_count", 0),
            "leader_changes": self.leader_log.changes,
            "shared_entries": so.shared_entries,
            "truncated_applied": so.truncated_applied,
            "refused_old_snapshots": so.refused_old_snapshots,
            "refused_peer_messages": so.refused_peer_messages,
            "refused_bindings": dict(so.refused_bindings),
            "peer_connections_replaced": so.peer_connections_replaced,
            # Our TCP transport counts them; a test's in-memory transport has no port to lose.
            "listen_losses": getattr(so._SyncObj__transport, "listen_losses", 0),
            "refused_entries": so.refused_entries,
            "read_index_rounds": so.read_index_rounds,
            **self._lease_status(),
            "votes_refused_leader_heard": so.votes_refused_leader_heard,
            "pre_votes_started": so.pre_votes_started,
            "pre_votes_won": so.pre_votes_won,
            "pre_votes_refused": so.pre_votes_refused,
            "term_notices_adopted": so.term_notices_adopted,
            "elections_without_pre_vote": so.elections_without_pre_vote,
            **self._snapshot_status(),
            **so.membership_status(),
        }

    def _lease_status(self) -> dict[str, Any]:
        lease = self._syncobj._lease
        if lease is None:
            return {}
        return {"lease_reads": lease.reads, "lease_read_fallbacks": lease.fallbacks,
                "lease_clock_steps_back": lease.clock_steps_back}

    def _snapshot_status(self) -> dict[str, Any]:
        writer = self._syncobj._snapshot_writer()
        if writer is None:
            return {}
        return {
            "snapshot_seconds": writer.last_duration_s,
            "snapshot_apply_paused_seconds": writer.last_capture_s,
            "snapshot_failures": writer.failures,
        }

    def _caught_up(self) -> bool:
        """True once this process applied everything up to a commit of the current term.

        pysyncobj's isReady() latches as soon as lastApplied equals the commit index
        a new leader announces (syncobj.py:694); after a full-cluster restart that
        index is a stale one from the leader's disk, so a node was "ready" with old
        state. Here the target is the leader's announced commit index (our own, on
        the leader), and it counts only if its entry carries the current term: then
        it covers everything ever committed. Latched per process.
        """
        if self._ready_latched:
            return True
        so = self._syncobj
        try:
            target = so.raftCommitIndex if so._isLeader() else so.leader_commit_seen
            term = so.raftCurrentTerm
            if target is not None and so.raftLastApplied >= target and so._local_term(target) == term:
                self._ready_latched = True
        except (IndexError, RuntimeError):  # the journal is changing under the tick thread
            return False
        return self._ready_latched

    def term_and_applied(self) -> tuple[int, int]:
        """(current Raft term, index of the last applied entry): cheap, for response headers."""
        return self._syncobj.raftCurrentTerm, self._replica.last_applied_index

    def is_leader(self) -> bool:
        return self._syncobj._isLeader()

    def leader_address(self) -> str | None:
        leader = self._syncobj._getLeader()
        return leader.address if leader is not None else None

    def listening(self) -> bool:
        """The Raft port is bound and open (the transport retries a bind that failed, and binds
        a port that closed under it again, every second)."""
        transport = self._syncobj._SyncObj__transport
        listening = getattr(transport, "listening", None)  # a test's in-memory transport: ready only
        return bool(listening() if listening is not None else transport.ready)

    def force_log_compaction(self) -> None:
        self._syncobj.forceLogCompaction()

    # -- lifecycle and simulation hooks ---------------------------------------

    def tick(self, wait_s: float = 0.0) -> None:
        """One step of the Raft loop (only with auto_tick=False: the simulation)."""
        self._syncobj.doTick(wait_s)

    @property
    def syncobj(self) -> SyncObj:
        return self._syncobj

    def close(self) -> None:
        so = self._syncobj
        if so.conf.autoTick:
            so.destroy_synchronous()
        else:
            so.destroy()
        if so._leader_sync is not None:
            so._leader_sync.stop()

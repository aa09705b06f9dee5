"""Membership changes through the log, one at a time, decided on the Raft thread.

Owns: ``MemberChanges``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that
takes change requests from any thread, decides them on the Raft thread as the leader (refused
while the last CONFIG entry is uncommitted, while a learner is catching up, or before this
leader committed an entry of its own term), appends their CONFIG entry, promotes a learner once
it has caught up, and keeps pysyncobj's node set, the transport's members and the peer log's
quorum following the configuration in effect. RAFT.md "Membership changes" says why.
Must never: append a CONFIG entry anywhere but on the leader's own Raft thread, have two
changes uncommitted at once, let a learner's acknowledgement or vote count (``MemberGate``
counts voters only), or remove the leader it runs on (it hands leadership over instead).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from coordinator.raft import membership
from coordinator.raft.interface import MemberChangeResult, MemberRefusal, ProposeFailure

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object

log = logging.getLogger(__name__)

# What ``request_member_change`` calls back with, on the Raft thread: a decided result (refused,
# or no leader here), or (index, pysyncobj fail code) once the appended entry's fate is known.
Done = Callable[[object], None]


class MemberChanges(_Host):
    """Mixed into HardenedSyncObj after MemberGate; ``_init_changes`` runs before SyncObj.__init__."""

    _packing: bool  # set by HardenedSyncObj: entries are being packed into one append

    def _init_changes(self, initial_peers) -> None:
        self._change_lock = threading.Lock()
        self._change_requests: list[tuple[str, str, str | None, Done]] = []
        self._initial_peers = frozenset(initial_peers)  # the config file's: until the log has a configuration
        self._followed_key: tuple[Any, ...] | None = None  # what the node set was last computed from
        self._removed_logged = False
        self.member_changes_appended = 0  # CONFIG entries this member appended as the leader

    # -- requests (any thread) ------------------------------------------------------

    def request_member_change(self, kind: str, member_id: str, address: str | None, done: Done) -> None:
        """``kind`` "add" (``member_id`` at ``address`` as a learner) or "remove"; ``done`` runs once."""
        if kind not in ("add", "remove"):
            raise ValueError(f"unknown membership change {kind!r}")
        with self._change_lock:
            self._change_requests.append((kind, member_id, address, done))
        self._wake_raft_thread()

    # -- deciding (the Raft thread, right before queued commands are appended) -------

    def decide_member_changes(self) -> None:
        with self._change_lock:
            requests, self._change_requests = self._change_requests, []
        appended = False
        for kind, member_id, address, done in requests:
            refused = self._why_no_change(appended)
            if refused is None:
                refused, new = self._plan(kind, member_id, address)
            if refused is not None:
                done(refused)
                continue
            self._append_config(new, done, f"{kind} {member_id}" + (f" at {address}" if address else ""))
            appended = True
        if not appended and self._isLeader():
            self._maybe_promote()

    def _why_no_change(self, appended_this_tick: bool) -> MemberChangeResult | None:
        if not self._isLeader():
            failure = ProposeFailure.NOT_LEADER if self._getLeader() is not None else ProposeFailure.NO_LEADER
            return MemberChangeResult.failed(failure)
        config = self.config()
        if config is None:
            return MemberChangeResult.refused(MemberRefusal.NO_CONFIGURATION, "the cluster has no configuration yet")
        pending = self._configs.current_index()
        if appended_this_tick or pending > self.raftCommitIndex:
            return MemberChangeResult.refused(
                MemberRefusal.CHANGE_IN_PROGRESS,
                f"the configuration at index {pending} is not committed yet; retry once it is",
            )
        if self._local_term(self.raftCommitIndex) != self.raftCurrentTerm:
            # Raft's rule for single-server changes: a new leader first commits an entry of its
            # own term, or a change of an earlier leader that it never saw could still commit.
            return MemberChangeResult.refused(
                MemberRefusal.CHANGE_IN_PROGRESS, "this leader has not committed an entry of its term yet; retry"
            )
        return None

    def _plan(self, kind: str, member_id: str, address: str | None):
        config = self.config()
        try:
            if kind == "add":
                assert address is not None  # request_member_change takes an add only with its address
                return None, membership.plan_add(config, member_id, address)
            new = membership.plan_remove(config, member_id)
        except membership.ChangeRefused as exc:
            return MemberChangeResult.refused(exc.refusal, str(exc)), None
        if config.by_id(member_id).address == self._self_address():
            # A leader that is not in its own configuration would still count itself (pysyncobj's
            # count starts at 1, syncobj.py:660): it hands leadership to a caught-up voter
            # first, and the caller retries at the new leader. Nothing was proposed.
            self.transferLeadership(callback=None)
            return MemberChangeResult.failed(
                ProposeFailure.NOT_LEADER, "this member is the leader: leadership handed over; retry at the new leader"
            ), None
        return None, new

    def _append_config(self, config: membership.Configuration, done: Done | None, what: str) -> None:
        def on_fate(_result, fail_reason):
            # pysyncobj calls back as it applies the entry: at lastApplied + 1 (syncobj.py:715-724).
            if done is not None:
                done((self.raftLastApplied + 1, fail_reason))

        for member in config.members:
            if not member.voter and self._configs.current().by_id(member.member_id) is None:
                # A new learner's stamps start now: nothing an earlier process at that address
                # sent may promote it.
                self._peer_incarnation.pop(member.address, None)
                self._acked_index.pop(member.address, None)
        was_packing, self._packing = self._packing, True
        try:
            self._applyCommand(config.encode_entry(), on_fate)
        finally:
            self._packing = was_packing
        self.member_changes_appended += 1
        log.warning(
            "raft: membership change (%s): appending configuration %s",
            what,
            ", ".join(
                f"{m.member_id}={m.address}#{m.incarnation}{'' if m.voter else ' (learner)'}" for m in config.members
            ),
        )

    def _maybe_promote(self) -> None:
        """A learner whose acknowledgement reached the commit index (so it holds the CONFIG entry
        that added it, and everything committed) becomes a voter bound to its incarnation."""
        config = self._configs.current()
        if config is None or all(m.voter for m in config.members):
            return
        if self._why_no_change(False) is not None:
            return
        learner = next(m for m in config.members if not m.voter)
        incarnation = self._peer_incarnation.get(learner.address)
        acked = self._acked_index.get(learner.address, 0)
        if incarnation is None or acked < self.raftCommitIndex:
            return
        new = membership.plan_promote(config, learner.member_id, incarnation)
        self._append_config(
            new,
            None,
            f"promote {learner.member_id}: caught up to {acked} of {self.raftCommitIndex}, incarnation {incarnation}",
        )

    # -- following the configuration (every tick) -----------------------------------

    def follow_configuration(self) -> None:
        """pysyncobj's node set (whom the leader replicates to, whom elections count, whom the
        transport admits and dials) = the configuration's members, learners included, plus the
        members of the last committed configuration until the next one commits (so a removed
        member receives the entry that removes it). No configuration yet: the config file's peers."""
        if not self._loaded():
            return
        config = self.config()
        committed = self._configs.at(self.raftCommitIndex) if config is not None else None
        key = (self._configs.current_index(), config, committed)  # a few members: cheap to compare
        if key == self._followed_key:
            return
        self._followed_key = key
        me = self._self_address()
        if config is None:
            wanted = set(self._initial_peers)
        else:
            wanted = {m.address for m in config.members}
            if committed is not None:
                wanted |= {m.address for m in committed.members}
            wanted.discard(me)
            self._log_if_removed(config)
        current = {node.address: node for node in self._SyncObj__otherNodes}
        for address in sorted(current.keys() - wanted):
            self._drop_node(current[address])
        for address in sorted(wanted - current.keys()):
            self._add_node(address)
        peer_log = getattr(self._SyncObj__transport, "peer_log", None)
        if peer_log is not None and config is not None:
            voters = frozenset(m.address for m in config.members if m.voter and m.address != me)
            member = config.by_address(me)
            peer_log.follow(voters, member is not None and member.voter)

    def _add_node(self, address: str) -> None:
        self._peer_incarnation.pop(address, None)
        self._acked_index.pop(address, None)
        # pysyncobj's own add (syncobj.py:1390-1402): node set, next/match index, transport.
        self._SyncObj__doChangeCluster(("add", address))
        log.info("raft: %s is a member now: replicating to it and admitting it", address)

    def _drop_node(self, node) -> None:
        self._SyncObj__doChangeCluster(("rem", node.address))
        self._true_match.pop(node, None)
        self._SyncObj__lastResponseTime.pop(node, None)
        self._peer_incarnation.pop(node.address, None)
        self._acked_index.pop(node.address, None)
        log.warning("raft: %s is no longer a member: no longer dialled or admitted", node.address)

    def _log_if_removed(self, config: membership.Configuration) -> None:
        listed = config.by_address(self._self_address()) is not None
        if listed:
            self._removed_logged = False
        elif not self._removed_logged:
            self._removed_logged = True
            log.warning(
                "raft: member %s (%s) is not in the configuration at index %d: it was removed; it neither votes "
                "nor counts (`fencingctl admin member add` brings it back)",
                self._identity.member_id, self._self_address(), self._configs.current_index(),
            )

"""Who may vote and who counts toward a commit: member identity on top of pysyncobj's Raft.

Owns: ``MemberGate``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that
stamps votes and append acknowledgements with this member's cluster id and incarnation,
refuses votes from and for incarnations the configuration does not name, holds back an
unconfigured candidate until every initial member voted for it (unanimous bootstrap), writes
the first CONFIG entry of a bootstrapped cluster, shows pysyncobj's commit count only the
acknowledgements of counted incarnations, keeps a member the configuration does not name from
standing for election, and reports membership for status. RAFT.md "Member identity" says why.
Must never: count a vote or an acknowledgement it cannot tie to the configuration's
incarnation for that address, or bootstrap a cluster without every initial member's vote.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pysyncobj.syncobj as _ps

from coordinator.raft import identity as member_identity
from coordinator.raft import limits as raft_limits
from coordinator.raft.fatal import EXIT_APPLY_FAILED, exit_code_for
from coordinator.raft.membership import ConfigLog, Configuration, Member
from coordinator.raft.transport import peer_warnings

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object

log = logging.getLogger(__name__)

# Messages that carry their sender's cluster id and incarnation (wire.py _SENDER).
# Appends carry the cluster id too, so a leader of another cluster (members of two clusters
# pointed at each other, with the same secret) cannot overwrite this member's log.
STAMPED_TYPES = frozenset({"request_vote", "response_vote", "next_node_idx", "append_entries",
                           "pre_vote", "pre_vote_response"})


def stamping_transport(transport_class, gate: MemberGate):
    """``transport_class`` whose sends add the sender fields to votes and acknowledgements."""

    class Stamped(transport_class):
        def send(self, node, message):
            if type(message) is dict and message.get("type") in STAMPED_TYPES:
                message = {**message, **gate.outgoing_fields(message)}
            return super().send(node, message)

    Stamped.__name__ = f"Stamped{transport_class.__name__}"
    return Stamped


class MemberGate(_Host):
    """Mixed into HardenedSyncObj; ``_init_gate`` runs before SyncObj.__init__."""

    def _init_gate(self, identity, data_dir: str, bootstrap: bool, member_ids: dict[str, str]) -> None:
        self._identity = identity
        self._identity_dir = data_dir
        self._bootstrap = bootstrap
        self._member_ids = member_ids  # initial address -> member id
        self._configs = ConfigLog()
        self._peer_incarnation: dict[str, int] = {}  # address -> incarnation it last sent
        self._acked_index: dict[str, int] = {}  # address -> highest index it acknowledged
        self._bootstrap_votes: dict[str, int] = {}  # address -> incarnation, this term
        self._bootstrap_term = -1
        # A cluster id a peer's message carried while this member had no configuration: the
        # peers are configured, so no unanimous bootstrap can include this member any more.
        self._peer_cluster: str | None = None
        self._not_member_logged_at = 0.0
        self.refused_votes = 0  # votes asked or granted by incarnations the configuration does not name
        self.refused_cluster_ids = 0  # votes or acks from members of another cluster
        self.uncounted_acks = 0  # leader ticks that hid an uncounted follower's acknowledgement

    # -- the configuration --------------------------------------------------------

    def config(self) -> Configuration | None:
        """The configuration in effect (the last CONFIG entry the log or snapshot holds)."""
        self._configs.sync(self._SyncObj__raftLog)
        config = self._configs.current()
        # Recorded once committed only: a bootstrap CONFIG appended but never committed (its
        # leader lost power before a majority held it) can be cut, and the next bootstrap
        # writes another cluster id (found by the simulation, seed 25902 crashy).
        if (config is not None and self._identity.cluster_id != config.cluster_id
                and self._configs.current_index() <= self._SyncObj__raftCommitIndex):
            try:
                self._identity = member_identity.with_cluster_id(self._identity_dir, self._identity, config.cluster_id)
            except (member_identity.IdentityError, OSError) as exc:
                # A disk that refused the write (OSError): EXIT_DISK_FAILED, as every durable write.
                self._on_fatal(f"cannot record the cluster id: {exc}", exit_code_for(exc))
        return config

    def _loaded(self) -> bool:
        # Until the first ready tick loads the snapshot, the configuration below the journal
        # head is unknown: decide nothing.
        return not getattr(self, "_SyncObj__needLoadDumpFile", True)

    def config_plain_at(self, index: int):
        """The configuration a snapshot at ``index`` records (the snapshot writer asks)."""
        self.config()
        config = self._configs.at(index)
        if config is None and self._identity.cluster_id is not None:
            # It learned a configuration (its identity records the cluster id), and a snapshot
            # covers committed entries only, which held one: writing None would make this
            # member forget its cluster at the next start. Stop instead. (Not checked in
            # config(): a member that lost power may have lost an unsynced CONFIG entry it had
            # appended, never acknowledged, and must simply catch up from the leader.)
            self._on_fatal(
                f"member {self._identity.member_id} of cluster {self._identity.cluster_id} has lost its"
                " cluster configuration (its log and snapshot hold none); stopping rather than"
                " writing a snapshot without one",
                EXIT_APPLY_FAILED,
            )
            raise RuntimeError("cluster configuration lost")
        return config.to_plain() if config is not None else None

    def snapshot_config_loaded(self, index: int, term: int, plain) -> None:
        self._configs.set_snapshot(index, term, Configuration.from_plain(plain) if plain is not None else None)

    def sender_fields(self) -> dict:
        config = self._configs.current()
        return {"cluster": config.cluster_id if config else None, "incarnation": self._identity.incarnation}

    def outgoing_fields(self, message: dict) -> dict:
        """The fields the stamping transport adds to ``message`` (a STAMPED_TYPES one)."""
        return self.sender_fields()

    def binding_identity(self) -> tuple[str, int]:
        """This member's id and incarnation, as its Raft connections' handshakes name it."""
        return self._identity.member_id, self._identity.incarnation

    def configured_member(self, address: str) -> Member | None:
        """The member the configuration in effect names at ``address`` (None without one)."""
        config = self.config()
        return config.by_address(address) if config is not None else None

    def _self_address(self) -> str:
        return self._SyncObj__selfNode.address

    def is_voter(self) -> bool:
        """This member may stand for election and grant votes that count."""
        if not self._loaded():
            return False
        config = self.config()
        if config is None:
            # Not once a peer showed a cluster of its own: every campaign would be refused (the
            # configured peers count votes of the configuration's incarnations only), and each
            # would raise this member's term past the cluster's, so the cluster's leader could
            # never reach it with the configuration that says what an operator must do (a
            # wiped member whose term ran ahead kept campaigning for good, test_member_identity).
            return self._bootstrap and self._peer_cluster is None
        return config.counts(self._self_address(), self._identity.incarnation)

    # -- votes ----------------------------------------------------------------------

    def admit_member_message(self, node, message: dict) -> bool:
        """False: drop ``message`` before pysyncobj sees it (no term change, no vote, no count)."""
        kind = message["type"]
        cluster, incarnation = message.get("cluster"), message.get("incarnation")
        address = node.address
        config = self.config()
        ours = config.cluster_id if config is not None else None
        if cluster is not None and ours is None and self._peer_cluster is None:
            self._peer_cluster = cluster
            log.warning("raft: peer %s belongs to cluster %s; this member has no configuration: it stands for"
                        " no election and waits for that cluster's leader", address, cluster)
        if cluster is not None and ours is not None and cluster != ours:
            self.refused_cluster_ids += 1
            peer_warnings.warning(
                "raft: refused a %s from %s: it belongs to cluster %s, this member to cluster %s "
                "(two clusters' members point at each other?)", kind, address, cluster, ours,
            )
            return False
        if kind == "append_entries":
            return True  # only its cluster id is checked here; the leader's term rules the rest
        if incarnation is not None:
            self._peer_incarnation[address] = incarnation
        if kind in ("pre_vote", "pre_vote_response"):
            return True  # pre_vote.py checks the incarnation against the configuration itself
        if kind == "next_node_idx":
            if message.get("success"):
                self._acked_index[address] = max(self._acked_index.get(address, 0), message["next_node_idx"] - 1)
            return True  # counted or not in show_counted_acks
        if kind == "request_vote":
            why = self._why_not_grant(config, address, cluster, incarnation)
        else:
            why = self._why_not_count_vote(config, address, cluster, incarnation, message["term"])
        if why is None:
            return True
        if not why:
            return False  # a bootstrap vote held back until every initial member voted
        self.refused_votes += 1
        peer_warnings.warning("raft: refused a %s from %s (incarnation %s): %s", kind, address, incarnation, why)
        return False

    def _why_not_grant(self, config, address, cluster, incarnation) -> str | None:
        if not self._loaded():
            return "this member has not loaded its snapshot yet"
        if config is None:
            if cluster is not None:
                # A configured candidate counts this vote only if the configuration names this
                # incarnation (a member that has not received the CONFIG entry yet).
                return None
            if not self._bootstrap:
                return "neither has a configuration, and this member may not bootstrap one"
            return None  # unanimous bootstrap: the candidate needs every initial member
        if not config.counts(self._self_address(), self._identity.incarnation):
            return f"this member's incarnation {self._identity.incarnation} is not a voter of the configuration"
        if not config.counts(address, incarnation):
            return "the configuration names another incarnation (or no voter) at that address"
        return None

    def _why_not_count_vote(self, config, address, cluster, incarnation, term) -> str | None:
        """None: count it; "": hold it (bootstrap); else why it is refused."""
        if self._SyncObj__raftState != _ps._RAFT_STATE.CANDIDATE or term != self.raftCurrentTerm:
            return None  # pysyncobj ignores it
        if config is not None:
            if not config.counts(address, incarnation):
                return "the configuration names another incarnation (or no voter) at that address"
            return None
        if cluster is not None:
            return "this candidate has no configuration and the voter has one: it must catch up, not bootstrap"
        if self._bootstrap_term != term:
            self._bootstrap_votes, self._bootstrap_term = {}, term
        self._bootstrap_votes[address] = incarnation
        others = {n.address for n in self._SyncObj__otherNodes}
        if not others <= set(self._bootstrap_votes):
            # Held back, not refused: bootstrap needs every initial member (RAFT.md).
            return ""
        # The last vote is handed to pysyncobj: make its count see everyone.
        self._SyncObj__votesCount = len(others)
        return None

    def _SyncObj__onBecomeLeader(self):
        _ps.SyncObj._SyncObj__onBecomeLeader(self)
        if self.config() is not None:
            return
        # Won by every initial member's vote: the first entry after the NO_OP is the
        # configuration with the incarnation each of them voted with.
        members = [Member(self._member_ids[self._self_address()], self._self_address(), self._identity.incarnation)]
        for node in self._SyncObj__otherNodes:
            members.append(Member(self._member_ids[node.address], node.address, self._bootstrap_votes[node.address]))
        config = Configuration(member_identity.new_cluster_id(), tuple(sorted(members, key=lambda m: m.member_id)))
        index = self._SyncObj__getCurrentLogIndex() + 1
        self._SyncObj__raftLog.add(config.encode_entry(), index, self.raftCurrentTerm)
        log.warning(
            "raft: bootstrapped cluster %s at index %d with %s",
            config.cluster_id, index, ", ".join(f"{m.member_id}={m.address}#{m.incarnation}" for m in config.members),
        )

    # -- commit counting and elections ---------------------------------------------

    def show_counted_acks(self) -> None:
        """Before pysyncobj's commit count and leader fallback: an acknowledgement or a response
        from an incarnation the configuration does not count is shown as none at all."""
        if not self._isLeader():
            return
        config = self.config()
        match = self._SyncObj__raftMatchIndex
        last_response = self._SyncObj__lastResponseTime
        for node in self._SyncObj__otherNodes:
            if config is None or not config.counts(node.address, self._peer_incarnation.get(node.address)):
                if match.get(node, 0):
                    self.uncounted_acks += 1
                match[node] = 0
                last_response[node] = 0
                # _cap_commit_votes keeps each follower's highest ack of the term aside: an
                # earlier incarnation's must not come back through it.
                self._true_match.pop(node, None)

    def hold_election_if_not_voter(self) -> None:
        """A member the configuration does not name as a voter never stands for election; it
        says every few seconds what an operator must do."""
        # Not loaded yet: pysyncobj loads the snapshot in this very tick, before its election check.
        if not self._loaded() or self.is_voter():
            return
        self._SyncObj__raftElectionDeadline = _ps.monotonicTime() + self._SyncObj__generateRaftTimeout()
        now = time.monotonic()
        if now - self._not_member_logged_at < raft_limits.RAFT_NOT_A_MEMBER_LOG_INTERVAL_MS / 1000:
            return
        self._not_member_logged_at = now
        config = self._configs.current()
        if config is None:
            why = ("initial_cluster_state = 'existing'" if self._peer_cluster is None
                   else f"its peers already belong to cluster {self._peer_cluster}")
            log.warning(
                "raft: member %s (incarnation %d) has no cluster configuration and may not bootstrap one"
                " (%s): waiting to be added (`fencingctl admin member add`) or to hear the cluster's leader",
                self._identity.member_id, self._identity.incarnation, why,
            )
            return
        listed = config.by_address(self._self_address())
        log.warning(
            "raft: my incarnation %d is not in the configuration (it names %s at %s); ask an operator to run "
            "`fencingctl admin member replace %s --address %s`",
            self._identity.incarnation,
            f"incarnation {listed.incarnation}" if listed else "no member", self._self_address(),
            listed.member_id if listed else self._identity.member_id, self._self_address(),
        )

    # -- status ---------------------------------------------------------------------

    def membership_status(self) -> dict:
        config = self._configs.current()
        leader = self._getLeader()
        members = []
        if config is not None:
            for m in config.members:
                is_self = m.address == self._self_address()
                incarnation = self._identity.incarnation if is_self else self._peer_incarnation.get(m.address)
                if leader is not None and leader.address == m.address:
                    role = "leader"
                else:
                    role = "follower" if m.voter else "learner"
                members.append({
                    "member_id": m.member_id,
                    "address": m.address,
                    "incarnation": m.incarnation,
                    "seen_incarnation": incarnation,
                    "voter": m.voter,
                    "role": role,
                    "match_index": (self.raftLastApplied if is_self else self._acked_index.get(m.address, 0)),
                    "counts": m.voter and incarnation == m.incarnation,
                })
        return {
            "cluster_id": config.cluster_id if config is not None else None,
            "member_id": self._identity.member_id,
            "incarnation": self._identity.incarnation,
            # Read on another thread than the Raft thread's: no log scan here.
            "voter": (
                config.counts(self._self_address(), self._identity.incarnation)
                if config is not None
                else self._bootstrap
            ),
            "members": members,
            "refused_votes": self.refused_votes,
            "refused_cluster_ids": self.refused_cluster_ids,
        }

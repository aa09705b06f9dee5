"""The log lines an operator reads to see who this member reaches: connects, losses, quorum.

Owns: ``PeerLog``, which turns the transport's connect and disconnect events into one line per
transition: "peer X connected (address)", "peer X lost", and, as the connected peers cross a
majority, "quorum reached" / "quorum lost" / "quorum regained" with this member's role.
Before, a member cut off from the others logged nothing at all. RAFT.md "Addresses that move".
Must never: log per connection attempt (a peer that is down is retried every
``connection_retry_s``: a failed attempt was never connected, so it logs nothing), or import
pysyncobj.
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


class PeerLog:
    """Connected peers of one member and whether they make a quorum with it, as log lines.

    ``role()`` describes this member for the quorum lines ("leader, term 7"); it is called only
    on a quorum transition.
    """

    def __init__(self, peer_count: int, role: Callable[[], str], logger: logging.Logger = log):
        self._peer_count = peer_count
        # Until ``follow`` is called (no configuration yet): every peer votes, this member too.
        self._voter_peers: frozenset[str] | None = None
        self._self_votes = True
        self._role = role
        self._log = logger
        self._connected: dict[str, str] = {}  # peer -> where it was reached
        self._quorum: bool | None = None  # None: never had one since start

    @property
    def connected(self) -> frozenset[str]:
        return frozenset(self._connected)

    def on_connected(self, peer: str, where: str) -> None:
        again = " again" if peer in self._connected else ""
        self._connected[peer] = where
        self._log.info("raft: peer %s connected%s (%s)", peer, again, where)
        self._check_quorum()

    def on_disconnected(self, peer: str) -> None:
        where = self._connected.pop(peer, None)
        if where is None:
            return  # a connection attempt that failed: it was never up
        self._log.warning("raft: peer %s lost (was %s)", peer, where)
        self._check_quorum()

    def follow(self, voter_peers: frozenset[str], self_votes: bool) -> None:
        """The configuration changed: a quorum is now a majority of these voters (learners and
        removed members are connected to, but never make one)."""
        if (voter_peers, self_votes) == (self._voter_peers, self._self_votes):
            return
        self._voter_peers, self._self_votes = frozenset(voter_peers), self_votes
        self._check_quorum()

    def _check_quorum(self) -> None:
        if self._voter_peers is None:
            voters, reached = self._peer_count + 1, len(self._connected) + 1
            connected = f"{len(self._connected)} of {self._peer_count} peers connected"
        else:
            voters = len(self._voter_peers) + self._self_votes
            reached = len(self._voter_peers & self._connected.keys()) + self._self_votes
            connected = f"{reached - self._self_votes} of {len(self._voter_peers)} voting peers connected"
        has = voters > 0 and reached * 2 > voters
        if has == bool(self._quorum) and self._quorum is not None:
            return
        if not has and self._quorum is None:
            return  # still starting: nothing was lost
        if has:
            word = "reached" if self._quorum is None else "regained"
            self._log.info("raft: quorum %s: %s (%s)", word, connected, self._role())
        else:
            self._log.warning("raft: quorum lost: %s (%s)", connected, self._role())
        self._quorum = has

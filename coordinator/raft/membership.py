"""The replicated cluster configuration: which members exist, at which address, as which incarnation.

Owns: ``Member`` and ``Configuration``, their log entry (a CONFIG entry, ``wire.CONFIG_ENTRY_HEAD``
then msgpack) and snapshot form, the initial member ids, and ``ConfigLog``, which follows the
configuration as the log holds it: Raft's single-server change rule takes a configuration
effect when its entry is appended (not committed), and undoes it when the entry is truncated.
It also plans membership changes (``plan_add``, ``plan_remove``, ``plan_promote``): one
voter in or out per change, a new member entering as a learner whose incarnation is unbound
(0) until the leader promotes it (RAFT.md "Membership changes").
Must never: import pysyncobj, do I/O, or trust a configuration the log does not hold (a
member's config file names the initial members only; later ones come from the log).
"""

from __future__ import annotations

import dataclasses
import logging

import msgpack

from coordinator.raft import limits as raft_limits
from coordinator.raft import wire as raft_wire
from coordinator.raft.interface import MemberRefusal

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Member:
    member_id: str
    address: str
    incarnation: int
    voter: bool = True


@dataclasses.dataclass(frozen=True)
class Configuration:
    cluster_id: str
    members: tuple[Member, ...]

    def __post_init__(self):
        _check(self)

    def by_address(self, address: str) -> Member | None:
        for member in self.members:
            if member.address == address:
                return member
        return None

    def by_id(self, member_id: str) -> Member | None:
        for member in self.members:
            if member.member_id == member_id:
                return member
        return None

    def counts(self, address: str, incarnation: int | None) -> bool:
        """A vote or an acknowledgement from ``address`` as ``incarnation`` counts here."""
        member = self.by_address(address)
        return member is not None and member.voter and incarnation is not None and member.incarnation == incarnation

    def replacing(self, *, remove: str | None = None, add: Member | None = None) -> Configuration:
        members = [m for m in self.members if m.member_id != remove]
        if add is not None:
            members.append(add)
        return Configuration(self.cluster_id, tuple(members))

    def to_plain(self) -> list:
        return [self.cluster_id, [[m.member_id, m.address, m.incarnation, m.voter] for m in self.members]]

    @classmethod
    def from_plain(cls, plain) -> Configuration:
        try:
            cluster_id, members = plain
            return cls(cluster_id, tuple(Member(i, a, n, v) for i, a, n, v in members))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a configuration: {exc}") from None

    def encode_entry(self) -> bytes:
        return raft_wire.CONFIG_ENTRY_HEAD + msgpack.packb(self.to_plain(), use_bin_type=True)


def _check(config: Configuration) -> None:
    if type(config.cluster_id) is not str or not 0 < len(config.cluster_id) <= raft_limits.RAFT_CLUSTER_ID_CHARS_MAX:
        raise ValueError("cluster id: 1 to RAFT_CLUSTER_ID_CHARS_MAX characters")
    if not 0 < len(config.members) <= raft_limits.RAFT_MEMBERS_MAX:
        raise ValueError(f"{len(config.members)} members; 1 to RAFT_MEMBERS_MAX are allowed")
    for m in config.members:
        if type(m.member_id) is not str or not 0 < len(m.member_id) <= raft_limits.RAFT_MEMBER_ID_CHARS_MAX:
            raise ValueError("member id: 1 to RAFT_MEMBER_ID_CHARS_MAX characters")
        if type(m.address) is not str or not 0 < len(m.address) <= raft_limits.RAFT_ADDRESS_CHARS_MAX:
            raise ValueError("member address: 1 to RAFT_ADDRESS_CHARS_MAX characters")
        if type(m.voter) is not bool:
            raise ValueError("voter: a bool")
        # 0: a learner whose incarnation is not bound yet (it is when it is promoted); a voter
        # always has one, or no vote or acknowledgement could ever count for it.
        if (
            type(m.incarnation) is not int
            or not (0 if not m.voter else 1) <= m.incarnation < raft_limits.RAFT_WIRE_INT_END
        ):
            raise ValueError("incarnation: an integer in [1, 2^63) (0: a learner not bound yet)")
    if len({m.member_id for m in config.members}) != len(config.members):
        raise ValueError("two members with one id")
    if len({m.address for m in config.members}) != len(config.members):
        raise ValueError("two members at one address")


def decode_entry(entry: bytes) -> Configuration:
    """The configuration a CONFIG entry carries; ValueError for anything else."""
    if entry[:2] != raft_wire.CONFIG_ENTRY_HEAD:
        raise ValueError("not a CONFIG entry")
    try:
        plain = msgpack.unpackb(entry[2:], raw=False, max_map_len=0, max_ext_len=0)
    # msgpack documents that "other exceptions can be raised during unpacking": any type.
    except Exception as exc:  # noqa: BLE001 - not a configuration
        raise ValueError(f"a CONFIG entry that is not msgpack: {exc}") from None
    return Configuration.from_plain(plain)


class ChangeRefused(ValueError):
    """A membership change that may not be proposed; nothing was changed."""

    def __init__(self, refusal: MemberRefusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


def _learner(config: Configuration) -> Member | None:
    return next((m for m in config.members if not m.voter), None)


def plan_add(config: Configuration, member_id: str, address: str) -> Configuration:
    """``config`` with a new learner (incarnation unbound): it receives the log but never votes or
    counts until ``plan_promote``. One learner at a time, so at most one voter is ever added
    before the previous one counts."""
    learner = _learner(config)
    if learner is not None:
        raise ChangeRefused(
            MemberRefusal.CHANGE_IN_PROGRESS,
            f"member {learner.member_id} is still catching up as a learner; wait for its promotion or remove it",
        )
    if config.by_id(member_id) is not None:
        raise ChangeRefused(MemberRefusal.MEMBER_EXISTS, f"member {member_id} is in the configuration already")
    taken = config.by_address(address)
    if taken is not None:
        raise ChangeRefused(MemberRefusal.MEMBER_EXISTS, f"address {address} belongs to member {taken.member_id}")
    try:
        return config.replacing(add=Member(member_id, address, 0, voter=False))
    except ValueError as exc:
        raise ChangeRefused(MemberRefusal.INVALID, str(exc)) from None


def plan_remove(config: Configuration, member_id: str) -> Configuration:
    """``config`` without ``member_id``: one voter out (or the learner, which aborts its add)."""
    member = config.by_id(member_id)
    if member is None:
        raise ChangeRefused(MemberRefusal.UNKNOWN_MEMBER, f"no member {member_id} in the configuration")
    learner = _learner(config)
    if learner is not None and learner.member_id != member_id:
        raise ChangeRefused(
            MemberRefusal.CHANGE_IN_PROGRESS,
            f"member {learner.member_id} is still catching up as a learner; only it may be removed now",
        )
    if member.voter and sum(m.voter for m in config.members) <= 1:
        raise ChangeRefused(MemberRefusal.TOO_FEW_VOTERS, f"member {member_id} is the last voter")
    return config.replacing(remove=member_id)


def plan_promote(config: Configuration, member_id: str, incarnation: int) -> Configuration:
    """``config`` with learner ``member_id`` a voter, bound to the incarnation it acknowledged with."""
    member = config.by_id(member_id)
    if member is None or member.voter:
        raise ChangeRefused(MemberRefusal.UNKNOWN_MEMBER, f"no learner {member_id} in the configuration")
    promoted = dataclasses.replace(member, incarnation=incarnation, voter=True)
    members = tuple(promoted if m.member_id == member_id else m for m in config.members)
    try:
        return Configuration(config.cluster_id, members)
    except ValueError as exc:
        raise ChangeRefused(MemberRefusal.INVALID, str(exc)) from None


def initial_member_id(address: str, initial_addresses) -> str:
    """The id of an initial member: its position among the sorted initial addresses, so every
    member derives the same ids from the same list, whatever order its config file has."""
    return f"m{sorted(initial_addresses).index(address) + 1}"


class ConfigLog:
    """The configurations the log (and the snapshot below it) holds; the last one is in effect.

    ``sync(log)`` is called before every decision. It scans only entries appended since the last
    call; a truncation (the entry last scanned is gone or has another term) drops what the log
    no longer holds and rescans it. Entries below the log head are committed: only the last
    configuration among them is kept (it is also what a snapshot records).
    """

    def __init__(self) -> None:
        self._configs: list[tuple[int, Configuration]] = []
        self._scanned_to = 0
        self._scanned_term: int | None = None
        # The last loaded snapshot's index: everything up to it is committed, so no truncation
        # reaches it, and its configuration (no CONFIG entry in the log holds it) is kept.
        self._snapshot_index = 0
        self.refused = 0  # CONFIG entries that did not decode: skipped by every member alike

    def set_snapshot(self, index: int, term: int, config: Configuration | None) -> None:
        """A snapshot up to (index, term) was loaded: its configuration replaces everything."""
        self._configs = [(index, config)] if config is not None else []
        self._scanned_to, self._scanned_term = index, term
        self._snapshot_index = index

    def sync(self, raft_log) -> None:
        n = len(raft_log)
        if not n:
            return
        first, last = raft_log[0][1], raft_log[n - 1][1]
        scanned = self._scanned_to
        if scanned > last or (scanned >= first and raft_log[scanned - first][2] != self._scanned_term):
            # Keep what the log below its head and the snapshot hold: the log head is the
            # snapshot's previous entry, so the snapshot's configuration sits at an index the
            # log still holds, as an entry that is not a CONFIG entry; a rescan would not find it.
            kept = max(first - 1, self._snapshot_index)
            self._configs = [c for c in self._configs if c[0] <= kept]
            scanned = kept
        for pos in range(max(scanned + 1, first) - first, n):
            entry, index, _term = raft_log[pos]
            if entry[:2] != raft_wire.CONFIG_ENTRY_HEAD:
                continue
            try:
                self._configs.append((index, decode_entry(entry)))
            except ValueError as exc:
                self.refused += 1
                log.error("raft: skipped CONFIG entry %d: %s", index, exc)
        self._scanned_to, self._scanned_term = last, raft_log[n - 1][2]
        below_head = [c for c in self._configs if c[0] < first]
        if len(below_head) > 1:
            self._configs = below_head[-1:] + [c for c in self._configs if c[0] >= first]

    def current(self) -> Configuration | None:
        return self._configs[-1][1] if self._configs else None

    def current_index(self) -> int:
        return self._configs[-1][0] if self._configs else 0

    def at(self, index: int) -> Configuration | None:
        found = None
        for at, config in self._configs:
            if at > index:
                break
            found = config
        return found

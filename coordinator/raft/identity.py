"""This member's identity, kept in its data dir: cluster id, member id and incarnation.

Owns: the identity file (``IDENTITY_NAME``): created once per data dir with a fresh random
64-bit incarnation, written and fsynced (file and directory) before the member can send a
vote or an acknowledgement, and the cluster id recorded in it once the member learns one.
Must never: import pysyncobj, pick a new incarnation for a data dir that has one (the
incarnation is what tells a wiped member from its old self, DESIGN I1), or accept a file
it cannot read whole (a damaged identity stops the member: guessing could make it vote as
someone it is not).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets

from coordinator.raft.journal_file import fsync_directory

IDENTITY_NAME = "member.identity"
_FORMAT = 1
# Incarnations are drawn from [1, 2^63): they travel as wire ints (RAFT_WIRE_INT_END), and
# 0 never occurs, so it can mean "unknown" nowhere by accident.
_INCARNATION_END = 2**63
# The operating system's randomness; the Raft simulation (tests/sim) swaps in its seeded one
# so that a seed replays identically.
_rng = secrets.SystemRandom()


class IdentityError(RuntimeError):
    """The identity file exists but cannot be used (damaged, or another member's)."""


@dataclasses.dataclass(frozen=True)
class Identity:
    member_id: str
    incarnation: int
    cluster_id: str | None = None  # None until this member learns its cluster's configuration


def new_cluster_id() -> str:
    """A new cluster's id: 128 random bits in hex (written once, by its bootstrap leader)."""
    return f"{_rng.getrandbits(128):032x}"


def _path(data_dir: str) -> str:
    return os.path.join(data_dir, IDENTITY_NAME)


def load_or_create(data_dir: str, member_id: str) -> tuple[Identity, bool]:
    """This data dir's identity, creating (and fsyncing) a fresh one if it has none.

    Returns (identity, created). A file naming another member id is refused: a data dir
    moved to another member would otherwise vote twice under one incarnation.
    """
    path = _path(data_dir)
    identity = read(data_dir)
    if identity is None:
        identity = Identity(member_id=member_id, incarnation=_rng.randrange(1, _INCARNATION_END))
        write(data_dir, identity)
        return identity, True
    if identity.member_id != member_id:
        raise IdentityError(
            f"{path} belongs to member {identity.member_id!r}, but this member is configured as "
            f"{member_id!r}: give this member its own data dir"
        )
    return identity, False


def read(data_dir: str) -> Identity | None:
    """This data dir's identity, or None if it has none yet; creates nothing. Raises
    IdentityError for a damaged file, OSError if it cannot be read."""
    path = _path(data_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    return _parse(path, raw)


def _parse(path: str, raw: bytes) -> Identity:
    try:
        doc = json.loads(raw)
        if doc["format"] != _FORMAT:
            raise ValueError(f"format {doc['format']!r}, this version reads {_FORMAT}")
        identity = Identity(doc["member_id"], doc["incarnation"], doc["cluster_id"])
        if type(identity.member_id) is not str or not identity.member_id:
            raise ValueError("member_id is not a non-empty string")
        if type(identity.incarnation) is not int or not 0 < identity.incarnation < _INCARNATION_END:
            raise ValueError("incarnation is not an integer in [1, 2^63)")
        if identity.cluster_id is not None and type(identity.cluster_id) is not str:
            raise ValueError("cluster_id is neither null nor a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise IdentityError(f"{path} is damaged ({exc}); refusing to guess who this member is") from None
    return identity


def write(data_dir: str, identity: Identity) -> None:
    """Replace the identity file atomically: temp file, fsync, rename, fsync the directory."""
    path = _path(data_dir)
    tmp = path + ".tmp"
    body = json.dumps({"format": _FORMAT, **dataclasses.asdict(identity)}, sort_keys=True).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def with_cluster_id(data_dir: str, identity: Identity, cluster_id: str) -> Identity:
    """Record the cluster id this member learned (once); durable before it is relied on."""
    if identity.cluster_id == cluster_id:
        return identity
    if identity.cluster_id is not None:
        raise IdentityError(
            f"this member belongs to cluster {identity.cluster_id}, but its log names cluster {cluster_id}"
        )
    updated = dataclasses.replace(identity, cluster_id=cluster_id)
    write(data_dir, updated)
    return updated

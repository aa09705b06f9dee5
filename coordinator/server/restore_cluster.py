"""Disaster recovery: ``fencingd restore-cluster``, a new cluster's data dirs made offline from a backup.

Owns: turning a backup (what ``fencingctl admin snapshot --out FILE`` writes), the new
cluster's member list and an epoch margin into one data dir per member, each exactly what a
member of a cluster bootstrapped with those members and then restored from that backup would
hold after its next snapshot: ``member.identity`` (the member id, a fresh random incarnation,
the new cluster's id), ``raft.dump`` (the restored state and the configuration, every member a
voter) and ``raft.journal``/``raft.meta`` (the two entries at the snapshot's head, term 1).
The state comes from the state machine itself: a fresh ``FencingStateMachine`` applies the
TICK and the RESTORE_BEGIN, RESTORE_CHUNK..., RESTORE_COMMIT entries ``backups.restore``
proposes, with the epoch floor ``backup epoch + margin`` (DESIGN I11); every file is written by
the Raft layer's own writers (``identity``, ``snapshot_file``, ``DurableJournal``).
Must never: write anything before every check passed (a refusal is one line, exit 2, nothing
written), write into a data dir that holds anything, reuse an incarnation or a cluster id
(every run draws new ones: a data dir made twice is two different members, DESIGN I1), or
issue a token: the new cluster's first token is above ``backup epoch + margin``.

Why every member's dir comes from one run, never one run per machine: the configuration
names each member's incarnation, so the dirs must agree on all of them. Incarnations derived
from shared inputs (as etcd derives member ids) would make a second run for one member, after
the new cluster has moved on, rebuild that member as its old self with an old log: the wiped
member that comes back as itself, which RAFT.md "Member identity" exists to stop. Drawn at
random in one run they cannot repeat; the operator copies each dir to its machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import secrets
import sys
from typing import Any

from coordinator.core import limits, ops
from coordinator.core.outcomes import Rejected
from coordinator.core.results import Result
from coordinator.core.snapshot_format import parse_snapshot
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft import identity as member_identity
from coordinator.raft import snapshot_file
from coordinator.raft import wire as raft_wire
from coordinator.raft.journal import DurableJournal, fsync_directory
from coordinator.raft.membership import Configuration, Member, initial_member_id
from coordinator.server import backups
from coordinator.server.errors import ServiceError

# Exit codes: 0 the dirs are written; 2 refused, nothing written (a usage error, as argparse's).
EXIT_REFUSED = 2
# The restored log's term: the one a bootstrapped cluster's first leader holds. The new
# cluster's first election is for term 2, so no leader ever shares a term with these entries.
RESTORED_TERM = 1
# A backup larger than this is no backup of ours (limits.BACKUP_BYTES_MAX): refused before it
# is read whole.
BACKUP_FILE_BYTES_MAX = limits.BACKUP_BYTES_MAX
# Incarnations are wire ints in [1, 2^63), as identity.py draws them.
INCARNATION_END = 2**63


class Refused(Exception):
    """Why the dirs cannot be made; one line for the operator, nothing written."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything checked: what to write, and where."""

    backup: bytes
    backup_epoch: int
    backup_log_clock_ms: int
    epoch_floor: int
    members: tuple[tuple[str, str], ...]  # (member id, Raft address), in the order given
    data_dirs: dict[str, str]  # member id -> data dir


# -- checking the inputs -----------------------------------------------------------------


def parse_members(text: str) -> tuple[tuple[str, str], ...]:
    """``ID=RAFT_HOST:PORT,...`` (or bare addresses: ids m1, m2, ... by sorted address, as the
    config files derive them when they set no ``member_id``) as (id, address) pairs."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise Refused("--initial-cluster: no members (give ID=RAFT_HOST:PORT for each, comma-separated)")
    addresses = [item.split("=", 1)[-1] for item in items]
    members = []
    for item, address in zip(items, addresses, strict=True):
        member_id = item.split("=", 1)[0] if "=" in item else initial_member_id(address, addresses)
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise Refused(f"--initial-cluster: {item!r} is not ID=RAFT_HOST:PORT")
        if not member_id or not member_id.isprintable() or " " in member_id:
            raise Refused(f"--initial-cluster: {item!r} has no usable member id")
        members.append((member_id, address))
    if len(members) % 2 == 0:
        raise Refused(f"--initial-cluster: {len(members)} members; use an odd number, as fencingd serve requires")
    try:
        # The Raft layer's own rules: ids and addresses unique, lengths, the member count.
        Configuration("0" * 32, tuple(Member(i, a, 1) for i, a in members))
    except ValueError as exc:
        raise Refused(f"--initial-cluster: {exc}") from None
    return tuple(members)


def parse_data_dirs(values: list[str], members: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``--data-dir ID=PATH``, one per member, each absent or an empty directory."""
    dirs: dict[str, str] = {}
    for value in values:
        member_id, sep, path = value.partition("=")
        if not sep or not path:
            raise Refused(f"--data-dir: {value!r} is not ID=PATH")
        if member_id in dirs:
            raise Refused(f"--data-dir: member {member_id} is given twice")
        dirs[member_id] = os.path.abspath(path)
    ids = [member_id for member_id, _ in members]
    missing, unknown = [i for i in ids if i not in dirs], [i for i in dirs if i not in ids]
    if missing or unknown:
        raise Refused(
            f"--data-dir: one per member of --initial-cluster ({', '.join(ids)});"
            + (f" missing {', '.join(missing)}" if missing else "")
            + (f" not a member: {', '.join(unknown)}" if unknown else "")
        )
    if len(set(dirs.values())) != len(dirs):
        raise Refused("--data-dir: two members share a data dir")
    for member_id, path in dirs.items():
        if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise Refused(
                f"--data-dir: {path} (member {member_id}) exists and is not an empty directory;"
                " move the old data dir aside first (never into the new cluster)"
            )
    return dirs


def read_backup(path: str) -> tuple[bytes, int, int]:
    """(the backup, its epoch, its log clock), checked as a restore through the log checks it."""
    try:
        size = os.path.getsize(path)
        if size > BACKUP_FILE_BYTES_MAX:
            raise Refused(f"--backup: {path} is {size} bytes, more than a backup can be ({BACKUP_FILE_BYTES_MAX})")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise Refused(f"--backup: cannot read {path}: {exc.strerror or exc}") from None
    try:
        # The state machine's own check of a backup (what Admin.Restore runs before proposing).
        FencingStateMachine().check_backup(data)
        parts = parse_snapshot(data, None)
    except ValueError as exc:
        raise Refused(f"--backup: {path} fails verification: {exc}") from None
    return data, parts.epoch, parts.log_clock_ms


def make_plan(args: argparse.Namespace) -> Plan:
    """Every input checked, in the order an operator fixes them; Refused on the first problem."""
    margin = args.epoch_margin
    if margin < 0:
        raise Refused("--epoch-margin: must be 0 or more")
    if margin == 0 and not args.force:
        raise Refused(
            "--epoch-margin 0 would let a token the old cluster issued after the backup be issued again"
            " (DESIGN I11); give a margin above the tokens it could issue after the backup, or --force"
        )
    members = parse_members(args.initial_cluster)
    dirs = parse_data_dirs(args.data_dir or [], members)
    backup, epoch, log_clock_ms = read_backup(args.backup)
    # The restore fences at max(floor, epoch + 1): a floor of the epoch itself (margin 0, forced)
    # still fences above every token the backup holds.
    floor = max(1, epoch + margin)
    if floor >= limits.TOKEN_MAX:
        raise Refused(f"--epoch-margin: the backup's epoch {epoch} + {margin} leaves no token to issue"
                      f" (max {limits.TOKEN_MAX})")
    return Plan(backup, epoch, log_clock_ms, floor, members, dirs)


# -- the restored log and state ----------------------------------------------------------


def restored_entries(plan: Plan, config: Configuration) -> tuple[list[snapshot_file.Entry], FencingStateMachine]:
    """The log of a cluster bootstrapped with ``config`` whose first leader then restored the
    backup, each entry as the journal stores it, and the state machine that applied them."""
    entries: list[snapshot_file.Entry] = [
        (raft_wire.NO_OP_ENTRY, 1, 0),  # the Raft library's first entry, before any term
        (raft_wire.NO_OP_ENTRY, 2, RESTORED_TERM),  # the first leader's NO_OP
        (config.encode_entry(), 3, RESTORED_TERM),  # the bootstrap's CONFIG entry
    ]
    sm = FencingStateMachine()

    def run(command: ops.Body, *, stamp_ms: int = 0, **_limits: Any) -> tuple[Result, int]:
        index = len(entries) + 1
        encoded = ops.encode(command, stamp_ms)  # a body is checked as it is built (ops.py)
        outcome = sm.apply(encoded, index)
        if isinstance(outcome, Rejected):
            raise Refused(f"--backup: the restore was refused: {outcome.message}")
        entries.append((raft_wire.encode_entry(encoded), index, RESTORED_TERM))
        return outcome.result, index

    if plan.backup_log_clock_ms:
        # The log clock goes on from the backup's (DESIGN I11: it keeps going forward).
        run(ops.Tick(), stamp_ms=plan.backup_log_clock_ms)
    try:
        result, _index = backups.restore(run, sm.check_backup, plan.backup, plan.epoch_floor, 0.0)
    except ServiceError as exc:
        raise Refused(f"--backup: the restore was refused: {exc}") from None
    assert result.epoch == sm.epoch >= plan.epoch_floor > 0, (result, sm.epoch, plan.epoch_floor)
    return entries, sm


def new_configuration(plan: Plan) -> Configuration:
    """The new cluster: a new id, every member a voter with a fresh incarnation."""
    incarnations = {member_id: _fresh_incarnation() for member_id, _ in plan.members}
    members = tuple(Member(i, a, incarnations[i]) for i, a in plan.members)
    return Configuration(member_identity.new_cluster_id(), tuple(sorted(members, key=lambda m: m.member_id)))


def _fresh_incarnation() -> int:
    # As identity.load_or_create draws one for a new data dir: the OS's randomness, [1, 2^63).
    return secrets.SystemRandom().randrange(1, INCARNATION_END)


# -- writing one data dir ----------------------------------------------------------------


def write_member_dir(path: str, member: Member, config: Configuration,
                     entries: list[snapshot_file.Entry], state: bytes) -> None:
    """One member's data dir, in the order that leaves a usable member or an obviously unfinished
    dir: the journal and term, then the snapshot, then the identity (without it a started
    member draws one of its own, is not in the configuration, and never votes)."""
    os.makedirs(path, exist_ok=True)
    journal = DurableJournal(path)
    try:
        for entry in entries:
            journal.add(*entry)
        journal.setCurrentTerm(RESTORED_TERM, None)  # syncs the entries first
        dump = os.path.join(path, snapshot_file.DUMP_NAME)
        last, prev = entries[-1], entries[-2]
        # As the snapshot writer does: the file, fsynced, renamed into place, the directory fsynced.
        snapshot_file.write(dump + ".tmp", last, prev, state, config.to_plain())
        os.replace(dump + ".tmp", dump)
        fsync_directory(path)
        # Then the compaction the Raft library runs after a snapshot: the journal keeps [prev, last].
        journal.deleteEntriesTo(len(entries) - 2)
    finally:
        journal._destroy()
    member_identity.write(path, member_identity.Identity(member.member_id, member.incarnation, config.cluster_id))


def restore_cluster(plan: Plan) -> dict:
    """Write every member's data dir; a summary of the new cluster."""
    config = new_configuration(plan)
    entries, sm = restored_entries(plan, config)
    state = sm.snapshot()
    for member in config.members:
        write_member_dir(plan.data_dirs[member.member_id], member, config, entries, state)
    return {
        "cluster_id": config.cluster_id,
        "backup_epoch": plan.backup_epoch,
        "epoch": sm.epoch,
        "first_token": sm.epoch + 1,
        "resources": sm.resources_count,
        "backup_sha256": hashlib.sha256(plan.backup).hexdigest(),
        "members": [(m.member_id, m.address, m.incarnation, plan.data_dirs[m.member_id]) for m in config.members],
    }


# -- the command -------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``fencingd restore-cluster`` on ``fencingd``'s subcommands."""
    p = sub.add_parser(
        "restore-cluster",
        help="offline: make a NEW cluster's data dirs from a backup, fenced above every old token",
        description=(
            "Make one data dir per member of a new cluster (new cluster id, new incarnations) whose"
            " state is the backup's, with the epoch at backup epoch + margin, so no token the old"
            " cluster issued, before or after the backup, is issued again. Run it once for all"
            " members, then copy each dir to its machine's data_dir (deploy/README.md, 'Two of three"
            " volumes lost'). Refuses, writing nothing, with exit 2."
        ),
    )
    p.add_argument("--backup", required=True, help="the file `fencingctl admin snapshot --out FILE` wrote")
    p.add_argument("--initial-cluster", required=True, metavar="ID=RAFT_HOST:PORT,...",
                   help="every member of the new cluster: its id and raft_address, as its config file names them")
    p.add_argument("--data-dir", action="append", metavar="ID=PATH",
                   help="where to write member ID's data dir (absent or empty); once per member")
    p.add_argument("--epoch-margin", required=True, type=int, metavar="N",
                   help="tokens the old cluster could have issued after the backup was taken; the new"
                        " epoch is the backup's + N (must be more than that count)")
    p.add_argument("--force", action="store_true",
                   help="allow --epoch-margin 0 (only if nothing was issued after the backup)")
    p.set_defaults(func=cmd_restore_cluster)


def cmd_restore_cluster(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(args)
        summary = restore_cluster(plan)
    except Refused as exc:
        print(f"fencingd restore-cluster: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(
        f"fencingd restore-cluster: new cluster {summary['cluster_id']} from a backup at epoch"
        f" {summary['backup_epoch']} ({summary['resources']} resources, sha256 {summary['backup_sha256'][:16]}...);"
        f" epoch {summary['epoch']}, first token {summary['first_token']}"
    )
    for member_id, address, incarnation, path in summary["members"]:
        print(f"  {member_id}  {address}  incarnation {incarnation}  {path}")
    for note in id_notes(plan.members):
        print(f"  note: {note}")
    return 0


def id_notes(members: tuple[tuple[str, str], ...]) -> list[str]:
    """Members whose id is not the one their address derives: their config file must say so
    (``member_id``), or the member refuses its data dir at start (identity.py)."""
    addresses = [address for _, address in members]
    notes = []
    for member_id, address in members:
        derived = initial_member_id(address, addresses)
        if member_id != derived:
            notes.append(f'{member_id} at {address} is not the id its address derives ({derived}):'
                         f' its config file must set member_id = "{member_id}"')
    return notes

"""``fencingd restore-cluster`` without processes: what it refuses (one line, exit 2, nothing
written) and what it writes (what a member of the new cluster reads at its start: the Raft
layer's own readers read it here). The real cluster started from these dirs, under the
deploy/README.md runbook, is tests/test_restore_cluster_runbook.py."""

from __future__ import annotations

import os

import pytest

from coordinator.core import commands
from coordinator.core.snapshot_format import parse_snapshot
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft import identity as member_identity
from coordinator.raft import snapshot_file
from coordinator.raft import wire as raft_wire
from coordinator.raft.journal import DurableJournal
from coordinator.raft.membership import Configuration
from coordinator.server import fencingd

MEMBERS = "m1=10.0.0.1:7000,m2=10.0.0.2:7000,m3=10.0.0.3:7000"
# A log clock the backup's state stands at (ms).
BACKUP_CLOCK_MS = 5_000_000


def make_backup(path) -> tuple[bytes, int]:
    """A backup of a state with leases, data and dedup entries; (its bytes, its epoch)."""
    sm = FencingStateMachine()
    for i in range(4):
        stamp = BACKUP_CLOCK_MS - 10 + i
        token = sm.execute(commands.acquire(resource=f"r/{i}", holder="h", ttl_ms=60_000,
                                            op_id=b"acquire--op-%04d" % i, stamp_ms=stamp)).result.token
        sm.execute(commands.write(resource=f"r/{i}", key="k", value=b"v%d" % i, token=token,
                                  op_id=b"write----op-%04d" % i, stamp_ms=stamp))
    data = sm.backup()
    path.write_bytes(data)
    return data, sm.epoch


def restore(tmp_path, *extra: str, margin: str = "1000", members: str = MEMBERS, dirs=None) -> int:
    argv = ["restore-cluster", "--backup", str(tmp_path / "backup.bin"), "--epoch-margin", margin,
            "--initial-cluster", members]
    for member_id in dirs if dirs is not None else ("m1", "m2", "m3"):
        argv += ["--data-dir", f"{member_id}={tmp_path / member_id}"]
    return fencingd.main([*argv, *extra])


def written(tmp_path) -> list[str]:
    return sorted(p for p in os.listdir(tmp_path) if p != "backup.bin")


def test_writes_the_dirs_a_member_of_the_new_cluster_starts_from(tmp_path, capsys):
    _data, epoch = make_backup(tmp_path / "backup.bin")
    assert restore(tmp_path) == 0
    configs, identities, states = [], [], []
    for member_id in ("m1", "m2", "m3"):
        path = str(tmp_path / member_id)
        assert sorted(os.listdir(path)) == ["member.identity", "raft.dump", "raft.journal", "raft.meta"]
        identity, created = member_identity.load_or_create(path, member_id)
        assert not created and identity.cluster_id is not None
        index, term = snapshot_file.verify(os.path.join(path, snapshot_file.DUMP_NAME))
        body = snapshot_file.read_body(os.path.join(path, snapshot_file.DUMP_NAME))
        last, prev, state, plain = snapshot_file.decode(body)
        config = Configuration.from_plain(plain)
        # Every member a voter, this one under its own incarnation, in the new cluster.
        assert all(m.voter for m in config.members) and len(config.members) == 3
        assert config.by_id(member_id).incarnation == identity.incarnation
        assert config.cluster_id == identity.cluster_id
        assert (last[1], last[2]) == (index, term) and prev[1] == index - 1
        # The journal holds the snapshot's two entries, at the term the meta file holds.
        journal = DurableJournal(path)
        try:
            assert [tuple(e) for e in journal] == [prev, last]
            assert journal.getCurrentTerm() == term == 1
        finally:
            journal._destroy()
        assert raft_wire.entry_command(last[0]) is not None  # the RESTORE_COMMIT entry
        configs.append(config)
        identities.append(identity)
        states.append(bytes(state))
    assert configs[0] == configs[1] == configs[2] and states[0] == states[1] == states[2]
    assert len({i.incarnation for i in identities}) == 3
    # The state: the backup's resources and data, fenced at backup epoch + margin (I11).
    sm = FencingStateMachine()
    sm.restore(states[0])
    assert sm.epoch == epoch + 1000
    parts = parse_snapshot(states[0], None)
    assert sorted(parts.resources) == ["r/0", "r/1", "r/2", "r/3"]
    for name, res in parts.resources.items():
        assert res.high_water_mark == epoch + 1000 and res.lease is None
        assert res.data["k"][0] == b"v" + name[-1].encode()
    assert not parts.dedup and parts.staged is None
    assert parts.log_clock_ms >= BACKUP_CLOCK_MS - 7
    out = capsys.readouterr().out
    assert f"epoch {epoch + 1000}, first token {epoch + 1001}" in out and configs[0].cluster_id in out


def test_every_run_is_a_new_cluster_with_new_incarnations(tmp_path):
    make_backup(tmp_path / "backup.bin")
    assert restore(tmp_path) == 0
    first = member_identity.load_or_create(str(tmp_path / "m1"), "m1")[0]
    for member_id in ("m1", "m2", "m3"):
        os.rename(tmp_path / member_id, tmp_path / f"{member_id}.first")
    assert restore(tmp_path) == 0
    second = member_identity.load_or_create(str(tmp_path / "m1"), "m1")[0]
    assert first.cluster_id != second.cluster_id and first.incarnation != second.incarnation


def test_bare_addresses_take_the_ids_the_config_files_derive(tmp_path):
    make_backup(tmp_path / "backup.bin")
    # m1, m2, m3 by sorted address, whatever the order given.
    assert restore(tmp_path, members="10.0.0.3:7000,10.0.0.1:7000,10.0.0.2:7000") == 0
    plain = snapshot_file.decode(snapshot_file.read_body(str(tmp_path / "m3" / snapshot_file.DUMP_NAME)))[3]
    assert Configuration.from_plain(plain).by_id("m3").address == "10.0.0.3:7000"


def test_an_id_its_address_does_not_derive_is_pointed_out(tmp_path, capsys):
    make_backup(tmp_path / "backup.bin")
    assert restore(tmp_path, members="m1=10.0.0.1:7000,m2=10.0.0.2:7000,m4=10.0.0.3:7000",
                   dirs=("m1", "m2", "m4")) == 0
    out = capsys.readouterr().out
    assert ('m4 at 10.0.0.3:7000 is not the id its address derives (m3):'
            ' its config file must set member_id = "m4"') in out
    assert "m1 at" not in out


@pytest.mark.parametrize("case, extra, expected", [
    ("margin 0", {"margin": "0"}, "--epoch-margin 0 would let a token"),
    ("negative margin", {"margin": "-1"}, "--epoch-margin: must be 0 or more"),
    ("even member count", {"members": "m1=10.0.0.1:7000,m2=10.0.0.2:7000", "dirs": ("m1", "m2")}, "use an odd number"),
    ("no port", {"members": "m1=10.0.0.1,m2=10.0.0.2:7000,m3=10.0.0.3:7000"}, "is not ID=RAFT_HOST:PORT"),
    ("address twice", {"members": "m1=10.0.0.1:7000,m2=10.0.0.1:7000,m3=10.0.0.3:7000"}, "two members at one address"),
    ("id twice", {"members": "m1=10.0.0.1:7000,m1=10.0.0.2:7000,m3=10.0.0.3:7000", "dirs": ("m1", "m3")},
     "two members with one id"),
    ("a dir missing", {"dirs": ("m1", "m2")}, "missing m3"),
    ("a dir for no member", {"dirs": ("m1", "m2", "m3", "m4")}, "not a member: m4"),
])
def test_refuses_bad_input_in_one_line_writing_nothing(tmp_path, capsys, case, extra, expected):
    make_backup(tmp_path / "backup.bin")
    assert restore(tmp_path, **extra) == 2, case
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err
    assert written(tmp_path) == []


def test_refuses_a_backup_that_fails_verification(tmp_path, capsys):
    data, _epoch = make_backup(tmp_path / "backup.bin")
    (tmp_path / "backup.bin").write_bytes(data[:-3])
    assert restore(tmp_path) == 2
    err = capsys.readouterr().err
    assert "fails verification" in err and err.count("\n") == 1, err
    assert written(tmp_path) == []
    (tmp_path / "backup.bin").write_bytes(b"\x00" * 100)
    assert restore(tmp_path) == 2 and "fails verification" in capsys.readouterr().err
    os.remove(tmp_path / "backup.bin")
    assert restore(tmp_path) == 2 and "cannot read" in capsys.readouterr().err
    assert written(tmp_path) == []


def test_refuses_a_data_dir_that_holds_anything_and_writes_no_other(tmp_path, capsys):
    make_backup(tmp_path / "backup.bin")
    os.makedirs(tmp_path / "m1")  # an empty dir (a mount point) is fine
    os.makedirs(tmp_path / "m3")
    (tmp_path / "m3" / "raft.journal").write_bytes(b"old")
    assert restore(tmp_path) == 2
    assert "m3" in capsys.readouterr().err
    assert written(tmp_path) == ["m1", "m3"] and os.listdir(tmp_path / "m1") == []
    assert (tmp_path / "m3" / "raft.journal").read_bytes() == b"old"


def test_margin_zero_only_when_forced_and_still_above_the_backup(tmp_path):
    _data, epoch = make_backup(tmp_path / "backup.bin")
    assert restore(tmp_path, "--force", margin="0") == 0
    state = snapshot_file.decode(snapshot_file.read_body(str(tmp_path / "m1" / snapshot_file.DUMP_NAME)))[2]
    sm = FencingStateMachine()
    sm.restore(bytes(state))
    assert sm.epoch == epoch + 1  # a restore always fences above the backup's own epoch

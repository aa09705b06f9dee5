"""Membership faults: a member loses its disk and an operator brings it back (RAFT.md "Member
identity", deploy/README.md "Lost volume"). Kept apart from chaos/faults.py and
chaos/disk_clock_faults.py so other fault work there does not collide.

``DiskLoss``: kill -9 a member, wipe its data dir, start it empty at the same address under the
same member id. It must not vote or count: it learns the configuration from the leader, finds
its fresh incarnation absent and logs so, while the others still name its lost incarnation.
Heal is the operator's step: ``member_replace`` through the Admin API (same id, same address),
then wait until the configuration names the fresh incarnation as a voter. The fault checks
each of these (``info["ok"]``) and records the unavailability clients saw: the longest time
without an acknowledged workload operation, over the whole fault and during the replace.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import time

from chaos.faults import Fault, _pick
from chaos.harness import ChaosCluster
from chaos.report import longest_gap_s
from chaos.workload import make_client
from coordinator.client.exceptions import OutcomeUnknown, Refused, Unavailable
from coordinator.raft.identity import IDENTITY_NAME
from testsupport.supervisor import wait_until

# The wiped member logs that it is not in the configuration every
# RAFT_NOT_A_MEMBER_LOG_INTERVAL_MS (5 s) once it holds the leader's log: two intervals plus
# start-up and catch-up on this shared 2-core machine.
NOT_MEMBER_LINE_TIMEOUT_S = 30.0
# A replace needs two committed CONFIG entries and the learner's catch-up (a snapshot of a
# few thousand entries here); elections in between can refuse it for a while (retried).
REPLACE_TIMEOUT_S = 60.0
# After the replace, the cluster must show it serves again before the gap is measured:
# this many more acknowledged workload operations (the four clients make tens per second).
ACKS_AFTER = 20
ACKS_AFTER_TIMEOUT_S = 30.0
NOT_MEMBER_LINE = "is not in the configuration"


def _incarnation(data_dir: str) -> int | None:
    """The incarnation a member's data dir holds (read from outside), None before it exists."""
    try:
        with open(os.path.join(data_dir, IDENTITY_NAME), encoding="utf-8") as f:
            return int(json.load(f)["incarnation"])
    except (FileNotFoundError, ValueError, KeyError):
        return None  # not written yet, or caught between create and rename: asked again


def _configuration(c: ChaosCluster, asked: list[int]) -> dict[str, tuple[str, int, bool]] | None:
    """member id -> (Raft address, incarnation, voter), as the first of ``asked`` that answers
    Status knows it; None if none answers."""
    for i in asked:
        try:
            members = c.nodes[i].status(timeout_s=1.5).members
        except Exception:  # noqa: BLE001 - a member mid-election or slow: ask the next
            continue
        return {m.member_id: (m.id, m.incarnation, m.voter) for m in members if m.member_id}
    return None


def acknowledged_ends_ns(clients_dir: str) -> list[int]:
    """complete_ns of every acknowledged workload op so far. The files are being appended to:
    a last line caught half written is skipped (it is read complete next time)."""
    ends = []
    for path in glob.glob(os.path.join(clients_dir, "c*.jsonl")):
        with open(path, encoding="utf-8") as f:
            ends.extend(end for end in map(ack_end_ns, f) if end is not None)
    return sorted(ends)


def ack_end_ns(line: str | bytes) -> int | None:
    """complete_ns of the history line if it is an acknowledged op; None for any other line,
    one cut short included (a file being appended to, or read from the middle)."""
    if (b'"outcome":"ok"' if isinstance(line, bytes) else '"outcome":"ok"') not in line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if record.get("type") == "op" and record.get("complete_ns") is not None:
        return int(record["complete_ns"])
    return None


class DiskLoss(Fault):
    """Wipe the leader's or a follower's data dir; heal: ``member_replace`` it (same id, same
    address) and wait until its fresh incarnation is a voter again."""

    failure = "a wiped member was counted before its replace, or not a voter again after it"

    def __init__(self, clients_dir: str, role: str = "follower") -> None:
        super().__init__()
        self.clients_dir, self.role = clients_dir, role
        self.kind = f"disk_loss_{role}"
        self.leader_fault = role == "leader"
        self.i = -1
        self.member_id = ""
        self.old_incarnation = 0
        self.inject_ns = 0

    def inject(self, c: ChaosCluster) -> None:
        self.inject_ns = time.monotonic_ns()
        self.i = _pick(c, self.role, random)
        node = c.nodes[self.i]
        others = [n.index for n in c.nodes if n.index != self.i]
        self.nodes = [node.raft_address]
        before = _configuration(c, others) or {}
        listed = [(mid, inc) for mid, (addr, inc, voter) in before.items() if addr == node.raft_address and voter]
        if not listed:
            raise RuntimeError(f"{node.raft_address} is not a voter before the fault: {before}")
        self.member_id, self.old_incarnation = listed[0]
        log_from = os.path.getsize(node.log_path)  # the log is appended to across restarts
        c.kill(self.i)  # first: a running member would write into the directory being wiped
        shutil.rmtree(node.data_dir)
        os.makedirs(node.data_dir)
        c.start(self.i)
        fresh = wait_until(lambda: _incarnation(node.data_dir), 30.0, what="the wiped member's new identity")

        def says_not_member():
            with open(node.log_path, encoding="utf-8", errors="replace") as f:
                f.seek(log_from)
                return NOT_MEMBER_LINE in f.read()

        wait_until(says_not_member, NOT_MEMBER_LINE_TIMEOUT_S, interval_s=0.2,
                   what="the wiped member to log that its incarnation is not in the configuration")
        self.info = {"node": node.raft_address, "member_id": self.member_id,
                     "old_incarnation": self.old_incarnation, "new_incarnation": fresh}

    def not_counted(self, c: ChaosCluster) -> tuple[bool, str]:
        """The others still name the lost incarnation, and the wiped member leads nothing;
        with why not, when not (a soak once reported False without saying which)."""
        others = [n.index for n in c.nodes if n.index != self.i]
        config = _configuration(c, others)
        if config is None:
            return False, "neither other member answered Status"
        entry = config.get(self.member_id)
        if entry is None or entry[1] != self.old_incarnation:
            return False, f"the others' configuration names {self.member_id} as {entry}, not #{self.old_incarnation}"
        if c.named_leader() == self.i:
            return False, "the wiped member is named leader"
        return True, ""

    def heal(self, c: ChaosCluster) -> None:
        if self.i < 0:
            return
        node = c.nodes[self.i]
        fresh = self.info.get("new_incarnation") or _incarnation(node.data_dir)
        counted_ok, why = self.not_counted(c)
        self.info["not_counted_before_replace"] = counted_ok
        if why:
            self.info["counted_because"] = why
        admin = make_client(c.endpoints, timeout_s=10.0)
        replace_ns = time.monotonic_ns()
        others = [n.index for n in c.nodes if n.index != self.i]
        try:
            self.info["replace_attempts"] = self._replace(admin, c, others)

            def voter_again():
                entry = (_configuration(c, others) or {}).get(self.member_id)
                return entry is not None and entry == (node.raft_address, fresh, True)

            promoted = True
            try:
                wait_until(voter_again, REPLACE_TIMEOUT_S, interval_s=0.1,
                           what=f"{self.member_id} a voter again with incarnation {fresh}")
            except TimeoutError:
                promoted = False
            self.info["voter_again_s"] = round((time.monotonic_ns() - replace_ns) / 1e9, 3)
            self.info["voter_again"] = promoted
        finally:
            admin.close()
        # Unavailability: wait until the workload is served again, then measure.
        count = len(acknowledged_ends_ns(self.clients_dir))
        try:
            wait_until(lambda: len(acknowledged_ends_ns(self.clients_dir)) >= count + ACKS_AFTER,
                       ACKS_AFTER_TIMEOUT_S, interval_s=0.2, what=f"{ACKS_AFTER} more acknowledged operations")
        except TimeoutError:
            self.info["served_after"] = False
        now = time.monotonic_ns()
        ends = acknowledged_ends_ns(self.clients_dir)
        self.info["unavailable_s"] = longest_gap_s(ends, self.inject_ns, now)
        self.info["unavailable_during_replace_s"] = longest_gap_s(ends, replace_ns, now)
        self.info["ok"] = bool(self.info["not_counted_before_replace"] and promoted
                               and self.info.get("served_after", True))

    def _replace(self, admin, c: ChaosCluster, others: list[int]) -> int:
        """member_replace until the configuration names a fresh incarnation for the id (learner
        or voter); returns the attempts. The first attempt is the runbook's command (no address:
        the one it has). A replace is sent once per attempt (Kind.ONCE): after an unknown outcome
        the configuration says whether it applied. A retry names the address: if the removal
        half committed, the id is gone and only an add under that address is left to do
        (RAFT.md "Membership changes")."""
        deadline = time.monotonic() + REPLACE_TIMEOUT_S
        address = ""
        attempts = 0
        while True:
            attempts += 1
            try:
                admin.member_replace(self.member_id, address)
                return attempts
            except (OutcomeUnknown, Unavailable, Refused) as exc:
                # Refused: a change still uncommitted, or a new leader that has not committed
                # in its term yet; Unavailable: an election.
                entry = (_configuration(c, others) or {}).get(self.member_id)
                if entry is not None and entry[1] != self.old_incarnation:
                    return attempts  # it applied (the learner is in, maybe bound already)
                if time.monotonic() > deadline:
                    raise
                leader = c.named_leader()
                self.info.setdefault("replace_retried_after", []).append(
                    f"{type(exc).__name__}: {str(exc)[:160]} (leader: "
                    f"{'none' if leader is None else c.nodes[leader].raft_address})")
            address = c.nodes[self.i].raft_address
            time.sleep(0.5)  # an election or a commit in progress: give it a moment


def random_disk_loss(rng: random.Random, clients_dir: str) -> DiskLoss:
    return DiskLoss(clients_dir, rng.choice(["leader", "follower"]))

"""Faults on a member's clock and on what a power cut leaves on its disk (issue "Deeper chaos",
point 4). Kept apart from chaos/faults.py so other fault work there does not collide.

``ClockStep``: steps one member's wall clock (leader or follower, forward or back) while it
runs, through testsupport/clock_step's wall-clock shim (the harness starts members with it
unless ``FENCING_CHAOS_CLOCK_STEP`` is ``0``, see ``chaos.harness``); monotonic stays real. Heal steps it
back. Leases must neither shorten nor lengthen (I6): the workload and the checker see it.
The fault proves each step took effect: it reads the member's wall clock (the ``Date`` of its
/readyz answer, ``ChaosCluster.wall_clock_offset_s``) until it reads the offset asked for, and
fails the inject (a run error) if it never does; heal checks the clock came back likewise.

``TornPowerLoss``: a power loss (``chaos.faults.PowerLoss``: freeze with unsynced journal bytes,
kill -9, drop what was never fsynced) that also leaves what a power cut mid-write leaves:
- the journal ends in a torn record: the never-synced tail keeps a prefix of its first record
  that stops inside it (when nothing unsynced was caught, a prefix of a fabricated record —
  a write the cut interrupted before any sync);
- the meta file's in-flight update is lost: a torn ``raft.meta.tmp`` (a higher term half
  written) beside the intact ``raft.meta`` — the update was never fsynced nor renamed;
- the snapshot's in-flight update is lost: a torn ``raft.dump.tmp``.
Nothing fsynced is touched: the member promised nothing about the rest. On restart it must cut
the torn record with a warning and start with its last durable term and vote (never a rolled
back one); the fault checks both (``info["ok"]``), and the run then checks it serves.
With ``require_snapshot`` (the CI profile) the snapshot tear must happen: inject first waits
(bounded) until every member has a snapshot file (chaos members snapshot every 20 s), and a
victim without one fails the fault; after the restart the intact snapshot beside the torn
``.tmp`` must still verify (``snapshot_index``).
"""

from __future__ import annotations

import os
import random
import struct
import time
import zlib

import msgpack

from chaos.faults import Fault, PowerLoss, _pick
from chaos.harness import ChaosCluster
from coordinator.raft import snapshot_file
from coordinator.raft.journal import JOURNAL_NAME, META_NAME, SYNCED_SIDECAR_SUFFIX, JournalCorrupt, read_meta
from coordinator.raft.snapshot_file import DUMP_NAME
from testsupport.supervisor import wait_until

_RECORD_HEAD = struct.Struct("<II")  # the journal's record head: payload length, crc32
_ENTRY_HEAD = struct.Struct("<QQ")  # index, term


# A read of the member's clock is good to about a second (whole-second HTTP dates, a local
# round trip); steps are minutes or more, so 3 s tells "stepped" from "not" without doubt.
CLOCK_OFFSET_TOLERANCE_S = 3.0
# The shim looks at the offset file again every 10 ms: a step shows in the next answer. The
# deadline covers a member slow to answer on a loaded machine.
CLOCK_STEP_SEEN_S = 10.0


class ClockNotStepped(RuntimeError):
    """The member's wall clock never read the offset the fault set."""


def wait_wall_offset(c: ChaosCluster, i: int, seconds: int) -> float:
    """Poll member ``i``'s wall clock until it reads ``seconds`` off ours (within the
    tolerance); the offset read. ClockNotStepped if it never does within the deadline."""
    seen: list[float] = []

    def there():
        seen.append(c.wall_clock_offset_s(i))
        return (seen[-1],) if abs(seen[-1] - seconds) <= CLOCK_OFFSET_TOLERANCE_S else None

    try:
        return round(wait_until(there, CLOCK_STEP_SEEN_S, interval_s=0.1, what="the stepped clock")[0], 1)
    except TimeoutError:
        last = f"{seen[-1]:+.1f} s" if seen else "nothing (no answer)"
        raise ClockNotStepped(f"member {i}'s wall clock should read {seconds:+d} s off real time; "
                              f"it read {last}") from None


class ClockStep(Fault):
    """Step the wall clock of the leader or a follower by ``seconds`` (negative: back)."""

    failure = "the member's wall clock did not come back after the step"

    def __init__(self, role: str = "leader", seconds: int = 3600) -> None:
        super().__init__()
        self.role, self.seconds = role, seconds
        self.kind = f"clock_step_{role}_{'forward' if seconds > 0 else 'back'}"
        self.i = -1

    def inject(self, c: ChaosCluster):
        if not c.clock_steppable:
            raise RuntimeError("members run without the clock-step shim (FENCING_CHAOS_CLOCK_STEP=0): no clock to step")
        self.i = _pick(c, self.role)
        self.nodes = [c.nodes[self.i].raft_address]
        self.info = {"node": self.nodes[0], "seconds": self.seconds}
        c.step_wall_clock(self.i, self.seconds)
        # Raises (the runner records a run error) if the member's clock did not move.
        self.info["offset_seen_s"] = wait_wall_offset(c, self.i, self.seconds)

    def heal(self, c: ChaosCluster):
        if self.i < 0:
            return
        c.step_wall_clock(self.i, 0)
        try:
            self.info["offset_after_heal_s"] = wait_wall_offset(c, self.i, 0)
            self.info["ok"] = True
        except (ClockNotStepped, OSError) as exc:
            self.info.update(ok=False, heal_error=str(exc))
        self.info["summary"] = (
            f"{self.nodes[0]}: wall clock stepped {self.seconds:+d} s, read "
            f"{self.info.get('offset_seen_s')} s off after the step,"
            f" {self.info.get('offset_after_heal_s')} s after heal"
        )


def read_meta_term(data_dir: str) -> tuple[int, object] | None:
    """(term, vote) of the durable meta file, read from outside; None if absent. The journal's
    own reader (``journal.read_meta``), so the fault and the member agree on the format."""
    try:
        return read_meta(os.path.join(data_dir, META_NAME))
    except JournalCorrupt as exc:
        raise RuntimeError(f"{META_NAME} of {data_dir} is damaged before the fault touched it: {exc}") from exc


def tear_journal_tail(data_dir: str, rng: random.Random) -> dict:
    """Drop every never-synced journal byte except a prefix of the first unsynced record that
    stops inside it (or append such a prefix of a fabricated record). Node must be dead."""
    path = os.path.join(data_dir, JOURNAL_NAME)
    with open(path + SYNCED_SIDECAR_SUFFIX, "rb") as f:
        synced = struct.unpack("<Q", f.read(8))[0]
    with open(path, "rb") as f:
        f.seek(synced)
        tail = f.read()
    record = b""
    if len(tail) >= _RECORD_HEAD.size:
        length, _ = _RECORD_HEAD.unpack_from(tail, 0)
        if _RECORD_HEAD.size + length <= len(tail):
            record = tail[: _RECORD_HEAD.size + length]
    source = "unsynced"
    if not record:
        # Nothing unsynced (or only a torn head already): the record a write in flight was
        # laying down. Index and term are never read: it stops before its end.
        payload = _ENTRY_HEAD.pack(0, 0) + os.urandom(32)
        record = _RECORD_HEAD.pack(len(payload), zlib.crc32(payload)) + payload
        source = "fabricated"
    keep = rng.randrange(1, len(record))  # at least one byte, never the whole record
    with open(path, "r+b") as f:
        f.truncate(synced)
        f.seek(synced)
        f.write(record[:keep])
    return {"synced_len": synced, "unsynced_len": len(tail), "torn_bytes": keep,
            "torn_of": len(record), "torn_source": source}


def tear_pending_updates(data_dir: str, rng: random.Random, term: int | None) -> dict:
    """The meta and snapshot updates a cut interrupted: torn ``.tmp`` files, never renamed."""
    out = {}
    body = msgpack.packb([1, (term or 0) + 7, "127.0.0.9:1"], use_bin_type=True)
    meta = body + struct.pack("<I", zlib.crc32(body))
    with open(os.path.join(data_dir, META_NAME + ".tmp"), "wb") as f:
        f.write(meta[: rng.randrange(1, len(meta))])
    out["meta_tmp_bytes"] = os.path.getsize(os.path.join(data_dir, META_NAME + ".tmp"))
    dump = os.path.join(data_dir, DUMP_NAME)
    if os.path.exists(dump):
        with open(dump, "rb") as f:
            head = f.read(4096)
        with open(dump + ".tmp", "wb") as f:
            f.write(head[: rng.randrange(1, max(2, len(head)))])
        out["dump_tmp_bytes"] = os.path.getsize(dump + ".tmp")
    return out


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class TornPowerLoss(PowerLoss):
    """PowerLoss plus a torn last journal record and lost meta / snapshot updates (above)."""

    failure = "member did not recover safely from a torn power loss"

    def __init__(self, scope: str = "leader", seed: int = 0, require_snapshot: bool = False,
                 snapshot_wait_s: float = 30.0) -> None:
        super().__init__(scope)
        self.kind = f"torn_power_loss_{scope}"
        self.rng = random.Random(seed)
        self.require_snapshot = require_snapshot
        # 30 s: members snapshot every 20 s (chaos settings), a loaded machine adds some.
        self.snapshot_wait_s = snapshot_wait_s
        self.before: dict[int, tuple[int, object] | None] = {}
        self.torn: dict[str, dict] = {}

    def inject(self, c):
        self.indexes = []
        if self.require_snapshot:
            # Every member, not just the victim: the leader is picked only after this wait.
            t0 = time.monotonic()
            wait_until(lambda: all(os.path.exists(os.path.join(n.data_dir, DUMP_NAME)) for n in c.nodes),
                       self.snapshot_wait_s, interval_s=0.2, what="every member to have a snapshot file")
            self.info["snapshot_wait_s"] = round(time.monotonic() - t0, 2)

        # PowerLoss.inject kills and cuts to the synced length; the tear is taken from the
        # sidecar, which still names the synced length, and the file before the cut.
        def cut(i: int) -> tuple[int, int]:
            c.kill(i)
            node = c.nodes[i]
            self.before[i] = read_meta_term(node.data_dir)
            old = os.path.getsize(os.path.join(node.data_dir, JOURNAL_NAME))
            torn = tear_journal_tail(node.data_dir, self.rng)
            term = self.before[i][0] if self.before[i] else None
            torn.update(tear_pending_updates(node.data_dir, self.rng, term))
            self.torn[node.raft_address] = torn
            return old, torn["synced_len"]

        original = c.power_loss
        c.power_loss = cut
        try:
            super().inject(c)
        finally:
            c.power_loss = original
        self.info["torn"] = self.torn

    def heal(self, c):
        # The log is appended to across restarts: only what this start writes counts.
        offsets = {i: _size(c.nodes[i].log_path) for i in self.indexes}
        super().heal(c)
        ok = True
        for i in self.indexes:
            node = c.nodes[i]

            def recovered(node=node, i=i):
                with open(node.log_path, encoding="utf-8", errors="replace") as f:
                    f.seek(offsets[i])
                    return "cutting torn tail" in f.read()

            try:
                wait_until(recovered, 30.0, interval_s=0.1, what=f"node {i} to cut its torn record")
            except TimeoutError:
                ok = False
                self.torn[node.raft_address]["cut_seen"] = False
                continue
            after = read_meta_term(node.data_dir)
            before = self.before.get(i)
            rolled_back = before is not None and (after is None or after[0] < before[0])
            torn = self.torn[node.raft_address]
            torn.update(cut_seen=True, rolled_back=rolled_back,
                        term_before=before and before[0], term_after=after and after[0])
            ok = ok and not rolled_back
            if "dump_tmp_bytes" in torn:
                try:
                    torn["snapshot_index"] = snapshot_file.verify(os.path.join(node.data_dir, DUMP_NAME))[0]
                except (OSError, ValueError) as exc:
                    torn["snapshot_error"] = repr(exc)
                    ok = False
            elif self.require_snapshot:
                torn["snapshot_error"] = "the victim had no snapshot file: its update was not torn"
                ok = False
        self.info["ok"] = ok
        self.info["summary"] = "; ".join(_torn_summary(addr, t) for addr, t in self.torn.items())


def _torn_summary(node: str, torn: dict) -> str:
    """One line per victim for the run's output: what was torn, and how it came back."""
    dump = (f", raft.dump.tmp {torn['dump_tmp_bytes']} B torn beside the snapshot at index "
            f"{torn.get('snapshot_index', '?')}" if "dump_tmp_bytes" in torn else ", no snapshot to tear")
    return (f"{node}: journal record torn at {torn['torn_bytes']}/{torn['torn_of']} B ({torn['torn_source']}), "
            f"raft.meta.tmp {torn['meta_tmp_bytes']} B{dump}; cut seen {torn.get('cut_seen')}, "
            f"term {torn.get('term_before')} -> {torn.get('term_after')}")

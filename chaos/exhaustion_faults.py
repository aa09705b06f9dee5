"""Exhaustion faults (issue 26, deliver 8): a member's disk fills, or its descriptors run out,
while the workload runs and the cluster's term moves. Kept apart from the other fault modules
so work there does not collide.

``DiskFull``: the member's data dir is on a small filesystem of its own (``chaos.small_fs``,
mounted by the harness for the whole run); inject fills it until a write gets ENOSPC and
proves a new write in the data dir is refused with ENOSPC. Heal deletes the filler.
``FdExhaustion``: the member's soft descriptor limit is lowered on the live process (prlimit) to
what it holds now plus ``FD_HEADROOM``, and idle connections to its API port are held until
its descriptor count reaches the limit (a few more wait in the listen queue, to take any
descriptor it frees). Heal closes them and puts the limit back.

Both, while exhausted, provoke an election that reaches the member: packets from the leader to
every other member are dropped for ``PROVOKE_ELECTION_S`` (nft, as ``faults.OneWay``), so the
followers hear no leader and, a majority of them, grant each other's pre-votes (one follower
cut off alone would be refused by the other, which still hears the leader: RAFT.md
"Pre-vote"); one stands for election, and its vote requests (which still arrive everywhere)
ask the exhausted member to write a higher term, or the exhausted follower stands itself. That
is the moment a full disk or an empty descriptor table meets Raft's durable state (a
``raft.meta`` that cannot be written).

Every step has its own deadline (the constants below), so a fault ends in well under a minute
whatever the member does: fill (bounded by the filesystem's size), connections
(``FD_CONNECT_DEADLINE_S``), the election (``PROVOKE_ELECTION_S``), the term reads
(``TERM_READ_TIMEOUT_S`` + ``META_CATCH_UP_S`` a member).

What the member may do: keep working, or stop cleanly (exit ``EXIT_DISK_FAILED`` through
coordinator/raft/fatal.py). Heal restarts a member that stopped, as the kill faults do. The
fault fails (``info["ok"]`` False, a run error) if the member exited any other way, or if a
member holds a term its ``raft.meta`` does not (a term acted on but never saved, in which it
could vote twice after a restart). That is judged twice: before the resource is back, from the
victim's own log lines (they need no connection) and every member's /metrics, and after heal
from /metrics again. The history check then shows no acknowledged write was lost and no term
had two leaders, and the run's convergence step that the cluster serves again.
"""

from __future__ import annotations

import os
import resource
import socket
import time

from chaos.disk_clock_faults import read_meta_term
from chaos.faults import Fault, _pick, nft_drop, nft_heal
from chaos.harness import ChaosCluster
from chaos.leader_reports import highest_term_logged
from chaos.small_fs import write_refused_with_enospc
from coordinator.raft.fatal import EXIT_DISK_FAILED
from testsupport.supervisor import wait_until

# The exits that are a clean stop: the fatal handler's "a durable write failed".
CLEAN_EXIT_CODES = (EXIT_DISK_FAILED,)
# Longer than the chaos election timeout (raft_max_timeout_s 1.0 s) with room for a second
# round: the cut-off member stands for election at least once, its vote requests reach the
# exhausted one, and the cluster is left leaderless for about this long at most.
PROVOKE_ELECTION_S = 2.0
# The cut lasts at least PROVOKE_ELECTION_S and until the cut-off member's term rose, at most
# this long: with pre-vote, where the exhausted follower has stopped, the other one is granted
# a vote only once the leader, which reaches no majority, steps down (leader_fallback_timeout_s).
PROVOKE_ELECTION_MAX_S = 8.0
# Descriptors the member may still open after the limit is lowered: what the held
# connections eat up. Small, so the connections needed stay few (each is one of ours too).
FD_HEADROOM = 48
# Connections held beyond the headroom: they wait in the listen queue and take any
# descriptor the member frees, so it stays at its limit while the fault holds.
FD_QUEUED_EXTRA = 16
# Until the member's descriptor count reaches the limit after the connections are made
# (gRPC accepts them on its poller thread within milliseconds here).
FD_FILL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0
# All the connections: the kernel completes them from the listen queue in microseconds; a
# member whose queue is full makes each wait CONNECT_TIMEOUT_S, and this bounds the sum.
FD_CONNECT_DEADLINE_S = 10.0
# A term write already in flight when the term was read has this long to land in raft.meta
# before the term counts as unsaved (a write is a few ms; a swallowed one never lands).
META_CATCH_UP_S = 2.0
# A member restarted by heal serves /metrics within a second or two here.
TERM_READ_TIMEOUT_S = 10.0


def unsaved_terms(c: ChaosCluster) -> dict[str, dict]:
    """Every running member whose term (as it holds it: its /metrics) is above the term its
    ``raft.meta`` holds (read from outside, after, so a write already under way has landed),
    with both."""
    out: dict[str, dict] = {}
    for node in [n for n in c.nodes if n.up]:
        try:
            (term,) = wait_until(lambda node=node: (c.raft_term(node.index),), TERM_READ_TIMEOUT_S, interval_s=0.2,
                                 what=f"the term of {node.raft_address}")
        except TimeoutError:
            continue  # no answer: convergence reports a member that never serves again

        def saved(node=node, term=term):
            meta = read_meta_term(node.data_dir)
            return meta is not None and meta[0] >= term

        try:
            wait_until(saved, META_CATCH_UP_S, interval_s=0.05, what="the term in raft.meta")
        except TimeoutError:
            meta = read_meta_term(node.data_dir)
            out[node.raft_address] = {"term": term, "meta_term": meta[0] if meta else None}
    return out


def unsaved_logged_term(node, log_from: int) -> dict | None:
    """The highest term the member's own log names since ``log_from`` if its ``raft.meta``
    holds less: asks nothing of the member, so it works while it has no descriptor to spare."""
    logged = highest_term_logged(node.log_path, log_from)
    meta = read_meta_term(node.data_dir)
    if logged is None or (meta is not None and meta[0] >= logged):
        return None
    return {"term": logged, "meta_term": meta[0] if meta else None, "from": "its log"}


def _fatal_line(log_path: str, offset: int) -> str | None:
    """The member's last ``FATAL:`` line written since ``offset``, if any."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            lines = [line.strip() for line in f if line.startswith("FATAL:")]
    except OSError:
        return None
    return lines[-1][:300] if lines else None


class ExhaustionFault(Fault):
    """Exhaust one member (``exhaust`` / ``relieve``), provoke an election meanwhile, then judge
    how the member came out of it (see the module docstring)."""

    failure = "the member neither kept working nor stopped cleanly, or a member holds a term it never saved"
    resource_name = "resource"
    # Every part of the step at its deadline (module docstring: a leader pick 20 s,
    # connections 10 + 5 s, the election 2 s, the failover probe 20 s, two rounds of term
    # reads 2 x 3 x 12 s, convergence 45 s) stays under this; a typical step takes 8-10 s.
    timeout_s = 180.0

    def __init__(self, role: str = "leader", provoke_election: bool = True) -> None:
        super().__init__()
        self.role = role
        self.kind = f"{self.resource_name}_{role}"
        self.leader_fault = role == "leader"
        self.provoke_election = provoke_election
        self.i = -1
        self.log_from = 0

    # -- what a subclass provides ---------------------------------------------------------

    def exhaust(self, c: ChaosCluster) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def release(self, c: ChaosCluster) -> None:
        """The first step of heal, after which the member can be asked its term (over a new
        connection) while it still lacks the resource; nothing by default."""

    def relieve(self, c: ChaosCluster) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- the fault ----------------------------------------------------------------------------

    def inject(self, c: ChaosCluster) -> None:
        self.i = _pick(c, self.role)
        node = c.nodes[self.i]
        self.nodes = [node.raft_address]
        self.info = {"node": node.raft_address}
        self.log_from = os.path.getsize(node.log_path)
        self.exhaust(c)
        if self.provoke_election:
            self.elect_while_exhausted(c)

    def elect_while_exhausted(self, c: ChaosCluster) -> None:
        """Cut the leader's packets to every other member for ``PROVOKE_ELECTION_S``: they stand
        for election and ask the exhausted member, among others, for its vote."""
        leader = self.i if self.role == "leader" else c.named_leader()
        if leader is None:
            self.info["election"] = {"skipped": "no leader named to cut off"}
            return
        other = next(n for n in c.nodes if n.index not in (self.i, leader))  # its term is reported
        term_before = self._term_of(c, other.index)
        try:
            for node in c.nodes:
                if node.index != leader:
                    nft_drop(c.nodes[leader].host, node.host, c.raft_port)
            time.sleep(PROVOKE_ELECTION_S)  # a duration: the cut-off members' election timeouts
            risen = lambda: (self._term_of(c, other.index) or 0) > (term_before or 0)  # noqa: E731
            deadline = time.monotonic() + PROVOKE_ELECTION_MAX_S - PROVOKE_ELECTION_S
            while not risen() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            nft_heal()
        self.info["election"] = {"cut_off": other.raft_address, "from": c.nodes[leader].raft_address,
                                 "term_before": term_before,
                                 "term_after": self._term_of(c, other.index)}

    @staticmethod
    def _term_of(c: ChaosCluster, i: int) -> int | None:
        try:
            return c.raft_term(i)
        except (OSError, RuntimeError):  # a figure for the report only
            return None

    def heal(self, c: ChaosCluster) -> None:
        if self.i < 0:
            return
        unsaved: dict[str, dict] = {}
        try:
            # Judged before the resource is back: a term the member could not save is still
            # unsaved now, whereas the elections it stirs up may save a newer one later.
            node = c.nodes[self.i]
            logged = unsaved_logged_term(node, self.log_from)
            if logged:
                unsaved[node.raft_address] = logged
            self.release(c)
            unsaved.update(unsaved_terms(c))
        finally:
            try:
                self.relieve(c)
            finally:
                self.judge_and_restart(c, unsaved)

    def judge_and_restart(self, c: ChaosCluster, unsaved_before: dict[str, dict]) -> None:
        node = c.nodes[self.i]
        exited = node.proc is not None and node.proc.poll() is not None and not node.stopped
        clean = True
        if exited:
            code = node.proc.returncode
            clean = code in CLEAN_EXIT_CODES
            self.info.update(outcome="stopped", exit_code=code, stopped_cleanly=clean,
                             fatal_line=_fatal_line(node.log_path, self.log_from))
            c.start(self.i)  # as after a crash: same address, same data dir
        else:
            self.info["outcome"] = "kept running"
        unsaved = {**unsaved_before, **unsaved_terms(c)}
        if unsaved:
            self.info["unsaved_terms"] = unsaved
        self.info["ok"] = clean and not unsaved
        self.info["summary"] = self.summary()

    def summary(self) -> str:
        """One line for the run's output: what the fault did, how the member came out."""
        info = self.info
        parts = [f"{info['node']}: {self.describe()}",
                 f"stopped with exit {info['exit_code']}" if "exit_code" in info else "kept running"]
        election = info.get("election", {})
        if "term_before" in election:
            parts.append(f"election while exhausted: term {election['term_before']} -> {election['term_after']}")
        if info.get("unsaved_terms"):
            parts.append(f"UNSAVED TERMS {info['unsaved_terms']}")
        return "; ".join(parts)

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


class DiskFull(ExhaustionFault):
    """The member's data dir filesystem full (ENOSPC) while the fault holds."""

    resource_name = "disk_full"

    def exhaust(self, c: ChaosCluster) -> None:
        fs = c.small_fs.get(self.i)
        if fs is None:
            raise RuntimeError("members' data dirs are not on small filesystems (ChaosCluster small_fs_bytes)")
        self.fs = fs
        self.info["filled_bytes"] = fs.fill()
        self.info["free_bytes_after_fill"] = fs.free_bytes()
        # The proof: a new write in the data dir itself is refused for want of space.
        self.info["enospc_seen"] = write_refused_with_enospc(fs.data_dir)
        if not self.info["enospc_seen"]:
            raise RuntimeError(f"{fs.mountpoint} filled, yet a write in the data dir was not refused with ENOSPC")

    def relieve(self, c: ChaosCluster) -> None:
        fs = getattr(self, "fs", None)
        if fs is not None:
            fs.unfill()
            self.info["free_bytes_after_heal"] = fs.free_bytes()

    def describe(self) -> str:
        return (f"filesystem filled ({self.info.get('filled_bytes', 0) // 1024} KiB), ENOSPC seen in its data dir: "
                f"{self.info.get('enospc_seen')}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def nofile_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) descriptor limit of ``pid``, as the kernel reports it."""
    with open(f"/proc/{pid}/limits", encoding="ascii") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise RuntimeError(f"/proc/{pid}/limits names no 'Max open files'")


class FdExhaustion(ExhaustionFault):
    """The member's (soft) descriptor limit lowered on the live process and its headroom taken
    by idle connections to its API port (from a caller with no credential)."""

    resource_name = "fd_exhaustion"

    def __init__(self, role: str = "leader", provoke_election: bool = True) -> None:
        super().__init__(role, provoke_election)
        self.held: list[socket.socket] = []
        self.pid: int | None = None
        self.old_limit: tuple[int, int] | None = None

    def exhaust(self, c: ChaosCluster) -> None:
        node = c.nodes[self.i]
        self.pid = node.proc.pid
        before = open_fds(self.pid)
        limit = before + FD_HEADROOM
        # The soft limit only (what EMFILE is measured against): raising a hard limit back
        # needs CAP_SYS_RESOURCE, which root here does not have.
        hard = resource.prlimit(self.pid, resource.RLIMIT_NOFILE)[1]
        self.old_limit = resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (limit, hard))
        self.info.update(fds_before=before, limit=limit, limit_seen=list(nofile_limit(self.pid)),
                         old_limit=list(self.old_limit))
        host, port = node.api_address.rsplit(":", 1)
        refused = 0
        deadline = time.monotonic() + FD_CONNECT_DEADLINE_S
        for _ in range(FD_HEADROOM + FD_QUEUED_EXTRA):
            if time.monotonic() > deadline:
                break
            try:
                self.held.append(socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S))
            except OSError:
                refused += 1
        self.info.update(connections_held=len(self.held), connections_refused=refused)
        try:
            wait_until(lambda: open_fds(self.pid) >= limit, FD_FILL_TIMEOUT_S, interval_s=0.05,
                       what="the member's descriptors to reach the limit")
            self.info["at_limit"] = True
        except (TimeoutError, FileNotFoundError):
            self.info["at_limit"] = False  # it refused or closed connections: it defends itself
        self.info["fds_at_limit"] = self._fds()

    def _fds(self) -> int | None:
        try:
            return open_fds(self.pid)
        except OSError:
            return None  # the process is gone

    def release(self, c: ChaosCluster) -> None:
        if not self.held:
            return  # released already
        self.info["fds_before_heal"] = self._fds()
        self.info["connections_dropped_by_member"] = sum(_closed_by_peer(s) for s in self.held)
        for sock in self.held:
            sock.close()
        self.held = []

    def relieve(self, c: ChaosCluster) -> None:
        self.release(c)  # idempotent: heal released already unless that step failed
        if self.old_limit is not None and self.pid is not None and c.nodes[self.i].alive:
            try:
                resource.prlimit(self.pid, resource.RLIMIT_NOFILE, self.old_limit)
            except ProcessLookupError:
                pass  # it exited in between: its successor starts with the normal limit

    def describe(self) -> str:
        return (f"nofile limit {self.info.get('limit_seen')}, {self.info.get('connections_held')} idle API "
                f"connections held, descriptors {self.info.get('fds_before')} -> {self.info.get('fds_at_limit')}"
                f" (at limit: {self.info.get('at_limit')})")


def _closed_by_peer(sock: socket.socket) -> bool:
    """The member closed this connection (EOF or reset); never blocks."""
    try:
        sock.setblocking(False)
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True

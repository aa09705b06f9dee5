"""Crash tests on real processes: three node processes on 127.0.0.2/.3/.4, real files, real fsync.

DESIGN §3 I1 (issuance never rolls back) and I8 (durable or not acknowledged). Each
scenario runs a stream of acknowledged ACQUIREs from client threads in this process
while nodes are killed (``kill -9``) or power-cut (``kill -9`` plus dropping every
journal byte written after the last sync), restarted, and then checks:

1. zero acknowledged loss: every acknowledged (resource, token) reads back through the
   log (a READ_BARRIER on that resource reports hwm == token) and the cluster epoch is
   at least the greatest acknowledged token;
2. the counter never goes backwards: a monitor samples every live node's ``status``
   every ~50 ms; inside one process the epoch never decreases (every sample), and per
   node, across restarts, the epoch of samples taken while the node says it is ready
   never decreases. Tokens strictly increase in each sequential client's
   acknowledgement order and in real-time order across clients, and no token is ever
   handed out twice;
3. equal replica digests after recovery.

Some crashes land at random moments, others right after the victim renamed a new
snapshot into place (``kill_right_after_snapshot``): until the journal is compacted on
the next tick the snapshot is newer than the journal head, the window in which stock
pysyncobj clears the journal on restart (coordinator/raft/RAFT.md "Durability"). Scenarios use
log compaction every 200 entries (one kill-all variant also 5000: no snapshot at all).

``FENCING_TEST_RAFT_FIXES`` ("all" by default, "none", or a comma list of fix names
from ``coordinator.raft.syncobj``) selects the Raft fixes the node processes run with, so
the same tests can show that they catch loss when the fixes are switched off. Without
``durable_journal`` nothing is ever synced and there is no synced length to cut back
to: the power-loss tests are then skipped, saying so.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import os
import threading
import time
from itertools import pairwise

import pytest

from coordinator.core import commands
from coordinator.core.state_machine import Applied, outcome_from_wire
from coordinator.raft.journal import cut_to_synced_length
from coordinator.raft.node import ALL_FIXES
from coordinator.raft.snapshot_file import DUMP_NAME
from testsupport.cluster import ProcessCluster, wait_until
from testsupport.control import ControlClient, ControlError

FIXES = os.environ.get("FENCING_TEST_RAFT_FIXES", "all").strip() or "all"


def _fix_set(spec: str) -> frozenset[str]:
    if spec == "all":
        return ALL_FIXES
    if spec == "none":
        return frozenset()
    return frozenset(f for f in spec.split(",") if f)


DURABLE_JOURNAL = "durable_journal" in _fix_set(FIXES)

pytestmark = pytest.mark.crash

needs_durable_journal = pytest.mark.skipif(
    not DURABLE_JOURNAL,
    reason=(
        f"FENCING_TEST_RAFT_FIXES={FIXES!r} runs the stock pysyncobj journal, which is never "
        "synced and records no synced length: a simulated power loss has nothing to cut "
        "back to, so this test would be meaningless (see coordinator/raft/RAFT.md 'Durability')"
    ),
)

COMPACT_OFTEN = 200  # log compaction every 200 entries (the example)
CLIENTS = 8  # sequential client threads in the workload
PROPOSE_TIMEOUT_S = 2.0
STATUS_TIMEOUT_S = 0.5
MONITOR_INTERVAL_S = 0.05
LEASE_TTL_MS = 60_000
READ_BACK_THREADS = 16
_CALL_ERRORS = (OSError, ControlError, ValueError, KeyError, TypeError)


# -- connections -----------------------------------------------------------------


class Conns:
    """One thread's own control connections: NodeHandle.call is for one thread only."""

    def __init__(self, cluster: ProcessCluster, timeout_s: float):
        self._cluster = cluster
        self._timeout_s = timeout_s
        self._clients: dict[int, ControlClient] = {}
        self.leader: int | None = None  # where this thread last found the leader

    def call(self, i: int, request: dict, timeout_s: float | None = None) -> dict:
        client = self._clients.get(i)
        if client is None:
            node = self._cluster.nodes[i]
            client = self._clients[i] = ControlClient(node.host, node.control_port, self._timeout_s)
        return client.call(request, timeout_s if timeout_s is not None else self._timeout_s)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def callable_nodes(cluster: ProcessCluster) -> list[int]:
    """Nodes worth calling: started and not paused (a paused node only times out)."""
    return [n.index for n in cluster.nodes if n.proc is not None and not n.paused]


def find_leader(cluster: ProcessCluster, conns: Conns) -> int | None:
    best = None
    for i in callable_nodes(cluster):
        try:
            s = conns.call(i, {"op": "status"}, STATUS_TIMEOUT_S)
        except _CALL_ERRORS:
            continue
        if s.get("is_leader") and s.get("has_quorum") and (best is None or s["term"] > best[0]):
            best = (s["term"], i)
    return None if best is None else best[1]


def propose_once(conns: Conns, i: int, cmd: bytes) -> dict | None:
    """One propose; None when the node could not be asked or did not answer (unknown fate)."""
    try:
        return conns.call(i, {"op": "propose", "cmd": cmd, "timeout_s": PROPOSE_TIMEOUT_S}, PROPOSE_TIMEOUT_S + 2.0)
    except _CALL_ERRORS:
        return None


def propose_until_decided(cluster: ProcessCluster, conns: Conns, cmd: bytes, deadline: float):
    """Propose ``cmd`` through the current leader until it is applied or refused.

    Only for commands that are safe to repeat (read barriers, same-op_id retries).
    Returns the state machine's outcome, or raises TimeoutError at ``deadline``.
    """
    while time.monotonic() < deadline:
        if conns.leader is None:
            conns.leader = find_leader(cluster, conns)
            if conns.leader is None:
                time.sleep(0.05)
                continue
        reply = propose_once(conns, conns.leader, cmd)
        if reply is not None and reply.get("outcome") in ("applied", "refused"):
            return outcome_from_wire(reply["value"])
        conns.leader = None
        time.sleep(0.02)
    raise TimeoutError("no leader applied the command before the deadline")


# -- workload --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ack:
    client: int
    resource: str
    token: int
    op_id: bytes
    sent_at: float  # first attempt (monotonic); a retry may return that attempt's outcome
    acked_at: float
    attempts: int


class Workload:
    """Sequential clients proposing ACQUIREs of fresh resources through the leader.

    A not_applied / unknown outcome or a failed connection is retried on the (new)
    leader with the same op_id: the state machine dedups it and returns the first
    outcome, so a retried command that had applied reports its original token.
    """

    def __init__(self, cluster: ProcessCluster, clients: int = CLIENTS):
        self.cluster = cluster
        self.run_id = os.urandom(6).hex()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acks: list[Ack] = []
        self.refusals: list[str] = []
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.abandoned = 0  # commands whose fate was still unknown at stop
        self._threads = [
            threading.Thread(target=self._client, args=(c,), name=f"crash-client-{c}", daemon=True)
            for c in range(clients)
        ]

    def start(self) -> "Workload":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=PROPOSE_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self._threads), "a workload client did not stop"

    def count(self) -> int:
        with self._lock:
            return len(self.acks)

    def wait_for_acks(self, more: int, timeout_s: float, what: str) -> int:
        """Wait until ``more`` further commands were acknowledged; return the new count."""
        target = self.count() + more
        wait_until(lambda: self.count() >= target, timeout_s, what=f"{more} more acknowledged commands ({what})")
        return self.count()

    def _client(self, client: int) -> None:
        conns = Conns(self.cluster, PROPOSE_TIMEOUT_S + 2.0)
        leader = None
        seq = 0
        try:
            while not self._stop.is_set():
                seq += 1
                resource = f"crash/{self.run_id}/{client}/{seq}"
                op_id = f"{self.run_id}-c{client}-{seq:08d}".encode()
                cmd = commands.acquire(
                    resource=resource, holder=f"crash-client-{client}", ttl_ms=LEASE_TTL_MS, op_id=op_id, stamp_ms=0
                ).encode()
                sent_at = time.monotonic()
                attempts = 0
                while True:
                    if self._stop.is_set():
                        if attempts:
                            with self._lock:
                                self.abandoned += 1
                        return
                    if leader is None:
                        leader = find_leader(self.cluster, conns)
                        if leader is None:
                            time.sleep(0.05)
                            continue
                    attempts += 1
                    reply = propose_once(conns, leader, cmd)
                    outcome = "no_answer" if reply is None else reply.get("outcome", "no_answer")
                    with self._lock:
                        self.outcomes[outcome] += 1
                    if outcome == "applied":
                        result = outcome_from_wire(reply["value"])
                        token = int(result.result.token)
                        ack = Ack(client, resource, token, op_id, sent_at, time.monotonic(), attempts)
                        with self._lock:
                            self.acks.append(ack)
                        break
                    if outcome == "refused":
                        with self._lock:
                            self.refusals.append(f"{resource}: {outcome_from_wire(reply['value'])}")
                        break
                    # not_applied, unknown or no answer: find the leader again, same op_id.
                    leader = None
                    time.sleep(0.02)
        finally:
            conns.close()


# -- monitor ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    t: float
    node: int
    pid: int
    ready: bool
    epoch: int
    last_applied: int
    commit_index: int
    is_leader: bool
    term: int


class Monitor:
    """Samples every live node's status every ~50 ms for the whole scenario."""

    def __init__(self, cluster: ProcessCluster):
        self.cluster = cluster
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crash-monitor", daemon=True)

    def start(self) -> "Monitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        conns = Conns(self.cluster, STATUS_TIMEOUT_S)
        try:
            while not self._stop.is_set():
                for i in callable_nodes(self.cluster):
                    try:
                        s = conns.call(i, {"op": "status"})
                        sample = Sample(
                            time.monotonic(), i, int(s["pid"]), bool(s["ready"]), int(s["epoch"]),
                            int(s["last_applied"]), int(s["commit_index"]), bool(s["is_leader"]), int(s["term"]),
                        )
                    except _CALL_ERRORS:
                        continue
                    self.samples.append(sample)
                self._stop.wait(MONITOR_INTERVAL_S)
        finally:
            conns.close()


# -- checks (each returns a list of problems, empty when fine) ------------------------


def _drops(samples: list[Sample]) -> list[tuple[Sample, Sample]]:
    """(highest earlier sample, later sample below it) pairs, in time order."""
    drops = []
    high = None
    for s in samples:
        if high is not None and s.epoch < high.epoch:
            drops.append((high, s))
        else:
            high = s
    return drops


def _describe_drops(where: str, drops: list[tuple[Sample, Sample]]) -> str:
    h, s = max(drops, key=lambda d: d[0].epoch - d[1].epoch)
    return (
        f"counter went backwards {where}: {len(drops)} samples below an earlier epoch; worst "
        f"{h.epoch} (pid {h.pid}, applied {h.last_applied}, ready {h.ready}) -> {s.epoch} (pid {s.pid}, "
        f"applied {s.last_applied}, ready {s.ready}, {'leader' if s.is_leader else 'follower'}, "
        f"{s.t - h.t:.2f}s later{', after a restart' if s.pid != h.pid else ''})"
    )


def check_counter_never_backwards(samples: list[Sample], nodes: int) -> list[str]:
    """The epoch never decreases within one process (every sample, ready or not), nor per
    node across restarts among samples taken while the node said it was ready."""
    problems = []
    for pid in sorted({s.pid for s in samples}):
        mine = [s for s in samples if s.pid == pid]
        drops = _drops(mine)
        if drops:
            problems.append(_describe_drops(f"inside process {pid} (node {mine[0].node})", drops))
    for node in range(nodes):
        ready = [s for s in samples if s.node == node and s.ready]
        if not ready:
            problems.append(f"monitor: no ready status sample from node {node} (monitor broken?)")
            continue
        drops = _drops(ready)
        if drops:
            problems.append(_describe_drops(f"on node {node} among ready samples (across restarts)", drops))
    return problems


def check_token_order(acks: list[Ack]) -> list[str]:
    """Tokens strictly increase per sequential client, in real-time order, and are never reused."""
    problems = []
    by_client: dict[int, list[Ack]] = collections.defaultdict(list)
    for a in sorted(acks, key=lambda a: a.acked_at):
        by_client[a.client].append(a)
    for client, seq in sorted(by_client.items()):
        bad = [(p, a) for p, a in pairwise(seq) if a.token <= p.token]
        if bad:
            p, a = bad[0]
            problems.append(
                f"client {client}: {len(bad)} acknowledged tokens not above the previous one "
                f"(first: {p.token} for {p.resource} then {a.token} for {a.resource})"
            )
    holders: dict[int, list[Ack]] = collections.defaultdict(list)
    for a in acks:
        holders[a.token].append(a)
    reused = {t: h for t, h in holders.items() if len({a.op_id for a in h}) > 1}
    if reused:
        t = min(reused)
        problems.append(
            f"{len(reused)} tokens were issued twice (rolled-back issuance), e.g. token {t} to "
            + " and ".join(a.resource for a in reused[t])
        )
    # DESIGN I1 in real time: a command first sent after another was acknowledged gets a
    # greater token.
    by_ack = sorted(acks, key=lambda a: a.acked_at)
    ack_times = [a.acked_at for a in by_ack]
    prefix_max = []
    high = None
    for a in by_ack:
        high = a if high is None or a.token > high.token else high
        prefix_max.append(high)
    late = []
    for b in acks:
        k = bisect.bisect_left(ack_times, b.sent_at)
        if k and prefix_max[k - 1].token >= b.token:
            late.append((prefix_max[k - 1], b))
    if late:
        a, b = max(late, key=lambda pair: pair[0].token - pair[1].token)
        problems.append(
            f"{len(late)} acknowledged tokens were not above a token acknowledged before they were "
            f"sent; worst: {a.token} ({a.resource}) acknowledged, then {b.token} ({b.resource})"
        )
    return problems


def check_no_acknowledged_loss(
    cluster: ProcessCluster, acks: list[Ack], timeout_s: float = 60.0
) -> tuple[list[str], dict]:
    """Read every acknowledged token back through the log; the epoch covers the greatest."""
    if not acks:
        return ["no command was acknowledged: the workload never ran"], {}
    deadline = time.monotonic() + timeout_s
    local = threading.local()
    all_conns: list[Conns] = []
    conns_lock = threading.Lock()

    def thread_conns() -> Conns:
        if not hasattr(local, "conns"):
            local.conns = Conns(cluster, PROPOSE_TIMEOUT_S + 2.0)
            with conns_lock:
                all_conns.append(local.conns)
        return local.conns

    def read_back(ack: Ack):
        cmd = commands.read_barrier(stamp_ms=0, resource=ack.resource).encode()
        outcome = propose_until_decided(cluster, thread_conns(), cmd, deadline)
        assert isinstance(outcome, Applied), f"read barrier refused: {outcome}"
        return ack, outcome.result.hwm

    lost, wrong = [], []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=READ_BACK_THREADS) as pool:
            for ack, hwm in pool.map(read_back, acks):
                if hwm == 0:
                    lost.append(ack)
                elif hwm != ack.token:
                    wrong.append((ack, hwm))
        final = propose_until_decided(cluster, thread_conns(), commands.read_barrier(stamp_ms=0).encode(), deadline)
        epoch = final.result.epoch
    except TimeoutError as exc:
        return [f"could not read acknowledged tokens back: {exc}"], {}
    finally:
        for c in all_conns:
            c.close()
    max_token = max(a.token for a in acks)
    problems = []
    if lost:
        tokens = sorted(a.token for a in lost)
        problems.append(
            f"ACKNOWLEDGED LOSS: {len(lost)} of {len(acks)} acknowledged acquires are gone "
            f"(resource unknown to the cluster); lost tokens {tokens[0]}..{tokens[-1]}"
        )
    if wrong:
        ack, hwm = wrong[0]
        problems.append(
            f"{len(wrong)} acknowledged resources hold another hwm than their token, "
            f"e.g. {ack.resource}: token {ack.token}, hwm {hwm}"
        )
    if epoch < max_token:
        problems.append(f"cluster epoch {epoch} is below the greatest acknowledged token {max_token}")
    return problems, {
        "acked": len(acks), "lost": len(lost), "wrong_hwm": len(wrong), "epoch": epoch, "max_token": max_token,
    }


def check_converged(cluster: ProcessCluster, timeout_s: float = 20.0) -> list[str]:
    """Every node runs and all hold the same state digest at the same applied index."""
    down = [n.index for n in cluster.nodes if not n.alive or n.paused]
    if down:
        return [f"nodes {down} are not running at the end"]
    try:
        d = cluster.wait_converged(timeout_s)
    except TimeoutError:
        try:
            d = cluster.digests()
        except _CALL_ERRORS as exc:
            d = repr(exc)
        return [f"replica digests differ after recovery: {d}"]
    if len(d) != len(cluster.nodes):
        return [f"only nodes {sorted(d)} reported a digest"]
    return []


# -- scenario plumbing --------------------------------------------------------------


@dataclasses.dataclass
class Run:
    cluster: ProcessCluster
    workload: Workload
    monitor: Monitor
    started: float
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def step(self, what: str, fn, *args, **kwargs):
        """Run a scenario step; a timeout becomes a problem and ends the scenario's steps."""
        try:
            return fn(*args, **kwargs)
        except TimeoutError as exc:
            self.problems.append(f"{what}: {exc}")
            raise _ScenarioStopped from exc


class _ScenarioStopped(Exception):
    pass


@contextlib.contextmanager
def crash_run(tmp_path, name: str, **cluster_kwargs):
    """A started cluster with monitor and workload; verifies everything on the way out."""
    base = str(tmp_path / "cluster")
    with ProcessCluster(base, fixes=FIXES, **cluster_kwargs) as cluster:
        cluster.start_all()
        cluster.wait_for_leader(20.0)
        monitor = Monitor(cluster).start()
        workload = Workload(cluster).start()
        run = Run(cluster, workload, monitor, time.monotonic())
        try:
            try:
                yield run
            except _ScenarioStopped:
                pass
            verify(run, name)
        finally:
            workload._stop.set()
            monitor.stop()


def verify(run: Run, name: str) -> None:
    """Stop the workload, let the cluster recover, and run every check."""
    cluster, workload = run.cluster, run.workload
    scenario_s = time.monotonic() - run.started
    workload.stop()
    problems = list(run.problems)
    if workload.refusals:
        problems.append(
            f"{len(workload.refusals)} acquires of fresh resources were refused, e.g. {workload.refusals[0]}"
        )
    problems += check_token_order(workload.acks)
    stats = {}
    try:
        cluster.wait_for_leader(20.0)
    except TimeoutError as exc:
        problems.append(f"no leader after recovery: {exc}")
    else:
        t0 = time.monotonic()
        loss, stats = check_no_acknowledged_loss(cluster, workload.acks)
        stats["read_back_s"] = round(time.monotonic() - t0, 1)
        problems += loss
    t0 = time.monotonic()
    problems += check_converged(cluster)
    stats["converge_s"] = round(time.monotonic() - t0, 1)
    run.monitor.stop()
    problems += check_counter_never_backwards(run.monitor.samples, len(cluster.nodes))
    ready = sum(s.ready for s in run.monitor.samples)
    summary = (
        f"[{name}] fixes={FIXES} scenario {scenario_s:.1f}s"
        f" + checks {time.monotonic() - run.started - scenario_s:.1f}s: "
        f"{len(workload.acks)} acknowledged, outcomes {dict(workload.outcomes)}, "
        f"abandoned {workload.abandoned}, {stats}, monitor {len(run.monitor.samples)} samples "
        f"({ready} ready); " + "; ".join(run.notes)
    )
    print(summary)
    assert not problems, (
        f"{len(problems)} problem(s) in {name} (fixes={FIXES}; node logs under {cluster.base_dir}):\n  - "
        + "\n  - ".join(problems)
        + "\n"
        + summary
    )


def restart(cluster: ProcessCluster, indices, timeout_s: float = 30.0) -> None:
    for i in indices:
        cluster.start(i, wait=False)
    for i in indices:
        cluster.wait_ping(i, timeout_s)


def status(cluster: ProcessCluster, i: int) -> dict:
    return cluster.nodes[i].call({"op": "status"})


def wait_caught_up(cluster: ProcessCluster, indices, timeout_s: float = 30.0) -> None:
    """Each node is ready and applied at least what the leader had committed when asked."""
    leader = cluster.wait_for_leader(timeout_s)
    target = status(cluster, leader)["commit_index"]

    def caught_up():
        for i in indices:
            s = status(cluster, i)
            if not s["ready"] or s["last_applied"] < target:
                return False
        return True

    wait_until(caught_up, timeout_s, what=f"nodes {list(indices)} to catch up to index {target}")


def freshest_follower(cluster: ProcessCluster, leader: int) -> int:
    """The live follower with the highest last_applied (then commit index) right now."""
    followers = [(s["last_applied"], s["commit_index"], i) for i, s in cluster.statuses().items() if i != leader]
    assert followers, "no live follower"
    return max(followers)[2]


def stalest_follower(cluster: ProcessCluster, leader: int) -> int:
    followers = [(s["last_applied"], s["commit_index"], i) for i, s in cluster.statuses().items() if i != leader]
    assert followers, "no live follower"
    return min(followers)[2]


def _dump_identity(cluster: ProcessCluster, i: int):
    try:
        st = os.stat(os.path.join(cluster.nodes[i].data_dir, DUMP_NAME))
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def kill_right_after_snapshot(run: Run, indices, timeout_s: float = 5.0) -> None:
    """kill -9 each node in ``indices`` the moment its next snapshot file is renamed into place.

    That is the crash point RAFT.md "Durability" calls a restart dropping acknowledged entries: the snapshot is newer
    than the journal head until the journal is compacted on the next tick, and stock
    pysyncobj then clears the whole journal on restart. Random kills rarely land there.
    """
    cluster = run.cluster
    before = {i: _dump_identity(cluster, i) for i in indices}
    for i in indices:
        cluster.nodes[i].call({"op": "compact"})
    pending = set(indices)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for i in sorted(pending):
            if _dump_identity(cluster, i) != before[i]:
                cluster.kill(i)
                pending.discard(i)
        time.sleep(0.0002)
    for i in sorted(pending):
        cluster.kill(i)
    if pending:
        run.notes.append(f"no new snapshot from {sorted(pending)} within {timeout_s}s: killed anyway")


def crash_nodes(run: Run, indices, *, at_snapshot: bool = False, power: bool = False) -> None:
    """kill -9 ``indices`` (all at once, or each right after its next snapshot); with
    ``power``, then also drop every journal byte each wrote after its last sync."""
    if at_snapshot:
        kill_right_after_snapshot(run, indices)
    else:
        for i in indices:
            run.cluster.kill(i)
    if power:
        for i in indices:
            old, new = cut_to_synced_length(run.cluster.nodes[i].data_dir)
            run.notes.append(f"power cut node {i}: journal {old} -> {new} bytes")


# -- scenarios ------------------------------------------------------------------------


def kill_leader_rounds(run: Run, rounds: int, power: bool) -> None:
    """Crash the leader (power: also the freshest follower on odd rounds) under load, restart it."""
    c, w = run.cluster, run.workload
    for rnd in range(rounds):
        run.step("load before the crash", w.wait_for_acks, 250, 30.0, f"round {rnd}")
        leader = run.step("leader before the crash", c.wait_for_leader, 15.0)
        victim = freshest_follower(c, leader) if power and rnd % 2 else leader
        at_snapshot = rnd % 4 >= 2  # rounds 2, 3: the crash lands right after a snapshot
        crash_nodes(run, [victim], at_snapshot=at_snapshot, power=power)
        if victim == leader:
            run.step("new leader", c.wait_for_leader, 15.0, exclude=leader)
        run.step("load with the node down", w.wait_for_acks, 50, 30.0, f"round {rnd}, node {victim} down")
        run.step("restart", restart, c, [victim])
        run.step("catch up", wait_caught_up, c, [victim])
        role = "leader" if victim == leader else "freshest follower"
        run.notes.append(f"round {rnd}: crashed {role} {victim}{' after a snapshot' if at_snapshot else ''}")
    run.step("load after the last round", w.wait_for_acks, 100, 30.0, "after the last round")


def two_node_rounds(run: Run, rounds: int, power: bool) -> None:
    """Pause the stalest follower, run on, crash the leader and the freshest follower, resume, restart."""
    c, w = run.cluster, run.workload
    for rnd in range(rounds):
        run.step("load", w.wait_for_acks, 200, 30.0, f"round {rnd}")
        leader = run.step("leader", c.wait_for_leader, 15.0)
        third = stalest_follower(c, leader)
        c.pause(third)
        # Everything acknowledged from now on is only on the leader and one follower,
        # and compaction (every 200 entries) runs on both meanwhile.
        run.step("load with the third paused", w.wait_for_acks, 400, 30.0, f"round {rnd}, node {third} paused")
        leader = run.step("leader", c.wait_for_leader, 15.0)
        fresh = freshest_follower(c, leader)
        crash_nodes(run, [leader, fresh], at_snapshot=rnd > 0, power=power)
        c.resume(third)
        run.step("restart", restart, c, [leader, fresh])
        run.step("leader after restart", c.wait_for_leader, 20.0)
        run.step("load after restart", w.wait_for_acks, 100, 30.0, f"round {rnd}, after restart")
        run.step("catch up", wait_caught_up, c, [0, 1, 2])
        run.notes.append(
            f"round {rnd}: paused {third}, crashed leader {leader} + follower {fresh}"
            + (" after their snapshots" if rnd > 0 else "")
        )


def all_nodes_rounds(run: Run, rounds: int, power: bool) -> None:
    """Crash all three nodes at once (round 1: each right after a snapshot), restart all."""
    c, w = run.cluster, run.workload
    for rnd in range(rounds):
        run.step("load", w.wait_for_acks, 300, 30.0, f"round {rnd}")
        crash_nodes(run, [0, 1, 2], at_snapshot=rnd % 2 == 1, power=power)
        run.step("restart", restart, c, [0, 1, 2])
        run.step("leader after restart", c.wait_for_leader, 20.0)
        run.step("load after restart", w.wait_for_acks, 100, 30.0, f"round {rnd}, after restart")
        run.step("catch up", wait_caught_up, c, [0, 1, 2])
        run.notes.append(f"round {rnd}: crashed all{' after their snapshots' if rnd % 2 else ''}")


@pytest.mark.timeout(150)
def test_kill_leader_repeatedly(tmp_path):
    """kill -9 the leader during a stream of acknowledged commands, restart it; 5 rounds."""
    with crash_run(tmp_path, "kill leader x5", compaction_entries=COMPACT_OFTEN) as run:
        kill_leader_rounds(run, 5, power=False)


@pytest.mark.timeout(150)
def test_kill_leader_and_freshest_follower_while_third_paused(tmp_path):
    """kill -9 the leader and the most up-to-date follower while the third node is paused."""
    with crash_run(tmp_path, "kill leader+freshest follower, third paused", compaction_entries=COMPACT_OFTEN) as run:
        two_node_rounds(run, 3, power=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compaction", [COMPACT_OFTEN, 5_000], ids=["compact200", "compact5000"])
def test_kill_all_and_restart(tmp_path, compaction):
    """kill -9 all three nodes, restart all; twice."""
    with crash_run(tmp_path, f"kill all (compaction {compaction})", compaction_entries=compaction) as run:
        all_nodes_rounds(run, 2, power=False)


@needs_durable_journal
@pytest.mark.timeout(150)
def test_power_loss_one_node(tmp_path):
    """Power-cut the leader or the freshest follower (alternately), restart it; 4 rounds."""
    with crash_run(tmp_path, "power loss one node x4", compaction_entries=COMPACT_OFTEN, track_synced=True) as run:
        kill_leader_rounds(run, 4, power=True)


@needs_durable_journal
@pytest.mark.timeout(150)
def test_power_loss_leader_and_freshest_follower_while_third_paused(tmp_path):
    """Power-cut the leader and the most up-to-date follower while the third is paused."""
    with crash_run(
        tmp_path, "power loss leader+freshest follower, third paused",
        compaction_entries=COMPACT_OFTEN, track_synced=True,
    ) as run:
        two_node_rounds(run, 3, power=True)


@needs_durable_journal
@pytest.mark.timeout(120)
def test_power_loss_all_nodes(tmp_path):
    """Power-cut all three nodes at once, restart all; twice."""
    with crash_run(tmp_path, "power loss all", compaction_entries=COMPACT_OFTEN, track_synced=True) as run:
        all_nodes_rounds(run, 2, power=True)

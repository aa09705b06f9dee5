"""Run a chaos profile: cluster + workload + nemesis schedule + recorder + checker + report.

One run = one cluster, one history. Client processes (``chaos.workload``) run all along, each
appending to its own JSONL; the runner appends faults, node samples, probe ops, ``final`` and
``final_state`` records to ``nemesis.jsonl``, and once the members are gone the members' own
``leader_report`` lines from their logs (``chaos.leader_reports``); at the end all are merged
into ``history.jsonl`` and checked with ``chaos.check``. Each member's data dir is on a small
filesystem of its own for the whole run (``chaos.small_fs``; the disk_full fault fills one).

Per fault: inject, hold (failover probes for leader faults), heal, then wait for convergence
(every node answers Status — a barrier through the log applied on that node, so it caught up —
all name one leader, and a probe acquire + write succeeds), then for every workload client to
have an acknowledgement after it (``SETTLE_TIMEOUT_S``). Every step has a hard deadline; a
whole-run watchdog tears everything down and exits 3 if the profile overruns, and so does a
fault's own one if its step overruns the fault's ``timeout_s``.

Figures: failover time (leader fault injected -> a probe write acknowledged; a fault whose
inject itself takes seconds, as disk_loss's restart and wait for the member's log line, counts
them too: the step's longest gap between acknowledgements is its availability figure),
convergence time (heal -> converged as above) and settle time (``settled_s``).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import types

from chaos import check as check_mod
from chaos import disk_clock_faults as DC
from chaos import exhaustion_faults as EF
from chaos import faults as F
from chaos import membership_faults as MF
from chaos import netns_claim
from chaos.convergence_trace import SLOW_CONVERGENCE_S, ConvergenceTrace, member_views
from chaos.harness import ChaosCluster, local_snapshots_at_one_index, network_teardown
from chaos.hazards import quiet_resource
from chaos.history import HistoryWriter, read_history
from chaos.leader_reports import leader_reports
from chaos.small_fs import DATA_FS_BYTES
from chaos.workload import KEYS, Recorder, make_client
from testsupport.supervisor import WaitTimeout, wait_until

RESOURCES = ["r0", "r1", "r2"]
PROBE_RESOURCES = [f"probe{i}" for i in range(6)]
CLIENTS = 4
# Contended resources (one key each) of the hazard roles (chaos.hazards).
HOT_RESOURCES = ["hot0", "hot1"]
CONTENTION_THREADS = 6
# Readers of hot0's key back to back: some read is nearly always in flight there, so the
# writes land in long overlapping runs (a 20 s trial: largest segment 13 ops without them, 151
# with 4, checked in 0.02 s).
CONTENTION_READERS = 4
# After a whole-cluster fault the workload clients are still backing off (retry_backoff_max_s,
# 0.5 s, per attempt) when the first probe write succeeds; a follower fault injected at once
# measured their backoff as its own gap (soak: 0.16-1.21 s right after a full restart or power
# loss of all three, 9-39 ms otherwise). So the next fault waits until every workload client
# has an acknowledgement after convergence: at most this long (then it goes on, and the step
# says so in ``settled_s``: None).
SETTLE_TIMEOUT_S = 10.0
# A leader fault's failover: from the fault until a probe write is acknowledged, at most this.
FAILOVER_TIMEOUT_S = 20.0
# The convergence wait looks again at least this often (its trace's resolution).
TRACE_ROUND_S = 2.0
# Enough of a client history's end to hold its last records whole (one op is < 1 KiB).
HISTORY_TAIL_BYTES = 16_384


class OutDirInUse(Exception):
    """A run needs a directory of its own."""


class Run:
    def __init__(self, out_dir: str, seed: int, *, hold_s: float = 3.0, converge_timeout_s: float = 45.0):
        self.out = os.path.abspath(out_dir)
        if os.path.isdir(self.out) and os.listdir(self.out):
            # History files are appended to and the cluster would start on the old run's
            # data: a reused directory mixes two runs and the checker reports nonsense.
            raise OutDirInUse(f"run directory {self.out} is not empty: give a new --out")
        os.makedirs(os.path.join(self.out, "clients"), exist_ok=True)
        self.seed = seed
        self.rng = random.Random(seed)
        random.seed(seed)  # follower choices in faults: the same seed replays the schedule
        self.hold_s = hold_s
        self.converge_timeout_s = converge_timeout_s
        # Data dirs on small filesystems of their own for the whole run: disk_full fills one.
        self.cluster = ChaosCluster(os.path.join(self.out, "cluster"), small_fs_bytes=DATA_FS_BYTES)
        self.writer = HistoryWriter(os.path.join(self.out, "nemesis.jsonl"))
        self.clients: list[subprocess.Popen] = []
        self.stop_sampler = threading.Event()
        self.steps: list[dict] = []
        self.errors: list[str] = []
        self.probe_n = 0
        self.probe_failure: str | None = None
        self.convergence_trace = ConvergenceTrace()
        self._probe_client = None
        self._probe_rec = None

    # -- records --------------------------------------------------------------------

    def fault_record(self, fault: F.Fault, action: str) -> int:
        t = time.monotonic_ns()
        self.writer.write({"type": "fault", "t_ns": t, "kind": fault.kind, "action": action, "nodes": fault.nodes})
        return t

    def sampler(self) -> None:
        while not self.stop_sampler.wait(0.4):
            try:
                st = self.cluster.statuses(timeout_s=1.0)
            except Exception:  # noqa: BLE001
                continue
            t = time.monotonic_ns()
            for i, s in st.items():
                node = self.cluster.nodes[i]
                self.writer.write({"type": "node", "t_ns": t, "node": node.raft_address, "term": int(s.term),
                                   "is_leader": s.leader == node.raft_address})

    def recorder(self, process: str) -> Recorder:
        return Recorder(make_client(self.cluster.endpoints, timeout_s=3.0), self.writer, process)

    # -- probe -----------------------------------------------------------------------

    def probe(self) -> bool:
        """One acquire + write + release on a probe resource; True if the write was
        acknowledged. What failed otherwise is in ``self.probe_failure``."""
        self.probe_failure = self._probe()
        return self.probe_failure is None

    def _probe(self) -> str | None:
        if self._probe_rec is None:
            self._probe_rec = self.recorder("probe")
        rec = self._probe_rec
        self.probe_n += 1
        resource = PROBE_RESOURCES[self.probe_n % len(PROBE_RESOURCES)]
        outcome, res = rec.acquire(resource, 1500, holder="probe")
        if outcome != "ok":
            return f"probe acquire {outcome}: {_brief(res)}"
        outcome, err = rec.write(resource, "a", f"probe-{self.probe_n}", res.token)
        rec.release(resource, res.token)
        return None if outcome == "ok" else f"probe write {outcome}: {_brief(err)}"

    def wait_converged(self, timeout_s: float) -> float | None:
        """Seconds until every member agrees on a leader and a probe write succeeds; None if
        not within ``timeout_s``. A member that exited on its own fails the run at once. What
        it waited on is in ``self.convergence_trace`` (chaos.convergence_trace)."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        trace = self.convergence_trace = ConvergenceTrace(t0)

        def converged():
            try:
                # Rounds of at most TRACE_ROUND_S, so the trace sees the members' views change.
                self.cluster.wait_ready(timeout_s=min(TRACE_ROUND_S, max(0.5, deadline - time.monotonic())))
            except WaitTimeout as exc:
                # What it waited for, not the message: its timeout and last error differ each
                # round, and would make every round a new note.
                trace.note(f"{exc.what} [{member_views(self.cluster.nodes)}]")
                return False
            if self.probe():
                return True
            trace.note(self.probe_failure or "probe failed")
            return False

        try:
            wait_until(converged, timeout_s, interval_s=0.1, what="convergence")
        except TimeoutError:
            return None
        return time.monotonic() - t0

    def wait_workload_flowing(self, since_ns: int, timeout_s: float) -> float | None:
        """Seconds until every workload client (c0.jsonl ...) acknowledged an op that completed
        after ``since_ns`` (monotonic ns); None if not within ``timeout_s``."""
        t0 = time.monotonic()
        paths = glob.glob(os.path.join(self.out, "clients", "c[0-9]*.jsonl"))
        try:
            wait_until(lambda: all((last_ack_ns(p) or 0) > since_ns for p in paths), timeout_s,
                       interval_s=0.05, what="every workload client acknowledged again")
        except TimeoutError:
            return None
        return time.monotonic() - t0

    # -- clients ----------------------------------------------------------------------

    def start_clients(self, n: int = CLIENTS) -> None:
        for k in range(n):
            out = os.path.join(self.out, "clients", f"c{k}.jsonl")
            proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.workload", "--process", f"c{k}", "--endpoints",
                 ",".join(self.cluster.endpoints), "--out", out, "--resources", ",".join(RESOURCES),
                 "--seed", str(self.seed * 100 + k)],
                stdout=open(os.path.join(self.out, "clients", f"c{k}.log"), "w"), stderr=subprocess.STDOUT,
            )
            self.cluster.adopt(proc.pid)
            self.clients.append(proc)
        self.start_watcher()
        self.start_hazard_roles()

    def start_watcher(self) -> None:
        """One watcher of the workload's resources (chaos.workload --watch), checked by
        chaos.watch_check: every acknowledged change seen once, in order."""
        out = os.path.join(self.out, "clients", "w0.jsonl")
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaos.workload", "--process", "w0", "--endpoints",
             ",".join(self.cluster.endpoints), "--out", out, "--watch", "r"],
            stdout=open(os.path.join(self.out, "clients", "w0.log"), "w"), stderr=subprocess.STDOUT,
        )
        self.cluster.adopt(proc.pid)
        self.clients.append(proc)

    def start_hazard_roles(self) -> None:
        """Contention, hostile clients and the operator (chaos.hazards), one process each."""
        roles = [("contention", "cx", ["--threads", str(CONTENTION_THREADS), "--readers", str(CONTENTION_READERS)]),
                 ("hostile", "hx", []),
                 ("operator", "op", [])]
        for k, (role, name, extra) in enumerate(roles):
            out = os.path.join(self.out, "clients", f"{name}.jsonl")
            proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.hazards", "--role", role, "--process", name, "--endpoints",
                 ",".join(self.cluster.endpoints), "--out", out, "--resources", ",".join(HOT_RESOURCES),
                 "--seed", str(self.seed * 100 + 50 + k), *extra],
                stdout=open(os.path.join(self.out, "clients", f"{name}.log"), "w"), stderr=subprocess.STDOUT,
            )
            self.cluster.adopt(proc.pid)
            self.clients.append(proc)

    def stop_clients(self) -> None:
        for p in self.clients:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.clients:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.errors.append(f"client pid {p.pid} did not stop: killed (an op may be missing)")
                p.kill()
                p.wait()

    # -- one fault ---------------------------------------------------------------------

    def run_fault(self, fault: F.Fault, hold_s: float) -> dict:
        watchdog = None
        if fault.timeout_s is not None:
            watchdog = threading.Timer(fault.timeout_s + hold_s, self._overrun, (f"{fault.kind} (its step)",))
            watchdog.daemon = True
            watchdog.start()
        try:
            return self._run_fault(fault, hold_s)
        finally:
            if watchdog is not None:
                watchdog.cancel()

    def _run_fault(self, fault: F.Fault, hold_s: float) -> dict:
        step: dict = {"kind": fault.kind}
        t_start = time.monotonic()
        leadership_before = self.leadership()
        try:
            t_inject = self.fault_record_after(fault, "inject")
            step["inject_t_ns"] = t_inject
            if fault.kind == "client_gc_pause":
                step["gc_pause"] = fault.info
            hold_until = time.monotonic() + hold_s
            if fault.leader_fault:
                # failover: from inject until a probe write is acknowledged (bounded)
                bound_s = max(hold_s, FAILOVER_TIMEOUT_S)
                try:
                    wait_until(self.probe, bound_s, interval_s=0.05, what="a probe write")
                    step["failover_s"] = round((time.monotonic_ns() - t_inject) / 1e9, 3)
                except TimeoutError:
                    step["failover_s"] = None
                    # The members' election timeout is 0.5-1 s: no write in this long is a
                    # failure of the cluster (or, as once, of the runner's own probe), not a figure.
                    self.errors.append(f"{fault.kind}: no probe write acknowledged within {bound_s} s of "
                                       f"the fault (failover): {self.probe_failure}")
            time.sleep(max(0.0, hold_until - time.monotonic()))  # the fault's hold: a duration
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"{fault.kind}: inject failed: {exc!r}")
            step["error"] = repr(exc)
            traceback.print_exc()
        try:
            fault.heal(self.cluster)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"{fault.kind}: heal failed: {exc!r}")
            network_teardown()
        t_heal = self.fault_record(fault, "heal")
        step["heal_t_ns"] = t_heal
        step["info"] = fault.info  # as it stands after heal (a fault may fill it in there)
        if fault.failure is not None and fault.info.get("ok") is False:
            self.errors.append(f"{fault.kind}: {fault.failure}: {fault.info}")
        conv = self.wait_converged(self.converge_timeout_s)
        step["convergence_s"] = round(conv, 3) if conv is not None else None
        if conv is None or conv >= SLOW_CONVERGENCE_S:
            step["convergence_trace"] = self.convergence_trace.record()
            # CPU starvation against the chaos members' 0.5-1 s election timeout was the cause
            # of the slow convergences traced so far: the machine's load belongs with the trace.
            step["load_avg_1m"] = round(os.getloadavg()[0], 1)
        if conv is None:
            self.errors.append(f"{fault.kind}: no convergence within {self.converge_timeout_s}s after heal")
        else:
            settled = self.wait_workload_flowing(time.monotonic_ns(), SETTLE_TIMEOUT_S)
            step["settled_s"] = round(settled, 3) if settled is not None else None
        self.check_leadership_kept(fault, step, leadership_before)
        step["seconds"] = round(time.monotonic() - t_start, 2)
        print(f"[chaos] {fault.kind:24s} failover={step.get('failover_s', '-')} convergence={step['convergence_s']}"
              f" leader_changes={step['leader_changes']} ({step['seconds']} s)", flush=True)
        if fault.info.get("summary"):  # what a fault proved it did (clock read, files torn)
            print(f"[chaos]   {fault.info['summary']}", flush=True)
        if "convergence_trace" in step:
            print(f"[chaos]   convergence waited on (load average {step['load_avg_1m']}): "
                  f"{self.convergence_trace.render()}", flush=True)
        return step

    def leadership(self) -> tuple[str, int] | None:
        """(leader's Raft address, term) as the highest-term answering member names them."""
        best = None
        for status in self.cluster.statuses().values():
            if status.leader and (best is None or status.term > best.term):
                best = status
        return None if best is None else (best.leader, best.term)

    def check_leadership_kept(self, fault: F.Fault, step: dict, before: tuple[str, int] | None) -> None:
        """A follower fault must leave the leader leading in its term (an election, even one the
        same member wins, is a leader change: every term has its own leader)."""
        after = self.leadership()
        step["leadership"] = {"before": before, "after": after}
        moved = before is not None and after is not None and before != after
        step["leader_changes"] = (after[1] - before[1]) if moved else 0
        if fault.keeps_leader and moved:
            self.errors.append(f"{fault.kind}: a follower fault moved the leadership: {before[0]} in term {before[1]}"
                               f" -> {after[0]} in term {after[1]}")

    def fault_record_after(self, fault: F.Fault, action: str) -> int:
        """Inject, then write the record (the fault's node list is known only after inject);
        the time recorded is the time just before inject."""
        t = time.monotonic_ns()
        fault.inject(self.cluster)
        self.writer.write({"type": "fault", "t_ns": t, "kind": fault.kind, "action": action, "nodes": fault.nodes})
        return t

    # -- the end -----------------------------------------------------------------------

    def finals(self) -> dict:
        """final (per-node digest at one applied index) and final_state records."""
        out: dict = {"digest": None}
        nodes = self.cluster.nodes
        # One linearizable barrier first: every member then converges on the same last
        # index, and local snapshots (no barrier of their own) stop moving it, so the
        # replicas can be compared at one applied index.
        try:
            nodes[0].snapshot(10.0)
        except Exception:  # noqa: BLE001 - reported below if the members never agree
            pass
        try:
            snaps, attempts = local_snapshots_at_one_index(nodes, 30.0)
        except TimeoutError:
            pass
        else:
            for n, s in zip(nodes, snaps, strict=True):
                self.writer.write({"type": "final", "node": n.raft_address, "applied_index": int(s.index),
                                   "digest": hashlib.sha256(s.data).hexdigest()})
            out["digest"] = {"index": int(snaps[0].index), "attempts": attempts,
                             "equal": len({hashlib.sha256(s.data).digest() for s in snaps}) == 1}
        if out["digest"] is None:
            self.errors.append("final digests: nodes never snapshotted at one applied index (no final records)")
        client = make_client(self.cluster.endpoints, timeout_s=10.0)
        resources = sorted(set(RESOURCES + HOT_RESOURCES + PROBE_RESOURCES + self.gc_resources()
                               + [quiet_resource("hx")]))
        for r in resources:
            d = client.describe(r)
            data = {}
            for key in (KEYS if r in RESOURCES else ("a",)):
                rd = client.read(r, key)
                if rd.found:
                    data[key] = {"value": rd.value.decode(), "version": int(rd.version)}
            self.writer.write({"type": "final_state", "resource": r, "hwm": int(d.hwm), "data": data})
        client.close()
        return out

    def write_leader_reports(self) -> None:
        """The members' own reports of who led each term (chaos.leader_reports), read from
        their logs once every member is gone."""
        for node in self.cluster.nodes:
            try:
                records = leader_reports(node.log_path, node.raft_address)
            except OSError as exc:
                self.errors.append(f"leader reports of {node.raft_address}: {exc}")
                continue
            for record in records:
                self.writer.write(record)

    def gc_resources(self) -> list[str]:
        return [s["gc_pause"]["resource"] for s in self.steps if s.get("gc_pause", {}).get("resource")]

    def merge(self) -> str:
        path = os.path.join(self.out, "history.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            for src in [os.path.join(self.out, "nemesis.jsonl")] + sorted(
                glob.glob(os.path.join(self.out, "clients", "*.jsonl"))
            ):
                with open(src, encoding="utf-8") as f:
                    for line in f:
                        if line.strip():
                            out.write(line if line.endswith("\n") else line + "\n")
        return path

    # -- the whole run -------------------------------------------------------------------

    def execute(self, profile: str, schedule_fn, budget_s: float) -> dict:
        t0 = time.monotonic()
        self.writer.write({"type": "meta", "profile": profile, "seed": self.seed, "started_ns": time.monotonic_ns(),
                           "endpoints": self.cluster.endpoints})
        watchdog = threading.Timer(budget_s, self._overrun)
        watchdog.daemon = True
        watchdog.start()
        final_info: dict = {}
        try:
            network_teardown()
            self.cluster.start_all(timeout_s=60)
            sampler = threading.Thread(target=self.sampler, daemon=True)
            sampler.start()
            self.start_clients()
            time.sleep(2.0)
            for fault, hold in schedule_fn(self):
                self.steps.append(self.run_fault(fault, hold))
            time.sleep(1.0)
            self.stop_clients()
            conv = self.wait_converged(self.converge_timeout_s)
            if conv is None:
                self.errors.append("final convergence failed")
            self.stop_sampler.set()
            final_info = self.finals()
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"run aborted: {exc!r}")
            traceback.print_exc()
        finally:
            self.stop_sampler.set()
            self.stop_clients()
            self.cluster.close()
            watchdog.cancel()
            if self._probe_rec is not None:
                self._probe_rec.client.close()
            self.write_leader_reports()
            self.writer.close()
        history_path = self.merge()
        history = read_history(history_path)
        report = check_mod.check_history(history)
        with open(os.path.join(self.out, "check.json"), "w") as f:
            json.dump(report.to_dict(), f, indent=2, default=str)
        from chaos.report import write_report

        summary = write_report(self.out, history, report, self.steps, self.errors, final_info,
                               profile=profile, seed=self.seed, wall_s=time.monotonic() - t0)
        return summary

    def _overrun(self, what: str = "profile") -> None:
        print(f"[chaos] {what} overran its budget: tearing down", file=sys.stderr, flush=True)
        try:
            self.cluster.close()
        finally:
            os._exit(3)


def ci_plan(run: Run):
    with_delay = F.delay_available()
    if not with_delay:
        print("[chaos] delay fault skipped: netfilterqueue not importable", flush=True)
    for fault in F.ci_schedule(lambda: run.recorder("gc-owner"), os.path.join(run.out, "clients"), with_delay):
        yield fault, run.hold_s
    for fault in deeper_faults(run.rng, ci=True):
        yield fault, run.hold_s
    # The leader's disk full, then its descriptors exhausted, each with an election meanwhile.
    for fault in exhaustion_faults(run.rng, ci=True):
        yield fault, run.hold_s
    # A lost disk, then its replace (the leader's: an election on top of the change).
    yield MF.DiskLoss(os.path.join(run.out, "clients"), "leader"), run.hold_s


def deeper_faults(rng: random.Random, ci: bool) -> list[F.Fault]:
    """Clock steps (leader and follower, forward and back) and torn power loss. CI takes one
    step each way (leader forward, follower back) and one torn power loss; a soak draws."""
    if ci:
        return [DC.ClockStep("leader", 3600), DC.ClockStep("follower", -3600),
                DC.TornPowerLoss("leader", seed=rng.randrange(2**32), require_snapshot=True)]
    return [rng.choice([
        lambda: DC.ClockStep(rng.choice(["leader", "follower"]), rng.choice([3600, -3600, 120, -120])),
        lambda: DC.TornPowerLoss(rng.choice(["leader", "all"]), seed=rng.randrange(2**32)),
    ])()]


def exhaustion_faults(rng: random.Random, ci: bool) -> list[F.Fault]:
    """A full disk and exhausted descriptors: CI takes each once on the leader (the member
    whose term and journal writes matter most); a soak draws one, leader or follower."""
    if ci:
        return [EF.DiskFull("leader"), EF.FdExhaustion("leader")]
    kind = rng.choice([EF.DiskFull, EF.FdExhaustion])
    return [kind(rng.choice(["leader", "follower"]))]


def soak_draw(run: Run) -> tuple[F.Fault, float]:
    """One soak fault and its hold: a fifth clock or torn-disk faults, a twentieth lost disks,
    a tenth exhaustion, the rest the classic kinds."""
    clients = os.path.join(run.out, "clients")
    pick = run.rng.random()
    if pick < 0.2:
        fault = deeper_faults(run.rng, ci=False)[0]
    elif pick < 0.25:
        fault = MF.random_disk_loss(run.rng, clients)
    elif pick < 0.35:
        fault = exhaustion_faults(run.rng, ci=False)[0]
    else:
        fault = F.random_fault(run.rng, lambda: run.recorder("gc-owner"), clients, F.delay_available())
    return fault, run.rng.uniform(5, 15)


# ``--only``: redraws per fault before the plan gives up on the given kinds.
ONLY_DRAWS_MAX = 10_000


def soak_kinds(draws: int = 5_000) -> set[str]:
    """Every fault kind a soak can draw, found by drawing from a throwaway seed (fault
    constructors do no I/O), so ``--only`` is checked before a cluster starts."""
    probe = types.SimpleNamespace(rng=random.Random(0), out="", recorder=lambda name: None)
    return {soak_draw(probe)[0].kind for _ in range(draws)}


def unmatched_only(only: frozenset[str]) -> list[str]:
    """The ``--only`` entries that name no soak fault kind (nor a prefix of one)."""
    kinds = soak_kinds()
    return sorted(k for k in only if not any(kind.startswith(k) for kind in kinds))


def soak_plan(minutes: float, only: frozenset[str] = frozenset()):
    """Faults drawn at random until ``minutes`` pass. ``only``: kinds or kind prefixes
    ("disk_loss", "pause_leader"); other draws are discarded (the schedule stays a function of
    the seed)."""

    def plan(run: Run):
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            for _ in range(ONLY_DRAWS_MAX):
                fault, hold = soak_draw(run)
                if not only or any(fault.kind.startswith(k) for k in only):
                    break
            else:
                raise ValueError(f"--only {','.join(sorted(only))}: no drawn fault kind matches")
            yield fault, hold

    return plan


def run_profile(profile: str, out_dir: str, seed: int | None = None, minutes: float = 30.0,
                only: frozenset[str] = frozenset()) -> tuple[int, dict]:
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 2**31)
    bad = unmatched_only(only)
    if bad:
        raise ValueError(f"--only: no soak fault kind starts with {', '.join(bad)}; kinds: "
                         + ", ".join(sorted(soak_kinds())))
    if profile not in ("ci", "soak"):
        raise SystemExit(f"unknown profile {profile}")
    netns_claim.claim()  # before anything is made: PacketFiltersBusy leaves no trace
    try:
        print(f"[chaos] profile={profile} seed={seed} out={out_dir}", flush=True)
        if profile == "ci":
            run = Run(out_dir, seed, hold_s=3.0)
            summary = run.execute("ci", ci_plan, budget_s=8 * 60)
        else:
            run = Run(out_dir, seed, hold_s=5.0, converge_timeout_s=60.0)
            summary = run.execute("soak", soak_plan(minutes, only), budget_s=minutes * 60 + 20 * 60)
    finally:
        netns_claim.release()
    code = 0 if summary["violations"] == 0 and not summary["errors"] else 1
    return code, summary


def _brief(failure: object, chars_max: int = 160) -> str:
    """An error, short enough for one trace note."""
    text = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else str(failure)
    return text if len(text) <= chars_max else text[: chars_max - 3] + "..."


def last_ack_ns(path: str) -> int | None:
    """complete_ns of the last acknowledged op in the client history at ``path``, read from its
    last ``HISTORY_TAIL_BYTES`` (the file is being appended to: a line cut at either end of
    that window does not parse and is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - HISTORY_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    return next((end for end in map(MF.ack_end_ns, reversed(tail.split(b"\n"))) if end is not None), None)

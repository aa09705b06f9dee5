"""``python -m bench scale``: what the size of the state costs a member (issue 17, point 4).

Benchmark-only: figures, never assertions about speed. Starts three real ``fencingd serve``
members on 127.0.0.2/.3/.4 (``testsupport.grpc_cluster``, production timings, fsynced journal),
each under ``bench._scale_node`` (the same server with timing probes on its snapshots and its
Raft thread), loads N resources through the public gRPC API (each an Acquire with a live lease
and one Write of one key), and reports:

  * the load rate;
  * each member's RSS at N (``/proc/<pid>/status`` VmRSS; VmHWM, the peak, beside it);
  * a snapshot of the leader, forced (SIGUSR1 to the probe: pysyncobj's forceLogCompaction):
    its time and size, and the longest stall of the leader's Raft thread meanwhile, measured
    inside (the probe's slowest tick body) and outside (a sequential writer's slowest write);
  * a restore: a follower takes a snapshot, is killed and restarted; the time until it is
    SERVING again, and the time its start spent loading the snapshot (inside);
  * KeepAliveMany keeping every lease alive: renewals per second, leader CPU per renewal, and
    the p99 of fenced writes meanwhile, beside the same writes alone.

What each figure means and how it is taken: bench/README.md, "python -m bench scale".
"""

from __future__ import annotations

import argparse
import array
import concurrent.futures
import functools
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time

from bench._harness import (
    cpu_model,
    ensure_repo_on_path,
    fdatasync_cost,
    fs_type,
    git_state,
    host_cpu_s,
    percentile,
    proc_cpu_s,
    sigterm_as_interrupt,
    wait_for_idle_host,
)

ensure_repo_on_path()

import grpc  # noqa: E402

from coordinator.api.v1 import fencing_pb2 as pb  # noqa: E402
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc  # noqa: E402
from coordinator.core import limits  # noqa: E402
from coordinator.raft.snapshot_file import DUMP_NAME  # noqa: E402
from testsupport.grpc_cluster import SERVING, GrpcCluster  # noqa: E402
from testsupport.supervisor import child_env, wait_until  # noqa: E402

# Production timings (config.ServerConfig defaults, as bench.grpc_bench runs them), overriding
# grpc_cluster's test ones: a snapshot's stall is judged against the election timeout members
# really have. Compaction stays at its defaults (50,000 entries, 300 s, 64 MiB), so the load
# also takes the snapshots a member takes in service.
CLUSTER_SETTINGS = {
    "raft_min_timeout_s": 1.0,
    "raft_max_timeout_s": 2.0,
    "leader_fallback_timeout_s": 1.5,
    "health_check_interval_s": 1.0,
    "log_level": "WARNING",
}
# One Acquire or Write waits out an election at most (1-2 s) plus a busy machine.
RPC_TIMEOUT_S = 10.0
# A KeepAliveMany of 1,000 items is 1,000 proposals: a second or two on a loaded leader.
KEEPALIVE_RPC_TIMEOUT_S = 60.0
# A call refused as retryable (an election, OVERLOADED) is sent again, with the same op_id,
# for at most this long before it counts as an error.
RETRY_FOR_S = 30.0
# Pause after a retryable refusal (OVERLOADED asks callers to back off).
RETRY_PAUSE_S = 0.02
# The lease of every loaded resource: the longest TTL allowed, so every lease stays live
# through a load of any length without renewals; the keep-alive phase renews them anyway.
LEASE_TTL_MS = limits.LEASE_TTL_MS_MAX
VALUE_BYTES = 32  # the one key's value: STATE_STORED_BYTES_MAX allows ~2 M such keys
KEY = "k"
# Resources per AcquireMany and per WriteMany while loading: the most one call takes. With the
# default 2 processes x 2 threads that is 256 proposals in flight, a member's default
# inflight_proposals_max, so the load is not refused OVERLOADED while it runs.
LOAD_BATCH = limits.ACQUIRE_MANY_ITEMS_MAX
# A snapshot of the full state takes seconds at most; a restart loads it and catches up.
SNAPSHOT_WAIT_S = 300.0
RESTART_WAIT_S = 300.0
# Writes timed before a forced snapshot (the trickle's usual latency) and after its end.
TRICKLE_BEFORE_S = 2.0
TRICKLE_AFTER_S = 1.0
RETRYABLE = ("UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def resource_name(i: int) -> str:
    return f"scale/{i:08d}"


# -- the cluster ------------------------------------------------------------------------------


class ScaleCluster(GrpcCluster):
    """GrpcCluster whose members run under bench._scale_node, each with its timings file."""

    def command(self, node) -> list[str]:
        return [sys.executable, "-m", "bench._scale_node", "serve", "--config", node.config_path]

    def env(self, node) -> dict:
        return child_env({"SCALE_TIMINGS_FILE": self.timings_path(node.index)})

    def timings_path(self, i: int) -> str:
        return os.path.join(self.base_dir, f"node{i}.timings.jsonl")

    def timings(self, i: int, kind: str | None = None, since: float = 0.0, pid: int | None = None) -> list[dict]:
        """The probe's records of member ``i`` (of ``kind``, starting at or after ``since``)."""
        out = []
        try:
            with open(self.timings_path(i), encoding="utf-8") as f:
                for line in f:
                    if not line.endswith("\n"):
                        break  # being written
                    rec = json.loads(line)
                    if ((kind is None or rec["kind"] == kind) and rec["t0"] >= since
                            and (pid is None or rec["pid"] == pid)):
                        out.append(rec)
        except OSError:
            pass
        return out


def rss(pid: int) -> dict:
    """VmRSS and VmHWM of ``pid`` in bytes, from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


def serving(node) -> bool:
    return node.health_status(timeout_s=0.5) == SERVING


class HostMeter:
    """Cores the host spent over a phase: ours (members, client processes, this one), other
    processes' (``other``: this machine is shared) and the hypervisor's (``steal``)."""

    def __init__(self, cluster, pool) -> None:
        self.cluster, self.pool = cluster, pool

    def _ours_s(self) -> float:
        pids = [n.proc.pid for n in self.cluster.nodes if n.alive]
        pids += list(getattr(self.pool, "_processes", None) or {})  # the client processes
        return sum(c for c in (proc_cpu_s(p) for p in [*pids, os.getpid()]) if c == c)

    def __enter__(self):
        self.t0, (self.busy0, self.steal0), self.ours0 = time.monotonic(), host_cpu_s(), self._ours_s()
        self.cores: dict = {}
        return self

    def __exit__(self, *exc) -> None:
        wall = time.monotonic() - self.t0
        (busy, steal), ours = host_cpu_s(), self._ours_s()
        self.cores.update({
            "ours": (ours - self.ours0) / wall, "steal": (steal - self.steal0) / wall,
            "other": max(0.0, (busy - self.busy0) - (steal - self.steal0) - (ours - self.ours0)) / wall,
        })


# -- client processes -------------------------------------------------------------------------


def _error_kind(err) -> str:
    from bench._grpc_worker import _raw_error_kind

    return _raw_error_kind(err)


def _call(method, request, errors: dict, timeout_s: float = RPC_TIMEOUT_S):
    """``method(request)``, sent again while refused as retryable; None after a final error."""
    give_up = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as err:
            kind = _error_kind(err)
            if kind.split("/")[0] in RETRYABLE and time.monotonic() < give_up:
                errors[f"retried {kind}"] = errors.get(f"retried {kind}", 0) + 1
                time.sleep(RETRY_PAUSE_S)
                continue
            errors[kind] = errors.get(kind, 0) + 1
            return None


def _call_many(method, request_of, items: dict, outcome: str, errors: dict) -> dict:
    """One Many call (AcquireMany, WriteMany) of ``items`` (index -> request item), sent again
    for the items refused as retryable, with the same op_ids, for at most RETRY_FOR_S.
    Returns index -> the ``outcome`` field of each item that succeeded."""
    done: dict = {}
    pending = dict(items)
    give_up = time.monotonic() + RETRY_FOR_S
    while pending:
        got = _call(method, request_of(list(pending.values())), errors)
        if got is None:
            return done
        retry = {}
        for (j, item), result in zip(pending.items(), got.results, strict=True):
            if result.WhichOneof("outcome") != "error":
                done[j] = getattr(result, outcome)
                continue
            kind = f"{result.error.code}/{result.error.reason}"
            if result.error.code in RETRYABLE and time.monotonic() < give_up:
                errors[f"retried {kind}"] = errors.get(f"retried {kind}", 0) + 1
                retry[j] = item
            else:
                errors[kind] = errors.get(kind, 0) + 1
        pending = retry
        if pending:
            time.sleep(RETRY_PAUSE_S)
    return done


def load_slice(target: str, first: int, count: int, threads: int) -> dict:
    """Client process: acquire and write resources first .. first+count-1 with ``threads``
    threads, each on its own channel, LOAD_BATCH resources an AcquireMany and a WriteMany at
    a time. Returns their tokens (0: failed) and the errors."""
    tokens = array.array("Q", bytes(8 * count))
    errors: dict = {}
    lock = threading.Lock()
    value = b"v" * VALUE_BYTES

    def body(t: int) -> None:
        mine: dict = {}
        with grpc.insecure_channel(target) as channel:
            lease, store = pb_grpc.LeaseStub(channel), pb_grpc.FencedStoreStub(channel)
            for start in range(t * LOAD_BATCH, count, threads * LOAD_BATCH):
                batch = range(start, min(start + LOAD_BATCH, count))
                acquired = _call_many(lease.AcquireMany, lambda items: pb.AcquireManyRequest(acquires=items), {
                    j: pb.AcquireRequest(resource=resource_name(first + j), holder="bench-scale",
                                         ttl_ms=LEASE_TTL_MS, op_id=os.urandom(16)) for j in batch}, "acquire", mine)
                wrote = _call_many(store.WriteMany, lambda items: pb.WriteManyRequest(writes=items), {
                    j: pb.WriteRequest(resource=resource_name(first + j), key=KEY, value=value, token=got.token,
                                       op_id=os.urandom(16)) for j, got in acquired.items()}, "write", mine)
                for j in wrote:
                    tokens[j] = acquired[j].token
        with lock:
            for kind, n in mine.items():
                errors[kind] = errors.get(kind, 0) + n

    pool = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return {"tokens": tokens.tobytes(), "errors": errors}


def keepalive_run(target: str, leases: list[tuple[str, int]], threads: int, batch: int,
                  t_start: float, t_end: float) -> dict:
    """Client process: from ``t_start``, ``threads`` threads renew ``leases`` with KeepAliveMany,
    ``batch`` items a call, round and round, starting no call after ``t_end``."""
    counts = {"ok": 0, "refused": 0, "calls": 0, "sweeps": 0}
    errors: dict = {}
    call_ms: list[float] = []
    lock = threading.Lock()
    parts = [leases[t::threads] for t in range(threads)]

    def body(part) -> None:
        ok = refused = calls = sweeps = 0
        mine: dict = {}
        lat = []
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.LeaseStub(channel)
            time.sleep(max(0.0, t_start - time.monotonic()))
            while time.monotonic() < t_end:
                for i in range(0, len(part), batch):
                    if time.monotonic() >= t_end:
                        break
                    request = pb.KeepAliveManyRequest(leases=[
                        pb.KeepAliveRequest(resource=name, token=token) for name, token in part[i:i + batch]])
                    t0 = time.monotonic()
                    got = _call(stub.KeepAliveMany, request, mine, KEEPALIVE_RPC_TIMEOUT_S)
                    lat.append((time.monotonic() - t0) * 1e3)
                    calls += 1
                    if got is not None:
                        n_ok = sum(1 for r in got.results if r.ok)
                        ok += n_ok
                        refused += len(got.results) - n_ok
                        for r in got.results:
                            if not r.ok:
                                mine[r.reason] = mine.get(r.reason, 0) + 1
                else:
                    sweeps += 1
        with lock:
            counts["ok"] += ok
            counts["refused"] += refused
            counts["calls"] += calls
            counts["sweeps"] += sweeps
            call_ms.extend(lat)
            for kind, n in mine.items():
                errors[kind] = errors.get(kind, 0) + n

    pool = [threading.Thread(target=body, args=(part,)) for part in parts]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    call_ms.sort()
    return {**counts, "errors": errors, "t_done": time.monotonic(),
            "call_ms_p50": percentile(call_ms, 0.5), "call_ms_max": call_ms[-1] if call_ms else float("nan")}


def writers_run(target: str, leases: list[tuple[str, int]], t_start: float, t_end: float) -> dict:
    """Client process: one thread per lease writes its resource's key, one write after the
    other, from ``t_start`` to ``t_end``; the latencies of the writes that ended in the window."""
    lat = array.array("d")
    errors: dict = {}
    lock = threading.Lock()
    value = b"w" * VALUE_BYTES

    def body(name: str, token: int) -> None:
        mine = array.array("d")
        bad: dict = {}
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.FencedStoreStub(channel)
            stub.Write(pb.WriteRequest(resource=name, key=KEY, value=value, token=token,
                                       op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S)  # connect first
            time.sleep(max(0.0, t_start - time.monotonic()))
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                try:
                    stub.Write(pb.WriteRequest(resource=name, key=KEY, value=value, token=token,
                                               op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as err:
                    kind = _error_kind(err)
                    bad[kind] = bad.get(kind, 0) + 1
                    continue
                t1 = time.monotonic()
                if t1 <= t_end:
                    mine.append((t1 - t0) * 1e3)
        with lock:
            lat.extend(mine)
            for kind, n in bad.items():
                errors[kind] = errors.get(kind, 0) + n

    pool = [threading.Thread(target=body, args=lease) for lease in leases]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return {"latencies": lat.tobytes(), "errors": errors}


def _latency_summary(raw: bytes, seconds: float) -> dict:
    lat = sorted(array.array("d", raw))
    return {"writes": len(lat), "writes_per_s": len(lat) / seconds, "p50_ms": percentile(lat, 0.5),
            "p99_ms": percentile(lat, 0.99), "max_ms": lat[-1] if lat else float("nan")}


# -- phases -----------------------------------------------------------------------------------


def load(pool, target: str, n: int, procs: int, threads: int) -> tuple[dict, list[tuple[str, int]]]:
    per = -(-n // procs)
    t0 = time.monotonic()
    futures = [pool.submit(load_slice, target, first, min(per, n - first), threads)
               for first in range(0, n, per)]
    tokens: list[int] = []
    errors: dict = {}
    for fut in futures:
        res = fut.result()
        tokens.extend(array.array("Q", res["tokens"]))
        for kind, count in res["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    seconds = time.monotonic() - t0
    leases = [(resource_name(i), tok) for i, tok in enumerate(tokens) if tok]
    return ({"resources": n, "loaded": len(leases), "seconds": seconds, "resources_per_s": len(leases) / seconds,
             "entries_per_s": 2 * len(leases) / seconds, "clients": procs * threads, "errors": errors}, leases)


def leader_and_term(cluster) -> tuple[int, int]:
    """The leader every member agrees on (waiting out an election) and its term."""
    leader = cluster.wait_ready(timeout_s=60)
    return leader, cluster.nodes[leader].status().term


def wait_applied(cluster, leader: int, timeout_s: float = 120.0) -> None:
    """Every member applied what the leader had committed when this was called."""
    target = cluster.nodes[leader].status().commit_index

    def caught_up():
        st = cluster.statuses()
        return len(st) == len(cluster.nodes) and all(s.applied_index >= target for s in st.values())

    wait_until(caught_up, timeout_s, interval_s=0.2, what="every member to apply the load")


def force_snapshot(cluster, i: int) -> tuple[float, dict]:
    """SIGUSR1 member ``i``; wait for the snapshot it starts. (signal time, serialize record)."""
    t_sig = time.monotonic()
    os.kill(cluster.nodes[i].proc.pid, signal.SIGUSR1)

    def taken():
        cluster.nodes[i].check_running()
        recs = cluster.timings(i, "serialize", since=t_sig)
        return recs[0] if recs else None

    return t_sig, wait_until(taken, SNAPSHOT_WAIT_S, interval_s=0.05, what=f"member {i}'s snapshot")


class Trickle:
    """One thread writing one resource's key, one write after the other: (start, ms) of each."""

    def __init__(self, target: str, lease: tuple[str, int]) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.FencedStoreStub(self.channel)
        self.lease = lease
        self.samples: list[tuple[float, float]] = []
        self.errors: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickle", daemon=True)

    def _run(self) -> None:
        name, token = self.lease
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.stub.Write(pb.WriteRequest(resource=name, key=KEY, value=b"t" * VALUE_BYTES, token=token,
                                                op_id=os.urandom(16)), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as err:
                kind = _error_kind(err)
                self.errors[kind] = self.errors.get(kind, 0) + 1
                continue
            self.samples.append((t0, (time.monotonic() - t0) * 1e3))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=RPC_TIMEOUT_S + 1)
        self.channel.close()


def snapshot_stall(cluster, leader: int, lease: tuple[str, int]) -> dict:
    """Force a snapshot on the leader while a trickle of writes runs; what it cost."""
    target = cluster.nodes[leader].api_address
    with Trickle(target, lease) as trickle:
        time.sleep(TRICKLE_BEFORE_S)  # the trickle's usual latency, measured before the snapshot
        t_sig, ser = force_snapshot(cluster, leader)
        t_ser_end = ser["t0"] + ser["ms"] / 1e3
        time.sleep(TRICKLE_AFTER_S)  # the next tick drops the journal head; writes queued meanwhile land
        t_end = time.monotonic()
    before = sorted(ms for t0, ms in trickle.samples if t0 + ms / 1e3 < t_sig)  # ended before the signal
    # Writes in flight at any moment from the signal to the end: one of them waited out the stall.
    during = [ms for t0, ms in trickle.samples if t0 <= t_end and t0 + ms / 1e3 >= t_sig]
    writes = cluster.timings(leader, "snapshot_write", since=t_sig)
    captures = cluster.timings(leader, "snapshot_capture", since=t_sig)
    compactions = cluster.timings(leader, "compaction", since=t_sig - 1.0)
    compactions = [c for c in compactions if c["t0"] + c["ms"] / 1e3 >= t_sig and c["t0"] <= t_end]
    ticks = cluster.timings(leader, "slow_tick", since=t_sig - 30.0)
    ticks = [t for t in ticks if t["t0"] + t["ms"] / 1e3 >= t_sig and t["t0"] <= t_end]
    write_ms = writes[0]["ms"] if writes else float("nan")
    write_cpu_ms = writes[0]["cpu_ms"] if writes else float("nan")
    inside = max([c["ms"] for c in compactions] + [t["ms"] for t in ticks], default=float("nan"))
    return {
        "snapshot_ms": ser["ms"],
        "state_ms": ser["ms"] - write_ms,  # the state machine's snapshot() under the apply lock
        "write_ms": write_ms,  # msgpack, write, fsync
        "snapshot_cpu_ms": ser["cpu_ms"],  # the Raft thread's CPU time in it: the work, not the waits
        "state_cpu_ms": ser["cpu_ms"] - write_cpu_ms,
        "write_cpu_ms": write_cpu_ms,
        "bytes": ser.get("bytes", 0),
        # Applying paused while the writer thread read the state (snapshot_writer.py);
        # NaN for a build that reads it on the Raft thread.
        "capture_ms": captures[0]["ms"] if captures else float("nan"),
        "snapshot_thread": ser.get("thread", ""),
        "signal_to_start_ms": (ser["t0"] - t_sig) * 1e3,
        "compaction_calls_ms": [c["ms"] for c in compactions],
        "slow_ticks_ms": [t["ms"] for t in ticks],
        "stall_inside_ms": inside,
        "trickle_p50_before_ms": percentile(before, 0.5),
        "trickle_max_before_ms": before[-1] if before else float("nan"),  # the machine's own noise
        "trickle_max_during_ms": max(during, default=float("nan")),
        "trickle_writes": len(trickle.samples),
        "trickle_errors": trickle.errors,
        "serialize_end_to_trickle_end_s": t_end - t_ser_end,
    }


def restore(cluster, follower: int) -> dict:
    """A follower takes a snapshot, is killed and started again: how long until SERVING."""
    force_snapshot(cluster, follower)  # so the restart loads a fresh snapshot and replays little after it
    node = cluster.nodes[follower]
    before = rss(node.proc.pid)
    cluster.kill(follower)
    t_spawn = time.monotonic()
    cluster.start(follower)
    pid = node.proc.pid

    def up():
        node.check_running()
        return serving(node)

    wait_until(up, RESTART_WAIT_S, interval_s=0.02, what=f"member {follower} SERVING after a restart")
    serving_s = time.monotonic() - t_spawn
    started = cluster.timings(follower, "start", since=t_spawn, pid=pid)
    loads = cluster.timings(follower, "load_dump", since=t_spawn, pid=pid)
    deser = cluster.timings(follower, "deserialize", since=t_spawn, pid=pid)
    reads = cluster.timings(follower, "snapshot_read", since=t_spawn, pid=pid)
    return {
        "member": follower,
        "restart_to_serving_s": serving_s,
        "interpreter_start_s": (started[0]["t0"] - t_spawn) if started else float("nan"),
        "load_dump_ms": loads[0]["ms"] if loads else float("nan"),
        "load_dump_cpu_ms": loads[0]["cpu_ms"] if loads else float("nan"),
        "deserialize_ms": deser[0]["ms"] if deser else float("nan"),
        "read_file_ms": reads[0]["ms"] if reads else float("nan"),
        "snapshot_bytes": deser[0].get("bytes", 0) if deser else 0,
        "rss_before": before,
        "rss_after": rss(pid),
    }


def keepalive_phase(pool, cluster, leader: int, leases, args) -> dict:
    target = cluster.nodes[leader].api_address
    writer_leases = leases[: args.writers]
    pids = {i: n.proc.pid for i, n in enumerate(cluster.nodes)}

    def window(with_keepalive: bool) -> dict:
        t_start = time.monotonic() + 2.0  # time for the client processes to connect
        t_end = t_start + args.window_s
        writes = pool.submit(writers_run, target, writer_leases, t_start, t_end)
        renew = (pool.submit(keepalive_run, target, leases, args.keepalive_threads, args.batch, t_start, t_end)
                 if with_keepalive else None)
        time.sleep(max(0.0, t_start - time.monotonic()))
        with HostMeter(cluster, pool) as host:
            cpu0 = {i: proc_cpu_s(pid) for i, pid in pids.items()}
            w = writes.result()
            r = renew.result() if renew is not None else None
            t_done = max(t_end, r["t_done"]) if r else t_end
            cpu1 = {i: proc_cpu_s(pid) for i, pid in pids.items()}
        seconds = t_done - t_start
        out = {"seconds": seconds, "cpu_s": {i: cpu1[i] - cpu0[i] for i in pids}, "cores": host.cores,
               "writes": _latency_summary(w["latencies"], args.window_s), "write_errors": w["errors"]}
        if r is not None:
            out["keepalive"] = {k: v for k, v in r.items() if k != "t_done"}
        return out

    alone = window(False)
    both = window(True)
    renewals = both["keepalive"]["ok"]
    cpu_per_write = alone["cpu_s"][leader] / max(1, alone["writes"]["writes"])
    leader_cpu = both["cpu_s"][leader]
    renewal_cpu = leader_cpu - both["writes"]["writes"] * cpu_per_write
    rate = renewals / both["seconds"]
    return {
        "writes_alone": alone,
        "writes_with_keepalive": both,
        "renewals": renewals,
        "renewals_per_s": rate,
        "sweep_s": len(leases) / rate if rate else float("nan"),
        "leader_cpu_ms_per_renewal": 1e3 * renewal_cpu / max(1, renewals),
        "leader_cpu_ms_per_renewal_raw": 1e3 * leader_cpu / max(1, renewals),
        "followers_cpu_ms_per_renewal":
            1e3 * sum(c for i, c in both["cpu_s"].items() if i != leader) / max(1, renewals),
        "leader_cpu_ms_per_write_alone": 1e3 * cpu_per_write,
    }


# -- report ------------------------------------------------------------------------------------


def figures(report: dict) -> dict:
    """The headline figures, flat (what the table prints and the smoke test checks)."""
    members = report["rss_at_n"]
    stalls = report["snapshots"]
    ka = report["keepalive"]
    n = report["load"]["loaded"]
    start = report["rss_at_start"]
    return {
        "load_resources_per_s": report["load"]["resources_per_s"],
        **{f"rss_mib_member{i}": m["VmRSS"] / 2**20 for i, m in sorted(members.items())},
        "rss_bytes_per_resource": max(m["VmRSS"] - start[i]["VmRSS"] for i, m in members.items()) / max(1, n),
        "snapshot_ms": max(s["snapshot_ms"] for s in stalls),
        "snapshot_cpu_ms": min(s["snapshot_cpu_ms"] for s in stalls),
        "snapshot_mib": max(s["bytes"] for s in stalls) / 2**20,
        "stall_inside_ms": max(s["stall_inside_ms"] for s in stalls),
        "snapshot_capture_ms": max(s.get("capture_ms", float("nan")) for s in stalls),
        "stall_outside_ms": max(s["trickle_max_during_ms"] for s in stalls),
        "restore_load_ms": report["restore"]["load_dump_ms"],
        "restore_load_cpu_ms": report["restore"]["load_dump_cpu_ms"],
        "restart_to_serving_s": report["restore"]["restart_to_serving_s"],
        "renewals_per_s": ka["renewals_per_s"],
        "leader_cpu_ms_per_renewal": ka["leader_cpu_ms_per_renewal"],
        "write_p99_ms_alone": ka["writes_alone"]["writes"]["p99_ms"],
        "write_p99_ms_with_keepalive": ka["writes_with_keepalive"]["writes"]["p99_ms"],
    }


def print_table(report: dict) -> None:
    f = report["figures"]
    info = report["info"]
    load_ = report["load"]
    ka = report["keepalive"]
    rows = [
        ("load", f"{f['load_resources_per_s']:,.0f} resources/s ({load_['entries_per_s']:,.0f} entries/s)",
         f"{load_['loaded']:,} of {load_['resources']:,} in {load_['seconds']:.0f} s, {load_['clients']} clients"),
        *[(f"RSS member {i}{' (leader)' if i == report['keepalive']['leader'] else ''}",
           f"{m['VmRSS'] / 2**20:,.0f} MiB", f"peak {m['VmHWM'] / 2**20:,.0f} MiB, at start "
           f"{report['rss_at_start'][i]['VmRSS'] / 2**20:,.0f} MiB, after the load (log not compacted) "
           f"{report['rss_after_load'][i]['VmRSS'] / 2**20:,.0f} MiB")
          for i, m in sorted(report["rss_at_n"].items())],
        ("RSS per resource", f"{f['rss_bytes_per_resource']:,.0f} B",
         "largest (RSS at N - RSS at start) / N of the members"),
        ("snapshot (leader)", f"{f['snapshot_ms']:,.0f} ms", f"{f['snapshot_mib']:.1f} MiB; slowest of "
         + ", ".join(f"{s['snapshot_ms']:.0f} (state {s['state_ms']:.0f} + write {s['write_ms']:.0f})"
                     for s in report["snapshots"])),
        ("applying paused (leader)", f"{f['snapshot_capture_ms']:,.1f} ms",
         "longest wait of committed entries for a snapshot: from its start until its first piece fixed the state"),
        ("snapshot CPU (leader)", f"{f['snapshot_cpu_ms']:,.0f} ms", "least CPU of the snapshotting thread of "
         + ", ".join(f"{s['snapshot_cpu_ms']:.0f} (state {s['state_cpu_ms']:.0f} + write {s['write_cpu_ms']:.0f})"
                     for s in report["snapshots"])),
        ("Raft-thread stall (inside)", f"{f['stall_inside_ms']:,.0f} ms", "slowest tick body / compaction call"),
        ("Raft-thread stall (outside)", f"{f['stall_outside_ms']:,.0f} ms",
         "slowest sequential write meanwhile; before it p50 / max "
         + ", ".join(f"{s['trickle_p50_before_ms']:.1f} / {s['trickle_max_before_ms']:.0f}"
                     for s in report["snapshots"]) + " ms"),
        ("restore (load snapshot)", f"{f['restore_load_ms']:,.0f} ms",
         f"member {report['restore']['member']}, {report['restore']['snapshot_bytes'] / 2**20:.1f} MiB, "
         f"CPU {f['restore_load_cpu_ms']:,.0f} ms"),
        ("restart to SERVING", f"{f['restart_to_serving_s']:.2f} s",
         f"of which interpreter start {report['restore']['interpreter_start_s']:.2f} s"),
        ("KeepAliveMany renewals", f"{f['renewals_per_s']:,.0f}/s",
         f"every lease once per {ka['sweep_s']:.0f} s; {ka['writes_with_keepalive']['keepalive']['calls']} calls"),
        ("leader CPU per renewal", f"{f['leader_cpu_ms_per_renewal']:.3f} ms",
         f"raw {ka['leader_cpu_ms_per_renewal_raw']:.3f} ms; followers {ka['followers_cpu_ms_per_renewal']:.3f} ms"),
        ("write p99 alone", f"{f['write_p99_ms_alone']:.1f} ms",
         f"{ka['writes_alone']['writes']['writes_per_s']:,.0f} writes/s, {report['info']['writers']} writers"),
        ("write p99 with keep-alives", f"{f['write_p99_ms_with_keepalive']:.1f} ms",
         f"{ka['writes_with_keepalive']['writes']['writes_per_s']:,.0f} writes/s, max "
         f"{ka['writes_with_keepalive']['writes']['max_ms']:.0f} ms"),
    ]
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print(f"scale: N={info['resources']:,}  git {info['git']}  {info['nproc']} CPUs ({info['cpu']})  "
          f"fdatasync p50 {info['fdatasync_ms']:.2f} ms on {info['fs']}")
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>{vwidth}}  {note}")
    bg = report["background"]
    phases = [("load", load_["cores"]), *(("snapshot", x["cores"]) for x in report["snapshots"]),
              ("writes", ka["writes_alone"]["cores"]), ("keep-alives", ka["writes_with_keepalive"]["cores"])]
    print("  cores used by other processes / stolen, by phase: "
          + ", ".join(f"{name} {c['other']:.2f}/{c['steal']:.2f}" for name, c in phases)
          + f" (ours: load {load_['cores']['ours']:.2f}); load average {info['loadavg'][0]:.1f} at the start")
    print(f"  during the load: {bg['snapshots']} snapshots on the members (slowest {bg['snapshot_ms_max']:.0f} ms), "
          f"slowest Raft tick {bg['slow_tick_ms_max']:.0f} ms; {bg['gc_passes']} GC passes over 20 ms (slowest "
          f"{bg['gc_ms_max']:.0f} ms), {bg['gc_passes_raft_thread']} on a Raft thread"
          f" (slowest {bg['gc_ms_max_raft_thread']:.0f} ms)")
    moved = [name for name, phase in (("load", load_), *(("snapshot", x) for x in report["snapshots"]),
                                      ("keep-alives", ka), ("restart", report["restore"]))
             if phase["terms"][0] != phase["terms"][1]]
    print(f"  Raft term {info['term_start']} -> {info['term_end']}"
          + (f"; leadership moved during: {', '.join(moved)} (its figures are not of one leader)" if moved else
             "; the leader never changed"))


def background(cluster, since: float, until: float) -> dict:
    sers, ticks, gcs = [], [], []
    for i in range(len(cluster.nodes)):
        sers += [r for r in cluster.timings(i, "serialize", since=since) if r["t0"] <= until]
        ticks += [r for r in cluster.timings(i, "slow_tick", since=since) if r["t0"] <= until]
        gcs += [r for r in cluster.timings(i, "gc", since=since) if r["t0"] <= until]
    raft_gcs = [r for r in gcs if "_autoTickThread" in r.get("thread", "")]  # "Thread-N (_autoTickThread)"
    return {"snapshots": len(sers), "snapshot_ms_max": max((r["ms"] for r in sers), default=0.0),
            "slow_ticks": len(ticks), "slow_tick_ms_max": max((r["ms"] for r in ticks), default=0.0),
            "gc_passes": len(gcs), "gc_ms_max": max((r["ms"] for r in gcs), default=0.0),
            "gc_passes_raft_thread": len(raft_gcs),
            "gc_ms_max_raft_thread": max((r["ms"] for r in raft_gcs), default=0.0)}


def run(args, base_dir: str) -> dict:
    settings = {**CLUSTER_SETTINGS, **args.settings}
    if args.wait_idle_s > 0:
        busy = wait_for_idle_host(args.wait_idle_s, log=log)
        log(f"scale: the host was busy {busy:.2f} cores when the run started")
    info = {"resources": args.resources, "git": git_state(), "nproc": os.cpu_count(), "cpu": cpu_model(),
            "fs": fs_type(base_dir), "fdatasync_ms": fdatasync_cost(base_dir)["p50_ms"], "settings": settings,
            "procs": args.procs, "threads": args.threads, "writers": args.writers, "loadavg": os.getloadavg()}
    with ScaleCluster(os.path.join(base_dir, "cluster"), settings=settings) as cluster, \
            concurrent.futures.ProcessPoolExecutor(
                max_workers=max(args.procs, 2), mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            cluster.start_all(timeout_s=60)
            leader, term = leader_and_term(cluster)
        except BaseException:
            print(cluster.logs(), file=sys.stderr)
            raise
        info["leader"] = leader
        info["term_start"] = term
        report: dict = {"info": info}
        report["rss_at_start"] = {i: rss(n.proc.pid) for i, n in enumerate(cluster.nodes)}
        target = cluster.nodes[leader].api_address
        log(f"scale: loading {args.resources:,} resources through {target} "
            f"({args.procs} processes x {args.threads} threads)")
        t_load = time.monotonic()
        with HostMeter(cluster, pool) as host:
            report["load"], leases = load(pool, target, args.resources, args.procs, args.threads)
        report["load"]["cores"] = host.cores
        log(f"scale: loaded {report['load']['loaded']:,} in {report['load']['seconds']:.0f} s "
            f"({report['load']['resources_per_s']:,.0f}/s); errors {report['load']['errors']}")
        if len(leases) <= args.writers:
            raise SystemExit(f"scale: only {len(leases)} resources loaded; see {cluster.base_dir}")
        # Leadership can move during a phase (a member starved of CPU on this shared machine
        # misses its heartbeats): each phase finds the leader again and records the terms.
        leader, term = leader_and_term(cluster)
        report["load"]["terms"] = [info["term_start"], term]
        wait_applied(cluster, leader)
        report["background"] = background(cluster, t_load, time.monotonic())
        report["rss_after_load"] = {i: rss(n.proc.pid) for i, n in enumerate(cluster.nodes)}
        for i in range(len(cluster.nodes)):
            if i != leader:  # the leader's come next, under a trickle of writes
                force_snapshot(cluster, i)  # its log compacted, as a member in service has it
        log("scale: snapshots of the leader under a trickle of writes")
        report["snapshots"] = []
        for _ in range(args.snapshots):
            leader, term = leader_and_term(cluster)
            with HostMeter(cluster, pool) as host:
                stall = snapshot_stall(cluster, leader, leases[0])
            report["snapshots"].append({**stall, "cores": host.cores, "leader": leader,
                                        "terms": [term, leader_and_term(cluster)[1]]})
        # At N with every member's log compacted: the state, not the entries that built it.
        report["rss_at_n"] = {i: rss(n.proc.pid) for i, n in enumerate(cluster.nodes)}
        report["dump_bytes"] = {i: _size(os.path.join(n.data_dir, DUMP_NAME)) for i, n in enumerate(cluster.nodes)}
        log("scale: keep-alives")
        leader, term = leader_and_term(cluster)
        report["keepalive"] = keepalive_phase(pool, cluster, leader, leases, args)
        report["keepalive"].update(leader=leader, terms=[term, leader_and_term(cluster)[1]])
        leader, term = leader_and_term(cluster)
        follower = next(i for i in range(len(cluster.nodes)) if i != leader)
        log(f"scale: restarting member {follower}")
        report["restore"] = restore(cluster, follower)
        leader, info["term_end"] = leader_and_term(cluster)
        report["restore"].update(leader=leader, terms=[term, info["term_end"]])
        report["figures"] = figures(report)
        return report


# -- the state machine alone (--in-process) ---------------------------------------------------


def in_process(n: int, base_dir: str) -> dict:
    """The state machine alone, in this process, with ``n`` resources as the load leaves them
    (an ACQUIRE and a WRITE each, applied directly): its memory, and the CPU of the steps of a
    snapshot and a restore, each with the cyclic GC off as replica.py runs them. Not limited to
    RESOURCES_MAX: the machine is built with ``resources_max=n`` (a constructor argument, not a
    setting of fencingd), to see what a larger limit would cost before anyone raises it."""
    import gc

    import msgpack

    from coordinator.core import commands
    from coordinator.core.state_machine import FencingStateMachine
    from coordinator.raft import snapshot_file
    from coordinator.raft.replica import freeze_long_lived

    def own_rss() -> int:
        return rss(os.getpid())["VmRSS"]

    def timed(fn):
        gc.disable()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            value = fn()
        finally:
            gc.enable()
        return value, {"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - c0) * 1e3}

    gc.collect()
    rss0 = own_rss()
    sm = FencingStateMachine(resources_max=max(n, limits.RESOURCES_MAX), state_keys_max=max(n, limits.STATE_KEYS_MAX))
    value, stamp, c0 = b"v" * VALUE_BYTES, 1_000, time.process_time()
    for i in range(n):
        name = resource_name(i)
        got = sm.apply(commands.acquire(resource=name, holder="bench-scale", ttl_ms=LEASE_TTL_MS,
                                        op_id=os.urandom(16), stamp_ms=stamp + 2 * i).encode(), 2 * i + 1)
        sm.apply(commands.write(resource=name, key=KEY, value=value, token=got.result.token,
                                op_id=os.urandom(16), stamp_ms=stamp + 2 * i + 1).encode(), 2 * i + 2)
    apply_cpu_s = time.process_time() - c0
    gc.collect()
    rss_n = own_rss()
    out: dict = {"resources": n, "apply_us_per_command": apply_cpu_s / (2 * n) * 1e6,
                 "rss_bytes": rss_n, "rss_bytes_per_resource": (rss_n - rss0) / n}
    state, out["snapshot"] = timed(sm.snapshot)
    out["state_bytes"] = len(state)
    path = os.path.join(base_dir, DUMP_NAME)
    last, prev = (b"", 2 * n, 1), (b"", 2 * n - 1, 1)
    _, out["snapshot_write"] = timed(functools.partial(snapshot_file.write, path, last, prev, state, None))
    # What the snapshot writer thread does instead (snapshot_writer.py): the state in pieces,
    # each one a stretch the GIL is held for (the longest is what the Raft thread can wait on
    # it), then the file written from the pieces.
    piece_ms: list[float] = []

    def read_pieces() -> list[bytes]:
        pieces, produce = [], iter(sm.snapshot_pieces())
        while True:
            t0 = time.perf_counter()
            piece = next(produce, None)
            piece_ms.append((time.perf_counter() - t0) * 1e3)
            if piece is None:
                return pieces
            pieces.append(piece)

    pieces, out["snapshot_pieces"] = timed(read_pieces)
    out["snapshot_pieces"].update(count=len(pieces), longest_ms=max(piece_ms))
    _, out["snapshot_write_pieces"] = timed(
        functools.partial(snapshot_file.write_pieces, path, last, prev, pieces, None))
    del pieces
    body, out["snapshot_read"] = timed(lambda: snapshot_file.read_body(path))
    parts, out["snapshot_decode"] = timed(functools.partial(snapshot_file.decode, body))
    _, out["restore"] = timed(lambda parts=parts: FencingStateMachine().restore(parts[2]))
    del body, parts, state
    # A full pass of the cyclic GC walks every container the state holds; it runs in whichever
    # thread allocates when it is due, the Raft thread included (replica.py pauses it only
    # around snapshots and restores).
    _, out["gc_full"] = timed(gc.collect)
    # What a member does after each snapshot and restore (replica.freeze_long_lived): the
    # state moves to the permanent generation, and a full pass walks only what is not frozen.
    _, out["gc_freeze"] = timed(freeze_long_lived)
    _, out["gc_full_after_freeze"] = timed(gc.collect)
    gc.unfreeze()
    out["msgpack_version"] = ".".join(map(str, msgpack.version))
    return out


def print_in_process(res: dict) -> None:
    print(f"scale --in-process: the state machine alone, N={res['resources']:,} "
          f"(apply {res['apply_us_per_command']:.1f} us/command)")
    rows = [
        ("RSS per resource", f"{res['rss_bytes_per_resource']:,.0f} B",
         f"{res['rss_bytes'] / 2**20:,.0f} MiB in all (this process)"),
        ("StateMachine.snapshot()", f"{res['snapshot']['cpu_ms']:,.0f} ms CPU",
         f"{res['snapshot']['ms']:,.0f} ms wall; {res['state_bytes'] / 2**20:.1f} MiB"),
        ("snapshot_file.write", f"{res['snapshot_write']['cpu_ms']:,.0f} ms CPU",
         f"{res['snapshot_write']['ms']:,.0f} ms wall: msgpack, crc32, write, fsync"),
        *([("snapshot_pieces()", f"{res['snapshot_pieces']['cpu_ms']:,.0f} ms CPU",
            f"{res['snapshot_pieces']['ms']:,.0f} ms wall, {res['snapshot_pieces']['count']:,} pieces, "
            f"longest {res['snapshot_pieces']['longest_ms']:.1f} ms (applying paused meanwhile)"),
           ("snapshot_file.write_pieces", f"{res['snapshot_write_pieces']['cpu_ms']:,.0f} ms CPU",
            f"{res['snapshot_write_pieces']['ms']:,.0f} ms wall: crc32, write, fsync (writer thread)")]
          if "snapshot_pieces" in res else []),
        ("read + decode", f"{res['snapshot_read']['cpu_ms'] + res['snapshot_decode']['cpu_ms']:,.0f} ms CPU",
         f"{res['snapshot_read']['ms'] + res['snapshot_decode']['ms']:,.0f} ms wall"),
        ("StateMachine.restore()", f"{res['restore']['cpu_ms']:,.0f} ms CPU", f"{res['restore']['ms']:,.0f} ms wall"),
        ("a full GC pass", f"{res['gc_full']['cpu_ms']:,.0f} ms CPU",
         f"{res['gc_full']['ms']:,.0f} ms wall (gc.collect())"),
        *([("a full GC pass, state frozen", f"{res['gc_full_after_freeze']['cpu_ms']:,.0f} ms CPU",
            f"{res['gc_full_after_freeze']['ms']:,.0f} ms wall, after freeze_long_lived() "
            f"({res['gc_freeze']['ms']:,.1f} ms)")] if "gc_full_after_freeze" in res else []),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>14}  {note}")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _setting(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return key.strip(), kind(value)
        except ValueError:
            pass
    return key.strip(), {"true": True, "false": False}.get(value.strip(), value.strip())


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--resources", type=int, default=100_000,
                   help=f"N, resources to load, each with a live lease and one key (at most RESOURCES_MAX, "
                        f"{limits.RESOURCES_MAX:,}: a constant, no setting raises it)")
    p.add_argument("--out", help="write every figure as JSON here")
    p.add_argument("--procs", type=int, default=2, help="client processes that load (default 2)")
    p.add_argument("--threads", type=int, default=2,
                   help=f"threads per loading process, each with {LOAD_BATCH} resources a call (default 2)")
    p.add_argument("--writers", type=int, default=4, help="fenced writers beside the keep-alives (default 4)")
    p.add_argument("--keepalive-threads", type=int, default=2, help="concurrent KeepAliveMany callers (default 2)")
    p.add_argument("--batch", type=int, default=limits.KEEP_ALIVE_BATCH_ITEMS_MAX,
                   help=f"leases per KeepAliveMany (default {limits.KEEP_ALIVE_BATCH_ITEMS_MAX})")
    p.add_argument("--window-s", type=float, default=15.0, help="seconds of each keep-alive window (default 15)")
    p.add_argument("--snapshots", type=int, default=3, help="forced leader snapshots (default 3)")
    p.add_argument("--setting", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="a fencingd setting for every member (repeatable)")
    p.add_argument("--in-process", action="store_true",
                   help="no cluster: the state machine alone in this process, at any N (even past RESOURCES_MAX)")
    p.add_argument("--wait-idle-s", type=float, default=0.0,
                   help="first wait up to this long for the host to be idle (this machine is shared)")
    p.add_argument("--dir", help="keep the cluster's data and logs here (default: a temporary directory)")
    args = p.parse_args(argv)
    args.settings = dict(_setting(s) for s in args.settings)
    if not 0 < args.resources <= limits.RESOURCES_MAX and not (args.in_process and args.resources > 0):
        p.error(f"--resources must be 1..{limits.RESOURCES_MAX:,}: RESOURCES_MAX is a constant of "
                "coordinator/core/limits.py, not a setting (--in-process measures the state machine alone past it)")
    if not 0 < args.batch <= limits.KEEP_ALIVE_BATCH_ITEMS_MAX:
        p.error(f"--batch must be 1..{limits.KEEP_ALIVE_BATCH_ITEMS_MAX}")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.in_process:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as base:
            report = {"in_process": in_process(args.resources, base)}
        print_in_process(report["in_process"])
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1, default=str)
        return 0
    with sigterm_as_interrupt():
        if args.dir:
            os.makedirs(args.dir, exist_ok=True)
            report = run(args, args.dir)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=os.environ.get("BENCH_DIR")) as base:
                report = run(args, base)
    print_table(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Failover side by side (bench.compare): the leader is SIGKILLed or SIGSTOPped; how long until
a client's next acquire and write both succeed.

Benchmark-only. Owns: one trial — probe clients on every member made while all are up, the
signal, the probes racing until one acquire+write succeeds, then the member restarted or
resumed and the cluster ready again before the next trial. Must never: start, signal or reap
a process itself (the cluster's supervisor does), nor wait without a deadline.

A probe starts a new attempt (acquire + write on a fresh resource) on every member every
PROBE_INTERVAL_S, each on a client of its own taken from a pool made while all members were up
(the same client classes the throughput runs use); an attempt's calls wait up to
PROBE_RPC_TIMEOUT_S. So a call stuck on a stopped member, or held by a member until an election
ends, does not hide the moment the cluster can serve again: the figure is from the signal to
the end of the first successful write, within about PROBE_INTERVAL_S (plus one acquire + write)
of that moment.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time

from bench._grpc_worker import make_client

# One call of an attempt. Short, because both systems hold a call made while there is no
# leader until its deadline (etcd drops the proposal and answers only at the deadline), while
# an attempt started once a leader is back takes milliseconds: the deadline frees the client
# for a new attempt, and never cuts one that starts after the cluster can serve again.
PROBE_RPC_TIMEOUT_S = 0.5
PROBE_INTERVAL_S = 0.05  # a new attempt on each member this often
# Attempts in flight per member, at most: twice the PROBE_RPC_TIMEOUT_S / PROBE_INTERVAL_S
# that calls stuck until their deadline can take, so a member never runs out of clients.
PROBE_CLIENTS_PER_MEMBER = 20
TRIAL_TIMEOUT_S = 30.0  # no successful write this long after the signal: the trial failed
READY_TIMEOUT_S = 60.0  # the cluster whole again (restart or resume) before the next trial
KINDS = ("kill", "stop")  # SIGKILL then restart; SIGSTOP then SIGCONT


class _Probe:
    """Attempts racing on every member until one acquire + write succeeds."""

    def __init__(self, system: str, cluster, run_id: str) -> None:
        self.pools: list[queue.SimpleQueue] = []
        self.clients = []
        for node in cluster.nodes:
            pool: queue.SimpleQueue = queue.SimpleQueue()
            for k in range(PROBE_CLIENTS_PER_MEMBER):
                client = make_client({"system": system, "mode": "raw", "workload": "cycle", "run_id": run_id,
                                      "target": node.api_address, "rpc_timeout_s": PROBE_RPC_TIMEOUT_S},
                                     f"probe{node.index}-{k}")
                client.setup()  # untimed, all members up: etcd's hwm key (ours needs nothing)
                pool.put(client)
                self.clients.append(client)
            self.pools.append(pool)
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.result: dict = {}
        self.base = f"failover/{run_id}-{os.urandom(3).hex()}"
        self.attempts = itertools.count()
        self.threads: list[threading.Thread] = []

    def _attempt(self, client, pool) -> None:
        client.resource = f"{self.base}/{next(self.attempts)}"
        try:
            client.acquire_then_write()
        except Exception as exc:  # noqa: BLE001 - an RPC failure is expected; anything else is a bug
            if client.error_kind(exc) is None:
                with self.lock:
                    self.result.setdefault("bugs", []).append(repr(exc))
                self.done.set()
            pool.put(client)
            return
        with self.lock:
            if "end" not in self.result:
                self.result.update(end=time.monotonic(), member=client.spec["target"])
        self.done.set()
        pool.put(client)

    def race(self, deadline: float) -> None:
        """Start attempts until one succeeded or ``deadline`` (monotonic) passed."""
        while not self.done.is_set() and time.monotonic() < deadline:
            for pool in self.pools:
                try:
                    client = pool.get_nowait()
                except queue.Empty:
                    continue  # every client of this member is stuck in a call
                t = threading.Thread(target=self._attempt, args=(client, pool), daemon=True)
                t.start()
                self.threads.append(t)
            self.done.wait(PROBE_INTERVAL_S)

    def close(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(PROBE_RPC_TIMEOUT_S * 3 + 5)
        for c in self.clients:
            c.channel.close()


def trial(system: str, cluster, kind: str, run_id: str) -> dict:
    """One failover of ``cluster``'s leader; ``system`` is "ours" or "etcd" (which client).
    Returns {"seconds": signal -> first successful write, "leader": old, "member": who answered}."""
    leader = cluster.wait_ready(READY_TIMEOUT_S)
    probe = _Probe(system, cluster, run_id)
    t0 = time.monotonic()
    try:
        if kind == "kill":
            cluster.kill(leader)
        else:
            cluster.pause(leader)
        probe.race(t0 + TRIAL_TIMEOUT_S)
    finally:
        if kind == "kill":
            cluster.start(leader)
        else:
            cluster.resume(leader)
        probe.close()
    if "bugs" in probe.result:
        raise RuntimeError(f"failover probe failed: {probe.result['bugs'][0]}")
    seconds = probe.result["end"] - t0 if "end" in probe.result else float("nan")
    # Whole again (the old leader back as a follower) before the next trial.
    cluster.wait_ready(READY_TIMEOUT_S)
    return {"seconds": seconds, "leader": leader, "member": probe.result.get("member")}


def run(sides: dict, trials: int, log, rows: list[dict]) -> None:
    """``trials`` failovers of each kind for each side ({"ours": cluster, "etcd": cluster}, and
    any other name for another cluster of ours), alternating sides trial by trial; one row
    per trial appended to ``rows``."""
    for kind in KINDS:
        for n in range(trials):
            order = list(sides) if n % 2 == 0 else list(reversed(list(sides)))
            for system in order:
                client_system = "etcd" if system == "etcd" else "ours"
                row = trial(client_system, sides[system], kind, f"f{kind}{n}")
                row.update(system=system, kind=kind, trial=n)
                rows.append(row)
                log(f"  failover {system:4s} {kind:4s} #{n + 1}: {row['seconds'] * 1000:7.0f} ms "
                    f"(leader was node {row['leader']}; answered by {row['member']})")


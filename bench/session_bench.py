"""``python -m bench session``: N leases kept alive by one session (issue 29 point 5).

Benchmark-only: figures, never assertions about speed. Starts three real ``fencingd serve``
members on 127.0.0.2/.3/.4 (``testsupport.grpc_cluster``, production Raft timings, fsynced
journal), takes ``--leases`` leases in one ``client.session(ttl_ms)`` in this process, keeps
them for ``--seconds`` (default three TTLs) and prints, for this client process:

  * threads: Python threads (``threading.active_count``) and OS threads (``/proc/self/status``
    Threads, gRPC's own included) before the session, with the leases held, and at the end;
  * CPU seconds of this process over the window (user + system, every thread), and per renewal;
  * renewal lag percentiles: per lease renewed, its answer's arrival minus the moment it was
    due (renewed_at + ttl/3), over the latest RENEWAL_LAG_SAMPLES_MAX renewals; negative is
    early (a round renews leases due within half an interval); and the duration of each
    KeepAliveMany call;
  * leases lost (must be 0) and leases the cluster shows held at the end (a sample of 50).

``--lone-leases`` runs the same with one ``client.lease()`` (one thread) per lease instead, for
the comparison. What the figures were: bench/README.md, "python -m bench session".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import threading
import time

from bench._harness import ensure_repo_on_path, percentile

ensure_repo_on_path()

from coordinator.client import FencingClient  # noqa: E402
from testsupport.grpc_cluster import GrpcCluster  # noqa: E402

# Production Raft timings (as bench scale and grpc use), not the tests' short ones.
CLUSTER_SETTINGS = {
    "raft_min_timeout_s": 1.0,
    "raft_max_timeout_s": 2.0,
    "leader_fallback_timeout_s": 1.5,
    "health_check_interval_s": 1.0,
    "log_level": "WARNING",
}
STARTUP_TIMEOUT_S = 60.0
# Leases held at the end that the bench asks the cluster about (a Describe each).
DESCRIBE_SAMPLE = 50


def log(msg: str) -> None:
    print(f"[session {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def os_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def threads_now() -> dict[str, int]:
    return {"python": threading.active_count(), "os": os_threads()}


def run(client: FencingClient, args: argparse.Namespace) -> dict:
    """Take the leases, hold them for the window, and measure this process meanwhile."""
    call_s: list[float] = []
    if not args.lone_leases:  # time each KeepAliveMany call the session sends (bench only)
        keep_alive_many = client.keep_alive_many

        def timed(*a, **kw):
            t0 = time.monotonic()
            try:
                return keep_alive_many(*a, **kw)
            finally:
                call_s.append(time.monotonic() - t0)

        client.keep_alive_many = timed  # type: ignore[method-assign]
    before = threads_now()
    started = time.monotonic()
    session = None
    if args.lone_leases:
        leases = [client.lease(f"bench-session/{n}", ttl_ms=args.ttl_ms) for n in range(args.leases)]
    else:
        session = client.session(ttl_ms=args.ttl_ms)
        leases = [session.acquire(f"bench-session/{n}") for n in range(args.leases)]
    acquired_s = time.monotonic() - started
    log(f"{args.leases} leases acquired in {acquired_s:.1f} s; holding them {args.seconds:g} s")
    held_threads = threads_now()
    renewals_before = 0 if session is None else session.renewals
    cpu0, t0 = cpu_s(), time.monotonic()
    peak = dict(held_threads)
    while time.monotonic() - t0 < args.seconds:
        time.sleep(0.5)
        now = threads_now()
        peak = {k: max(peak[k], now[k]) for k in peak}
    window_s = time.monotonic() - t0
    cpu = cpu_s() - cpu0
    lost = sum(lease.lost.is_set() for lease in leases)
    sample = random.Random(7).sample(leases, min(DESCRIBE_SAMPLE, len(leases)))
    shown_held = sum(1 for lease in sample if client.describe(lease.resource).token == lease.token
                     and client.describe(lease.resource).held)
    result = {
        "mode": "lone leases (a thread each)" if args.lone_leases else "one session",
        "leases": args.leases, "ttl_ms": args.ttl_ms, "window_s": round(window_s, 1),
        "acquire_s": round(acquired_s, 1),
        "threads_before": before, "threads_held": held_threads, "threads_peak": peak,
        "client_cpu_s": round(cpu, 3), "client_cpu_share_of_a_core": round(cpu / window_s, 4),
        "lost": lost, "held_in_sample": f"{shown_held}/{len(sample)}",
    }
    if session is not None:
        lags = sorted(session.renewal_lags_s())
        calls = sorted(call_s)
        renewals = session.renewals - renewals_before
        result.update({
            "rounds": session.rounds, "renewals_in_window": renewals, "lag_samples": len(lags),
            "cpu_ms_per_renewal": round(1000 * cpu / max(1, renewals), 3),
            "renewal_lag_ms": {q: round(1000 * percentile(lags, p), 1)
                               for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))},
            "keep_alive_many_call_ms": {q: round(1000 * percentile(calls, p), 1)
                                        for q, p in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
        })
        session.close()
    else:
        for lease in leases:
            lease.close()
    result["threads_after"] = threads_now()
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench session", description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=1000, help="leases in the session (default 1000)")
    parser.add_argument("--ttl-ms", type=int, default=10_000, help="the session's TTL (default 10000)")
    parser.add_argument("--seconds", type=float, default=None, help="how long to hold them (default 3 TTLs)")
    parser.add_argument("--lone-leases", action="store_true",
                        help="one client.lease() (one thread) per lease instead of a session")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 3 * args.ttl_ms / 1000
    with tempfile.TemporaryDirectory(prefix="bench-session-") as base_dir, \
            GrpcCluster(os.path.join(base_dir, "cluster"), settings=CLUSTER_SETTINGS) as cluster:
        cluster.start_all(timeout_s=STARTUP_TIMEOUT_S)
        leader = cluster.wait_ready(timeout_s=STARTUP_TIMEOUT_S)
        log(f"cluster up: leader node {leader}")
        with FencingClient([n.api_address for n in cluster.nodes]) as client:
            result = run(client, args)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

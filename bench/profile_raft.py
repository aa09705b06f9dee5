"""Where does a replicated command's time go? Profiling companion of bench.raft_bench.

    python -m bench.profile_raft [--fixes all|none] [--count N] [--pyspy] [--cprofile]

Runs the product node under bench.instrumented_node (same code, timing probes only) as a
three-process cluster, then for 1 and 8 proposers on the leader prints:

  * the critical path of each op, from per-index CLOCK_MONOTONIC timestamps taken in all
    three processes (median / p90 / p99 of each step);
  * per-node tick accounting per op: ticks, busy tick time, poll wait, fdatasync time,
    apply time, syncs, entries per sync, append_entries messages, acks;
  * CPU seconds per op per process (from /proc);
  * with --pyspy: a py-spy sample of the leader during the 8-proposer run, top functions
    by own time and by thread (needs ``pip install py-spy`` and ptrace permission);
  * with --cprofile: a cProfile of the leader's tick thread during the 8-proposer run.

Probes cost a little time themselves (a few microseconds per entry and event); py-spy and
cProfile runs are separate from the timed runs. Prints figures only.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ._harness import (
    ensure_repo_on_path,
    host_cpu_busy_s,
    percentile,
    proc_cpu_s,
    proc_cpu_split_s,
    thread_cpu_s,
    thread_schedstat,
)

ensure_repo_on_path()

from testsupport.cluster import ProcessCluster  # noqa: E402 - needs the repo on the path

PYSPY_RATE = 500  # samples per second

SEGMENTS = [
    # (name, from, to); L = leader, F = the follower whose ack reached the leader first.
    # The chain below is the critical path when the leader sends before it syncs; the
    # two lines after it are the leader's own fdatasync, which runs beside that chain.
    ("queue -> journal add (L)", ("L", "prop"), ("L", "add")),
    ("add -> append sent (L)", ("L", "add"), ("L", "ae_sent")),
    ("append sent -> received (F)", ("L", "ae_sent"), ("F", "ae_recv")),
    ("received -> fdatasync done (F)", ("F", "ae_recv"), ("F", "synced")),
    ("synced -> ack sent (F)", ("F", "synced"), ("F", "ack_sent")),
    ("ack sent -> ack received (L)", ("F", "ack_sent"), ("L", "ack_recv")),
    ("ack received -> applied (L)", ("L", "ack_recv"), ("L", "applied")),
    ("applied -> proposer returns (L)", ("L", "applied"), ("L", "done")),
    ("[beside] add -> fdatasync done (L)", ("L", "add"), ("L", "synced")),
    ("[beside] 1st ack -> own sync (L) >0=late", ("L", "ack_recv"), ("L", "synced")),
]


def _stats(values: list[float]) -> str:
    if not values:
        return "      -        -        -"
    v = sorted(values)
    return f"{percentile(v, 0.5) * 1e3:7.3f}  {percentile(v, 0.9) * 1e3:7.3f}  {percentile(v, 0.99) * 1e3:7.3f}"


def analyse(traces: dict[int, dict], leader: int, cpu: dict[int, float], out=sys.stdout) -> dict:
    ev = {i: {} for i in traces}
    for i, tr in traces.items():
        for idx, name, t in tr["events"]:
            ev[i].setdefault(idx, {})[name] = t
    props = traces[leader]["props"]
    ops = len(props)
    if not ops:
        print("  no ops traced", file=out)
        return {}
    followers = [i for i in traces if i != leader]
    seg_values = collections.defaultdict(list)
    totals = []
    for idx, t0, t1 in props:
        L = dict(ev[leader].get(idx, {}))
        L["prop"], L["done"] = t0, t1
        # The follower whose ack the leader saw first formed the majority.
        cands = [(ev[f].get(idx, {}).get("ack_sent", float("inf")), f) for f in followers]
        F = ev[min(cands)[1]].get(idx, {}) if cands else {}
        totals.append(t1 - t0)
        for name, (wa, ea), (wb, eb) in SEGMENTS:
            a = (L if wa == "L" else F).get(ea)
            b = (L if wb == "L" else F).get(eb)
            if a is not None and b is not None:
                seg_values[name].append(b - a)
    print(f"  critical path of {ops} ops (ms)                    p50      p90      p99", file=out)
    for name, *_ in SEGMENTS:
        print(f"    {name:<42}{_stats(seg_values[name])}  (n={len(seg_values[name])})", file=out)
    print(f"    {'TOTAL propose() latency':<42}{_stats(totals)}", file=out)
    summary = {"ops": ops, "segments_p50_ms": {n: percentile(sorted(v), 0.5) * 1e3 for n, v in seg_values.items()}}
    print("  per op, per node           ticks  busy ms  poll ms  sync ms  apply ms  syncs  ent/sync"
          "  AE sent  AE w/ent  ent/AE  acks tx  acks rx  cpu ms", file=out)
    for i in sorted(traces):
        c = traces[i]["counters"]
        role = "leader" if i == leader else "follower"

        def per(name, scale=1.0, c=c):
            return c.get(name, 0.0) * scale / ops

        ent_sync = c.get("sync_entries", 0) / c["sync_calls"] if c.get("sync_calls") else 0.0
        ent_ae = c.get("ae_entries_sent", 0) / c["ae_sent_with_entries"] if c.get("ae_sent_with_entries") else 0.0
        busy = c.get("tick_s", 0.0) - c.get("poll_s", 0.0)
        print(f"    node{i} {role:<9}        {per('ticks'):6.2f}  {busy * 1e3 / ops:7.3f}  {per('poll_s', 1e3):7.3f}"
              f"  {per('sync_s', 1e3):7.3f}  {per('apply_s', 1e3):8.3f}  {per('sync_calls'):5.2f}  {ent_sync:8.2f}"
              f"  {per('ae_sent'):7.2f}  {per('ae_sent_with_entries'):8.2f}  {ent_ae:6.2f}  {per('acks_sent'):7.2f}"
              f"  {per('acks_received'):7.2f}  {cpu.get(i, float('nan')) * 1e3 / ops:6.3f}", file=out)
        summary[f"node{i}"] = {k: v / ops for k, v in c.items()} | {
            "role": role, "cpu_ms_per_op": cpu.get(i, 0) * 1e3 / ops}
    print("  CPU per op, per node (thread_time, ms)  tick thread: total  = tick body  + flush(send+sync)"
          "  + poll(msg handling)  | inside: sync  send  apply | proposers | per send: wall/cpu us", file=out)
    for i in sorted(traces):
        c = traces[i]["counters"]
        role = "leader" if i == leader else "follower"
        tick, flush, poll = c.get("tick_cpu_s", 0.0), c.get("flush_cpu_s", 0.0), c.get("poll_cpu_s", 0.0)
        sends = c.get("send_calls", 0.0)
        per_send = (f"{c.get('send_s', 0) / sends * 1e6:6.1f}/{c.get('send_cpu_s', 0) / sends * 1e6:5.1f}"
                    if sends else "     -")
        print(f"    node{i} {role:<9}{'':26}{tick * 1e3 / ops:6.3f} = {(tick - flush - poll) * 1e3 / ops:6.3f}"
              f"     + {flush * 1e3 / ops:6.3f}           + {poll * 1e3 / ops:6.3f}"
              f"               | {c.get('sync_cpu_s', 0) * 1e3 / ops:6.3f} {c.get('send_cpu_s', 0) * 1e3 / ops:5.3f}"
              f" {c.get('apply_cpu_s', 0) * 1e3 / ops:5.3f} | {c.get('propose_cpu_s', 0) * 1e3 / ops:6.3f}"
              f"    | {per_send}", file=out)
    return summary


def print_thread_cpu(split0, split1, names, leader, ops, out=sys.stdout) -> None:
    """CPU per op by thread (user/system), from /proc; exited threads = the bench's proposers."""
    print("  CPU per op by thread, ms (user+system)", file=out)
    for i in sorted(split0):
        (u0, s0), th0 = split0[i]
        (u1, s1), th1 = split1[i]
        parts = []
        live_u = live_s = 0.0
        for tid, (tu1, ts1) in th1.items():
            if tid not in th0:
                continue
            tu0, ts0 = th0[tid]
            du, ds = tu1 - tu0, ts1 - ts0
            live_u += du
            live_s += ds
            if du + ds > 0:
                name = names[i].get(str(tid), f"tid{tid}")
                parts.append((du + ds, f"{name} {du * 1e3 / ops:.3f}+{ds * 1e3 / ops:.3f}"))
        gone_u, gone_s = (u1 - u0) - live_u, (s1 - s0) - live_s
        if gone_u + gone_s > 0.0005:
            parts.append((gone_u + gone_s,
                          f"exited threads (proposers) {gone_u * 1e3 / ops:.3f}+{gone_s * 1e3 / ops:.3f}"))
        parts.sort(reverse=True)
        role = "leader" if i == leader else "follower"
        print(f"    node{i} {role:<8} total {(u1 - u0) * 1e3 / ops:.3f}+{(s1 - s0) * 1e3 / ops:.3f}: "
              + "; ".join(p for _, p in parts), file=out)


def print_tick_thread_time(sched0, sched1, names, traces, leader, elapsed, ops, out=sys.stdout) -> None:
    """Where the tick thread's wall time goes, from the kernel's per-thread schedstat.

    on CPU; runnable but waiting for a CPU (run queue: more runnable threads than cores);
    off CPU (blocked: idle in poll, in fdatasync, or waiting for the GIL or a lock).
    The probes' own wall/CPU figures for fdatasync and poll overlap these (a thread can
    wait in the run queue inside either), so they are shown beside, not subtracted.
    """
    if not ops:
        return
    print("  tick thread wall time per op (ms) = on CPU + waiting for a CPU (run queue) + off CPU "
          "(blocked: idle poll, fdatasync, GIL, locks)", file=out)
    for i in sorted(sched0):
        tick_tid = next((int(t) for t, n in names[i].items() if "autoTick" in n), None)
        if tick_tid is None or tick_tid not in sched0[i] or tick_tid not in sched1[i]:
            continue
        run = sched1[i][tick_tid][0] - sched0[i][tick_tid][0]
        wait = sched1[i][tick_tid][1] - sched0[i][tick_tid][1]
        c = traces[i]["counters"]
        blocked = max(0.0, elapsed - run - wait)
        role = "leader" if i == leader else "follower"
        f = 1e3 / ops
        print(f"    node{i} {role:<9} {elapsed * f:6.3f} = {run * f:6.3f} + {wait * f:6.3f} + {blocked * f:6.3f}"
              f"   (beside: fdatasync wall {c.get('sync_s', 0) * f:6.3f}, poll wall {c.get('poll_s', 0) * f:6.3f};"
              f" run-queue share of non-idle time {100 * wait / max(1e-9, run + wait):.0f}%)", file=out)
    # The leader's proposer threads wait in the same run queue and for the same GIL.


def _pyspy_top(raw_path: str, out=sys.stdout, top: int = 25, expected_samples: float | None = None,
               gil: bool = False) -> None:
    """Aggregate py-spy's collapsed stacks: own time per function, and samples per thread."""
    own = collections.Counter()
    incl = collections.Counter()
    per_thread = collections.Counter()
    total = 0
    with open(raw_path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            n = int(n)
            total += n
            frames = stack.split(";")
            thread = frames[0]
            per_thread[thread] += n
            own[frames[-1]] += n
            for fr in set(frames[1:]):
                incl[fr] += n
    if not total:
        print("  py-spy: no samples", file=out)
        return
    share = ""
    if expected_samples:
        what = "GIL held" if gil else "non-idle thread-samples per wall sample"
        share = f" = {100 * total / expected_samples:.0f}% {what} over the sampled time"
    print(f"  py-spy: {total} samples ({'holding the GIL' if gil else 'non-idle'}){share}; by thread:", file=out)
    for th, n in per_thread.most_common(12):
        print(f"    {n / total * 100:5.1f}%  {th}", file=out)
    print("  top functions by own samples:", file=out)
    for fr, n in own.most_common(top):
        print(f"    {n / total * 100:5.1f}%  {fr}", file=out)
    print("  top functions by inclusive samples:", file=out)
    for fr, n in incl.most_common(top):
        print(f"    {n / total * 100:5.1f}%  {fr}", file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixes", default="all")
    p.add_argument("--count", type=int, default=2000, help="ops per traced run (split across proposers)")
    p.add_argument("--threads", default="1,8", help="proposer counts, comma-separated")
    p.add_argument("--pyspy", action="store_true", help="py-spy the leader during an extra 8-proposer run")
    p.add_argument("--pyspy-gil", action="store_true", help="py-spy: only samples holding the GIL")
    p.add_argument("--pyspy-followers", action="store_true", help="also py-spy one follower")
    p.add_argument("--cprofile", action="store_true", help="cProfile the leader's tick thread in an extra run")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    threads_list = [int(x) for x in args.threads.split(",") if x]
    base = tempfile.mkdtemp(prefix="raft-profile-")
    try:
        with ProcessCluster(base, module="bench.instrumented_node", fixes=args.fixes) as cluster:
            cluster.start_all(timeout_s=30.0)
            leader = cluster.wait_for_leader(timeout_s=30.0)
            L = cluster.nodes[leader]
            print(f"fixes={args.fixes}; leader node{leader}; nproc={len(os.sched_getaffinity(0))}")
            for threads in threads_list:
                per_thread = max(1, args.count // threads)
                L.call({"op": "bench", "threads": threads, "count": max(10, 100 // threads)}, timeout_s=60)
                for n in cluster.nodes:
                    n.call({"op": "trace_reset"})
                host0, self0 = host_cpu_busy_s(), proc_cpu_s(os.getpid())
                cpu0 = {n.index: proc_cpu_s(n.proc.pid) for n in cluster.nodes}
                split0 = {n.index: (proc_cpu_split_s(n.proc.pid), thread_cpu_s(n.proc.pid)) for n in cluster.nodes}
                sched0 = {n.index: thread_schedstat(n.proc.pid) for n in cluster.nodes}
                r = L.call({"op": "bench", "threads": threads, "count": per_thread}, timeout_s=120)
                cpu = {n.index: proc_cpu_s(n.proc.pid) - cpu0[n.index] for n in cluster.nodes}
                host_s = host_cpu_busy_s() - host0
                other = (host_s - sum(cpu.values()) - (proc_cpu_s(os.getpid()) - self0)) / r["elapsed_s"]
                split1 = {n.index: (proc_cpu_split_s(n.proc.pid), thread_cpu_s(n.proc.pid)) for n in cluster.nodes}
                sched1 = {n.index: thread_schedstat(n.proc.pid) for n in cluster.nodes}
                names = {n.index: n.call({"op": "threads"})["threads"] for n in cluster.nodes}
                traces = {n.index: n.call({"op": "trace_get"}, timeout_s=30) for n in cluster.nodes}
                lat = sorted(x * 1e3 for x in r["latencies"])
                print(f"\n== {threads} proposer(s): {len(lat)} ops, {len(lat) / r['elapsed_s']:.0f} ops/s, "
                      f"p50 {percentile(lat, .5):.2f} ms, p99 {percentile(lat, .99):.2f} ms, "
                      f"cores busy {sum(cpu.values()) / r['elapsed_s']:.2f}, other load {max(0.0, other):.2f} cores"
                      + ("  <- machine busy, figures pessimistic" if other > 0.25 else ""))
                analyse(traces, leader, cpu)
                print_thread_cpu(split0, split1, names, leader, len(r["latencies"]))
                print_tick_thread_time(sched0, sched1, names, traces, leader, r["elapsed_s"],
                                       len(traces[leader]["props"]))
            conc = max(threads_list)
            if args.pyspy:
                pyspy = shutil.which("py-spy")
                if not pyspy:
                    print("\npy-spy not found (pip install py-spy)")
                else:
                    per_thread = max(1, 3 * args.count // conc)
                    followers = [n for n in cluster.nodes if n.index != leader]
                    targets = [L] + (followers[:1] if args.pyspy_followers else [])
                    procs = []
                    for n in targets:
                        raw = os.path.join(base, f"pyspy-node{n.index}.txt")
                        procs.append((n, raw, subprocess.Popen(
                            [pyspy, "record", "--pid", str(n.proc.pid), "--format", "raw", "--threads",
                             "--rate", str(PYSPY_RATE), "--nonblocking", "-o", raw, "--duration", "60",
                             *(["--gil"] if args.pyspy_gil else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
                    time.sleep(1.0)
                    t_sample = time.monotonic()
                    r = L.call({"op": "bench", "threads": conc, "count": per_thread}, timeout_s=120)
                    t_sample = time.monotonic() - t_sample + 1.0  # py-spy also sampled the idle second before
                    for _n, _raw, proc in procs:
                        proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
                        try:
                            proc.wait(timeout=20)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait()
                    print(f"\n== py-spy, {conc} proposers ({len(r['latencies'])} ops at "
                          f"{len(r['latencies']) / r['elapsed_s']:.0f} ops/s while sampled)")
                    for n, raw, _proc in procs:
                        print(f" node{n.index} ({'leader' if n.index == leader else 'follower'}):")
                        if os.path.exists(raw):
                            _pyspy_top(raw, expected_samples=PYSPY_RATE * t_sample, gil=args.pyspy_gil)
                        else:
                            print("  py-spy wrote nothing (ptrace not permitted?)")
            if args.cprofile:
                per_thread = max(1, args.count // conc)
                L.call({"op": "profile_start"})
                time.sleep(0.2)
                r = L.call({"op": "bench", "threads": conc, "count": per_thread}, timeout_s=120)
                prof = L.call({"op": "profile_stop", "top": 30}, timeout_s=30)
                print(f"\n== cProfile of the leader tick thread, {conc} proposers "
                      f"({len(r['latencies'])} ops, {len(r['latencies']) / r['elapsed_s']:.0f} ops/s under cProfile)")
                print(prof["text"])
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replicated-command benchmark: our Raft layer beside stock pysyncobj, in one run.

    python -m bench.raft_bench [--seconds N | --count N] [--stock-seconds N] [--json out.json]

Prints figures and asserts nothing about speed. Three configurations, each a cluster
of three real node processes on 127.0.0.2/.3/.4, each measured with 1 proposer
(sequential) and 8 concurrent proposers. Proposers run inside the leader process
(control op ``bench``), so the figures are the Raft layer's, not a client's RPC.

  ours/durable   ProcessCluster defaults: all fixes, fsynced journal with group commit,
                 compaction every 5000 entries. Each op is a fenced write (state machine
                 included).
  ours/no-fsync  the same node with ``--fixes none``: pysyncobj's stock mmap journal, never
                 synced, none of the safety fixes (still our coalesced sends). Shows what
                 durability + safety cost. NOT a configuration anyone should run.
  stock          pysyncobj 0.3.17 with SyncObjConf() defaults (only bindAddress set so it
                 listens on its loopback alias), in-memory journal, trivial @replicated
                 counter, ``incr(sync=True, timeout=...)``. Bounded by time: its default
                 appendEntriesPeriod of 100 ms makes it ~10 ops/s per proposer.

Targets from the issue (2 cores, raw Raft layer): >= 500 ops/s sequential, >= 3,000 ops/s
with 8 concurrent proposers, p99 < 15 ms. They are reported, never asserted.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time

import pysyncobj.version

from ._harness import (
    cpu_model,
    ensure_repo_on_path,
    fdatasync_cost,
    fs_type,
    git_state,
    host_cpu_busy_s,
    percentile,
    proc_cpu_s,
    proc_ctx_switches,
    wait_for_idle_host,
)

ensure_repo_on_path()

from testsupport.cluster import ProcessCluster  # noqa: E402 - needs the repo on the path, set just above

TARGET_SEQ_OPS = 500.0
TARGET_CONC_OPS = 3000.0
TARGET_P99_MS = 15.0
PROPOSER_COUNTS = (1, 8)
CALL_TIMEOUT_S = 5.0  # per replicated call
BUSY_HOST_CORES = 0.25  # other processes using more than this during a run: flagged (and retried)


# -- one measured run ---------------------------------------------------------------


def _snapshot(cluster: ProcessCluster) -> dict:
    """Per-node journal sync counters, CPU seconds and context switches, right now."""
    snap = {"host_busy_s": host_cpu_busy_s(), "self_cpu_s": proc_cpu_s(os.getpid())}
    for node in cluster.nodes:
        if not node.alive:
            continue
        try:
            syncs = node.call({"op": "status"}).get("journal_syncs", 0)
        except Exception:  # noqa: BLE001 - a counter we can live without
            syncs = None
        snap[node.index] = {
            "syncs": syncs,
            "cpu_s": proc_cpu_s(node.proc.pid),
            "ctx": proc_ctx_switches(node.proc.pid),
        }
    return snap


def _run_bench(cluster: ProcessCluster, leader: int, threads: int, *, count: int | None,
               seconds: float | None) -> dict:
    """One ``bench`` call on the leader, with counters read just before and after."""
    req = {"op": "bench", "threads": threads, "timeout_s": CALL_TIMEOUT_S}
    if count is not None:
        req["count"] = count
    if seconds is not None:
        req["seconds"] = seconds
    expected = seconds if seconds is not None else 10.0
    before = _snapshot(cluster)
    t0 = time.perf_counter()
    reply = cluster.nodes[leader].call(req, timeout_s=max(60.0, 4 * expected + 30.0))
    wall = time.perf_counter() - t0
    after = _snapshot(cluster)
    reply["wall_s"] = wall
    reply["before"], reply["after"] = before, after
    return reply


def _summarise(label: str, kind: str, threads: int, reply: dict) -> dict:
    lat = sorted(x * 1e3 for x in reply["latencies"])
    outcomes = reply.get("outcomes", {})
    ok = outcomes.get("applied", 0) + outcomes.get("refused", 0)
    elapsed = reply["elapsed_s"]
    leader = reply["leader"]
    before, after = reply["before"], reply["after"]

    def delta(i, key):
        b, a = before.get(i, {}).get(key), after.get(i, {}).get(key)
        if b is None or a is None:
            return None
        return a - b

    followers = [i for i in after if isinstance(i, int) and i != leader and i in before]
    syncs_leader = delta(leader, "syncs")
    syncs_foll = [delta(i, "syncs") for i in followers]
    cpu_leader = delta(leader, "cpu_s")
    cpu_foll = [delta(i, "cpu_s") for i in followers]
    ctx_leader = None
    if leader in before and leader in after:
        ctx_leader = tuple(a - b for a, b in zip(after[leader]["ctx"], before[leader]["ctx"], strict=True))
    durable = kind == "ours" and reply.get("fixes") == "all"
    # CPU used on the host by anything but the three nodes and this driver: other
    # work on the machine competing for the same cores (figures are then pessimistic).
    wall = reply.get("wall_s") or elapsed
    ours_cpu = (cpu_leader or 0) + sum(c or 0 for c in cpu_foll) + (after["self_cpu_s"] - before["self_cpu_s"])
    foreign = (after["host_busy_s"] - before["host_busy_s"] - ours_cpu) / wall if wall else None
    row = {
        "config": label,
        "kind": kind,
        "proposers": threads,
        "ops": ok,
        "calls": len(lat),
        "errors": {k: v for k, v in outcomes.items() if k not in ("applied", "refused")},
        "elapsed_s": elapsed,
        "ops_per_s": ok / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": lat[-1] if lat else float("nan"),
        "mean_ms": sum(lat) / len(lat) if lat else float("nan"),
        "leader_syncs_per_op": (syncs_leader / ok) if durable and ok and syncs_leader is not None else None,
        "follower_syncs_per_op": (sum(syncs_foll) / len(syncs_foll) / ok)
        if durable and ok and syncs_foll and None not in syncs_foll else None,
        "leader_cpu_ms_per_op": cpu_leader * 1e3 / ok if ok and cpu_leader is not None else None,
        "followers_cpu_ms_per_op": sum(cpu_foll) * 1e3 / ok if ok and cpu_foll and None not in cpu_foll else None,
        "cluster_cpu_cores_busy": ((cpu_leader or 0) + sum(c or 0 for c in cpu_foll)) / elapsed if elapsed else None,
        "leader_ctx_switches_per_op": (sum(ctx_leader) / ok) if ctx_leader and ok else None,
        "other_cores_busy": max(0.0, foreign) if foreign is not None else None,
    }
    return row


def _measure_once(cluster: ProcessCluster, label: str, kind: str, fixes: str | None, leader: int,
                  threads: int, args) -> dict:
    if kind == "stock":
        # Warm-up (connections, first batches), then a time-bounded run.
        _run_bench(cluster, leader, threads, count=None, seconds=0.5)
        reply = _run_bench(cluster, leader, threads, count=None, seconds=args.stock_seconds)
    else:
        warm = _run_bench(cluster, leader, threads, count=max(20, 200 // threads), seconds=None)
        if args.count is not None:
            per_thread = max(1, math.ceil(args.count / threads))
        else:
            rate = max(1.0, len(warm["latencies"]) / max(warm["elapsed_s"], 1e-6))
            per_thread = max(20, min(50_000, math.ceil(rate * args.seconds / threads)))
        reply = _run_bench(cluster, leader, threads, count=per_thread, seconds=None)
    reply["leader"], reply["fixes"] = leader, fixes
    now_leader = cluster.leader_index()
    row = _summarise(label, kind, threads, reply)
    if now_leader != leader:
        row["note"] = f"leader changed during run (node{leader} -> {now_leader})"
    return row


def _measure_cluster(cluster: ProcessCluster, label: str, kind: str, fixes: str | None, args, log) -> list[dict]:
    rows = []
    t_start = time.perf_counter()
    cluster.start_all(timeout_s=30.0)
    leader = cluster.wait_for_leader(timeout_s=30.0)
    log(f"  [{label}] leader node{leader} ({cluster.nodes[leader].address}) after {time.perf_counter() - t_start:.1f}s")
    rounds = args.rounds if kind == "ours" else 1  # stock's figures are its fixed 100 ms period
    per_threads: dict[int, list[dict]] = {t: [] for t in PROPOSER_COUNTS}
    for round_no in range(1, rounds + 1):
        if rounds > 1:
            log(f"  [{label}] round {round_no} of {rounds}")
        for threads in PROPOSER_COUNTS:
            per_threads[threads].append(_measure_quietest(cluster, label, kind, fixes, leader, threads, args, log))
    for threads in PROPOSER_COUNTS:
        runs = sorted(per_threads[threads], key=lambda r: r["ops_per_s"])
        row = dict(runs[(len(runs) - 1) // 2])  # the median run (lower middle), all its columns
        row["rounds"] = len(runs)
        row["ops_per_s_runs"] = [round(r["ops_per_s"]) for r in per_threads[threads]]
        rows.append(row)
    if kind == "ours":
        # Not a speed assertion: a sanity note that the replicas agree after the load.
        try:
            cluster.wait_converged(timeout_s=15.0)
            rows[-1]["converged"] = True
        except TimeoutError:
            rows[-1]["converged"] = False
            log(f"  [{label}] WARNING: replicas did not converge within 15 s")
    return rows


def _measure_quietest(cluster: ProcessCluster, label: str, kind: str, fixes: str | None, leader: int,
                      threads: int, args, log) -> dict:
    """One run; with --retries, re-measured while other load disturbed it, keeping the quietest."""
    best = None
    for attempt in range(1 + max(0, args.retries)):
        if attempt:
            log(f"  [{label}] {threads} proposer(s): other processes used "
                f"{best['other_cores_busy']:.2f} cores; measuring again ({attempt}/{args.retries})")
            if args.wait_idle > 0:
                wait_for_idle_host(args.wait_idle, log=log)
        row = _measure_once(cluster, label, kind, fixes, leader, threads, args)
        if best is None or (row["other_cores_busy"] or 0) < (best["other_cores_busy"] or 0):
            best = row
        if (best["other_cores_busy"] or 0) <= BUSY_HOST_CORES:
            break
    row = best
    log(f"  [{label}] {threads} proposer(s): {row['ops']} ops in {row['elapsed_s']:.2f}s = "
        f"{row['ops_per_s']:.0f} ops/s, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
        f"other load {row['other_cores_busy']:.2f} cores"
        + (f", errors {row['errors']}" if row["errors"] else ""))
    return row


# -- output -------------------------------------------------------------------------


def _fmt(v, spec=".2f", none="-"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, spec)


def print_table(rows: list[dict], out=sys.stdout) -> None:
    stock = {r["proposers"]: r for r in rows if r["kind"] == "stock"}
    nofsync = {r["proposers"]: r for r in rows if r["config"].startswith("ours/no-fsync")}
    headers = ["config", "proposers", "ops", "ops/s", "p50 ms", "p99 ms", "max ms",
               "x stock", "x no-fsync", "syncs/op L", "syncs/op F", "cpu ms/op L", "cpu ms/op F", "cores busy",
               "other load",
               "ops/s of each round"]
    table = []
    for r in rows:
        base = stock.get(r["proposers"])
        nf = nofsync.get(r["proposers"])
        x_stock = r["ops_per_s"] / base["ops_per_s"] if base and base["ops_per_s"] else None
        x_nf = r["ops_per_s"] / nf["ops_per_s"] if nf and nf["ops_per_s"] and nf is not r else None
        r["ratio_vs_stock"], r["ratio_vs_no_fsync"] = x_stock, x_nf
        table.append([
            r["config"], str(r["proposers"]), str(r["ops"]), _fmt(r["ops_per_s"], ".0f"),
            _fmt(r["p50_ms"]), _fmt(r["p99_ms"]), _fmt(r["max_ms"]),
            _fmt(x_stock, ".1f") + ("x" if x_stock is not None else ""),
            _fmt(x_nf, ".2f") + ("x" if x_nf is not None else ""),
            _fmt(r["leader_syncs_per_op"]), _fmt(r["follower_syncs_per_op"]),
            _fmt(r["leader_cpu_ms_per_op"]), _fmt(r["followers_cpu_ms_per_op"]),
            _fmt(r["cluster_cpu_cores_busy"]), _fmt(r["other_cores_busy"]),
            " ".join(str(v) for v in r.get("ops_per_s_runs", [])),
        ])
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    print(line, file=out)
    print("-" * len(line), file=out)
    for row in table:
        cells = enumerate(zip(row, widths, strict=True))
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in cells), file=out)
    for r in rows:
        notes = []
        if r["errors"]:
            notes.append(f"non-applied outcomes {r['errors']}")
        if r.get("note"):
            notes.append(r["note"])
        if r.get("converged") is False:
            notes.append("replicas did NOT converge after the run")
        if (r.get("other_cores_busy") or 0) > BUSY_HOST_CORES:
            notes.append(f"other processes used {r['other_cores_busy']:.2f} cores during this run: "
                         "figures are pessimistic, rerun on an idle machine")
        if notes:
            print(f"  note {r['config']} x{r['proposers']}: " + "; ".join(notes), file=out)


def print_targets(rows: list[dict], out=sys.stdout) -> None:
    ours = {r["proposers"]: r for r in rows if r["config"].startswith("ours/durable")}
    if not ours:
        return
    seq, conc = ours.get(1), ours.get(8)
    rounds = (seq or conc).get("rounds", 1)
    print(f"\nissue targets (informational, never asserted) for ours/durable, median run of {rounds}:", file=out)
    if seq:
        print(f"  sequential   >= {TARGET_SEQ_OPS:.0f} ops/s : {seq['ops_per_s']:.0f} ops/s "
              f"({'met' if seq['ops_per_s'] >= TARGET_SEQ_OPS else 'MISSED'})", file=out)
    if conc:
        print(f"  8 proposers  >= {TARGET_CONC_OPS:.0f} ops/s: {conc['ops_per_s']:.0f} ops/s "
              f"({'met' if conc['ops_per_s'] >= TARGET_CONC_OPS else 'MISSED'})", file=out)
    for r in (seq, conc):
        if r:
            print(f"  p99 < {TARGET_P99_MS:.0f} ms ({r['proposers']} proposer{'s' if r['proposers'] > 1 else ''}): "
                  f"{r['p99_ms']:.2f} ms ({'met' if r['p99_ms'] < TARGET_P99_MS else 'MISSED'})", file=out)


# -- main ---------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--seconds", type=float, default=3.0,
                      help="target duration of each measured run of our cluster (default 3); "
                           "the op count is calibrated from a warm-up run")
    size.add_argument("--count", type=int, default=None,
                      help="total replicated commands per measured run of our cluster "
                           "(split evenly across proposers) instead of --seconds")
    p.add_argument("--stock-seconds", type=float, default=3.0,
                   help="duration of each stock pysyncobj run (always time-bounded; default 3)")
    p.add_argument("--only", choices=("durable", "no-fsync", "stock"), action="append",
                   help="run only these configurations (repeatable; default all three)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                   help="before each configuration, wait up to SECONDS for other processes on the host "
                        "to go quiet (< 0.15 cores); useful on shared machines (default: don't wait)")
    p.add_argument("--rounds", type=int, default=3,
                   help="measure our configurations this many times in turn, one cluster each, and report "
                        "the median run (default 3; this 2-core VM has slow spells)")
    p.add_argument("--retries", type=int, default=0,
                   help="re-measure a run up to this many times when other processes used more than "
                        f"{BUSY_HOST_CORES} cores during it, keeping the quietest (default 0)")
    p.add_argument("--data-dir", default=None,
                   help="where node data dirs and logs go (default: a fresh temp dir, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the data dir (node logs) after the run")
    p.add_argument("--json", dest="json_path", default=None, help="also write all figures to this JSON file")
    return p.parse_args(argv)


def machine_info(data_dir: str) -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "nproc": affinity,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "loadavg": os.getloadavg(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "pysyncobj": pysyncobj.version.VERSION,
        "git": git_state(),
        "data_dir": data_dir,
        "data_dir_fs": fs_type(data_dir),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    only = set(args.only or ("durable", "no-fsync", "stock"))
    own_dir = args.data_dir is None
    base = args.data_dir or tempfile.mkdtemp(prefix="raft-bench-")
    os.makedirs(base, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    t_total = time.perf_counter()
    info = machine_info(base)
    log(f"machine: nproc={info['nproc']} (cpu_count {info['cpu_count']}), {info['cpu_model']}, "
        f"load avg {info['loadavg'][0]:.2f}/{info['loadavg'][1]:.2f}/{info['loadavg'][2]:.2f}")
    log(f"python {info['python']} ({info['implementation']}), pysyncobj {info['pysyncobj']}, {info['platform']}")
    log(f"code: git {info['git']}")
    log(f"data dir {base} on {info['data_dir_fs']}")
    if info["data_dir_fs"] in ("tmpfs", "ramfs"):
        log("WARNING: data dir is in memory: fdatasync is free here, durable figures are optimistic")
    sync = fdatasync_cost(base)
    info["fdatasync"] = sync
    log(f"fdatasync cost in data dir: {sync['n']} x ({sync['record_bytes']} B append + fdatasync): "
        f"mean {sync['mean_ms']:.3f} ms, p50 {sync['p50_ms']:.3f} ms, p99 {sync['p99_ms']:.3f} ms, "
        f"max {sync['max_ms']:.3f} ms")
    mode = f"--count {args.count} per run" if args.count is not None else f"~{args.seconds:g} s per run (calibrated)"
    defaults = inspect.signature(ProcessCluster.__init__).parameters
    compaction = defaults["compaction_entries"].default if "compaction_entries" in defaults else "?"
    info["ours_compaction_entries"] = compaction
    log(f"runs: ours {mode}, ProcessCluster defaults (compaction every {compaction} entries); "
        f"stock {args.stock_seconds:g} s per run; proposers {PROPOSER_COUNTS}; call timeout {CALL_TIMEOUT_S:g} s\n")

    rows: list[dict] = []
    configs = []
    if "durable" in only:
        configs.append(("ours/durable", "ours", "all"))
    if "no-fsync" in only:
        configs.append(("ours/no-fsync (UNSAFE)", "ours", "none"))
    if "stock" in only:
        configs.append(("stock pysyncobj", "stock", None))
    try:
        for label, kind, fixes in configs:
            sub = os.path.join(base, label.split()[0].replace("/", "-"))
            if kind == "ours":
                # ProcessCluster defaults (compaction 5000 entries, election 0.5-1.0 s),
                # only the fix set varies.
                cluster = ProcessCluster(sub, fixes=fixes)
            else:
                cluster = ProcessCluster(sub, module="bench.stock_node")
            if args.wait_idle > 0:
                busy = wait_for_idle_host(args.wait_idle, log=log)
                log(f"  [{label}] host busy before start: {busy:.2f} cores")
            with cluster:
                try:
                    rows.extend(_measure_cluster(cluster, label, kind, fixes, args, log))
                except Exception as exc:  # noqa: BLE001 - report and go on with the others
                    log(f"  [{label}] FAILED: {exc!r} (node logs under {sub})")
                    args.keep = True
        sync_end = fdatasync_cost(base)
        info["fdatasync_after"] = sync_end
        info["loadavg_after"] = os.getloadavg()
    finally:
        elapsed_total = time.perf_counter() - t_total
        if own_dir and not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    print()
    print_table(rows)
    print_targets(rows)
    print("\nlegend: x stock / x no-fsync = ops/s ratio against that config at the same proposer count;"
          "\n  syncs/op L/F = journal fdatasyncs per op on the leader / per follower (durable journal only);"
          "\n  cpu ms/op L/F = CPU time per op of the leader process / of both followers together;"
          f"\n  cores busy = CPU seconds of all three nodes per wall second (machine has {info['nproc']});"
          "\n  other load = cores used meanwhile by other processes on the host (should be ~0)."
          "\n  ours = fenced write through the state machine; stock = trivial counter, in-memory journal.")
    if "fdatasync_after" in info:
        a = info["fdatasync_after"]
        print(f"\nfdatasync cost: before the runs p50 {sync['p50_ms']:.3f} ms / p99 {sync['p99_ms']:.3f} ms, "
              f"after p50 {a['p50_ms']:.3f} ms / p99 {a['p99_ms']:.3f} ms; load avg before "
              f"{info['loadavg'][0]:.2f}, after {info['loadavg_after'][0]:.2f}")
    print(f"total benchmark time {elapsed_total:.1f} s")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"machine": info, "args": vars(args), "rows": rows,
                       "targets": {"seq_ops_per_s": TARGET_SEQ_OPS, "conc8_ops_per_s": TARGET_CONC_OPS,
                                   "p99_ms": TARGET_P99_MS}}, f, indent=2, default=str)
        print(f"figures written to {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

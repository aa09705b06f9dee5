"""Ours beside etcd: the same workloads, client processes of the same shape, on this machine.

    python -m bench compare                         # 1, 16, 64 clients; 4 workloads; 3 rounds; failover (~8 min)
    python -m bench compare --json out.json --chart out.png
    python -m bench compare --clients 1,16 --rounds 5 --trials 0
    python -m bench compare --rounds 0                # failover trials only (~5 min)

Benchmark-only: figures, never assertions. Owns the run: both clusters up side by side (three
``fencingd serve`` members with production timings, and three etcd members with etcd's
defaults, each on 127.0.0.2/.3/.4 with data on disk), the alternation of runs, CPU readings
from /proc, then the failover trials (bench/_failover.py). The workloads' calls are in
bench/_grpc_worker.py (ours, raw generated stubs) and bench/_etcd_client.py (etcd, stubs
generated from bench/etcdpb/rpc.proto); both run in the same client processes and threads
(``--procs`` processes, clients spread over them as threads, one channel per client) with
the same timing loop, against the leader's address.

Each round measures every (workload, clients) cell for both systems back to back, the order
alternating from cell to cell and round to round, so a slow spell of the machine hits both.
A cell's ratio is the median over rounds of ours/etcd ops/s measured in the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time

from . import _compare_report as report
from . import _failover
from ._harness import (
    cpu_model,
    ensure_repo_on_path,
    fdatasync_cost,
    fs_type,
    git_state,
    host_cpu_s,
    percentile,
    proc_cpu_s,
    sigterm_as_interrupt,
)
from .grpc_bench import loadavg, log

WORKLOADS = ("write", "acqrel", "cycle", "read")
STARTUP_TIMEOUT_S = 60.0
LEADER_TIMEOUT_S = 30.0


# How our clients call (--ours-client), each measured as a system of its own, named here:
# raw generated stubs with one channel per client thread (etcd's clients are the same), the
# library's FencingClient one per thread, or one FencingClient(multiplex=True) per client
# process shared by its threads (their concurrent writes, acquires and releases go out as
# WriteMany, AcquireMany and ReleaseMany batches).
OURS_CLIENTS = {"raw": "ours", "lib": "ours-lib", "multiplex": "ours-mux"}
OURS_MODES = {"raw": "raw", "lib": "lib", "multiplex": "mux"}


class Side:
    """One system under test: its cluster, where its leader is, and how clients call it."""

    def __init__(self, name: str, cluster, *, system: str | None = None, mode: str = "raw",
                 leader: int | None = None) -> None:
        self.name = name  # the row's system: ours, ours-lib, ours-mux or etcd
        self.system = system or name  # which cluster the worker talks to: ours or etcd
        self.mode = mode
        self.cluster = cluster
        self.leader = cluster.wait_ready(STARTUP_TIMEOUT_S) if leader is None else leader

    def follow_leader(self) -> None:
        """A run goes to the current leader (an election between runs moves it)."""
        now = self.cluster.leader_index(timeout_s=LEADER_TIMEOUT_S)
        if now != self.leader:
            log(f"  {self.name}: leader moved, node {self.leader} -> node {now}")
            self.leader = now

    def server_pids(self) -> list[int]:
        return [n.proc.pid for n in self.cluster.nodes if n.alive]


def _snapshot(sides: dict, workers) -> dict:
    return {
        "t": time.monotonic(), "host": host_cpu_s(),
        # Per cluster (every ours-client side shares ours): each process counted once.
        "servers": {side.system: sum(proc_cpu_s(p) for p in side.server_pids()) for side in sides.values()},
        "clients": sum(proc_cpu_s(p.pid) for p in workers.procs),
        "driver": proc_cpu_s(os.getpid()),
    }


def measure(side: Side, sides: dict, workers, args, workload: str, clients: int, run_id: str) -> dict:
    """One run of ``workload`` with ``clients`` clients against ``side``'s leader."""
    from .grpc_bench import steal_and_other

    side.follow_leader()
    spec = {"system": side.system, "mode": side.mode, "workload": workload, "run_id": run_id,
            "target": side.cluster.nodes[side.leader].api_address, "fixed_token": 0,
            "warmup": args.warmup, "seconds": args.seconds}
    snaps: dict = {}

    def on_window(t_meas: float, t_end: float) -> None:
        def body():
            time.sleep(max(0.0, t_meas - time.monotonic()))
            snaps["a"] = _snapshot(sides, workers)
            time.sleep(max(0.0, t_end - time.monotonic()))
            snaps["b"] = _snapshot(sides, workers)

        snaps["thread"] = threading.Thread(target=body, daemon=True)
        snaps["thread"].start()

    res = workers.run(spec, clients, on_window=on_window)
    snaps["thread"].join(timeout=10)
    lat = sorted(res["latencies"])
    ops = len(lat)
    a, b = snaps.get("a"), snaps.get("b")
    nan = float("nan")
    row = {"system": side.name, "workload": workload, "clients": clients, "ops": ops,
           "ops_per_s": ops / args.seconds, "p50_ms": percentile(lat, 0.5) * 1000,
           "p99_ms": percentile(lat, 0.99) * 1000, "errors": res["errors"], "setup_errors": res["setup_errors"],
           "server_cpu_ms_per_op": nan, "client_cpu_ms_per_op": nan, "cores": {}}
    if a and b and ops:
        wall = b["t"] - a["t"]
        server_s = b["servers"][side.system] - a["servers"][side.system]
        client_s = b["clients"] - a["clients"]
        # Every process of this benchmark (both clusters, clients, this driver): the rest is "other".
        bench_s = sum(b["servers"].values()) - sum(a["servers"].values()) + client_s + b["driver"] - a["driver"]
        row["server_cpu_ms_per_op"] = 1000 * server_s / ops
        row["client_cpu_ms_per_op"] = 1000 * client_s / ops
        row["cores"] = {"servers": server_s / wall, "clients": client_s / wall,
                        **steal_and_other(b["host"][0] - a["host"][0], b["host"][1] - a["host"][1], bench_s, wall)}
    if res["setup_errors"]:
        # Fewer clients ran than asked: the row stays, counted and printed as errors.
        log(f"  {side.name} {workload} x{clients}: client setup failed: {res['setup_errors']}")
    c = row["cores"]
    log(f"  {side.name:8s} {workload:6s} c={clients:<3d} {row['ops_per_s']:7.0f} ops/s  p50 {row['p50_ms']:6.2f} "
        f"p99 {row['p99_ms']:7.2f} ms  CPU/op srv {row['server_cpu_ms_per_op']:.3f} cli "
        f"{row['client_cpu_ms_per_op']:.3f} ms  steal {c.get('steal', nan):.2f} other {c.get('other', nan):.2f}"
        + (f"  errors {row['errors']}" if row["errors"] else ""))
    return row


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__.split("\n\n")[1].strip())
    p.add_argument("--seconds", type=float, default=2.0, help="measured window per run (default 2)")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up per run, not counted (default 0.5)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds; every cell of both systems once per round (default 3; 0: failover trials only)")
    p.add_argument("--clients", default="1,16,64", help="client counts (default 1,16,64)")
    p.add_argument("--procs", type=int, default=4, help="client processes (default 4; 16 clients = 4 x 4 threads)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}")
    p.add_argument("--trials", type=int, default=10, help="failover trials per kind and system (default 10; 0: none)")
    p.add_argument("--json", metavar="FILE", help="write every run, cell and trial to FILE")
    p.add_argument("--chart", metavar="PNG", default=os.path.join("runs", "compare.png"),
                   help="chart file (default runs/compare.png; runs/ is git-ignored)")
    p.add_argument("--data-dir", help="parent of both clusters' data (default: a temp dir, removed after)")
    p.add_argument("--ours-setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a fencingd setting for our members (repeatable), for A/B runs: e.g. read_index=false")
    p.add_argument("--failover-b", action="append", default=[], metavar="KEY=VALUE",
                   help="a fencingd setting (repeatable) for a second cluster of ours, 'ours-b', that joins the "
                        "failover trials only, alternating with ours and etcd: the A/B of a failover setting "
                        "in one run, e.g. leader_lost_election_s=0")
    p.add_argument("--ours-client", default="raw", metavar="KINDS",
                   help="how our clients call, comma-separated, each measured beside etcd in the same rounds: "
                        "raw (generated stubs, a channel per client; the default), lib (a FencingClient per "
                        "client), multiplex (one FencingClient(multiplex=True) per client process: concurrent "
                        "writes, acquires and releases share WriteMany, AcquireMany and ReleaseMany calls); "
                        "e.g. raw,multiplex for an A/B")
    args = p.parse_args(argv)
    args.ours_clients = [k.strip() for k in args.ours_client.split(",") if k.strip()]
    unknown = [k for k in args.ours_clients if k not in OURS_CLIENTS]
    if unknown or not args.ours_clients or len(set(args.ours_clients)) != len(args.ours_clients):
        p.error(f"--ours-client: a comma-separated subset of {','.join(OURS_CLIENTS)}, each once")
    bad = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if bad:
        p.error(f"--workloads: unknown {', '.join(bad)} (known: {', '.join(WORKLOADS)})")
    if args.rounds < 0 or args.trials < 0 or args.procs < 1 or args.seconds <= 0:
        p.error("--procs must be >= 1, --rounds and --trials >= 0, --seconds > 0")
    if args.rounds == 0 and args.trials == 0:
        p.error("--rounds 0 --trials 0 measures nothing")
    args.ours_settings = _settings(p, "--ours-setting", args.ours_setting)
    args.failover_b_settings = _settings(p, "--failover-b", args.failover_b)
    if args.failover_b_settings and not args.trials:
        p.error("--failover-b needs failover trials (--trials > 0)")
    return args


def _settings(p, flag: str, items: list[str]) -> dict:
    """KEY=VALUE items as {key: value as its TOML type}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            p.error(f"{flag} {item!r}: KEY=VALUE")
        out[key.strip()] = _setting_value(value.strip())
    return out


def _setting_value(text: str):
    """A --ours-setting value as its TOML type: true/false, an int, a float, else a string."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run_side_by_side(args, base_dir: str, started: float, rows: list[dict], trials: list[dict]) -> None:
    """Both clusters and the client processes up, every round, then the failovers; appends
    to ``rows`` and ``trials`` as it goes (an interrupted run keeps what it measured) and
    leaves no process behind."""
    from testsupport.grpc_cluster import GrpcCluster

    from .etcd_cluster import EtcdCluster
    from .grpc_bench import CLUSTER_SETTINGS, Workers

    clients_list = [int(c) for c in args.clients.split(",") if c.strip()]
    workloads = [w for w in args.workloads.split(",") if w]
    with contextlib.ExitStack() as stack:
        workers = Workers(args.procs)
        stack.callback(workers.close)
        ours = stack.enter_context(GrpcCluster(
            os.path.join(base_dir, "ours"), settings={**CLUSTER_SETTINGS, **args.ours_settings}))
        if args.ours_settings:
            log(f"ours: {args.ours_settings}")
        etcd = stack.enter_context(EtcdCluster(os.path.join(base_dir, "etcd")))
        ours.start_all(timeout_s=STARTUP_TIMEOUT_S)
        etcd.start_all(timeout_s=STARTUP_TIMEOUT_S)
        ours_leader = ours.wait_ready(STARTUP_TIMEOUT_S)
        sides = {OURS_CLIENTS[kind]: Side(OURS_CLIENTS[kind], ours, system="ours", mode=OURS_MODES[kind],
                                          leader=ours_leader)
                 for kind in args.ours_clients}
        sides["etcd"] = Side("etcd", etcd)
        systems = list(sides)
        log(f"both clusters up in {time.monotonic() - started:.1f} s; measured: {', '.join(systems)}")
        run_no = 0
        for round_no in range(1, args.rounds + 1):
            log(f"round {round_no} of {args.rounds}")
            cell_no = 0
            for workload in workloads:
                for clients in clients_list:
                    # Rotate which system goes first from cell to cell and round to round.
                    first = (round_no + cell_no) % len(systems)
                    for system in systems[first:] + systems[:first]:
                        run_no += 1
                        row = measure(sides[system], sides, workers, args, workload, clients, f"r{run_no}")
                        row["round"] = round_no
                        rows.append(row)
                    cell_no += 1
        if args.trials:
            failover_sides = {"ours": ours, "etcd": etcd}
            if args.failover_b_settings:
                log(f"ours-b (failover trials only): {args.failover_b_settings}")
                ours_b = stack.enter_context(GrpcCluster(
                    os.path.join(base_dir, "ours-b"),
                    settings={**CLUSTER_SETTINGS, **args.ours_settings, **args.failover_b_settings}))
                ours_b.start_all(timeout_s=STARTUP_TIMEOUT_S)
                failover_sides = {"ours": ours, "ours-b": ours_b, "etcd": etcd}
            log(f"failover: {args.trials} trial(s) per kind and system")
            _failover.run(failover_sides, args.trials, log, trials)


def main(argv=None) -> int:
    args = parse_args(argv)
    ensure_repo_on_path()
    from .etcd_cluster import etcd_binary, etcd_version

    try:
        etcd_binary()
    except RuntimeError as exc:
        print(f"bench compare: {exc}", file=sys.stderr)
        return 2
    import grpc

    base_dir = tempfile.mkdtemp(prefix="bench-compare-", dir=args.data_dir)
    started = time.monotonic()
    info = {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "grpcio": grpc.__version__, "etcd": etcd_version(), "git": git_state(), "loadavg_start": loadavg(),
            "data_dir_fs": fs_type(base_dir), "fdatasync_p50_ms": round(fdatasync_cost(base_dir, n=100)["p50_ms"], 3),
            "seconds": args.seconds, "warmup": args.warmup, "rounds": args.rounds, "procs": args.procs}
    log(f"bench compare: nproc {info['nproc']}, load {info['loadavg_start']}, etcd {info['etcd']}, git {info['git']}")
    rows: list[dict] = []
    trials: list[dict] = []
    interrupted = False
    with sigterm_as_interrupt():
        try:
            run_side_by_side(args, base_dir, started, rows, trials)
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted: what was measured so far follows")
        finally:
            if args.data_dir is None:
                shutil.rmtree(base_dir, ignore_errors=True)
    info["loadavg_end"] = loadavg()
    info["elapsed_s"] = round(time.monotonic() - started, 1)
    cells = report.cells(rows)
    fails = report.failover_cells(trials) if trials else []
    title = (f"ours vs etcd {info['etcd']}, 3 members each on loopback, {info['nproc']} cores; "
             f"git {info['git']}; {args.rounds} round(s) of {args.seconds:g} s")
    print(f"\n{title}\nload average {info['loadavg_start']} at start, {info['loadavg_end']} at end; "
          f"data on {info['data_dir_fs']} (fdatasync p50 {info['fdatasync_p50_ms']} ms); "
          f"{args.procs} client process(es); elapsed {info['elapsed_s']} s\n")
    from .grpc_bench import disturbance

    disturbed = [r for r in rows if r["cores"] and disturbance(r["cores"])]
    if disturbed:
        print(f"{len(disturbed)} of {len(rows)} runs lost cores to the hypervisor (steal > 0.10) or to processes "
              f"not ours (other > 0.25): their figures are pessimistic; the JSON has them per run\n")
    if cells:
        report.print_cells(cells)
    if fails:
        print("\nfailover: leader signalled -> next successful acquire + write (ms)")
        report.print_failover(fails)
    if os.path.dirname(args.chart):
        os.makedirs(os.path.dirname(args.chart), exist_ok=True)
    why_not = report.chart(cells, fails, args.chart, title) if cells else "no runs"
    print(f"\nchart: {args.chart}" if why_not is None else f"\nchart not drawn: {why_not}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"info": info, "rows": rows, "cells": cells, "failover_trials": trials,
                       "failover": fails, "chart": None if why_not else args.chart}, f, indent=2, default=str)
        print(f"figures written to {args.json}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

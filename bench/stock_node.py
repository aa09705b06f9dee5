"""Stock pysyncobj baseline node: a trivial replicated counter with DEFAULT settings.

    python -m bench.stock_node --self 127.0.0.2:7001 \
        --peers 127.0.0.3:7001,127.0.0.4:7001 --control-port 7002 [--data-dir DIR]

Speaks the control protocol of testsupport/control.py (length-prefixed
msgpack maps) with the ops the benchmark needs:

  ping                               -> {pong, pid}
  status                             -> {is_leader, has_quorum, term, leader, ...}
  bench {threads, count, timeout_s, seconds?}
                                     -> {latencies, elapsed_s, outcomes, journal_syncs}
       ``threads`` proposers each call ``incr(sync=True, timeout=timeout_s)`` until
       they made ``count`` calls or ``seconds`` elapsed (whichever comes first).

Configuration: ``SyncObjConf()`` defaults, plus only ``bindAddress`` (the node's own
address) so the listener stays on its loopback alias instead of 0.0.0.0 — that changes
where it listens, not how it batches, ticks or stores. Journal and dump are the
defaults: in memory (no journalFile, no fullDumpFile), so nothing is ever written to disk.
``--data-dir`` is accepted (for symmetry with node_process) and ignored.

This file is benchmark-only; it must never be used as a product node.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.syncobj import SyncObjException

from testsupport.control import serve_control

_FAIL_NAMES = {
    1: "queue_full",
    2: "missing_leader",
    3: "discarded",
    4: "not_leader",
    5: "leader_changed",
    6: "request_denied",
    7: "unknown_outcome",
}


class Counter(SyncObj):
    def __init__(self, self_address: str, peers: list[str], conf: SyncObjConf):
        # Set before SyncObj.__init__ starts the tick thread (coordinator/raft/RAFT.md "Call semantics").
        self.value = 0
        super().__init__(self_address, peers, conf=conf)

    @replicated
    def incr(self):
        self.value += 1
        return self.value


class StockService:
    def __init__(self, obj: Counter):
        self.obj = obj

    def status(self) -> dict:
        for _ in range(10):
            try:
                raw = self.obj.getStatus()  # races with the tick thread; retry
                break
            except RuntimeError:
                continue
        else:
            raw = {}
        leader = raw.get("leader")
        return {
            "self": self.obj.selfNode.address,
            "leader": leader.address if leader is not None else None,
            "is_leader": self.obj._isLeader(),
            "term": raw.get("raft_term", self.obj.raftCurrentTerm),
            "commit_index": raw.get("commit_idx", self.obj.raftCommitIndex),
            "last_applied": raw.get("last_applied", self.obj.raftLastApplied),
            "has_quorum": raw.get("has_quorum", False),
            "log_len": raw.get("log_len", 0),
            "ready": self.obj.isReady(),
            "journal_syncs": 0,  # the stock journal never syncs
            "value": self.obj.value,
            "pid": os.getpid(),
        }

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "ping":
            return {"pong": True, "pid": os.getpid()}
        if op == "status":
            return self.status()
        if op == "bench":
            seconds = req.get("seconds")
            return self.bench(
                int(req["threads"]),
                int(req.get("count", 1 << 62)),
                float(req.get("timeout_s", 5.0)),
                None if seconds is None else float(seconds),
            )
        return {"error": f"unknown op {op!r}"}

    def bench(self, threads: int, count: int, timeout_s: float, seconds: float | None) -> dict:
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        lock = threading.Lock()
        start_gate = threading.Event()

        def worker():
            local, local_out = [], {}
            start_gate.wait()
            deadline = None if seconds is None else time.perf_counter() + seconds
            for _ in range(count):
                if deadline is not None and time.perf_counter() >= deadline:
                    break
                t0 = time.perf_counter()
                try:
                    self.obj.incr(sync=True, timeout=timeout_s)
                    key = "applied"
                except SyncObjException as exc:
                    code = exc.errorCode
                    key = "timeout" if code == "Timeout" else _FAIL_NAMES.get(code, f"fail_{code}")
                local.append(time.perf_counter() - t0)
                local_out[key] = local_out.get(key, 0) + 1
            with lock:
                latencies.extend(local)
                for k, v in local_out.items():
                    outcomes[k] = outcomes.get(k, 0) + v

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
        for w in workers:
            w.start()
        start = time.perf_counter()
        start_gate.set()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        return {"latencies": latencies, "elapsed_s": elapsed, "outcomes": outcomes, "journal_syncs": 0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--self", dest="self_address", required=True)
    p.add_argument("--peers", required=True)
    p.add_argument("--control-port", type=int, required=True)
    p.add_argument("--data-dir", default=None, help="ignored: the stock defaults keep everything in memory")
    # ProcessCluster passes its node options; the baseline ignores them on purpose.
    args, _ignored = p.parse_known_args(argv)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    conf = SyncObjConf(bindAddress=args.self_address)
    obj = Counter(args.self_address, [p for p in args.peers.split(",") if p], conf)
    host = args.self_address.rsplit(":", 1)[0]
    server = serve_control(StockService(obj), host, args.control_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"READY stock {args.self_address} control={host}:{args.control_port} pid={os.getpid()}", flush=True)
    stop.wait()
    server.shutdown()
    obj.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())

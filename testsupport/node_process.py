"""Run one Raft replica of the fencing state machine as a process, for tests and benchmarks.

    python -m testsupport.node_process --self 127.0.0.2:7001 \
        --peers 127.0.0.3:7001,127.0.0.4:7001 --data-dir DIR --control-port 7101

Owns: process lifecycle and a control socket (control.py frames) on the node's own
address. Must never: decide anything a state machine or Raft decides.

Requests (msgpack maps, key "op"):
  ping | status | digest | compact
  propose  {cmd: bytes, timeout_s}  - cmd is an encoded command; its stamp is
                                      replaced here by the node's log-clock stamp
  propose_raw {entry: bytes, timeout_s} - ``entry`` proposed as it is, unchecked: a
                                      stand-in for an entry a later build wrote
  bench    {threads, count, timeout_s} - fenced writes proposed inside this process,
                                      returns per-call latencies (seconds)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from coordinator.core import ops
from coordinator.core.state_machine import FencingStateMachine, outcome_to_wire
from coordinator.raft.interface import ProposeOutcome
from coordinator.raft.node import ALL_FIXES, RaftConfig, RaftNode
from testsupport.control import serve_control

log = logging.getLogger("node_process")


def _wire(result) -> dict:
    reply = {"outcome": result.outcome.value, "index": result.index, "detail": result.detail}
    if result.value is not None:
        reply["value"] = outcome_to_wire(result.value)
    return reply


class NodeService:
    def __init__(self, node: RaftNode):
        self.node = node

    def propose_command(self, body: ops.Body, timeout_s: float):
        return self.node.propose(ops.encode(body, self.node.next_stamp_ms()), timeout_s, batch_key=body.resource)

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "ping":
            return {"pong": True, "pid": os.getpid()}
        if op == "status":
            status = self.node.status()
            status["epoch"], status["log_clock_ms"] = self.node.read(lambda sm: (sm.epoch, sm.log_clock_ms))
            status["pid"] = os.getpid()
            return status
        if op == "digest":
            index, digest = self.node.digest()
            epoch = self.node.read(lambda sm: sm.epoch)
            return {"index": index, "digest": digest, "epoch": epoch}
        if op == "compact":
            self.node.force_log_compaction()
            return {"ok": True}
        if op == "propose":
            _stamp_ms, body = ops.decode(req["cmd"])  # restamped here, as the proposer does
            return _wire(self.propose_command(body, float(req.get("timeout_s", 5.0))))
        if op == "propose_raw":
            return _wire(self.node.propose(bytes(req["entry"]), float(req.get("timeout_s", 5.0))))
        if op == "bench":
            return self.bench(int(req["threads"]), int(req["count"]), float(req.get("timeout_s", 5.0)))
        return {"error": f"unknown op {op!r}"}

    def bench(self, threads: int, count: int, timeout_s: float) -> dict:
        """Fenced writes from ``threads`` proposers, ``count`` each, inside this process."""
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        lock = threading.Lock()
        run_id = os.urandom(4).hex()

        def worker(n: int):
            resource = f"bench/{run_id}/{n}"
            acq = self.propose_command(
                ops.Acquire(resource=resource, holder=f"bench-{n}", ttl_ms=60_000, op_id=os.urandom(16)),
                timeout_s,
            )
            if acq.outcome is not ProposeOutcome.APPLIED:
                with lock:
                    outcomes["acquire_" + acq.outcome.value] = outcomes.get("acquire_" + acq.outcome.value, 0) + 1
                return
            token = acq.value.result.token
            local = []
            for i in range(count):
                cmd = ops.Write(resource=resource, key=f"k{i % 16}", value=b"v" * 32, token=token,
                                op_id=os.urandom(16))
                t0 = time.perf_counter()
                res = self.propose_command(cmd, timeout_s)
                local.append(time.perf_counter() - t0)
                with lock:
                    outcomes[res.outcome.value] = outcomes.get(res.outcome.value, 0) + 1
            with lock:
                latencies.extend(local)

        workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        return {"latencies": latencies, "elapsed_s": elapsed, "outcomes": outcomes,
                "journal_syncs": self.node.status()["journal_syncs"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--self", dest="self_address", required=True)
    p.add_argument("--peers", required=True, help="comma-separated host:port of the other members")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--control-port", type=int, required=True)
    p.add_argument("--fixes", default="all", help="'all', 'none' or a comma-separated list")
    p.add_argument("--track-synced", action="store_true", help="record synced journal length (power-loss tests)")
    p.add_argument("--compaction-entries", type=int, default=5_000)
    p.add_argument("--raft-min-timeout", type=float, default=1.0)
    p.add_argument("--raft-max-timeout", type=float, default=2.0)
    p.add_argument("--leader-fallback-timeout", type=float, default=1.5)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.fixes == "all":
        fixes = ALL_FIXES
    elif args.fixes == "none":
        fixes = frozenset()
    else:
        fixes = frozenset(f for f in args.fixes.split(",") if f)
    config = RaftConfig(
        self_address=args.self_address,
        peer_addresses=tuple(p for p in args.peers.split(",") if p),
        data_dir=args.data_dir,
        raft_min_timeout_s=args.raft_min_timeout,
        raft_max_timeout_s=args.raft_max_timeout,
        leader_fallback_timeout_s=args.leader_fallback_timeout,
        log_compaction_min_entries=args.compaction_entries,
        log_compaction_min_time_s=3600.0,
        fixes=fixes,
        track_synced=args.track_synced,
    )
    node = RaftNode(config, FencingStateMachine())
    host = args.self_address.rsplit(":", 1)[0]
    server = serve_control(NodeService(node), host, args.control_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"READY {args.self_address} control={host}:{args.control_port} pid={os.getpid()}", flush=True)
    stop.wait()
    server.shutdown()
    node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench list``: what one List page costs a member, by the size of its resource table.

Builds a state machine with N resources (short names under a few prefixes, each with a live
lease) and times the listing READ_BARRIER a List sends -- one pass over the names, then a bounded
heap (coordinator/core/listing.py) -- as the leader's read-index path runs it (``read_now``,
under the apply lock in a member). Prints, per N: the median and the worst of a few runs, for a
first page of the whole table, a page deep inside it (``after``), and a narrow prefix that
matches a hundredth of the names. Prints figures only; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

from coordinator.core import commands, limits, ops
from coordinator.core.state_machine import FencingStateMachine

PREFIXES = 100  # names are p00/00000001 ... p99/...: a narrow prefix holds a hundredth of them


def build(n: int) -> FencingStateMachine:
    sm = FencingStateMachine()
    for i in range(n):
        name = f"p{i % PREFIXES:02d}/{i:08d}"
        cmd = commands.acquire(resource=name, holder="bench", ttl_ms=limits.LEASE_TTL_MS_MAX,
                               op_id=i.to_bytes(16, "big"), stamp_ms=1)
        sm.execute(cmd)
    return sm


def timed(sm: FencingStateMachine, cmd: ops.ReadBarrier, runs: int) -> tuple[float, float, int]:
    took = []
    items = 0
    for _ in range(runs):
        start = time.perf_counter()
        outcome = sm.read_now(cmd)
        took.append(time.perf_counter() - start)
        items = len(getattr(outcome, "result", {}).get("resources", []))
    return statistics.median(took) * 1000, max(took) * 1000, items


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench list", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000",
                        help="comma-separated resource counts (default 1000,10000,100000,1000000)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per figure (default 5)")
    parser.add_argument("--limit", type=int, default=limits.LIST_LIMIT_MAX, help="page size (default the max)")
    args = parser.parse_args(argv)
    print(f"List page cost (read_now of a listing READ_BARRIER), page size {args.limit}, {args.runs} runs each")
    print(f"{'resources':>10}  {'case':<12} {'items':>5}  {'median ms':>9}  {'worst ms':>8}")
    for n in (int(s) for s in args.sizes.split(",")):
        sm = build(n)
        cases = {
            "whole table": ops.ReadBarrier(prefixes=("",), limit=args.limit),
            "deep page": ops.ReadBarrier(prefixes=("",), limit=args.limit, after="p50/"),
            "one prefix": ops.ReadBarrier(prefixes=("p07/",), limit=args.limit),
        }
        for case, cmd in cases.items():
            median, worst, items = timed(sm, cmd, args.runs)
            print(f"{n:>10}  {case:<12} {items:>5}  {median:>9.1f}  {worst:>8.1f}", flush=True)
        del sm
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))

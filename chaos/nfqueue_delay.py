"""Delay with jitter for node-to-node packets: iptables NFQUEUE rules + a netfilterqueue delayer.

``tc netem`` is not available on this kernel (CHAOS.md). Instead packets between the given
addresses are sent to NFQUEUE ``QUEUE_NUM`` (with ``--queue-bypass``: if no delayer is bound, packets
pass undelayed rather than being dropped), and this module, run as a process
(``python -m chaos.nfqueue_delay --delay-ms 100 --jitter-ms 20``), holds each packet for
``delay ± jitter`` ms before accepting it. Verdicts are issued by a timer thread in due order, so
one slow packet does not serialize the others.

Needs: ``apt-get install -y libnetfilter-queue-dev`` and ``pip install netfilterqueue``.
The rules are iptables OUTPUT rules tagged ``-m comment --comment chaos-delay`` (nft's ``queue``
statement is not in this kernel; iptables-nft's xt NFQUEUE is), removed by ``remove_rules()``
which the harness teardown always calls.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import signal
import subprocess
import sys
import threading
import time

# Overridable for the same reason as harness.NFT_TABLE: one queue per concurrent run.
QUEUE_NUM = int(os.environ.get("FENCING_CHAOS_NFQUEUE_NUM", "7"))


COMMENT = "chaos-delay"


def _rule(src: str, dst: str, port_match: list[str]) -> list[str]:
    return ["OUTPUT", "-s", src, "-d", dst, "-p", "tcp", *port_match, "-m", "comment", "--comment", COMMENT,
            "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM), "--queue-bypass"]


def add_rules(pairs: list[tuple[str, str]], port: int) -> None:
    """iptables NFQUEUE rules for the Raft traffic (``port``, both directions) between each pair
    (nft's own ``queue`` statement is not built into this kernel)."""
    for src, dst in pairs:
        for match in (["--dport", str(port)], ["--sport", str(port)]):
            subprocess.run(["iptables", "-I", *_rule(src, dst, match)], check=True, capture_output=True,
                           text=True, timeout=10)


def remove_rules() -> None:
    """Delete every rule tagged chaos-delay, then the ``ip filter`` table if iptables left it empty.
    Idempotent; never raises when iptables is missing."""
    try:
        listing = subprocess.run(["iptables", "-S", "OUTPUT"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return
    for line in listing.stdout.splitlines():
        if COMMENT in line and line.startswith("-A "):
            subprocess.run(["iptables", "-D", *line.split()[1:]], capture_output=True, timeout=10)
    rest = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    if rest and all(r.startswith("-P ") for r in rest):
        subprocess.run(["nft", "delete", "table", "ip", "filter"], capture_output=True, timeout=10)


def serve(delay_ms: float, jitter_ms: float, seed: int = 0) -> int:
    from netfilterqueue import NetfilterQueue

    rng = random.Random(seed)
    heap: list[tuple[float, int, object]] = []
    cond = threading.Condition()
    counter = [0]
    stop = threading.Event()

    def on_packet(pkt) -> None:
        due = time.monotonic() + max(0.0, delay_ms + rng.uniform(-jitter_ms, jitter_ms)) / 1000
        with cond:
            counter[0] += 1
            heapq.heappush(heap, (due, counter[0], pkt))
            cond.notify()

    def releaser() -> None:
        while not stop.is_set():
            with cond:
                while not heap and not stop.is_set():
                    cond.wait(0.1)
                if stop.is_set():
                    break
                due, _, pkt = heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                heapq.heappop(heap)
            try:
                pkt.accept()
            except Exception:  # noqa: BLE001
                pass

    nfq = NetfilterQueue()
    nfq.bind(QUEUE_NUM, on_packet, max_len=4096)
    threading.Thread(target=releaser, daemon=True).start()

    def on_term(*_):
        stop.set()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    print("DELAYER READY", flush=True)
    try:
        nfq.run(block=True)
    except SystemExit:
        pass
    finally:
        stop.set()
        with cond:
            for _, _, pkt in heap:  # never strand a packet
                try:
                    pkt.accept()
                except Exception:  # noqa: BLE001
                    pass
        nfq.unbind()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.nfqueue_delay")
    p.add_argument("--delay-ms", type=float, default=100.0)
    p.add_argument("--jitter-ms", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return serve(args.delay_ms, args.jitter_ms, args.seed)


if __name__ == "__main__":
    sys.exit(main())

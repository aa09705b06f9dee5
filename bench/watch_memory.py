"""``python -m bench watch``: what slow watchers cost a member -- its RSS with none, then with
N watchers that never read, while the cluster applies writes worth several times the watch
history (WATCH_HISTORY_BYTES_MAX); then what those watchers are told when they read again.

Figures only: nothing here asserts. A three-member cluster of real ``fencingd serve``
processes on loopback (testsupport.grpc_cluster); the watchers stream from one follower,
each on its own channel, reading only the first (``created``) response.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client.sync import FencingClient
from coordinator.server.watch_hub import WATCH_HISTORY_BYTES_MAX

MIB = 1024 * 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def write_burst(client: FencingClient, token: int, writes: int, value_bytes: int) -> float:
    value = os.urandom(value_bytes)
    started = time.monotonic()
    for _ in range(writes):
        client.write("bench/w", "k", value, token=token)  # one key: the state does not grow
    return time.monotonic() - started


def bursts(client: FencingClient, token: int, args: argparse.Namespace, pid: int) -> str:
    figures = []
    for _ in range(args.bursts):
        took = write_burst(client, token, args.writes, args.value_bytes)
        figures.append(f"{rss_mib(pid):.1f} MiB ({took:.1f} s)")
    return ", ".join(figures)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench watch", description=__doc__)
    parser.add_argument("--watchers", type=int, default=30)
    parser.add_argument("--writes", type=int, default=400, help="writes per burst")
    parser.add_argument("--value-bytes", type=int, default=64 * 1024)
    parser.add_argument("--bursts", type=int, default=3, help="bursts in each phase")
    args = parser.parse_args(argv)
    from testsupport.grpc_cluster import GrpcCluster

    settings = {"streams_max": args.watchers + 4, "streams_per_principal_max": args.watchers + 4,
                "watchers_per_principal_max": args.watchers, "grpc_threads": 2 * args.watchers + 32}
    with tempfile.TemporaryDirectory() as base, GrpcCluster(os.path.join(base, "c"), settings=settings) as cluster:
        cluster.start_all()
        leader = cluster.leader_index()
        follower = (leader + 1) % 3
        pid = cluster.nodes[follower].proc.pid
        eps = [n.api_address for n in cluster.nodes]
        burst_mib = args.writes * args.value_bytes / MIB
        print(f"watch history bound: {WATCH_HISTORY_BYTES_MAX / MIB:.0f} MiB per member; each burst:"
              f" {args.writes} writes of {args.value_bytes} bytes = {burst_mib:.1f} MiB")
        with FencingClient(eps, timeout_s=30) as client:
            token = client.acquire("bench/w", ttl_ms=600_000, holder="bench").token
            write_burst(client, token, args.writes, args.value_bytes)  # warm-up: history full
            print(f"0 watchers:  follower RSS {rss_mib(pid):.1f} MiB, after each burst:"
                  f" {bursts(client, token, args, pid)}")
            channels = [grpc.insecure_channel(eps[follower]) for _ in range(args.watchers)]
            streams = [pb_grpc.WatchStub(ch).Watch(pb.WatchRequest(prefix="bench/"), timeout=600) for ch in channels]
            for stream in streams:
                next(stream)  # created; then never read until the end
            print(f"{args.watchers} slow watchers opened: RSS {rss_mib(pid):.1f} MiB, after each burst:"
                  f" {bursts(client, token, args, pid)}")
            fresh = [grpc.insecure_channel(eps[follower]) for _ in range(args.watchers)]
            opened_again = 0
            for ch in fresh:
                try:
                    next(pb_grpc.WatchStub(ch).Watch(pb.WatchRequest(prefix="bench/"), timeout=10))
                    opened_again += 1
                except grpc.RpcError as err:
                    print(f"  a new watcher refused: {err.code().name}: {err.details()}")
            print(f"new watchers opened on that member while the slow ones had not read yet:"
                  f" {opened_again} of {args.watchers} (their slots came back)")
            for ch in fresh:
                ch.close()
            ended: dict[str, int] = {}
            delivered = 0
            for stream in streams:
                try:
                    for _response in stream:
                        delivered += 1
                except grpc.RpcError as err:
                    key = f"{err.code().name}: {err.details()}"
                    ended[key.split(" it had read")[0]] = ended.get(key.split(" it had read")[0], 0) + 1
            print(f"then read: {delivered} responses delivered in all before the end; how they ended:")
            for text, count in ended.items():
                print(f"  {count} x {text}")
            for ch in channels:
                ch.close()
            time.sleep(1.0)
            print(f"after they closed: RSS {rss_mib(pid):.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

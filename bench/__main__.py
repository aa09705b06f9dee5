"""``python -m bench NAME [ARGS]``: run one benchmark by name (each also runs as its own module).

Owns only the dispatch; every benchmark parses its own arguments.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "compare": ("bench.compare", "ours beside etcd: throughput, latency, CPU per op, failover"),
    "grpc": ("bench.grpc_bench", "the product end to end, beside an in-memory gRPC server"),
    "raft": ("bench.raft_bench", "replicated commands in the leader, ours beside stock pysyncobj"),
    "profile": ("bench.profile_raft", "where a Raft op's time goes"),
    "scale": ("bench.scale", "what the state's size costs: RSS, snapshot, restore, stall, keep-alives"),
    "probes": ("bench.exhaustion_probes", "issue 26's seven exhaustion and impersonation probes, then and now"),
    "session": ("bench.session_bench", "1,000 leases in one client.session(): threads, CPU, renewal lag"),
    "watch": ("bench.watch_memory", "what slow watchers cost a member: RSS, and what they are told"),
    "list": ("bench.list_bench", "what one List page costs a member, by the number of resources"),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        names = "\n".join(f"  {name:8s} {what}" for name, (_, what) in BENCHMARKS.items())
        print(f"usage: python -m bench NAME [ARGS]  (NAME --help for its options)\n{names}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

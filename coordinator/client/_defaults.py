"""The client's defaults: every timeout, retry and discovery number, each with its reason.

Owns: the values the clients' keywords default to, the discovery and suspicion intervals, the
channel options, and the endpoints of the local dev cluster. Must never: hold state or import
anything of the client beyond ``coordinator.core.limits``: every other client module reads
these, so this one reads none of them.
"""

from __future__ import annotations

from typing import Any

from coordinator.core import limits

# The local three-node dev cluster (`fencingd dev`, API ports 7100-7102): fencingctl uses
# this when neither --endpoints nor FENCING_ENDPOINTS is given.
DEFAULT_ENDPOINTS: tuple[str, ...] = ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")

# -- defaults (each one is a keyword of the clients) ----------------------------------------
# Whole-call budget, retries included: a leader election takes 1-2 s (raft_node's timeout
# window) and a SIGKILLed leader is noticed at once, so 10 s rides out an election plus a
# few slow attempts, yet a caller still hears back quickly when the cluster is really down.
TIMEOUT_S_DEFAULT = 10.0
# One RPC attempt: a commit is milliseconds when healthy; a paused or partitioned node is
# abandoned after 3 s so the retry can go elsewhere well inside the whole-call budget.
ATTEMPT_TIMEOUT_S_DEFAULT = 3.0
# Attempts per call: with the backoff below, 10 attempts span about 4 s of sleeping, more
# than one election, and cap the load a client adds to a struggling cluster.
RETRY_MAX_ATTEMPTS_DEFAULT = 10
# First backoff 50 ms, doubling, capped at 1 s: quick after a failover, gentle while down.
RETRY_BACKOFF_S_DEFAULT = 0.05
RETRY_BACKOFF_MAX_S_DEFAULT = 1.0
# Leader discovery: one parallel Cluster.Status round waits at most this long; a live node
# answers in milliseconds, a paused one is not worth waiting for.
DISCOVERY_TIMEOUT_S = 1.0
# Discovery rounds are at least this far apart, so a cluster in an election is not flooded.
DISCOVERY_INTERVAL_S = 0.5
# An endpoint whose attempt just failed (connection, deadline) is not taken back as the
# leader for this long, even if the others still name it: a killed or paused leader is
# named by its followers until they elect another one (1-2 s).
SUSPECT_S = 2.0
# A backup (snapshot or restore, up to limits.BACKUP_BYTES_MAX, ~740 MB) in one attempt: the
# transfer, the check of the whole backup and ~707 chunk entries through the log take a minute
# or two at the largest; five minutes leaves room on a slow disk yet ends a stuck transfer.
BACKUP_TIMEOUT_S_DEFAULT = 300.0
# Channel options. Message size: a unary snapshot or restore is the largest message. Reconnect
# backoff: a restarted node is used again within 1 s (gRPC's default backoff grows to 120 s).
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

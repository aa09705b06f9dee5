"""fencingctl's per-endpoint view: ``endpoint status``, ``endpoint health``, and what
``status`` shows when members are down or the quorum is lost.

Owns: asking each endpoint on its own, all at once, with a short deadline each (never a
leader-routed call, so the answers come with two of three members down and without a
quorum); which members answer at all; the tables and JSON of those answers and the exit
code they mean. Must never: retry, send a question to another endpoint than the one it is
about, or present a member's own (possibly stale) view as the cluster's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from coordinator.client import exceptions as exc
from coordinator.client.ctl_parser import TLS_ENV
from coordinator.client.results import ClusterStatus
from coordinator.client.sync import FencingClient, open_channel, tls_credentials

# Each endpoint's deadline (at most --timeout): a member that answers at all answers a local
# Status or a health check in milliseconds; 2 s also covers a member busy with a snapshot,
# and keeps `endpoint status` with two members down at about 2 s, not two whole timeouts.
ENDPOINT_TIMEOUT_S = 2.0
EXIT_OK = 0
EXIT_UNAVAILABLE = 4  # fencingctl's code: some endpoint did not answer, or is not serving


@dataclasses.dataclass(frozen=True)
class EndpointStatus:
    endpoint: str
    reachable: bool
    took_ms: float
    status: ClusterStatus | None = None
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"endpoint": self.endpoint, "reachable": self.reachable,
                               "took_ms": round(self.took_ms, 1), "error": self.error or None}
        s = self.status
        if s is not None:
            doc.update(
                member_id=s.header.member_id, is_leader=_is_leader(self.endpoint, s), leader=s.leader,
                leader_api_address=s.leader_api_address, term=s.term, commit_index=s.commit_index,
                applied_index=s.applied_index, epoch=s.epoch, has_quorum=s.has_quorum,
                version=s.version, data_size_bytes=s.data_size_bytes,
            )
        return doc


@dataclasses.dataclass(frozen=True)
class EndpointHealth:
    endpoint: str
    health: str  # SERVING, NOT_SERVING, ... (grpc.health.v1), or "UNREACHABLE"
    took_ms: float
    error: str = ""

    @property
    def healthy(self) -> bool:
        return self.health == "SERVING"

    def as_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "health": self.health, "healthy": self.healthy,
                "took_ms": round(self.took_ms, 1), "error": self.error or None}


def _is_leader(endpoint: str, status: ClusterStatus) -> bool:
    """Whether the member at ``endpoint`` says it is the leader itself."""
    if not status.leader:
        return False
    if status.leader_api_address == endpoint:
        return True
    return any(m.id == status.leader and m.member_id == status.header.member_id for m in status.members)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _all_at_once(fn: Callable[[str], Any], endpoints: Sequence[str]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        return list(pool.map(fn, endpoints))


# -- asking ------------------------------------------------------------------------------


def endpoint_statuses(client: FencingClient, timeout_s: float) -> list[EndpointStatus]:
    """A local Status (the member's own view) from every endpoint of ``client``, each on its own."""

    def ask(endpoint: str) -> EndpointStatus:
        started = time.monotonic()
        try:
            status = client.status(endpoint=endpoint, timeout_s=timeout_s, local=True)
        except exc.FencingError as error:
            # An error the member sent (ErrorInfo: no leader, unauthenticated...) means it is up.
            took = (time.monotonic() - started) * 1000
            return EndpointStatus(endpoint, bool(error.reason), took, error=_one_line(error))
        return EndpointStatus(endpoint, True, (time.monotonic() - started) * 1000, status)

    return _all_at_once(ask, client.endpoints)


# grpc.health.v1's Check, spoken without grpcio-health-checking: that package is a server
# dependency (the [server] extra), and a client-only install runs `fencingctl endpoint health` too.
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING_STATUS_NAMES = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")


def serving_status(reply: bytes) -> str:
    """The status name of an encoded HealthCheckResponse: ``{status = 1}``, an enum (a varint).
    Empty bytes are the default, UNKNOWN; a field or value this client does not know is named
    by its number."""
    if not reply:
        return SERVING_STATUS_NAMES[0]
    if reply[0] != 0x08 or len(reply) != 2 or reply[1] >= 0x80:
        return f"UNKNOWN (undecoded answer {reply.hex()})"
    value = reply[1]
    return SERVING_STATUS_NAMES[value] if value < len(SERVING_STATUS_NAMES) else f"UNKNOWN ({value})"


def health_of(
    endpoints: Sequence[str], credentials: grpc.ChannelCredentials | None, timeout_s: float
) -> list[EndpointHealth]:
    """grpc.health.v1 Check (the whole server, service "") of every endpoint, each on its own."""

    def ask(endpoint: str) -> EndpointHealth:
        started = time.monotonic()
        with open_channel(endpoint, credentials) as channel:
            try:
                check: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(HEALTH_CHECK)
                reply = check(b"", timeout=timeout_s)  # HealthCheckRequest{service: ""} is empty
            except grpc.RpcError as error:
                took = (time.monotonic() - started) * 1000
                code = error.code() if hasattr(error, "code") else None
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, None):
                    return EndpointHealth(endpoint, "UNREACHABLE", took, f"no answer within {timeout_s:g} s")
                return EndpointHealth(endpoint, "UNKNOWN", took, f"{code.name}: {error.details()}")
        took = (time.monotonic() - started) * 1000
        return EndpointHealth(endpoint, serving_status(reply), took)

    return _all_at_once(ask, endpoints)


def channel_credentials(args: Any) -> grpc.ChannelCredentials | None:
    """The TLS credentials the options (or their environment variables) name, as ``_client``'s."""
    return tls_credentials(**{name: getattr(args, name, None) or os.environ.get(env) for name, env in TLS_ENV.items()})


def endpoint_deadline(args: Any) -> float:
    return min(float(getattr(args, "timeout", ENDPOINT_TIMEOUT_S)), ENDPOINT_TIMEOUT_S)


# -- commands ----------------------------------------------------------------------------


def run_endpoint(client: FencingClient, args: Any, name: str, out: str) -> int:
    """``endpoint status`` / ``endpoint health``: 0 when every endpoint answered (and is
    SERVING), else 4 (unavailable) after the whole table."""
    if name == "endpoint-status":
        answers = endpoint_statuses(client, endpoint_deadline(args))
        if out == "json":
            print(json.dumps({"endpoints": [a.as_dict() for a in answers]}, sort_keys=True))
        else:
            _table(["ENDPOINT", "REACHABLE", "MEMBER", "LEADER", "IS_LEADER", "TERM", "APPLIED", "COMMIT",
                    "QUORUM", "VERSION", "DATA", "ERROR"], [_status_row(a, answers) for a in answers])
        return EXIT_OK if all(a.status is not None for a in answers) else EXIT_UNAVAILABLE
    health = health_of(client.endpoints, channel_credentials(args), endpoint_deadline(args))
    if out == "json":
        print(json.dumps({"endpoints": [h.as_dict() for h in health]}, sort_keys=True))
    else:
        _table(["ENDPOINT", "HEALTH", "TOOK", "ERROR"],
               [[h.endpoint, h.health, f"{h.took_ms:.1f}ms", h.error or "-"] for h in health])
    return EXIT_OK if all(h.healthy for h in health) else EXIT_UNAVAILABLE


def _status_row(a: EndpointStatus, answers: Sequence[EndpointStatus]) -> list[str]:
    s = a.status
    if s is None:
        return [a.endpoint, "yes" if a.reachable else "no", *(["-"] * 9), _short_error(a)]
    leader = s.leader_api_address or s.leader or "-"
    if any(b.endpoint == s.leader_api_address and not b.reachable for b in answers):
        leader += " (down)"  # this member's view is older than the leader's death
    return [
        a.endpoint, "yes", s.header.member_id or "-", leader,
        "yes" if _is_leader(a.endpoint, s) else "no", str(s.term), str(s.applied_index), str(s.commit_index),
        "yes" if s.has_quorum else "no", s.version or "-", size_text(s.data_size_bytes), "-",
    ]


def _short_error(a: EndpointStatus) -> str:
    """The table's ERROR cell: the gist (the whole message is in --output json)."""
    if a.reachable:
        return a.error or "-"
    if "Connection refused" in a.error:
        return "unreachable: connection refused"
    if "Deadline" in a.error or "deadline" in a.error or "timed out" in a.error:
        return "unreachable: no answer in time"
    return "unreachable"


def size_text(n: int) -> str:
    """Bytes as people read them: 512 B, 1.5 kB, 3.2 MB (decimal units, as etcdctl's DB SIZE)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # pragma: no cover


def _table(titles: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(t), *(len(r[i]) for r in rows)]) for i, t in enumerate(titles)]
    print("  ".join(f"{t:<{w}}" for t, w in zip(titles, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip())


# -- status with members down ------------------------------------------------------------


def reachability(members: Sequence[Any], args: Any) -> dict[str, bool | None]:
    """api_address -> whether that member answers a health check at all (None: no address known)."""
    addresses = [m.api_address for m in members if m.api_address]
    health = health_of(addresses, channel_credentials(args), endpoint_deadline(args)) if addresses else []
    return {h.endpoint: h.health != "UNREACHABLE" for h in health}


def best_local_status(answers: Sequence[EndpointStatus]) -> ClusterStatus | None:
    """The own view of the answering endpoint with the highest term and applied index (None
    if no endpoint answered)."""
    answered = [a.status for a in answers if a.status is not None]
    return max(answered, key=lambda s: (s.term, s.applied_index)) if answered else None


def quorum_impossible(answers: Sequence[EndpointStatus]) -> bool:
    """True when the endpoints known not to answer are voters enough that no majority is left
    (then a read through the log cannot succeed, and ``status`` need not wait its deadline
    for it). Only voters whose API address is one of the endpoints asked count as down."""
    best = best_local_status(answers)
    if best is None:
        return True
    down = {a.endpoint for a in answers if not a.reachable}
    voters = [m for m in best.members if m.voter] or list(best.members)
    lost = sum(1 for m in voters if m.api_address in down)
    return len(voters) - lost < len(voters) // 2 + 1

"""``fencingd health``: one member's gRPC health, as an exit code a container probe reads.

Owns: one ``grpc.health.v1`` Check of the whole server (service ""), its exit codes (those of
``grpc_health_probe``, so a probe written for it reads ours), and the subcommand's arguments
and help. Must never: retry, or ask any member but the one named by ``--address``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# fencingd health's exit codes: grpc_health_probe's.
HEALTH_SERVING = 0
HEALTH_USAGE = 1  # a malformed command line or an unreadable TLS file
HEALTH_UNREACHABLE = 2  # no connection, or no answer within --timeout-s
HEALTH_RPC_FAILED = 3  # the member answered the check with an error
HEALTH_NOT_SERVING = 4  # the member answered: NOT_SERVING (or any status but SERVING)


def check(api_address: str, timeout_s: float = 1.0, credentials: Any = None) -> tuple[int, str]:
    """(exit code above, what the member said) for one grpc.health.v1 Check of the whole server."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from coordinator.client import open_channel

    with open_channel(api_address, credentials) as channel:
        try:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # the generated stub declares no methods
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, None):
                return HEALTH_UNREACHABLE, f"unreachable (no answer within {timeout_s:g} s)"
            return HEALTH_RPC_FAILED, f"health check failed: {code.name}"
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return (HEALTH_SERVING if serving else HEALTH_NOT_SERVING), name


def healthy(api_address: str, timeout_s: float = 1.0, credentials: Any = None) -> bool:
    """Whether the member at ``api_address`` answers SERVING within ``timeout_s``."""
    return check(api_address, timeout_s, credentials)[0] == HEALTH_SERVING


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 iff the member at ``--address`` says SERVING; 2 unreachable, 4 not serving
    (grpc_health_probe's codes, for container health checks)."""
    from coordinator.client import tls_credentials

    try:
        credentials = tls_credentials(args.ca_file, args.cert_file, args.key_file)
    except OSError as exc:
        print(f"fencingd health: {exc}", file=sys.stderr, flush=True)
        return HEALTH_USAGE
    code, said = check(args.address, timeout_s=args.timeout_s, credentials=credentials)
    print(f"{args.address}: {said}", file=sys.stdout if code == HEALTH_SERVING else sys.stderr, flush=True)
    return code


def add_parser(sub: Any) -> None:
    """``fencingd health`` on ``fencingd``'s subcommands."""
    health = sub.add_parser(
        "health", help="exit 0 iff a member answers SERVING (grpc.health.v1): for container probes",
        description="Ask one member's grpc.health.v1 service (the whole server) and exit as grpc_health_probe does.",
        epilog="exit codes (grpc_health_probe's):\n"
               "  0  SERVING\n"
               "  1  a malformed command line, or a TLS file that cannot be read\n"
               "  2  unreachable: no connection or no answer within --timeout-s\n"
               "  3  the health check itself failed (an error status)\n"
               "  4  NOT_SERVING (no quorum, not caught up, or shutting down)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    health.add_argument("--address", default="127.0.0.1:7100", help="the member's API address (HOST:PORT)")
    health.add_argument("--timeout-s", type=float, default=2.0, help="seconds to wait for the answer")
    health.add_argument("--ca-file", help="TLS: PEM CA that signed the member's certificate (default: plaintext)")
    health.add_argument("--cert-file", help="mutual TLS: this probe's PEM certificate")
    health.add_argument("--key-file", help="mutual TLS: its PEM private key")
    health.set_defaults(func=cmd_health)

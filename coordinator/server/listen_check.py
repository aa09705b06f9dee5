"""Why an address cannot be listened on, asked of the OS before (or after) the real listener.

Owns: ``why_not(address)``, a bind with a throwaway socket (SO_REUSEADDR, as the real
listeners bind) that returns the OS's reason ("Address already in use", "Cannot assign
requested address") or None. gRPC reports a failed bind only as "Failed to bind", and the
Raft transport retries a failed bind forever without saying why: this is how a start-up
failure gets one line that names the setting and the reason.
Must never: keep a socket open, or be taken as a promise (the port can be taken between this
check and the real bind; the real listener's own failure still stops the start).
"""

from __future__ import annotations

import errno
import ipaddress
import socket


def why_not(address: str) -> OSError | None:
    """Why ``address`` (HOST:PORT) cannot be bound now (the OS's error), or None. A host name
    that does not resolve is not a reason: it may resolve later (RAFT.md "Addresses that move")."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            return exc
    return None


def is_final(error: OSError, address: str) -> bool:
    """A failure that waiting will not fix: a port in use, or a literal IP this machine does
    not have (a name may yet point elsewhere: the transport looks it up again)."""
    if error.errno == errno.EADDRINUSE:
        return True
    try:
        ipaddress.ip_address(address.rpartition(":")[0].strip("[]"))
    except ValueError:
        return False
    return True

"""Where a member's name points now: peer and own addresses, looked up again on every use.

Owns: ``Resolver``, the lookup of member host names off the Raft thread. Every call of
``resolve`` asks for a fresh lookup and waits for it at most ``raft_limits.RAFT_RESOLVE_WAIT_MS``;
a lookup slower than that lands for the next call, and the call answers with the last address
the name had. It logs once per change of what a name resolves to (first address, moved,
stopped resolving, resolves again), failures through the caller's rate limiter.
RAFT.md "Addresses that move".
Must never: cache an answer past the next call (pysyncobj's resolver kept a peer's address for
10 minutes, so a member restarted under a new IP stayed out of the cluster), block its caller
longer than the wait bound, run more than one lookup of a name at a time, or import pysyncobj.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import threading
from typing import Callable

from coordinator.raft import limits as raft_limits

log = logging.getLogger(__name__)


def lookup_address(host: str) -> str:
    """One address of ``host`` from the system resolver (/etc/hosts, DNS): the first IPv4 one
    in getaddrinfo's order, else the first of any family. Raises OSError if there is none.

    IPv4 first as pysyncobj does (``preferredAddrType``); the first, not a random one
    (pysyncobj picks at random), so every lookup of an unchanged name gives the same answer.
    """
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos if info[0] == socket.AF_INET] or [str(info[4][0]) for info in infos]
    if not addresses:
        raise OSError(f"no address for {host}")
    return addresses[0]


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Name:
    """What one host name resolved to, and its lookups: asked (calls) and answered (lookups done)."""

    __slots__ = ("what", "retry", "address", "error", "asked", "answered", "in_flight")

    def __init__(self, what: str, retry: str):
        self.what = what  # "peer" or "own address", and when it is tried again: for the log lines
        self.retry = retry
        self.address: str | None = None
        self.error: str | None = None
        self.asked = 0
        self.answered = 0
        self.in_flight = False


class Resolver:
    """Looks names up on a thread of its own, so a slow DNS server never stalls the Raft thread.

    ``warn`` takes the failure lines (``transport.PeerWarnings.warning``: a name that flaps
    cannot write the log); the other transitions are info lines.
    """

    def __init__(
        self,
        warn: Callable[..., None],
        *,
        wait_ms: int = raft_limits.RAFT_RESOLVE_WAIT_MS,
        lookup: Callable[[str], str] = lookup_address,
    ):
        self._warn = warn
        self._wait_s = wait_ms / 1000
        self._lookup = lookup
        self._cond = threading.Condition()
        self._names: dict[str, _Name] = {}
        self._queue: collections.deque[str] = collections.deque()
        self._thread: threading.Thread | None = None
        self._closed = False

    def resolve(self, host: str, what: str = "peer", retry: str = "on every connection attempt") -> str | None:
        """``host``'s address now: a fresh lookup if it answers within the wait bound, else the
        last address it had (None if it never resolved). An IP literal is its own address."""
        if is_ip_literal(host):
            return host
        with self._cond:
            name = self._names.get(host)
            if name is None:
                name = self._names[host] = _Name(what, retry)
            if name.in_flight or self._closed:
                # The previous call's lookup is still running: a slow resolver. Waiting again
                # would stall the caller once per call; its answer is used when it lands.
                return name.address
            name.asked += 1
            name.in_flight = True
            target = name.asked
            self._queue.append(host)
            self._start_thread()
            self._cond.notify_all()
            self._cond.wait_for(lambda: name.answered >= target, timeout=self._wait_s)
            return name.address

    def close(self) -> None:
        """Stop the lookup thread once its current lookup (if any) returns; never waits for it."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()

    def _start_thread(self) -> None:
        if self._thread is None:
            # A daemon: a lookup stuck in getaddrinfo cannot be interrupted and must not hold up exit.
            self._thread = threading.Thread(target=self._run, name="raft-resolver", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                host = self._queue.popleft()
                name = self._names[host]
                target = name.asked
            try:
                address, error = self._lookup(host), None
            except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
                address, error = None, str(exc) or type(exc).__name__
            with self._cond:
                before, before_error = name.address, name.error
                if address is not None:
                    name.address = address  # on failure the last address stays: better than none
                name.error = error
                name.answered = target
                name.in_flight = False
                self._cond.notify_all()
            self._log_change(host, name, before, before_error, address, error)

    def _log_change(self, host, name: _Name, before, before_error, address, error) -> None:
        what = name.what
        if error is not None:
            if before_error is None:
                kept = f"; still using its last address {before}" if before else ""
                self._warn("raft: %s %s does not resolve (%s)%s; looking it up again %s",
                           what, host, error, kept, name.retry)
            return
        if before_error is not None:
            log.info("raft: %s %s resolves again, to %s", what, host, address)
        elif before is None:
            log.info("raft: %s %s resolves to %s", what, host, address)
        elif before != address:
            log.info("raft: %s %s moved from %s to %s", what, host, before, address)

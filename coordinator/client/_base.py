"""What the sync and the asyncio fencing clients share: configuration and endpoint choice.

Owns: ``_ClientBase``, the clients' common base: the constructor and its checks (written
once), the channels' stubs per endpoint, and which endpoint an attempt goes to (the believed
leader, a discovered or hinted one, else round-robin; an endpoint whose attempt just failed
is suspect for a while). Every public RPC method comes from ``ClientMethods`` (``_methods``);
a call's attempts are ``_calls``'s, a lock wait ``_lock_wait``'s, a lease and its keep-alive
policy ``_lease``'s, request checks ``_requests``'s and the defaults ``_defaults``'s.
Must never: block, sleep or do I/O: ``FencingClient`` (threads) and ``AsyncFencingClient``
(asyncio) only add their channel flavour, the loop that runs a ``Call`` and the loop that runs
a lease's keep-alive, so both follow exactly the same rules; nor take a leader hint that names
an endpoint the caller did not configure.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Sequence

import grpc

from coordinator.client._calls import Stubs
from coordinator.client._defaults import (
    ATTEMPT_TIMEOUT_S_DEFAULT,
    DISCOVERY_INTERVAL_S,
    DISCOVERY_TIMEOUT_S,
    RETRY_BACKOFF_MAX_S_DEFAULT,
    RETRY_BACKOFF_S_DEFAULT,
    RETRY_MAX_ATTEMPTS_DEFAULT,
    SUSPECT_S,
    TIMEOUT_S_DEFAULT,
)
from coordinator.client._lock_wait import LockWait
from coordinator.client._methods import ClientMethods
from coordinator.client.exceptions import from_rpc_error
from coordinator.client.retry import Backoff
from coordinator.core.names import ErrorMeta


def normalize_endpoint(endpoint: str) -> str:
    """``host:port``, with ``localhost`` spelled 127.0.0.1; ValueError if malformed."""
    scheme, found, rest = endpoint.strip().partition("://")
    if found:  # etcd's habit (http://host:port): a gRPC target here is host:port alone
        raise ValueError(f"endpoint must be host:port without a scheme ({scheme}://), got {endpoint!r}; "
                         f"try {rest.rstrip('/')!r}")
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    if host == "localhost":
        host = "127.0.0.1"
    return f"{host}:{port}"


class _ClientBase(ClientMethods):
    """Configuration, endpoint choice and every RPC (``ClientMethods``); subclasses provide
    channels and ``_execute`` (run a ``Call`` with retries and return its converted answer)."""

    _log: Any  # the subclass's logger

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        attempt_timeout_s: float = ATTEMPT_TIMEOUT_S_DEFAULT,
        retry_max_attempts: int = RETRY_MAX_ATTEMPTS_DEFAULT,
        retry_backoff_s: float = RETRY_BACKOFF_S_DEFAULT,
        retry_backoff_max_s: float = RETRY_BACKOFF_MAX_S_DEFAULT,
        bearer_token: str | None = None,
        admin_token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        normalized: list[str] = []
        for endpoint in endpoints:
            e = normalize_endpoint(endpoint)
            if e not in normalized:
                normalized.append(e)
        if not normalized:
            raise ValueError("at least one endpoint is needed")
        if not timeout_s > 0 or not attempt_timeout_s > 0:
            raise ValueError("timeout_s and attempt_timeout_s must be positive")
        if retry_max_attempts < 1:
            raise ValueError("retry_max_attempts must be at least 1")
        if retry_backoff_s < 0 or retry_backoff_max_s < retry_backoff_s:
            raise ValueError("need 0 <= retry_backoff_s <= retry_backoff_max_s")
        if bearer_token and admin_token and bearer_token != admin_token:
            raise ValueError("give bearer_token or admin_token (its older name), not both")
        bearer_token = bearer_token or admin_token
        self._endpoints: tuple[str, ...] = tuple(normalized)
        self._timeout_s = float(timeout_s)
        self._attempt_timeout_s = float(attempt_timeout_s)
        self._max_attempts = int(retry_max_attempts)
        self._backoff = Backoff(base_s=float(retry_backoff_s), max_s=float(retry_backoff_max_s))
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {bearer_token}"),) if bearer_token else ()
        )
        self._credentials = credentials
        self._rng = random.Random()
        self._lock = threading.Lock()  # never held across I/O or an await
        self._preferred: str | None = None  # the endpoint believed to be the leader
        self._rr = 0  # round-robin cursor when no leader is known
        self._next_discovery_at = 0.0
        self._suspects: dict[str, float] = {}  # endpoint -> monotonic time it is trusted again
        self._closed = False
        self._stubs: dict[str, Stubs] = {
            endpoint: Stubs(self._open_channel(endpoint, credentials)) for endpoint in self._endpoints
        }
        self._leases = self._lease_registry()
        # lock() calls still waiting: close() takes their waiters out of line (asyncio client).
        self._lock_waits: set[LockWait] = set()

    # What a subclass adds: its channel flavour, how it tracks open leases, and the loop.
    _lease_registry: Callable[[], Any]  # a set-like factory (weak for threads, strong for tasks)

    def _open_channel(self, endpoint: str, credentials: grpc.ChannelCredentials | None) -> Any:
        raise NotImplementedError  # pragma: no cover - abstract

    # -- endpoint choice ----------------------------------------------------------------

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    @property
    def leader_endpoint(self) -> str | None:
        """The endpoint this client currently believes is the leader (None: unknown)."""
        with self._lock:
            return self._preferred

    def _known_or_discover(self) -> tuple[str | None, bool]:
        """(the believed leader, None if unknown; whether a discovery round is due now)."""
        with self._lock:
            if self._preferred is not None:
                return self._preferred, False
            now = time.monotonic()
            if now >= self._next_discovery_at:
                self._next_discovery_at = now + DISCOVERY_INTERVAL_S
                return None, True
            return None, False

    def _adopt(self, leader: str | None) -> str:
        """Remember a discovered leader, or take the next endpoint round-robin."""
        with self._lock:
            if leader is not None and not self._suspect(leader):
                self._preferred = leader
                return leader
            endpoint = self._endpoints[self._rr % len(self._endpoints)]
            self._rr += 1
            return endpoint

    def _suspect(self, endpoint: str) -> bool:
        """Did an attempt on ``endpoint`` fail at the transport level a moment ago?"""
        until = self._suspects.get(endpoint)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._suspects[endpoint]
            return False
        return True

    @staticmethod
    def _discovery_budget_s(deadline: float) -> float:
        return min(DISCOVERY_TIMEOUT_S, max(0.0, deadline - time.monotonic()) / 2)

    def _match_endpoint(self, address: str) -> str | None:
        """``address`` if it is one of the configured endpoints (hints naming anything else
        are ignored: the caller chose where this client may connect)."""
        if not address:
            return None
        try:
            normalized = normalize_endpoint(address)
        except ValueError:
            return None
        return normalized if normalized in self._endpoints else None

    def _leader_from_answer(self, response: Any = None, error: grpc.RpcError | None = None) -> str | None:
        if error is not None:
            return self._match_endpoint(from_rpc_error(error).metadata.get(ErrorMeta.LEADER_API, ""))
        return self._match_endpoint(response.leader_api_address)

    def _after_failure(self, endpoint: str, hint: str, *, answered: bool) -> None:
        """After a retryable failure on ``endpoint``: follow the leader hint if it names
        another endpoint, else move on round-robin. ``answered``: the node itself replied
        (NO_LEADER, OVERLOADED); otherwise it is suspect for SUSPECT_S."""
        leader = self._match_endpoint(hint)
        with self._lock:
            if not answered:
                self._suspects[endpoint] = time.monotonic() + SUSPECT_S
            if leader is not None and leader != endpoint and not self._suspect(leader):
                self._preferred = leader
                return
            if self._preferred == endpoint:
                self._preferred = None
            # Next round-robin pick is the endpoint after the one that failed.
            self._rr = self._endpoints.index(endpoint) + 1

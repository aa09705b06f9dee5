"""Admission and idle timeout of long-lived streams (KeepAliveStream), so streams cannot
take the threads every other call needs (issue 14: idle streams starved health checks).

Owns: the count of open streams, in total and per caller, the refusal of a stream past either
cap, and reading a stream's requests with an idle timeout. Must never: implement an RPC
(service.py does), read or propose anything, or hold a gRPC worker thread beyond the idle
timeout waiting for a request that does not come.

A gRPC worker thread serves a stream for as long as it is open. ``streams_max`` is below the
worker count (config.py checks it), so however many streams are open, threads remain for
health, Admin and unary calls. A stream's requests are read by a helper thread into a
one-item queue; the worker waits for each item at most ``idle_timeout_s`` and then ends the
stream with RESOURCE_EXHAUSTED / LIMIT_EXCEEDED, limit ``stream_idle_timeout_s``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Iterable, Iterator

from coordinator.core.state_machine import Reason
from coordinator.server.errors import ServiceError

__all__ = ["StreamGate", "caller_key"]

_END = object()  # the client closed its side (or the call ended): no more requests


def caller_key(principal_name: str | None, peer: str) -> str:
    """Who a stream counts against: its principal, or its peer's host on an open data plane
    (no principals file), where every client is anonymous. ``peer`` is ``context.peer()``,
    e.g. ``ipv4:10.0.0.7:53012``; the port is dropped, so one host's connections share a cap."""
    if principal_name is not None:
        return f"principal {principal_name}"
    host, _, _port = peer.rpartition(":")
    return f"host {host or peer}"


class StreamGate:
    """Counts open streams and refuses one past ``streams_max`` or ``per_caller_max``."""

    def __init__(self, *, streams_max: int, per_caller_max: int, idle_timeout_s: float) -> None:
        self.streams_max = streams_max
        self.per_caller_max = per_caller_max
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._total = 0

    def open_count(self) -> int:
        with self._lock:
            return self._total

    @contextlib.contextmanager
    def admit(self, who: str) -> Iterator[None]:
        """Hold one stream slot for ``who`` while the block runs; raise ServiceError
        (RESOURCE_EXHAUSTED, LIMIT_EXCEEDED) when a cap is reached, taking nothing."""
        with self._lock:
            if self._total >= self.streams_max:
                raise _limit("streams_max", self.streams_max,
                             f"{self.streams_max} streams are open on this member; retry later or use KeepAliveMany")
            mine = self._open.get(who, 0)
            if mine >= self.per_caller_max:
                raise _limit("streams_per_principal_max", self.per_caller_max,
                             f"{who} already has {mine} streams open on this member")
            self._open[who] = mine + 1
            self._total += 1
        try:
            yield
        finally:
            with self._lock:
                self._total -= 1
                left = self._open[who] - 1
                if left:
                    self._open[who] = left
                else:
                    del self._open[who]

    def requests(self, request_iterator: Iterable[Any]) -> Iterator[Any]:
        """The items of ``request_iterator``; raises ServiceError when none comes for
        ``idle_timeout_s``. Close it when done (``contextlib.closing``): its ``finally``
        lets the reader thread go."""
        items: queue.Queue = queue.Queue(maxsize=1)  # one item read ahead: a flood stays in gRPC's flow control
        done = threading.Event()

        def offer(item: Any) -> bool:
            """Hand ``item`` to the worker; False once the worker has stopped taking items."""
            while not done.is_set():
                try:
                    # Bounded, so a reader never outlives a worker that stopped taking items.
                    items.put(item, timeout=self.idle_timeout_s)
                    return True
                except queue.Full:
                    continue
            return False

        def read() -> None:
            try:
                for item in request_iterator:
                    if not offer(item):
                        return
            except Exception:  # noqa: BLE001 - the call was cancelled or failed: the stream is over
                pass
            offer(_END)

        reader = threading.Thread(target=read, name="stream-reader", daemon=True)
        reader.start()
        try:
            while True:
                try:
                    item = items.get(timeout=self.idle_timeout_s)
                except queue.Empty:
                    raise _limit(
                        "stream_idle_timeout_s", self.idle_timeout_s,
                        f"no request for {self.idle_timeout_s:g} s; the stream is closed (open a new one)",
                    ) from None
                if item is _END:
                    return
                yield item
        finally:
            done.set()
            with contextlib.suppress(queue.Empty):
                items.get_nowait()  # a reader blocked on a full queue moves on and sees ``done``


def _limit(name: str, value: float, message: str) -> ServiceError:
    return ServiceError(Reason.LIMIT_EXCEEDED, message, {"limit": name, "max": value})

"""Admission of calls that hold a gRPC worker thread for long (streaming RPCs of every service,
admitted by stream_admission.py, and Acquires waiting with ``wait_ms``), and the idle timeout
of streams, so neither can take the threads every other call needs (issue 14: idle streams
starved health checks; waiting Acquires could do the same; issue 26: so did reflection
streams the caps did not count).

Owns: one admission mechanism (``SlotGate``: a count of held slots, in total and per caller,
and the refusal of a slot past either cap), its two uses (``StreamGate`` for streams, with
reading a stream's requests, or a server-streaming servicer's responses, under an idle
timeout; ``waiter_gate`` for waiting Acquires), and
who a slot counts against (``caller_key``). Must never: implement an RPC (the servicers do),
read or propose anything, or hold a gRPC worker thread beyond the idle timeout waiting for a
request that does not come.

A gRPC worker thread serves a stream for as long as it is open, and a waiting Acquire for as
long as it waits. ``streams_max`` + ``acquire_waiters_max`` (+ the backup transfers) is below the worker
count (config.py checks it), so however many streams are open and Acquires wait, threads remain for
health, Admin and unary calls. A stream past a cap is refused with RESOURCE_EXHAUSTED /
LIMIT_EXCEEDED naming the cap. An Acquire past a waiter cap is answered at once as if its
``wait_ms`` were 0 (lock_wait.py): its one try still runs, so a free lease is granted, and a held
one is answered LEASE_HELD, an answer every client already handles and one that is true; a
LIMIT_EXCEEDED would refuse a caller whose only fault is that others wait, and waiting is a
convenience that only saves the client its own retries. A stream's requests (or a
server-streaming servicer's responses) are read by a helper thread into a one-item queue; the
worker waits for each item at most ``idle_timeout_s`` and then ends the stream with
RESOURCE_EXHAUSTED / LIMIT_EXCEEDED, limit ``stream_idle_timeout_s``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Generator, Iterable, Iterator

from coordinator.core.state_machine import Reason
from coordinator.server.errors import ServiceError

__all__ = ["SlotGate", "StreamGate", "caller_key", "waiter_gate"]

_END = object()  # the client closed its side (or the call ended): no more requests


def caller_key(principal_name: str | None, peer: str) -> str:
    """Who a stream counts against: its principal, or its peer's host on an open data plane
    (no principals file), where every client is anonymous. ``peer`` is ``context.peer()``,
    e.g. ``ipv4:10.0.0.7:53012``; the port is dropped, so one host's connections share a cap."""
    if principal_name is not None:
        return f"principal {principal_name}"
    host, _, _port = peer.rpartition(":")
    return f"host {host or peer}"


class SlotGate:
    """Counts held slots and refuses one past ``total_max`` or ``per_caller_max``; a refusal
    is RESOURCE_EXHAUSTED / LIMIT_EXCEEDED naming the setting (``total_limit`` or
    ``per_caller_limit``) it met."""

    def __init__(self, *, what: str, total_max: int, total_limit: str, per_caller_max: int,
                 per_caller_limit: str, retry_hint: str) -> None:
        self.what = what  # plural noun for messages, e.g. "streams"
        self.total_max = total_max
        self.total_limit = total_limit
        self.per_caller_max = per_caller_max
        self.per_caller_limit = per_caller_limit
        self.retry_hint = retry_hint
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._total = 0

    def open_count(self) -> int:
        with self._lock:
            return self._total

    def take(self, who: str) -> None:
        """Take one slot for ``who``; raise ServiceError when a cap is reached, taking nothing.
        Every successful ``take`` must be followed by one ``give_back``."""
        with self._lock:
            if self._total >= self.total_max:
                raise _limit(self.total_limit, self.total_max,
                             f"{self.total_max} {self.what} on this member already; {self.retry_hint}")
            mine = self._held.get(who, 0)
            if mine >= self.per_caller_max:
                raise _limit(self.per_caller_limit, self.per_caller_max,
                             f"{who} already has {mine} {self.what} on this member")
            self._held[who] = mine + 1
            self._total += 1

    def give_back(self, who: str) -> None:
        with self._lock:
            self._total -= 1
            left = self._held[who] - 1
            if left:
                self._held[who] = left
            else:
                del self._held[who]

    @contextlib.contextmanager
    def admit(self, who: str) -> Iterator[None]:
        """Hold one slot for ``who`` while the block runs (``take`` ... ``give_back``)."""
        self.take(who)
        try:
            yield
        finally:
            self.give_back(who)


def waiter_gate(*, waiters_max: int, per_caller_max: int) -> SlotGate:
    """The gate of Acquires that wait server-side (``wait_ms`` > 0 on a held lease)."""
    return SlotGate(
        what="Acquires waiting", total_max=waiters_max, total_limit="acquire_waiters_max",
        per_caller_max=per_caller_max, per_caller_limit="acquire_waiters_per_principal_max",
        retry_hint="not waiting",
    )


class StreamGate(SlotGate):
    """Caps open streams (``streams_max``, ``streams_per_principal_max``) and ends idle ones."""

    def __init__(self, *, streams_max: int, per_caller_max: int, idle_timeout_s: float) -> None:
        super().__init__(
            what="streams open", total_max=streams_max, total_limit="streams_max",
            per_caller_max=per_caller_max, per_caller_limit="streams_per_principal_max",
            retry_hint="retry later or use KeepAliveMany",
        )
        self.streams_max = streams_max
        self.idle_timeout_s = idle_timeout_s

    def requests(self, request_iterator: Iterable[Any]) -> Generator[Any, None, None]:
        """The items of ``request_iterator``; raises ServiceError when none comes for
        ``idle_timeout_s``. Close it when done (``contextlib.closing``): its ``finally``
        lets the reader thread go."""
        return self._paced(request_iterator, "stream-reader", "no request")

    def responses(self, response_iterator: Iterable[Any]) -> Generator[Any, None, None]:
        """The items a server-streaming servicer yields (``response_iterator``); raises
        ServiceError when it yields none for ``idle_timeout_s`` (Health.Watch while the status
        stays the same). An exception it raises is raised here, in the caller's thread."""
        return self._paced(response_iterator, "stream-responses", "nothing to send")

    def _paced(self, source: Iterable[Any], thread_name: str, what: str) -> Generator[Any, None, None]:
        """The items of ``source``, read by a helper thread into a one-item queue, so the
        caller (a gRPC worker) waits for each at most ``idle_timeout_s``; ends the stream with
        RESOURCE_EXHAUSTED / LIMIT_EXCEEDED (limit ``stream_idle_timeout_s``) after that."""
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
                for item in source:
                    if not offer(item):
                        return
            except Exception as exc:  # noqa: BLE001 - whatever the source raises is the caller's: raised there
                offer(_Raised(exc))
                return
            offer(_END)

        reader = threading.Thread(target=read, name=thread_name, daemon=True)
        reader.start()
        try:
            while True:
                try:
                    item = items.get(timeout=self.idle_timeout_s)
                except queue.Empty:
                    raise _limit(
                        "stream_idle_timeout_s", self.idle_timeout_s,
                        f"{what} for {self.idle_timeout_s:g} s; the stream is closed (open a new one)",
                    ) from None
                if item is _END:
                    return
                if isinstance(item, _Raised):
                    raise item.exc
                yield item
        finally:
            done.set()
            with contextlib.suppress(queue.Empty):
                items.get_nowait()  # a reader blocked on a full queue moves on and sees ``done``


class _Raised:
    """What the source raised (the call was cancelled or failed, or the servicer aborted the
    RPC): raised again in the worker's thread, where gRPC expects the RPC's exception."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def _limit(name: str, value: float, message: str) -> ServiceError:
    return ServiceError(Reason.LIMIT_EXCEEDED, message, {"limit": name, "max": value})

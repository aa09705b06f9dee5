"""The multiplexed write path of ``FencingClient(multiplex_writes=True)``: concurrent writes of
one process travel together as one ``FencedStore.WriteMany`` call per endpoint.

Owns: ``WriteBatcher`` (the per-endpoint queue of write attempts waiting to be sent, the one
batch in flight per endpoint, and handing each attempt its own outcome) and ``ItemOutcome``.
Must never: retry, classify or translate an error (the client's retry loop and its one error
table do, exactly as for a plain Write), wait on a timer to let a batch grow, or leave an
attempt waiting without a sender coming for it.

How a batch forms, with no linger: an attempt joins its endpoint's queue; if no batch is in
flight to that endpoint, the thread that queued it sends one at once (so one client alone
pays one WriteMany of one item: no added wait). While a batch is in flight, attempts queue;
when it completes (on gRPC's callback thread), the queue is sent as the next batch, oldest
first, up to limits.WRITE_MANY_ITEMS_MAX items and limits.WRITE_MANY_BYTES_MAX bytes; the
rest waits for the one after. A batch's RPC deadline is the earliest of its attempts'; an
attempt whose deadline passes while it waits is not sent and fails as a deadline would.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import limits

# Once its own deadline has passed, a caller whose attempt is in flight waits this much
# longer for the batch's answer before it gives up on it: the batch's RPC deadline is never
# later than the attempt's, so gRPC ends it by then; this only covers callback latency.
IN_FLIGHT_GRACE_S = 1.0


@dataclasses.dataclass
class ItemOutcome:
    """What one attempt came back with: exactly one of the fields is set (``expired``:
    its deadline passed before it was sent; ``closed``: the client closed before it was)."""

    response: pb.WriteResponse | None = None
    item_error: pb.WriteItemError | None = None
    header: pb.ResponseHeader | None = None  # the WriteMany's header, for an item_error
    rpc_error: grpc.RpcError | None = None  # the whole WriteMany failed
    expired: bool = False
    closed: bool = False


class _Attempt:
    __slots__ = ("request", "size", "deadline", "done", "outcome")

    def __init__(self, request: pb.WriteRequest, deadline: float) -> None:
        self.request = request
        self.size = request.ByteSize()  # what the server sums against WRITE_MANY_BYTES_MAX
        self.deadline = deadline
        self.done = threading.Event()
        self.outcome: ItemOutcome | None = None

    def finish(self, outcome: ItemOutcome) -> None:
        self.outcome = outcome
        self.done.set()


class WriteBatcher:
    """Coalesces concurrent write attempts into WriteMany calls, one in flight per endpoint.

    ``write_many(endpoint)`` is the WriteMany stub method of that endpoint's channel;
    ``metadata`` goes on every call (the bearer credential)."""

    def __init__(self, write_many: Callable[[str], Any], metadata: tuple[tuple[str, str], ...]) -> None:
        self._write_many = write_many
        self._metadata = metadata
        self._lock = threading.Lock()  # never held across I/O
        self._queues: dict[str, collections.deque[_Attempt]] = {}
        self._in_flight: set[str] = set()  # endpoints with a batch sent or being sent
        self._closed = False

    def write(self, endpoint: str, request: pb.WriteRequest, timeout_s: float) -> ItemOutcome:
        """Send ``request`` to ``endpoint`` in the next batch and wait for its own outcome;
        ``timeout_s`` is this attempt's deadline."""
        attempt = _Attempt(request, time.monotonic() + timeout_s)
        with self._lock:
            if self._closed:
                return ItemOutcome(closed=True)
            self._queues.setdefault(endpoint, collections.deque()).append(attempt)
            send = endpoint not in self._in_flight
            if send:
                self._in_flight.add(endpoint)
        if send:
            self._send_next(endpoint)
        return self._wait(endpoint, attempt)

    def close(self) -> None:
        """Every attempt not sent yet ends as ``closed``; those in flight end with their RPC
        (closing the channels cancels it)."""
        with self._lock:
            self._closed = True
            waiting = [a for queue in self._queues.values() for a in queue]
            self._queues.clear()
        for attempt in waiting:
            attempt.finish(ItemOutcome(closed=True))

    def _wait(self, endpoint: str, attempt: _Attempt) -> ItemOutcome:
        while not attempt.done.wait(max(0.0, attempt.deadline - time.monotonic()) + IN_FLIGHT_GRACE_S):
            with self._lock:
                queue = self._queues.get(endpoint)
                if queue is not None and attempt in queue:
                    # Still waiting to be sent (a sender always comes; this is the safety net).
                    queue.remove(attempt)
                    attempt.finish(ItemOutcome(expired=True))
            # Else it is in flight: its RPC's deadline, never later than its own, ends it.
        assert attempt.outcome is not None
        return attempt.outcome

    def _take_batch(self, endpoint: str) -> tuple[list[_Attempt], list[_Attempt]]:
        """(the next batch, attempts whose deadline passed unsent); an empty batch gives the
        endpoint's in-flight mark back. Called with the lock held."""
        queue = self._queues.get(endpoint)
        batch: list[_Attempt] = []
        expired: list[_Attempt] = []
        size = 0
        now = time.monotonic()
        while queue and len(batch) < limits.WRITE_MANY_ITEMS_MAX:
            attempt = queue[0]
            if attempt.deadline <= now:
                expired.append(queue.popleft())
                continue
            if batch and size + attempt.size > limits.WRITE_MANY_BYTES_MAX:
                break
            batch.append(queue.popleft())
            size += attempt.size
        if not batch:
            self._in_flight.discard(endpoint)
        return batch, expired

    def _send_next(self, endpoint: str) -> None:
        """Send the endpoint's next batch (the caller holds its in-flight mark), or give the
        mark back when nothing waits."""
        while True:
            with self._lock:
                batch, expired = self._take_batch(endpoint)
            for attempt in expired:
                attempt.finish(ItemOutcome(expired=True))
            if not batch:
                return
            timeout_s = min(a.deadline for a in batch) - time.monotonic()
            request = pb.WriteManyRequest(writes=[a.request for a in batch])
            try:
                future = self._write_many(endpoint).future(
                    request, timeout=max(0.0, timeout_s), metadata=self._metadata
                )
            except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
                for attempt in batch:
                    attempt.finish(ItemOutcome(closed=True))
                continue
            future.add_done_callback(lambda done, batch=batch: self._on_done(endpoint, batch, done))
            return

    def _on_done(self, endpoint: str, batch: list[_Attempt], future: Any) -> None:
        """On gRPC's callback thread: hand each attempt its result, then send what queued
        meanwhile."""
        try:
            try:
                response = future.result()
            except grpc.RpcError as err:
                for attempt in batch:
                    attempt.finish(ItemOutcome(rpc_error=err))
            except Exception as exc:  # noqa: BLE001 - a cancelled future: as a cancelled RPC
                err = _CancelledError(str(exc) or type(exc).__name__)
                for attempt in batch:
                    attempt.finish(ItemOutcome(rpc_error=err))
            else:
                results = list(response.results)
                for n, attempt in enumerate(batch):
                    result = results[n] if n < len(results) else None
                    if result is not None and result.WhichOneof("outcome") == "write":
                        attempt.finish(ItemOutcome(response=result.write))
                    elif result is not None and result.WhichOneof("outcome") == "error":
                        attempt.finish(ItemOutcome(item_error=result.error, header=response.header))
                    else:  # a server that answered fewer items than it was sent
                        missing = pb.WriteItemError(
                            code=grpc.StatusCode.INTERNAL.name, message="WriteMany returned no result for this item"
                        )
                        attempt.finish(ItemOutcome(item_error=missing, header=response.header))
        finally:
            self._send_next(endpoint)


class _CancelledError(grpc.RpcError):
    """A batch whose future ended without a status (cancelled): what a plain call reports."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()

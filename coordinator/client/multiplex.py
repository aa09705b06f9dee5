"""The multiplexed write path of ``FencingClient(multiplex_writes=True)``: concurrent writes of
one process travel together as one ``FencedStore.WriteMany`` call per endpoint.

Owns: ``WriteBatcher`` (the per-endpoint queue of write attempts waiting to be sent, the one
batch in flight per endpoint, and handing each attempt its own outcome) and ``ItemOutcome``.
Must never: retry, classify or translate an error (the client's retry loop and its one error
table do, exactly as for a plain Write), wait on a timer to let a batch grow, or leave an
attempt waiting without a sender coming for it.

How a batch forms, with no linger: an attempt joins its endpoint's queue; if no batch is in
flight to that endpoint, the thread that queued it sends one at once, itself, as a blocking
call (so one client alone pays one plain Write, as without multiplexing: no added wait, no
thread hop).
While a batch is in flight, attempts queue; when it completes, its sender hands the
outcomes out and passes the sending turn to the oldest queued attempt, whose thread sends
the queue as the next batch, oldest first, up to limits.WRITE_MANY_ITEMS_MAX items and
limits.WRITE_MANY_BYTES_MAX bytes; the rest waits for the one after. A batch's RPC deadline is the earliest of its attempts'; an
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

# A waiting caller looks at its attempt again this long after the attempt's deadline: an
# attempt still unsent then is taken out of the queue (a safety net: a sending turn always
# comes, and expired attempts are dropped when a batch is taken); one in flight is left to
# its RPC, whose deadline is never later than the attempt's.
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
    __slots__ = ("request", "size", "deadline", "wake", "outcome", "lead")

    def __init__(self, request: pb.WriteRequest, deadline: float) -> None:
        self.request = request
        self.size = request.ByteSize()  # what the server sums against WRITE_MANY_BYTES_MAX
        self.deadline = deadline
        self.wake = threading.Event()
        self.outcome: ItemOutcome | None = None
        self.lead = False  # handed the endpoint's sending turn: send the next batch

    def finish(self, outcome: ItemOutcome) -> None:
        self.outcome = outcome
        self.wake.set()


class WriteBatcher:
    """Coalesces concurrent write attempts into WriteMany calls, one in flight per endpoint.

    The batch is sent by one of its own callers, in its own thread, as a plain blocking call
    (no extra thread between a lone caller and its answer): the caller that finds nothing in
    flight sends; when its answer is in, it hands each attempt its outcome and passes the
    turn to the oldest attempt that queued meanwhile, which sends the next batch.

    A batch of one goes as a plain ``Write`` (one writer alone pays exactly what a plain
    client pays; its failure is that Write's own status); ``single_as_write = False`` sends
    every batch as WriteMany (the tests do, to see each status as an item).

    ``store_for(endpoint)`` is the FencedStore stub of that endpoint's channel; ``metadata``
    goes on every call (the bearer credential)."""

    def __init__(self, store_for: Callable[[str], Any], metadata: tuple[tuple[str, str], ...]) -> None:
        self._store_for = store_for
        self._metadata = metadata
        self.single_as_write = True
        self._lock = threading.Lock()  # never held across I/O
        self._queues: dict[str, collections.deque[_Attempt]] = {}
        # Endpoints whose sending turn is taken: a batch in flight, or an attempt handed the turn.
        self._in_flight: set[str] = set()
        self._closed = False

    def write(self, endpoint: str, request: pb.WriteRequest, timeout_s: float) -> ItemOutcome:
        """Send ``request`` to ``endpoint`` in the next batch and wait for its own outcome;
        ``timeout_s`` is this attempt's deadline."""
        attempt = _Attempt(request, time.monotonic() + timeout_s)
        with self._lock:
            if self._closed:
                return ItemOutcome(closed=True)
            self._queues.setdefault(endpoint, collections.deque()).append(attempt)
            attempt.lead = endpoint not in self._in_flight
            if attempt.lead:
                self._in_flight.add(endpoint)
        try:
            while True:
                if attempt.outcome is not None:
                    return attempt.outcome
                if attempt.lead:
                    attempt.wake.clear()
                    self._send_one(endpoint, attempt)
                    continue
                if not attempt.wake.wait(max(0.0, attempt.deadline - time.monotonic()) + IN_FLIGHT_GRACE_S):
                    with self._lock:
                        queue = self._queues.get(endpoint)
                        if not attempt.lead and queue is not None and attempt in queue:
                            # Still unsent past its deadline (a turn always comes; a safety net).
                            queue.remove(attempt)
                            attempt.finish(ItemOutcome(expired=True))
                    # Else it is in flight: the RPC's deadline, never later than its own, ends it.
        except BaseException:
            self._leave(endpoint, attempt)  # interrupted: never take the turn away with it
            raise

    def _leave(self, endpoint: str, attempt: _Attempt) -> None:
        """``attempt``'s caller is gone before its outcome: out of the queue, and a sending
        turn it was handed but did not use goes to the next attempt (else nobody would send)."""
        with self._lock:
            queue = self._queues.get(endpoint)
            if queue is not None and attempt in queue:
                queue.remove(attempt)
            if attempt.lead:
                attempt.lead = False
                if queue:
                    queue[0].lead = True
                    queue[0].wake.set()
                else:
                    self._in_flight.discard(endpoint)

    def close(self) -> None:
        """Every attempt not sent yet ends as ``closed``; those in flight end with their RPC
        (closing the channels cancels it)."""
        with self._lock:
            self._closed = True
            waiting = [a for queue in self._queues.values() for a in queue]
            self._queues.clear()
        for attempt in waiting:
            attempt.finish(ItemOutcome(closed=True))

    def _take_batch(self, endpoint: str) -> tuple[list[_Attempt], list[_Attempt]]:
        """(the next batch, attempts whose deadline passed unsent); an empty batch gives the
        endpoint's turn back. Called with the lock held."""
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

    def _send_one(self, endpoint: str, sender: _Attempt) -> None:
        """``sender`` holds the endpoint's turn: send its next batch, hand out the outcomes,
        then pass the turn to the oldest attempt still queued (or give it back)."""
        with self._lock:
            sender.lead = False  # the turn now rides with the batch taken here
            batch, expired = self._take_batch(endpoint)
        outcomes = [ItemOutcome(rpc_error=_SenderFailed("the thread sending this batch failed"))] * len(batch)
        try:
            for attempt in expired:
                attempt.finish(ItemOutcome(expired=True))
            if batch:
                outcomes = self._call(endpoint, batch)
        finally:  # however the call ended, every attempt gets an outcome and the turn goes on
            if batch:
                with self._lock:
                    queue = self._queues.get(endpoint)
                    if queue:
                        queue[0].lead = True
                        queue[0].wake.set()
                    else:
                        self._in_flight.discard(endpoint)
                for attempt, outcome in zip(batch, outcomes):
                    attempt.finish(outcome)

    def _call(self, endpoint: str, batch: list[_Attempt]) -> list[ItemOutcome]:
        """One WriteMany of ``batch``, its deadline the earliest of theirs: per attempt its outcome."""
        timeout_s = max(0.0, min(a.deadline for a in batch) - time.monotonic())
        try:
            store = self._store_for(endpoint)
            if len(batch) == 1 and self.single_as_write:
                return [ItemOutcome(response=store.Write(batch[0].request, timeout=timeout_s, metadata=self._metadata))]
            request = pb.WriteManyRequest(writes=[a.request for a in batch])
            response = store.WriteMany(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as err:
            return [ItemOutcome(rpc_error=err)] * len(batch)
        except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
            return [ItemOutcome(closed=True)] * len(batch)
        results = list(response.results)
        outcomes = []
        for n in range(len(batch)):
            kind = results[n].WhichOneof("outcome") if n < len(results) else None
            if kind == "write":
                outcomes.append(ItemOutcome(response=results[n].write))
            elif kind == "error":
                outcomes.append(ItemOutcome(item_error=results[n].error, header=response.header))
            else:  # a server that answered fewer items than it was sent
                missing = pb.WriteItemError(
                    code=grpc.StatusCode.INTERNAL.name, message="WriteMany returned no result for this item"
                )
                outcomes.append(ItemOutcome(item_error=missing, header=response.header))
        return outcomes


class _SenderFailed(grpc.RpcError):
    """The batch's sending thread raised before the call returned (interrupted): for its
    attempts, a call whose fate is unknown, as a cancelled plain call reports."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()

"""The multiplexed path of ``FencingClient(multiplex=True)``: concurrent writes, acquires and
releases of one process travel together, one ``WriteMany``, ``AcquireMany`` or ``ReleaseMany``
call per kind and endpoint.

Owns: ``Batcher`` (per endpoint and kind, the queue of attempts waiting to be sent, the
batches in flight -- at most BATCHES_IN_FLIGHT_MAX -- and handing each attempt its own
outcome), ``BatchKind`` (what a kind's plain and batch RPCs are called and its limits) and
``ItemOutcome``.
Must never: retry, classify or translate an error (the client's retry loop and its one error
table do, exactly as for the plain call), wait on a timer to let a batch grow, or leave an
attempt waiting without a sender coming for it.

How a batch forms, with no linger: an attempt joins its (endpoint, kind) queue; if fewer than
BATCHES_IN_FLIGHT_MAX batches of that kind are in flight to that endpoint, the thread that
queued it takes a sending turn and sends at once, itself, as a blocking call (so one client
alone pays one plain call, as without multiplexing: no added wait, no thread hop). Kinds do
not wait for each other: an acquire batch and a write batch may be in flight to one endpoint
at once.
While every turn is taken, attempts queue; when a batch completes, its sender hands the
outcomes out and passes its turn to the oldest queued attempt without one, whose thread sends
the queue as the next batch (an attempt holding a turn that another sender takes into its
batch passes that turn on the same way), oldest first, up to the kind's items limit (and bytes limit,
for writes); the rest waits for the one after. A batch's RPC deadline is the earliest of its
attempts'; an attempt whose deadline passes while it waits is not sent and fails as a
deadline would.
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


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity: three constants
class BatchKind:
    """One kind of batchable call: the service (an attribute of the client's Stubs), its
    plain RPC and its batch RPC, the batch request's repeated field, the oneof field of an
    item's success, and the server's limits for one batch."""

    name: str
    service: str
    single: str
    many: str
    request: Any  # the batch request message
    field: str
    ok: str
    items_max: int
    bytes_max: int | None = None


WRITE = BatchKind("write", "store", "Write", "WriteMany", pb.WriteManyRequest, "writes", "write",
                  limits.WRITE_MANY_ITEMS_MAX, limits.WRITE_MANY_BYTES_MAX)
ACQUIRE = BatchKind("acquire", "lease", "Acquire", "AcquireMany", pb.AcquireManyRequest, "acquires", "acquire",
                    limits.ACQUIRE_MANY_ITEMS_MAX)
RELEASE = BatchKind("release", "lease", "Release", "ReleaseMany", pb.ReleaseManyRequest, "releases", "release",
                    limits.RELEASE_MANY_ITEMS_MAX)
KINDS = {kind.name: kind for kind in (WRITE, ACQUIRE, RELEASE)}

# Batches of one kind in flight to one endpoint at once. 1 makes the biggest batches, but a
# caller that arrives while one is in flight waits for its whole round trip before its own
# starts; with few threads per process (4 in bench compare's 16 clients) that wait costs more
# than batching saves. 2 lets a second batch start at once.
BATCHES_IN_FLIGHT_MAX = 2

# A waiting caller looks at its attempt again this long after the attempt's deadline: an
# attempt still unsent then is taken out of the queue (a safety net: a sending turn always
# comes, and expired attempts are dropped when a batch is taken); one in flight is left to
# its RPC, whose deadline is never later than the attempt's.
IN_FLIGHT_GRACE_S = 1.0


@dataclasses.dataclass
class ItemOutcome:
    """What one attempt came back with: exactly one of the fields is set (``expired``:
    its deadline passed before it was sent; ``closed``: the client closed before it was)."""

    response: Any = None  # the plain call's response message (WriteResponse, AcquireResponse, ...)
    item_error: pb.WriteItemError | None = None
    header: pb.ResponseHeader | None = None  # the batch's header, for an item_error
    rpc_error: grpc.RpcError | None = None  # the whole batch call failed
    expired: bool = False
    closed: bool = False


class _Attempt:
    __slots__ = ("request", "size", "deadline", "wake", "outcome", "lead")

    def __init__(self, request: Any, deadline: float, sized: bool) -> None:
        self.request = request
        self.size = request.ByteSize() if sized else 0  # what the server sums against a bytes limit
        self.deadline = deadline
        self.wake = threading.Event()
        self.outcome: ItemOutcome | None = None
        self.lead = False  # holds a sending turn of its (endpoint, kind): send the next batch

    def finish(self, outcome: ItemOutcome) -> None:
        self.outcome = outcome
        self.wake.set()


class Batcher:
    """Coalesces concurrent attempts of one kind into batch calls, at most
    ``batches_in_flight_max`` (BATCHES_IN_FLIGHT_MAX) in flight per endpoint and kind.

    The batch is sent by one of its own callers, in its own thread, as a plain blocking call
    (no extra thread between a lone caller and its answer): the caller that finds nothing in
    flight sends; when its answer is in, it hands each attempt its outcome and passes the
    turn to the oldest attempt that queued meanwhile, which sends the next batch.

    A batch of one goes as the plain call (``Write``, ``Acquire``, ``Release``: one caller
    alone pays exactly what a plain client pays; its failure is that call's own status);
    ``single_as_plain = False`` sends every batch as a batch RPC (the tests do, to see each
    status as an item).

    ``stub_for(endpoint, service)`` is the stub of that service (``store``, ``lease``) on
    that endpoint's channel; ``metadata`` goes on every call (the bearer credential)."""

    def __init__(self, stub_for: Callable[[str, str], Any], metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub_for = stub_for
        self._metadata = metadata
        self.single_as_plain = True
        self.batches_in_flight_max = BATCHES_IN_FLIGHT_MAX
        self._lock = threading.Lock()  # never held across I/O
        self._queues: dict[tuple[str, BatchKind], collections.deque[_Attempt]] = {}
        # Per (endpoint, kind), the sending turns taken (batches in flight, or attempts handed
        # a turn), at most batches_in_flight_max; a key with none taken is absent.
        self._in_flight: dict[tuple[str, BatchKind], int] = {}
        self._closed = False

    def send(self, kind: BatchKind, endpoint: str, request: Any, timeout_s: float) -> ItemOutcome:
        """Send ``request`` (the plain call's request of ``kind``) to ``endpoint`` in the next
        batch of its kind and wait for its own outcome; ``timeout_s`` is this attempt's deadline."""
        key = (endpoint, kind)
        attempt = _Attempt(request, time.monotonic() + timeout_s, kind.bytes_max is not None)
        with self._lock:
            if self._closed:
                return ItemOutcome(closed=True)
            self._queues.setdefault(key, collections.deque()).append(attempt)
            taken = self._in_flight.get(key, 0)
            attempt.lead = taken < self.batches_in_flight_max
            if attempt.lead:
                self._in_flight[key] = taken + 1
        try:
            while True:
                if attempt.outcome is not None:
                    return attempt.outcome
                if attempt.lead:
                    attempt.wake.clear()
                    self._send_one(key, attempt)
                    continue
                if not attempt.wake.wait(max(0.0, attempt.deadline - time.monotonic()) + IN_FLIGHT_GRACE_S):
                    with self._lock:
                        queue = self._queues.get(key)
                        if not attempt.lead and queue is not None and attempt in queue:
                            # Still unsent past its deadline (a turn always comes; a safety net).
                            queue.remove(attempt)
                            attempt.finish(ItemOutcome(expired=True))
                    # Else it is in flight: the RPC's deadline, never later than its own, ends it.
        except BaseException:  # any exit, interrupts too, gives the turn back; re-raised
            self._leave(key, attempt)  # interrupted: never take the turn away with it
            raise

    def write(self, endpoint: str, request: pb.WriteRequest, timeout_s: float) -> ItemOutcome:
        """``send`` of a Write."""
        return self.send(WRITE, endpoint, request, timeout_s)

    def _leave(self, key: tuple[str, BatchKind], attempt: _Attempt) -> None:
        """``attempt``'s caller is gone before its outcome: out of the queue, and a sending
        turn it was handed but did not use goes to the next attempt (else nobody would send)."""
        with self._lock:
            queue = self._queues.get(key)
            if queue is not None and attempt in queue:
                queue.remove(attempt)
            if attempt.lead:
                attempt.lead = False
                self._pass_turn(key)

    def close(self) -> None:
        """Every attempt not sent yet ends as ``closed``; those in flight end with their RPC
        (closing the channels cancels it)."""
        with self._lock:
            self._closed = True
            waiting = [a for queue in self._queues.values() for a in queue]
            self._queues.clear()
        for attempt in waiting:
            attempt.finish(ItemOutcome(closed=True))

    def _take_batch(self, key: tuple[str, BatchKind]) -> tuple[list[_Attempt], list[_Attempt]]:
        """(the next batch, attempts whose deadline passed unsent); an empty batch gives the
        turn back. Called with the lock held."""
        kind = key[1]
        queue = self._queues.get(key)
        batch: list[_Attempt] = []
        expired: list[_Attempt] = []
        size = 0
        now = time.monotonic()
        handed = 0  # turns that attempts taken here held without having used them yet
        while queue and len(batch) < kind.items_max:
            attempt = queue[0]
            if attempt.deadline <= now:
                handed += self._take_turn(queue.popleft())
                expired.append(attempt)
                continue
            if batch and kind.bytes_max is not None and size + attempt.size > kind.bytes_max:
                break
            handed += self._take_turn(queue.popleft())
            batch.append(attempt)
            size += attempt.size
        for _ in range(handed):  # such a turn goes to an attempt still queued, or back
            self._pass_turn(key)
        if not batch:
            self._give_back_turn(key)
        return batch, expired

    @staticmethod
    def _take_turn(attempt: _Attempt) -> int:
        """1 if ``attempt``, taken into another sender's batch, held a turn it had not used
        (with two batches in flight, the turn the other one passed on): it is its sender's no
        more. Called with the lock held."""
        if not attempt.lead:
            return 0
        attempt.lead = False
        attempt.wake.clear()  # woken for the turn: now it waits for its outcome
        return 1

    def _pass_turn(self, key: tuple[str, BatchKind]) -> None:
        """Hand a sending turn of ``key`` to its oldest queued attempt that has none, or give
        it back. Called with the lock held."""
        for attempt in self._queues.get(key, ()):
            if not attempt.lead:
                attempt.lead = True
                attempt.wake.set()
                return
        self._give_back_turn(key)

    def _give_back_turn(self, key: tuple[str, BatchKind]) -> None:
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)

    def _send_one(self, key: tuple[str, BatchKind], sender: _Attempt) -> None:
        """``sender`` holds the turn of ``key``: send its next batch, hand out the outcomes,
        then pass the turn to the oldest attempt still queued (or give it back)."""
        with self._lock:
            if not sender.lead:
                return  # its turn was taken with it into another sender's batch (``_take_turn``)
            sender.lead = False  # the turn now rides with the batch taken here
            batch, expired = self._take_batch(key)
        outcomes = [ItemOutcome(rpc_error=_SenderFailed("the thread sending this batch failed"))] * len(batch)
        try:
            for attempt in expired:
                attempt.finish(ItemOutcome(expired=True))
            if batch:
                outcomes = self._call(key, batch)
        finally:  # however the call ended, every attempt gets an outcome and the turn goes on
            if batch:
                with self._lock:
                    self._pass_turn(key)
                for attempt, outcome in zip(batch, outcomes, strict=True):
                    attempt.finish(outcome)

    def _call(self, key: tuple[str, BatchKind], batch: list[_Attempt]) -> list[ItemOutcome]:
        """One batch call of ``batch``, its deadline the earliest of theirs: per attempt its outcome."""
        endpoint, kind = key
        timeout_s = max(0.0, min(a.deadline for a in batch) - time.monotonic())
        try:
            stub = self._stub_for(endpoint, kind.service)
            if len(batch) == 1 and self.single_as_plain:
                single = getattr(stub, kind.single)
                return [ItemOutcome(response=single(batch[0].request, timeout=timeout_s, metadata=self._metadata))]
            request = kind.request(**{kind.field: [a.request for a in batch]})
            response = getattr(stub, kind.many)(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as err:
            return [ItemOutcome(rpc_error=err)] * len(batch)
        except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
            return [ItemOutcome(closed=True)] * len(batch)
        results = list(response.results)
        outcomes = []
        for n in range(len(batch)):
            which = results[n].WhichOneof("outcome") if n < len(results) else None
            if which == kind.ok:
                outcomes.append(ItemOutcome(response=getattr(results[n], kind.ok)))
            elif which == "error":
                outcomes.append(ItemOutcome(item_error=results[n].error, header=response.header))
            else:  # a server that answered fewer items than it was sent
                missing = pb.WriteItemError(
                    code=grpc.StatusCode.INTERNAL.name, message=f"{kind.many} returned no result for this item"
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

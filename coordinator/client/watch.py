"""``client.watch(prefix)``: the changes under a prefix, in log order, resumed across failures.

Owns: ``WatchEvent`` (one change, as the API's ``WatchEvent``), ``Watcher`` (the sync
client's stream of them) and ``AsyncWatcher`` (the asyncio client's), and the one rule both
follow on a failed stream (``resumable``): a lost connection, a member going away, the
stream's own deadline or the member's idle timeout open the stream again, on the next
endpoint, from the last revision seen + 1 -- so no event is missed or repeated -- and any
other failure (COMPACTED, a watcher that fell behind, a refusal) is raised as the client's
exception. Must never: yield an event twice or out of order, or report a revision before
every event up to it was yielded.

Each stream has a deadline (``WATCH_STREAM_S``): a member that stops answering is left
within it, and the watch goes on elsewhere. A watch that cannot get a stream going again
within the client's ``timeout_s`` raises ``Unavailable``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any, AsyncIterator, Iterator

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client.exceptions import FencingError, LimitExceeded, Unavailable, from_rpc_error
from coordinator.core.names import ErrorMeta

__all__ = ["WATCH_STREAM_S", "AsyncWatcher", "WatchEvent", "Watcher"]

# One stream's deadline, in seconds: then it is opened again from where it was (the member
# sends progress at least every 10 s, so a live stream always has somewhere to resume from).
WATCH_STREAM_S = 60.0
# Pause between two tries to open a stream again, in seconds.
WATCH_RESUME_PAUSE_S = 0.2
_RESUMED_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
})
# Member-wide stream limits: another member may have room (a caller's own cap is raised).
_RESUMED_LIMITS = frozenset({"stream_idle_timeout_s", "streams_max"})


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One change. ``type``: ACQUIRED, RELEASED, EXPIRED, FORCE_RELEASED, WRITTEN, DELETED or
    RESET; ``revision``: the log index of the entry that made it."""

    type: str
    revision: int
    resource: str
    holder: str = ""
    token: int = 0
    expires_at_ms: int = 0
    key: str = ""
    value: bytes = b""
    version: int = 0

    @classmethod
    def from_pb(cls, event: pb.WatchEvent) -> WatchEvent:
        return cls(
            type=pb.WatchEvent.Type.Name(event.type), revision=event.revision, resource=event.resource,
            holder=event.holder, token=event.token, expires_at_ms=event.expires_at_ms, key=event.key,
            value=event.value, version=event.version,
        )


def resumable(error: FencingError) -> bool:
    """Whether a failed stream is opened again (from the last revision + 1) or raised."""
    if isinstance(error, LimitExceeded):
        return error.metadata.get(ErrorMeta.LIMIT, "") in _RESUMED_LIMITS
    return error.code in _RESUMED_CODES and not error.reason


class _Position:
    """Where a watch stands: the next revision to ask for (0: "from now"), and the rule that
    moves it. Shared by the sync and asyncio watchers."""

    def __init__(self, prefix: str, start_revision: int) -> None:
        if start_revision < 0:
            raise ValueError("start_revision must be >= 0")
        self.prefix = prefix
        self.next_revision = start_revision

    @property
    def revision(self) -> int:
        """Every event up to this revision has been yielded (0: none asked for yet)."""
        return max(0, self.next_revision - 1)

    def each(self, revision: int, events: list[WatchEvent]) -> Iterator[WatchEvent]:
        """``events`` one by one, ``revision`` counted as seen only with its last one: a
        caller that stops in the middle of an entry's events resumes at that entry."""
        self.next_revision = revision
        for event in events[:-1]:
            yield event
        self.next_revision = revision + 1
        yield events[-1]

    def context(self) -> dict[str, Any]:
        return {"rpc": "watch", "prefix": self.prefix, "start_revision": self.next_revision}

    def request(self) -> pb.WatchRequest:
        return pb.WatchRequest(prefix=self.prefix, start_revision=self.next_revision)

    def after_error(
        self, err: grpc.RpcError, endpoint: str, failing_since: float | None, timeout_s: float,
    ) -> tuple[float, bool]:
        """After stream ``err`` from ``endpoint``: raise it (as its FencingError) unless a new
        stream resumes the watch, or Unavailable once none has stayed open for ``timeout_s``
        since ``failing_since``; else (since when streams fail, whether to move on to the next
        member after a pause). The stream's own deadline is no fault of the member: the same
        one again, at once."""
        error = from_rpc_error(err, endpoint=endpoint, request=self.context())
        if not resumable(error):
            raise error from err
        now = time.monotonic()
        failing_since = failing_since or now
        if now - failing_since > timeout_s:
            raise Unavailable(f"watch: no stream for {now - failing_since:.1f} s: {error}") from err
        return failing_since, error.code is not grpc.StatusCode.DEADLINE_EXCEEDED

    def batch(self, response: pb.WatchResponse) -> tuple[int, list[WatchEvent]] | None:
        """The response's (revision, events), or None for one with none (created, progress),
        which moves the position at once."""
        if not response.events:
            if self.next_revision == 0 or response.revision + 1 > self.next_revision:
                self.next_revision = response.revision + 1
            return None
        return response.revision, [WatchEvent.from_pb(e) for e in response.events]


class Watcher:
    """The sync client's watch (``FencingClient.watch``). Iterate it for events, or
    ``batches()`` for each revision's events together; ``close()`` from any thread ends it."""

    def __init__(self, client: Any, prefix: str, start_revision: int = 0) -> None:
        self._client = client
        self._position = _Position(prefix, start_revision)
        self._lock = threading.Lock()
        self._stream: Any = None
        self._closed = False
        self._endpoint_index = 0
        self.resumes = 0  # streams opened again after a failure

    @property
    def revision(self) -> int:
        return self._position.revision

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[WatchEvent]:
        for revision, events in self.batches():
            yield from self._position.each(revision, events)

    def batches(self) -> Iterator[tuple[int, list[WatchEvent]]]:
        """(revision, its events) in log order, until ``close``."""
        failing_since: float | None = None
        while True:
            endpoints = self._client.endpoints
            endpoint = endpoints[self._endpoint_index % len(endpoints)]
            stub = self._client._stubs[endpoint].watch
            with self._lock:
                if self._closed:
                    return
                stream = self._stream = stub.Watch(
                    self._position.request(), timeout=WATCH_STREAM_S, metadata=self._client._metadata)
            try:
                for response in stream:
                    failing_since = None
                    found = self._position.batch(response)
                    if found is not None:
                        self._position.next_revision = found[0] + 1  # the caller has them all
                        yield found
            except grpc.RpcError as err:
                if self._closed:
                    return
                failing_since, move_on = self._position.after_error(
                    err, endpoint, failing_since, self._client._timeout_s)
                if move_on:
                    self._endpoint_index += 1
                    time.sleep(WATCH_RESUME_PAUSE_S)
                self.resumes += 1
            else:
                if self._closed:
                    return
            finally:
                with self._lock:
                    self._stream = None


class AsyncWatcher:
    """The asyncio client's watch (``AsyncFencingClient.watch``): ``async for`` its events,
    or ``batches()``; ``close()`` ends it."""

    def __init__(self, client: Any, prefix: str, start_revision: int = 0) -> None:
        self._client = client
        self._position = _Position(prefix, start_revision)
        self._stream: Any = None
        self._closed = False
        self._endpoint_index = 0
        self.resumes = 0

    @property
    def revision(self) -> int:
        return self._position.revision

    def close(self) -> None:
        self._closed = True
        if self._stream is not None:
            self._stream.cancel()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        async for revision, events in self.batches():
            for event in self._position.each(revision, events):
                yield event

    async def batches(self) -> AsyncIterator[tuple[int, list[WatchEvent]]]:
        failing_since: float | None = None
        while not self._closed:
            endpoints = self._client.endpoints
            endpoint = endpoints[self._endpoint_index % len(endpoints)]
            stream = self._stream = self._client._stubs[endpoint].watch.Watch(
                self._position.request(), timeout=WATCH_STREAM_S, metadata=self._client._metadata)
            try:
                async for response in stream:
                    failing_since = None
                    found = self._position.batch(response)
                    if found is not None:
                        self._position.next_revision = found[0] + 1  # the caller has them all
                        yield found
            except grpc.RpcError as err:
                if self._closed:
                    return
                failing_since, move_on = self._position.after_error(
                    err, endpoint, failing_since, self._client._timeout_s)
                if move_on:
                    self._endpoint_index += 1
                    await asyncio.sleep(WATCH_RESUME_PAUSE_S)
                self.resumes += 1
            except asyncio.CancelledError:
                if self._closed:
                    return
                raise
            finally:
                self._stream = None

"""The metrics endpoint's HTTP server (``metrics_address``): ``GET /metrics``, ``GET /readyz``,
404 elsewhere, on one asyncio event loop in one thread (issue 26: a thread per connection let
150 half-sent requests hold 150 threads, with no timeout).

Owns: the listener, the connection cap (``metrics_connections_max``: a connection beyond it is
closed as soon as it is accepted), the deadline of each connection (``metrics_request_timeout_s``:
request in, whole reply out, or it is closed), and one reply per connection (``Connection:
close``, as the HTTP/1.0 server before it). Replies are rendered on one worker thread, so a
slow collector never stalls the loop's timeouts and never runs twice at once.
Must never: start a thread per connection, read more than ``REQUEST_HEAD_BYTES_MAX`` of a
request, or know what the metrics are (it is handed a ``render(path, accept)`` function).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import threading
from typing import Callable

# Bytes of a request's line and headers: Prometheus sends ~300; a head past this is refused
# (431) rather than buffered.
REQUEST_HEAD_BYTES_MAX = 8 * 1024
# How long ``serve`` waits for the loop to bind, and ``close`` for it to stop: both take
# milliseconds; the bound only keeps a wedged loop from hanging start-up or shutdown.
LOOP_START_STOP_TIMEOUT_S = 10.0

# (status, body, content type) for a path and the request's Accept header
Render = Callable[[str, str], tuple[int, bytes, str]]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class MetricsHttpServer:
    """``serve()`` binds and starts the loop thread (OSError naming ``metrics_address`` if it
    cannot bind); ``close()`` stops it and closes every connection."""

    def __init__(self, address: str, render: Render, *, connections_max: int, request_timeout_s: float) -> None:
        self.address = address
        self.connections_max = connections_max
        self.request_timeout_s = request_timeout_s
        self.open_connections = 0
        self.refused_connections = 0  # closed at once: over the cap
        self.timed_out_connections = 0  # closed at the deadline
        self._render = render
        self._loop = asyncio.new_event_loop()
        self._renderer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics-render")
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "serve() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def serve(self) -> None:
        host, _, port = self.address.rpartition(":")
        self._thread = threading.Thread(target=self._loop.run_forever, name="metrics-http", daemon=True)
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, host.strip("[]"), int(port), reuse_address=True,
                                 limit=REQUEST_HEAD_BYTES_MAX),
            self._loop,
        )
        try:
            self._server = started.result(LOOP_START_STOP_TIMEOUT_S)
        except OSError as exc:
            self._stop_loop()
            raise OSError(exc.errno, f"metrics_address {self.address}: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self._thread is None:
            return
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(LOOP_START_STOP_TIMEOUT_S)
        self._stop_loop()
        self._renderer.shutdown(wait=False, cancel_futures=True)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None  # started by serve(), the only caller before close()
        self._thread.join(LOOP_START_STOP_TIMEOUT_S)
        self._thread = None
        if not self._loop.is_running():
            self._loop.close()

    async def _shut(self) -> None:
        assert self._server is not None  # close() calls this only with a server
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= self.connections_max:
            self.refused_connections += 1
            writer.transport.abort()  # its descriptor is free now, not after a reply
            return
        self.open_connections += 1
        self._writers.add(writer)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._exchange(reader, writer)
        except TimeoutError:
            self.timed_out_connections += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self.open_connections -= 1
            self._writers.discard(writer)
            writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await self._reply(writer, 431, b"request head too large\n")
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await self._reply(writer, 400, b"bad request line\n")
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            await self._reply(writer, 405, b"only GET\n", extra=b"Allow: GET, HEAD\r\n")
            return
        accept = ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep and name.strip().lower() == "accept":
                accept = value.strip()
        status, body, content_type = await self._loop.run_in_executor(
            self._renderer, self._render, target.split("?", 1)[0], accept)
        await self._reply(writer, status, body, content_type, head_only=method == "HEAD")

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, body: bytes,
                     content_type: str = "text/plain; charset=utf-8", *, extra: bytes = b"",
                     head_only: bool = False) -> None:
        writer.write(
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {content_type}\r\n"
            # Date, from this process's wall clock: HTTP/1.1 wants it, and the chaos suite reads a
            # member's clock (a stepped one included) from it (chaos/harness.py wall_clock_offset_s).
            f"Date: {email.utils.formatdate(usegmt=True)}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode("latin-1") + extra + b"\r\n"
            + (b"" if head_only else body)
        )
        # Flushed and closed under the connection's deadline: a client that does not read is cut off.
        writer.close()
        await writer.wait_closed()

"""Length-prefixed msgpack frames over TCP: the control protocol of node_process.

Owns: framing, a small blocking client and the threaded server loop (``serve_control``).
Must never: block a client call without a timeout.
A frame is a 4-byte big-endian length followed by one msgpack map.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import struct
import threading

import msgpack

log = logging.getLogger("control")

FRAME_BYTES_MAX = 16 * 1024 * 1024  # a bench reply with many latencies fits easily
_LEN = struct.Struct(">I")


class ControlError(RuntimeError):
    pass


def send_frame(sock: socket.socket, obj) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(_LEN.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("control connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket):
    (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if length > FRAME_BYTES_MAX:
        raise ControlError(f"frame of {length} bytes exceeds {FRAME_BYTES_MAX}")
    return msgpack.unpackb(_recv_exact(sock, length), raw=False)


class ControlClient:
    """One connection to one node process; calls are sequential."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0):
        self.address = (host, port)
        self._timeout_s = timeout_s
        self._sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.create_connection(self.address, timeout=self._timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        return self._sock

    def call(self, request: dict, timeout_s: float | None = None) -> dict:
        """Send one request; any socket error closes the connection and re-raises."""
        sock = self._connect()
        sock.settimeout(timeout_s if timeout_s is not None else self._timeout_s)
        try:
            send_frame(sock, request)
            reply = recv_frame(sock)
        except BaseException:
            self.close()
            raise
        if reply.get("error"):
            raise ControlError(reply["error"])
        return reply

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def serve_control(service, host: str, port: int) -> socketserver.ThreadingTCPServer:
    """Answer control requests on ``host:port`` with ``service.handle(request) -> reply`` on a
    daemon thread, one thread per connection; an exception becomes ``{"error": ...}`` and the
    connection keeps serving. Used by the node control process and the stock-node baseline."""
    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            sock = self.request
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                try:
                    req = recv_frame(sock)
                except (ConnectionError, OSError):
                    return
                try:
                    reply = service.handle(req)
                except Exception as exc:  # report to the caller, keep serving
                    log.exception("control request failed")
                    reply = {"error": repr(exc)}
                try:
                    send_frame(sock, reply)
                except OSError:
                    return

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
    return server

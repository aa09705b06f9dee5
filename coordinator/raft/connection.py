"""What ``patches.install()`` puts on pysyncobj's TcpConnection: bounded frames, typed, both ways.

Owns: the frame reader that replaces pysyncobj's (``process_read_bounded``,
``parse_message_bounded``: heads checked as bytes arrive, a bytearray grown in place, frames
decoded by the typed wire, at most ``raft_limits.RAFT_PREAUTH_BYTES_MAX`` buffered for a
connection that has not named a member), ``send_typed``, the writer, the connection timeout
that counts silence only while the peer owes an answer (``drop_if_unanswered``), and our
per-connection state (``CONNECTION_DEFAULTS``, ``restarting_frame_scan``). RAFT.md "A typed
wire", "Bounded frames" and "Idle is not dead". The transport that owns the connections, and
the warnings' rate limiter, are in ``transport.py``.
Must never: patch pysyncobj itself (``patches.install()`` does), decode a frame any other way
than ``wire.decode_frame`` (no peer byte reaches pickle), or keep a connection that declared a
frame over ``raft_limits.RAFT_MESSAGE_BYTES_MAX`` or sent one that failed.
"""

from __future__ import annotations

import errno
import socket
from typing import Any, Callable

from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.poller import POLL_EVENT_TYPE

from coordinator.raft import limits as raft_limits
from coordinator.raft import peer_binding
from coordinator.raft import wire as raft_wire

# The lines keep the logger they were always written under (and its one rate limiter).
from coordinator.raft.transport import log, peer_warnings

# Our per-connection state, as class defaults on pysyncobj's TcpConnection (patches.py sets
# them) that a connection overrides for itself. ``_frames_scanned_to`` is where the first
# frame not yet whole starts in the read buffer.
CONNECTION_DEFAULTS: dict[str, Any] = {
    "_frames_scanned_to": 0,
    "on_refused_frame": None,  # the transport's refusal counter, once it owns the connection
    "accepted_at": 0.0,  # monotonic time an incoming connection was accepted
    # The transport's connections that have not named a member yet: one in it reads under
    # raft_limits.RAFT_PREAUTH_BYTES_MAX (outgoing connections are never in it).
    "unnamed_connections": frozenset(),
    # Monotonic time of the first message sent since the last read that the peer answers
    # (ANSWERED_TYPES); None when nothing sent since then waits for an answer.
    "awaiting_answer_since": None,
    # With the secret: the binding handshake so far (peer_binding.Transcript), and once it is
    # done the incarnation of the member at the other end, which every stamped message on
    # the connection must carry (BoundTCPTransport._on_bound_message).
    "handshake": None,
    "bound_incarnation": None,
}

# Raft messages a live peer answers: an append or snapshot chunk (with next_node_idx), a vote
# request it grants (response_vote), a forwarded command (apply_command_response), and a
# handshake's hello (the welcome), and a pre-vote request (always answered, yes or no): a dial
# nobody answers is dropped after connectionTimeout.
ANSWERED_TYPES = frozenset({"append_entries", "request_vote", "apply_command", "pre_vote", peer_binding.BIND_TYPE})


# pysyncobj drops a connection on which nothing was read for connectionTimeout (3.5 s here),
# checked lazily at the connection's next event, before that event is handled
# (tcp_connection.py:186, 227-230, 233). Between two followers nothing flows while a leader
# leads, so after 3.5 s of a stable leader that next event was the first vote request of an
# election, on either side: the connection closed with the request unsent or unread, the
# candidate waited out a whole election timeout more with its one vote, and a failover took
# two election timeouts (bench compare: ~1.3 s of NO_LEADER after the leader was gone).
# Silence on a connection says the peer is gone only when the peer owes an answer: the timeout
# now runs from the first message sent since the last read that a live peer answers. A peer
# that went quiet while owing one (stopped, or its host gone) is still dropped after
# connectionTimeout, as before.


def drop_if_unanswered(conn) -> None:
    """TcpConnection.__processConnectionTimeout (tcp_connection.py:227-230), silence counted
    only while the peer owes an answer."""
    since = conn.awaiting_answer_since
    if since is None or since < conn._TcpConnection__lastReadTime:
        return  # nothing sent since the last read waits for an answer: idle, not dead
    if _monotonic() - since > conn._TcpConnection__timeout:
        conn.disconnect()


# pysyncobj's frame reader (tcp_connection.py:261-299) buffers until a frame's 32-bit length
# is in: up to 2 GiB per connection, from anyone who reaches a Raft port (with the secret
# too: it is checked once the frame is whole). It also grows its buffer by concatenating
# bytes, which copies the buffer on every read: seconds on the Raft thread for a frame of
# tens of MiB. Ours is the same reader with the heads checked as bytes arrive
# (raft_wire.scan_frames: a head declaring more than raft_limits.RAFT_MESSAGE_BYTES_MAX drops the
# connection before its body is waited for; before the connection names a member, more than
# raft_limits.RAFT_PREAUTH_BYTES_MAX) and a bytearray that grows in place.


def process_read_bounded(conn) -> bool:
    """TcpConnection.__processRead (tcp_connection.py:261-275), the buffer a bytearray, heads checked.

    Until the connection names a member it reads under the pre-authentication budget
    (``raft_limits.RAFT_PREAUTH_BYTES_MAX``): never more than that many bytes buffered, its
    first frame's head checked against it, and no read past a whole first frame (which may
    name a member: it is parsed first, and a member's next frames get the full bound).
    """
    buffer = conn._TcpConnection__readBuffer
    if not isinstance(buffer, bytearray):  # pysyncobj (re)sets it to bytes() on (dis)connect
        buffer = conn._TcpConnection__readBuffer = bytearray(buffer)
    unnamed = conn in conn.unnamed_connections
    size = conn._TcpConnection__recvBufferSize
    if unnamed:
        if _first_frame_whole(buffer):
            return False  # pysyncobj parses it next; the rest stays in the kernel's buffer
        # > 0: a first frame within the budget is whole before the buffer reaches it (above).
        size = min(size, raft_limits.RAFT_PREAUTH_BYTES_MAX - len(buffer))
    try:
        incoming = conn._TcpConnection__socket.recv(size)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            conn.disconnect()
        return False
    if conn._TcpConnection__socket.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        conn.disconnect()
        return False
    if not incoming:
        conn.disconnect()
        return False
    buffer += incoming
    try:
        if unnamed:
            # The first frame's head against the budget; heads after it (a member may send its
            # appends right behind its name) against the full bound. At most the budget's bytes
            # are scanned here; the offset stays 0, so they are scanned again once named.
            raft_wire.scan_frames(buffer[: raft_wire.FRAME_HEAD.size], 0, max_bytes=_PREAUTH_FRAME_BYTES_MAX)
            if _first_frame_whole(buffer):
                (length,) = raft_wire.FRAME_HEAD.unpack_from(buffer, 0)
                raft_wire.scan_frames(
                    buffer, raft_wire.FRAME_HEAD.size + length, max_bytes=raft_limits.RAFT_MESSAGE_BYTES_MAX
                )
        else:
            conn._frames_scanned_to = raft_wire.scan_frames(
                buffer, conn._frames_scanned_to, max_bytes=raft_limits.RAFT_MESSAGE_BYTES_MAX
            )
    except raft_wire.FrameTooLarge as exc:
        before = " before naming a member" if unnamed else ""
        peer_warnings.warning("raft: dropped a connection%s: %s", before, exc)
        if conn.on_refused_frame is not None:
            conn.on_refused_frame()
        conn.disconnect()
        return False
    return True


# A frame, head included, fits the pre-authentication budget.
_PREAUTH_FRAME_BYTES_MAX = raft_limits.RAFT_PREAUTH_BYTES_MAX - raft_wire.FRAME_HEAD.size


def _first_frame_whole(buffer: bytearray) -> bool:
    if len(buffer) < raft_wire.FRAME_HEAD.size:
        return False
    (length,) = raft_wire.FRAME_HEAD.unpack_from(buffer, 0)
    return len(buffer) >= raft_wire.FRAME_HEAD.size + length


def parse_message_bounded(conn):
    """TcpConnection.__processParseMessage (tcp_connection.py:277-299) on the bytearray, typed.

    The frame is decrypted with the secret (when there is one) and decoded by
    ``raft_wire.decode_frame``: a frame that fails anything (replayed, another connection's
    key, not the typed wire, any field's type or range) drops the connection, as pysyncobj
    drops any bad frame, and is counted; nothing in it reaches pysyncobj.
    """
    buffer = conn._TcpConnection__readBuffer
    if len(buffer) < raft_wire.FRAME_HEAD.size:
        return None
    (length,) = raft_wire.FRAME_HEAD.unpack_from(buffer, 0)
    end = raft_wire.FRAME_HEAD.size + length
    if len(buffer) < end:
        return None
    with memoryview(buffer) as view:  # released before the buffer shrinks
        data = view[raft_wire.FRAME_HEAD.size : end].tobytes()
    try:
        if conn.encryptor:
            timestamp = conn.encryptor.extract_timestamp(data)
            if timestamp < conn.recvLastTimestamp:
                raise ValueError("a replayed or reordered frame")
            conn.recvLastTimestamp = timestamp
            data = conn.encryptor.decrypt(data)
        message = raft_wire.decode_frame(data, conn.recvRandKey)
    except raft_wire.LegacyWireFrame:
        _refuse_frame(conn, _LEGACY_WIRE_LINE, legacy=True)
        return None
    except Exception as exc:  # noqa: BLE001 - as pysyncobj: any bad frame drops the connection
        _refuse_frame(conn, f"raft: dropped a connection: refused frame ({exc})")
        return None
    del buffer[:end]
    conn._frames_scanned_to = max(0, conn._frames_scanned_to - end)
    return message


# A member still on pysyncobj's pickle wire (a rolling upgrade from a version before the
# typed wire) reconnects every connectionRetryTime: one line says what is wrong, once per
# process; every such frame is still counted.
_LEGACY_WIRE_LINE = (
    "raft: refused a peer speaking pysyncobj's pickle wire (a member of a version before the "
    "typed Raft wire): a rolling upgrade across this change is not supported; stop every "
    "member, then start them all on this version (RAFT.md \"A typed wire\")"
)
_legacy_logged = False


def _refuse_frame(conn, line: str, *, legacy: bool = False) -> None:
    global _legacy_logged
    if legacy:
        if not _legacy_logged:
            _legacy_logged = True
            log.error(line)
    else:
        peer_warnings.warning("%s", line)
    if conn.on_refused_frame is not None:
        conn.on_refused_frame()
    conn.disconnect()


def send_typed(conn, message) -> None:
    """TcpConnection.send (tcp_connection.py:141-149) on the typed wire: msgpack, no deflate.

    The write buffer is a bytearray the frame is appended to in place (pysyncobj
    concatenated bytes, copying everything still unsent on every message).
    """
    data = raft_wire.encode_frame(message, conn.sendRandKey)
    if type(message) is dict and message.get("type") in ANSWERED_TYPES:
        since = conn.awaiting_answer_since
        if since is None or since < conn._TcpConnection__lastReadTime:
            conn.awaiting_answer_since = _monotonic()
    if conn.encryptor:
        data = conn.encryptor.encrypt_at_time(data, int(_monotonic()))
    buffer = conn._TcpConnection__writeBuffer
    if not isinstance(buffer, bytearray):  # pysyncobj (re)sets it to bytes() on (dis)connect
        buffer = conn._TcpConnection__writeBuffer = bytearray(buffer)
    buffer += raft_wire.FRAME_HEAD.pack(len(data))
    buffer += data
    conn._TcpConnection__trySendBuffer()
    fileno = conn._TcpConnection__fileno
    # (A partial send rebinds the buffer to what is left: read it again.)
    if conn._TcpConnection__writeBuffer and fileno is not None:
        # The kernel took only part of the frame. pysyncobj asks the poller for write events
        # only while handling one (tcp_connection.py:203-209), never after a send, so the rest
        # went out only when the next message was sent: a 1 MiB restore chunk crawled out at
        # a socket buffer per heartbeat (~0.4 s). Its write handler drops the interest again
        # once the buffer is empty.
        conn._TcpConnection__poller.subscribe(
            fileno, conn._TcpConnection__processConnection,
            POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
        )


def restarting_frame_scan(method: Callable) -> Callable:
    """``method`` (connect or disconnect) that first forgets where frames were scanned to:
    pysyncobj reuses a connection object, and its buffer starts over."""

    def wrapped(conn, *args):
        conn._frames_scanned_to = 0
        conn.handshake = conn.bound_incarnation = None  # a binding holds for one connection
        return method(conn, *args)

    return wrapped

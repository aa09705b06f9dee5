"""Who may talk to a member over Raft: connection admission, naming and binding.

Owns: ``BoundTCPTransport`` (outgoing sockets leave from the node's own address, looked up
when it binds; peers' names looked up on every connection attempt through ``addresses.Resolver``
and a connect nobody answers abandoned after ``RAFT_CONNECT_TIMEOUT_MS``; connects and losses
told to ``peer_log.PeerLog``, RAFT.md "Addresses that move"; incoming
connections must name a member, in time, at most ``RAFT_UNNAMED_CONNECTIONS_MAX`` waiting, and
never take the place of a working connection unless they completed the secret's binding
handshake, ``peer_binding.py``, which the transport drives on both sides and whose refusals
it counts by reason; a listen backlog of ``RAFT_LISTEN_BACKLOG``) and ``PeerWarnings``, the
one rate limiter every per-connection warning goes through. The bounded frame reader and
writer its connections use are in ``connection.py``.
RAFT.md "Connections that name no member" and "Peer authentication".
Must never: act on a message with the secret before the binding handshake completed, or on
a stamped one naming another incarnation than the connection's, or log a line per connection
(anyone who reaches the port makes connections: ``peer_warnings`` lets one line per
``raft_limits.RAFT_PEER_WARNING_LOG_INTERVAL_MS`` through).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.tcp_server import SERVER_STATE, TcpServer
from pysyncobj.transport import TCPTransport

from coordinator.raft import addresses, peer_binding
from coordinator.raft import limits as raft_limits
from coordinator.raft.peer_binding import Party, Refusal, Transcript
from coordinator.raft.peer_log import PeerLog

log = logging.getLogger(__name__)

class PeerWarnings:
    """One rate limiter for every per-connection warning: the first in an interval is
    logged (saying how many were suppressed since the last line), the rest only counted."""

    def __init__(self, logger: logging.Logger, interval_ms: int, clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()  # the Raft thread logs; a lock keeps any other caller exact
        self._suppressed = 0
        self._next_at: float | None = None

    def warning(self, message: str, *args: object) -> None:
        with self._lock:
            now = self._clock()
            if self._next_at is not None and now < self._next_at:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._next_at = self._suppressed, 0, now + self._interval_s
        more = f" (and {suppressed} more since the last line)" if suppressed else ""
        self._logger.warning(message + "%s", *args, more)


peer_warnings = PeerWarnings(log, raft_limits.RAFT_PEER_WARNING_LOG_INTERVAL_MS)
# Names that do not resolve: a limiter of their own, so a stranger's refused connections never
# hide the one line that says why a member stays out.
address_warnings = PeerWarnings(addresses.log, raft_limits.RAFT_PEER_WARNING_LOG_INTERVAL_MS)

# Messages that name their sender's incarnation (member_gate.STAMPED_TYPES; wire.py _SENDER).
_INCARNATION_STAMPED = frozenset({"request_vote", "response_vote", "next_node_idx", "append_entries",
                                  "pre_vote", "pre_vote_response", "term_notice"})


def _peer_of(conn) -> str:
    """Where a connection's other end is, for the log ("127.0.0.3:7000")."""
    try:
        host, port = conn._TcpConnection__socket.getpeername()[:2]
    except (AttributeError, OSError):  # no socket any more, or already reset
        return "address unknown"
    return f"{host}:{port}"


def still_open(conn) -> bool:
    """The connection is up as far as this process can tell: pysyncobj says connected and the
    kernel holds neither an end of stream nor an error for it (either may not have been read
    yet when the peer reconnects right after closing)."""
    if conn.state != CONNECTION_STATE.CONNECTED:
        return False
    sock = conn._TcpConnection__socket
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True  # nothing to read: open
    except OSError:
        return False  # reset, or any other error the next read would report


class BoundTCPTransport(TCPTransport):
    """Outgoing peer connections leave from this node's own address; strangers are bounded.

    pysyncobj never binds outgoing sockets (tcp_connection.py:119), so every node on
    127.0.0.2/.3/.4 would connect from 127.0.0.1 and packet filters could not tell
    them apart. TcpConnection.connect() calls setSockoptKeepalive() right before
    connect() (tcp_connection.py:123): binding there is the smallest hook.
    """

    # pysyncobj's TCPTransport state read and set here (pysyncobj itself is untyped).
    _lastBindAttemptTime: float
    _server: Any  # its TcpServer, None while not bound

    def __init__(self, syncObj, selfNode, otherNodes):
        # Before pysyncobj's constructor: it adds the peers and creates the server.
        self._addresses = addresses.Resolver(address_warnings.warning)
        self.own_ip: str | None = None  # this member's address as last bound; outgoing sockets leave from it
        self._bind_failing = False
        self._relisten_at: float | None = None  # monotonic; set while the bound port is closed
        self.listen_losses = 0  # times the bound port closed under it (fencing_raft_listen_losses_total)
        self.peer_log = PeerLog(len(otherNodes), self._role)
        super().__init__(syncObj, selfNode, otherNodes)

    def _count_refused(self) -> None:
        self._syncObj.refused_peer_messages += 1

    def _role(self) -> str:
        so = self._syncObj
        term = so.raftCurrentTerm
        if so._isLeader():
            return f"leader, term {term}"
        leader = so._getLeader()
        return f"follower of {leader.address}, term {term}" if leader is not None else f"no leader, term {term}"

    # -- this member's own address --------------------------------------------------------

    def _createServer(self):
        """Deferred to ``_maybeBind``: pysyncobj looks its own name up once, here, inside SyncObj's
        constructor (transport.py:277-279), and a name that did not resolve yet (a pod whose DNS
        record is not published) died with ``TypeError: inet_aton() argument 1 must be str``."""
        self._server = None

    def _maybeBind(self):
        if self._ready:  # bound already; pysyncobj checks this first too, every tick
            return
        conf = self._syncObj.conf
        if self._server is None:
            now = _monotonic()
            if now < self._lastBindAttemptTime + conf.bindRetryTime:
                return
            self._lastBindAttemptTime = now
            if not self._make_server():
                return
            self._lastBindAttemptTime = 0  # pysyncobj's bind below, at once
        attempts = self._bindAttempts
        super()._maybeBind()
        if self._ready:
            # listen() again on a listening socket only resizes its queue (transport.py:285-299
            # binds; tcp_server.py:42 listened with a backlog of 5).
            self._server._TcpServer__socket.listen(raft_limits.RAFT_LISTEN_BACKLOG)
            log.info("raft: listening on %s (%s)", self._selfNode.address, self.own_ip)
            self._bind_failing = False
        elif self._bindAttempts > attempts:
            # The name may point at an address not on this machine yet (a stale DNS record):
            # look it up again before the next attempt.
            if not self._bind_failing:
                address_warnings.warning(
                    "raft: cannot listen on %s (%s) yet; retrying every %g s",
                    self._selfNode.address, self.own_ip, conf.bindRetryTime,
                )
                self._bind_failing = True
            self._server.unbind()
            self._server = None

    def listening(self) -> bool:
        """Bound, and the port still open: pysyncobj's ``ready`` stays true once it bound."""
        return bool(self._ready) and self._server is not None and not self._server_closed()

    def _server_closed(self) -> bool:
        return bool(self._server._TcpServer__state == SERVER_STATE.UNBINDED)

    def _relisten_if_closed(self) -> None:
        """pysyncobj's server closes its port for good on an accept error other than EAGAIN
        (tcp_server.py:74-80: EMFILE once the member's descriptors run out, ENFILE, ENOBUFS),
        and nothing binds it again, as ``_ready`` stays true. A member its peers dial (the
        higher address dials, transport.py:401) was then out of the cluster for as long as it
        ran (soak: a follower out of descriptors for 15 s, apart for minutes after). So a port
        closed under a bound transport is bound again every ``bindRetryTime``, while Raft goes
        on ticking (a ``_ready`` set false would stop pysyncobj's whole tick, syncobj.py:612-622)."""
        if not self._ready or self._server is None or not self._server_closed():
            return
        now = _monotonic()
        retry_s = self._syncObj.conf.bindRetryTime
        if self._relisten_at is None:  # just closed: the descriptors it lacked may still be short
            self.listen_losses += 1
            self._relisten_at = now + retry_s
            peer_warnings.warning(
                "raft: stopped listening on %s (%s): accept failed (out of descriptors?); listening again every %g s",
                self._selfNode.address, self.own_ip, retry_s,
            )
            return
        if now < self._relisten_at:
            return
        try:
            self._server.bind()
            self._server._TcpServer__socket.listen(raft_limits.RAFT_LISTEN_BACKLOG)
        except OSError:
            self._server.unbind()  # the socket it may have made; the next try in retry_s
            self._relisten_at = now + retry_s
            return
        self._relisten_at = None
        log.info("raft: listening on %s (%s) again", self._selfNode.address, self.own_ip)

    def _make_server(self) -> bool:
        conf = self._syncObj.conf
        ip = self._addresses.resolve(
            self._selfNode.host, "own address (raft_address)",
            f"every {conf.bindRetryTime:g} s; this member stays out of the cluster until it resolves",
        )
        if ip is None:
            return False
        self.own_ip = ip
        self._server = TcpServer(
            self._syncObj._poller, ip, self._selfNode.port, onNewConnection=self._onNewIncomingConnection,
            sendBufferSize=conf.sendBufferSize, recvBufferSize=conf.recvBufferSize,
            connectionTimeout=conf.connectionTimeout,
        )
        return True

    # -- peers' addresses -----------------------------------------------------------------

    def _connectIfNecessarySingle(self, node):
        """pysyncobj's (transport.py:411-427), the peer's name looked up again on every attempt.

        pysyncobj's ``node.ip`` kept an answer for 10 minutes (dnsCacheTime): a member restarted
        under a new IP stayed out of the cluster that long. No attempt before this member's own
        address is known: outgoing sockets leave from it.
        """
        conn = self._connections.get(node)
        if conn is not None and conn.state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node) or self.own_ip is None:
            return False
        now = _monotonic()
        last = self._lastConnectAttempt.get(node)
        if last is not None and now - last < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = now
        ip = self._addresses.resolve(node.host)
        if ip is None:
            return False
        if (":" in ip) != (":" in self.own_ip):
            address_warnings.warning("raft: peer %s resolves to %s, which %s cannot reach from %s",
                                     node.address, ip, self._selfNode.address, self.own_ip)
            return False
        try:
            return conn.connect(ip, node.port)
        except OSError as exc:
            # socket() itself refused (EMFILE, ENFILE, ENOBUFS): pysyncobj does not catch it
            # (tcp_connection.py:119), and anything escaping a tick stops the member
            # (durable_term.py). No connection is no durable write: retry at the next attempt;
            # the member stops only when a write of its durable state fails.
            peer_warnings.warning("raft: cannot open a connection to %s: %s", node.address, exc)
            return False

    def _abandon_slow_connects(self) -> None:
        # pysyncobj checks a connection's timeout only when its socket reports an event: a
        # connect to an address that drops SYNs waited out the kernel's retries (~2 min).
        cutoff = _monotonic() - raft_limits.RAFT_CONNECT_TIMEOUT_MS / 1000
        for node, conn in list(self._connections.items()):
            if conn.state == CONNECTION_STATE.CONNECTING and self._lastConnectAttempt.get(node, cutoff) < cutoff:
                conn.disconnect()

    def _onNodeConnected(self, node):
        self.peer_log.on_connected(node.address, _peer_of(self._connections.get(node)))
        super()._onNodeConnected(node)

    def _onNodeDisconnected(self, node):
        self.peer_log.on_disconnected(node.address)
        super()._onNodeDisconnected(node)

    def destroy(self):
        super().destroy()
        self._addresses.close()

    def _onNewIncomingConnection(self, conn):
        conn.on_refused_frame = self._count_refused
        # pysyncobj moves it out of this set once it names a member; until then the
        # pre-authentication budget holds (process_read_bounded).
        conn.unnamed_connections = self._unknownConnections
        conn.accepted_at = time.monotonic()
        while len(self._unknownConnections) >= raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX:
            oldest = min(self._unknownConnections, key=lambda c: c.accepted_at)
            self._drop_unnamed(oldest, f"more than {raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX} have named no member yet")
        super()._onNewIncomingConnection(conn)

    def _onTick(self):
        super()._onTick()
        self._relisten_if_closed()
        self._abandon_slow_connects()
        if self._unknownConnections:  # usually empty: members name themselves at once
            cutoff = time.monotonic() - raft_limits.RAFT_NAMING_DEADLINE_MS / 1000
            for conn in [c for c in self._unknownConnections if c.accepted_at < cutoff]:
                self._drop_unnamed(conn, f"it named no member within {raft_limits.RAFT_NAMING_DEADLINE_MS} ms")

    def _drop_unnamed(self, conn, why: str) -> None:
        peer_warnings.warning("raft: dropped an incoming connection: %s", why)
        self._count_refused()
        self._unknownConnections.discard(conn)
        conn.disconnect()

    def dropNode(self, node):
        # A member the configuration no longer names: its connection closes here, and the peer
        # log must not keep counting it toward a quorum (pysyncobj's disconnect callback does
        # not find a connection it already forgot).
        super().dropNode(node)
        self.peer_log.on_disconnected(node.address)

    def addNode(self, node):
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:
            conn.on_refused_frame = self._count_refused
        if conn is None or self._selfNode is None:
            return
        keepalive = conn.setSockoptKeepalive

        def bind_then_keepalive():
            sock = conn._TcpConnection__socket
            if sock is not None:
                # The address this member listens on, as last looked up (never the name: bind()
                # would look it up again on the Raft thread, unbounded).
                sock.bind((self.own_ip, 0))
            keepalive()

        conn.setSockoptKeepalive = bind_then_keepalive

    def _onIncomingMessageReceived(self, conn, message):
        """Accept only members on incoming connections: no read-only nodes, no utility commands.

        pysyncobj lets any connection announce itself as a read-only node, which is then sent
        every entry, or send utility commands (status, add, remove, set_version, transfer;
        transport.py:375-384) that no member of ours uses. Only the handshake is seen here:
        with the secret the binding (``_bind_incoming``), without it one name. It must name a
        member, and one that dials this member, never one this member dials itself (pysyncobj:
        the higher address dials, transport.py:401-409). pysyncobj would put the incoming
        connection in place of the outgoing one it dials that member with, and once that
        closed reconnect with it: it never named itself to that member again, which then
        stayed out of the cluster for good (found by tests/test_raft_port_fuzz.py).
        """
        if self._syncObj.encryptor:
            dialler = self._bind_incoming(conn, message)
            if dialler is None:
                return  # the handshake goes on, or the connection was refused
            address = dialler.address
        elif isinstance(message, str) and message in self._nodeAddrToNode:
            address, dialler = message, None
        else:
            self._drop_unnamed(conn, f"its first message did not name a member ({type(message).__name__})")
            return
        node = self._nodeAddrToNode.get(address)
        if node is None:
            self._refuse_binding(conn, "unknown_member", f"it is {address}, which is no member")
            return
        if self._shouldConnect(node):
            # Members dial only lower addresses, so this member never hears from that one on an
            # incoming connection. pysyncobj would put the newcomer in place of the connection
            # it dials (transport.py:359) and, once the newcomer hangs up, "reconnect" through
            # an accepted socket that never names itself: the member stayed cut off for good.
            why = f"it named {address}, a member this one connects to itself"
            if dialler is not None:
                self._refuse_binding(conn, "wrong_direction", why)
            else:
                self._drop_unnamed(conn, why)
            return
        established = self._connections.get(node)
        keep = established is not None and established is not conn and still_open(established)
        if keep and dialler is None:
            # Without the secret a name proves nothing: the connection that works stays, and a
            # restarted member gets in once the kernel reports its old connection closed.
            self._drop_unnamed(conn, f"it named {address}, which is connected already")
            return
        if keep and dialler is not None and self._keeps_configured(node, established, dialler):
            self._refuse_binding(conn, "stale_incarnation", (
                f"it is {address} as incarnation {dialler.incarnation}, which the configuration does not"
                f" name; the connection of incarnation {established.bound_incarnation} stays"))
            return
        if dialler is not None:
            conn.bound_incarnation = dialler.incarnation
        super()._onIncomingMessageReceived(conn, address)
        if dialler is not None:
            conn.setOnMessageReceivedCallback(functools.partial(self._on_bound_message, conn, node))
        if keep:
            # The newcomer completed the binding: it is that member (one restarted, say, after
            # a power loss its old connection never reported). pysyncobj would leave the replaced
            # connection open, still delivering; closing it after the swap (_connToNode no
            # longer finds it) tells no one that the member disconnected.
            self._syncObj.peer_connections_replaced += 1
            established.disconnect()

    # -- the binding handshake, with the secret (peer_binding.py; RAFT.md "Peer authentication") --

    def _own_party(self) -> Party:
        member_id, incarnation = self._syncObj.binding_identity()
        return Party(self._selfNode.address, member_id, incarnation)

    def _refuse_binding(self, conn, reason: str, why: str) -> None:
        """Count and close a connection whose handshake failed: one rate-limited line for all."""
        outgoing = conn.handshake is not None and conn.handshake.dialler.address == self._selfNode.address
        peer_warnings.warning("raft: refused %s connection (%s): %s",
                              "an outgoing" if outgoing else "an incoming", reason, why)
        counts = self._syncObj.refused_bindings
        counts[reason] = counts.get(reason, 0) + 1
        self._count_refused()
        self._unknownConnections.discard(conn)
        conn.disconnect()

    def _bind_incoming(self, conn, message) -> Party | None:
        """The receiver's side: a hello for this member gets a welcome; a confirm of that
        welcome returns the dialler it binds. None while the handshake goes on or once refused."""
        if conn.handshake is None:
            hello, refusal = peer_binding.check_hello(message, self._selfNode.address)
            if refusal is not None:
                self._refuse_binding(conn, *refusal)
                return None
            assert hello is not None  # check_hello gives a transcript whenever it refuses nothing
            welcomed = hello.answered(os.urandom(peer_binding.NONCE_BYTES), self._own_party())
            conn.handshake = welcomed
            # Frames to the dialler carry its nonce; frames from it must carry ours.
            conn.sendRandKey, conn.recvRandKey = welcomed.dialler_nonce, welcomed.receiver_nonce
            conn.send(welcomed.message(peer_binding.STEP_WELCOME))
            return None
        refusal = peer_binding.check_confirm(message, conn.handshake)
        if refusal is None:
            refusal = self._misnamed(conn.handshake.dialler)
        if refusal is not None:
            self._refuse_binding(conn, *refusal)
            return None
        return conn.handshake.dialler

    def _misnamed(self, party: Party) -> Refusal | None:
        """A member id at an address that the configuration gives another member."""
        member = self._syncObj.configured_member(party.address)
        if member is not None and member.member_id != party.member_id:
            return Refusal(peer_binding.MISDIALLED, (
                f"it is member {party.member_id} at {party.address}; the configuration names {member.member_id}"))
        return None

    def _keeps_configured(self, node, established, dialler: Party) -> bool:
        """The established connection is bound to the incarnation the configuration names at
        that address, and the newcomer to another (an old incarnation, still running): the
        newcomer must not take its place."""
        member = self._syncObj.configured_member(node.address)
        if member is None or not member.incarnation:
            return False  # no configuration yet, or a learner not bound to an incarnation yet
        return established.bound_incarnation == member.incarnation != dialler.incarnation

    def _onOutgoingConnected(self, conn):
        """The dialler's side: a hello naming this member and the member dialled (pysyncobj
        sent a bare key, transport.py:452-456, then named itself unasked)."""
        if not self._syncObj.encryptor:
            return super()._onOutgoingConnected(conn)
        node = self._connToNode(conn)
        hello = Transcript(os.urandom(peer_binding.NONCE_BYTES), self._own_party(), node.address)
        conn.handshake = hello
        conn.recvRandKey = hello.dialler_nonce  # the welcome must carry it
        conn.setOnMessageReceivedCallback(functools.partial(self._on_welcome, conn, node))
        conn.send(hello.message(peer_binding.STEP_HELLO))

    def _on_welcome(self, conn, node, message) -> None:
        """The answer to our hello: it must be from the member dialled, or we hang up (and
        dial again after connectionRetryTime)."""
        member = self._syncObj.configured_member(node.address)
        bound, refusal = peer_binding.check_welcome(message, conn.handshake, member.member_id if member else None)
        if refusal is not None:
            self._refuse_binding(conn, *refusal)
            return
        assert bound is not None and bound.receiver is not None  # check_welcome's, with no refusal
        conn.handshake = bound
        conn.sendRandKey = bound.receiver_nonce
        conn.bound_incarnation = bound.receiver.incarnation
        conn.send(bound.message(peer_binding.STEP_CONFIRM))
        conn.setOnMessageReceivedCallback(functools.partial(self._on_bound_message, conn, node))
        self._onNodeConnected(node)

    def _on_bound_message(self, conn, node, message) -> None:
        """A message on a bound connection: one that names its sender's incarnation must name
        the one the connection is bound to, or it is not acted on and the connection closes."""
        if type(message) is dict and message.get("type") in _INCARNATION_STAMPED:
            if message["incarnation"] != conn.bound_incarnation:
                self._refuse_binding(conn, "incarnation_mismatch", (
                    f"a {message['type']} from {node.address} as incarnation {message['incarnation']} on a"
                    f" connection bound to incarnation {conn.bound_incarnation}"))
                return
        self._onMessageReceived(node, message)

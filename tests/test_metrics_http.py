"""The metrics endpoint's HTTP server (issue 26, point 7): one event loop thread, a connection
cap and a per-connection deadline, so half-sent requests neither hold threads nor stay open.

Each test serves a real ``Metrics`` registry on a loopback port of this process and talks to it
over real sockets. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import email.utils
import http.client
import socket
import threading
import time

import pytest

from coordinator.server import metrics_http
from coordinator.server.metrics import Metrics
from testsupport.supervisor import wait_until

TIMEOUT_S = 1.0  # metrics_request_timeout_s here: short, so a test waits seconds, not minutes
CAP = 4  # metrics_connections_max here
HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: member\r\n"  # never the blank line that ends the head


@pytest.fixture
def endpoint():
    """(metrics, port, server) serving on 127.0.0.1, ready() as the dict says."""
    metrics = Metrics()
    state = {"ready": True}
    metrics.serve("127.0.0.1:0", lambda: state["ready"], connections_max=CAP, request_timeout_s=TIMEOUT_S)
    server = metrics._http
    yield metrics, server.port, server, state
    metrics.close()


def get(port: int, path: str, method: str = "GET", headers: dict | None = None) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read(), reply.getheader("Content-Type", "")
    finally:
        conn.close()


def closed_by_server(sock: socket.socket) -> bool:
    """The server closed (EOF or reset) ``sock``; never blocks."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def half_sent(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(HALF_SENT)
        socks.append(sock)
    return socks


def test_a_scrape_gets_the_metrics_and_readyz_follows_ready(endpoint):
    metrics, port, server, state = endpoint
    status, body, content_type = get(port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    assert b"fencing_build_info" in body
    status, body, content_type = get(port, "/metrics", headers={"Accept": "application/openmetrics-text"})
    assert status == 200 and content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert get(port, "/readyz")[:2] == (200, b"ok\n")
    state["ready"] = False
    assert get(port, "/readyz")[:2] == (503, b"not serving\n")
    assert get(port, "/metricz")[0] == 404
    assert get(port, "/metrics", method="HEAD")[:2] == (200, b"")
    assert get(port, "/metrics", method="POST")[0] == 405


def test_every_reply_carries_the_members_wall_clock_as_its_date(endpoint):
    # The chaos suite reads a member's (possibly stepped) clock from it: chaos/harness.py.
    port = endpoint[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        before = time.time()
        conn.request("GET", "/readyz")
        reply = conn.getresponse()
        reply.read()
        after = time.time()
        date = reply.getheader("Date")
    finally:
        conn.close()
    assert date, "no Date header"
    stamped = email.utils.parsedate_to_datetime(date).timestamp()
    assert int(before) - 1 <= stamped <= after, (before, date, after)


def test_half_sent_requests_are_closed_at_the_timeout_without_a_thread_each(endpoint):
    metrics, port, server, state = endpoint
    threads_before = threading.active_count()
    started = time.monotonic()
    socks = half_sent(port, CAP)
    try:
        wait_until(lambda: server.open_connections == CAP, 5, what="the server to hold the connections")
        assert threading.active_count() == threads_before  # no thread per connection
        assert not any(closed_by_server(s) for s in socks)  # open while their deadline runs
        wait_until(lambda: all(closed_by_server(s) for s in socks), TIMEOUT_S + 5,
                   what="the half-sent requests to be closed")
        assert time.monotonic() - started >= TIMEOUT_S * 0.9  # at the deadline, not before
        assert server.timed_out_connections == CAP and server.open_connections == 0
    finally:
        for s in socks:
            s.close()
    assert get(port, "/readyz")[0] == 200  # and it serves on


def test_a_connection_over_the_cap_is_closed_at_once(endpoint):
    metrics, port, server, state = endpoint
    held = half_sent(port, CAP)
    try:
        wait_until(lambda: server.open_connections == CAP, 5, what="the server to hold the connections")
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            # closed well before the held ones' deadline: refused on arrival
            wait_until(lambda: closed_by_server(extra), TIMEOUT_S / 2, interval_s=0.01,
                       what="the connection over the cap to be closed")
        finally:
            extra.close()
        assert server.refused_connections == 1
    finally:
        for s in held:
            s.close()
    wait_until(lambda: server.open_connections == 0, TIMEOUT_S + 5, what="the held connections to go")
    assert get(port, "/metrics")[0] == 200  # room again


def test_a_request_head_past_the_bound_is_refused(endpoint):
    metrics, port, server, state = endpoint
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * metrics_http.REQUEST_HEAD_BYTES_MAX + b"\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 431 ")


def test_a_slow_scrape_does_not_hold_back_other_deadlines(endpoint):
    """A reply is rendered off the loop: while one render takes longer than the deadline, the
    loop still closes a half-sent request at its own deadline."""
    metrics, port, server, state = endpoint
    release = threading.Event()
    original = server._render  # the render function the server was given

    def slow_render(path: str, accept: str) -> tuple[int, bytes, str]:
        release.wait(10)
        return original(path, accept)

    def slow_get() -> None:
        try:
            get(port, "/readyz")
        except OSError:
            pass  # cut off at its own deadline: expected

    server._render = slow_render
    slow = threading.Thread(target=slow_get, daemon=True)
    slow.start()
    try:
        wait_until(lambda: server.open_connections == 1, 5, what="the slow scrape to arrive")
        [sock] = half_sent(port, 1)
        wait_until(lambda: closed_by_server(sock), TIMEOUT_S + 5, what="the half-sent request to be closed")
        sock.close()
    finally:
        release.set()
        server._render = original
        slow.join(10)


def test_a_taken_port_is_an_error_naming_metrics_address(endpoint):
    metrics, port, server, state = endpoint
    with pytest.raises(OSError, match=rf"metrics_address 127.0.0.1:{port}"):
        Metrics().serve(f"127.0.0.1:{port}", lambda: True, connections_max=CAP, request_timeout_s=TIMEOUT_S)

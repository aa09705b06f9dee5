"""systemd ``Type=notify``: fencingd tells the service manager when it serves, and when it stops.

A datagram socket bound here plays systemd's part: it is what ``$NOTIFY_SOCKET`` names, as
systemd sets it for a ``Type=notify`` unit. The unit tests speak to it through the module; the
process tests start real ``fencingd serve`` members (and ``fencingd dev``) with it and read what
they send: READY=1 only once the member serves (a quorum and a read barrier, what its gRPC
health says), never before, and STOPPING=1 on SIGTERM.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from coordinator.server import sd_notify
from testsupport.grpc_cluster import write_toml
from testsupport.supervisor import DEFAULT_HOSTS, child_env, pick_ports

HOST = DEFAULT_HOSTS[0]
# Three fresh members elect a leader in 1-2 s; a loaded CI machine starting Python processes
# takes far longer. Every wait below ends as soon as its datagram arrives.
START_TIMEOUT_S = 60.0
# How long a member without a quorum is watched for a READY=1 it must not send: many
# health checks (health_check_interval_s) and election timeouts.
NO_QUORUM_WATCH_S = 4.0


def bound_socket(tmp_path, abstract: bool) -> tuple[socket.socket, str]:
    """A datagram socket as systemd binds it, and the $NOTIFY_SOCKET value that names it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"fencing-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        return sock, "@" + name
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    return sock, path


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def receive(sock: socket.socket, timeout_s: float) -> dict[str, str] | None:
    sock.settimeout(timeout_s)
    try:
        return fields(sock.recv(4096))
    except TimeoutError:
        return None


def receive_until(sock: socket.socket, key: str, timeout_s: float = START_TIMEOUT_S) -> list[dict[str, str]]:
    """Every notification up to and including the first that carries ``key``."""
    deadline = time.monotonic() + timeout_s
    got = []
    while time.monotonic() < deadline:
        message = receive(sock, max(0.01, deadline - time.monotonic()))
        if message is not None:
            got.append(message)
            if key in message:
                return got
    raise AssertionError(f"no {key} within {timeout_s} s; got {got}")


# -- the module ---------------------------------------------------------------------------------


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_the_notifier_sends_what_systemd_reads_and_takes_the_variable_out(tmp_path, abstract):
    sock, value = bound_socket(tmp_path, abstract)
    with sock:
        environ = {sd_notify.NOTIFY_SOCKET_ENV: value, "OTHER": "x"}
        notifier = sd_notify.Notifier.from_environment(environ)
        assert environ == {"OTHER": "x"}, "a process it starts must not notify for it"
        assert notifier.ready("serving\nnow")
        assert receive(sock, 5) == {"READY": "1", "STATUS": "serving now"}  # one line of status
        assert notifier.status("x" * 1000)
        assert receive(sock, 5) == {"STATUS": "x" * sd_notify.STATUS_CHARS_MAX}
        assert notifier.stopping()
        assert receive(sock, 5) == {"STOPPING": "1", "STATUS": "stopping"}


def test_without_systemd_or_with_a_socket_gone_nothing_is_sent_and_nothing_raises(tmp_path):
    quiet = sd_notify.Notifier.from_environment({})
    assert not quiet.enabled and not quiet.ready("serving")
    for value in ("vsock:2:1234", "relative/path", "@"):
        assert sd_notify.socket_address(value) is None
    gone = sd_notify.Notifier.from_environment({sd_notify.NOTIFY_SOCKET_ENV: str(tmp_path / "nobody")})
    assert gone.enabled and not gone.ready("serving") and not gone.stopping()


# -- real members ----------------------------------------------------------------------------------


def three_members(tmp_path) -> list[dict]:
    ports = [pick_ports((HOST,)) for _ in range(3)]
    members = [f"{HOST}:{raft}={HOST}:{api}" for raft, api in ports]
    return [{"data_dir": str(tmp_path / f"d{i}"), "raft_address": f"{HOST}:{raft}", "members": members,
             "cpu_affinity": "off", "log_level": "WARNING", "initial_cluster_state": "new"}
            for i, (raft, _) in enumerate(ports)]


def start(tmp_path, values: dict, i: int, notify_socket: str | None = None) -> subprocess.Popen:
    path = str(tmp_path / f"m{i}.toml")
    write_toml(path, values)
    extra = {sd_notify.NOTIFY_SOCKET_ENV: notify_socket} if notify_socket else {}
    env = {k: v for k, v in child_env(extra).items() if notify_socket or k != sd_notify.NOTIFY_SOCKET_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", path],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    guard = threading.Timer(3 * START_TIMEOUT_S, proc.kill)  # a hung member ends the test, not the run
    guard.daemon = True
    guard.start()
    return proc


def api_of(values: dict) -> str:
    return values["members"][[m.split("=")[0] for m in values["members"]].index(values["raft_address"])].split("=")[1]


def health(address: str) -> bool:
    from coordinator.server.health_probe import healthy as _healthy

    return _healthy(address, timeout_s=5)


def test_a_member_says_ready_only_once_it_serves_and_stopping_on_sigterm(tmp_path):
    configs = three_members(tmp_path)
    sock, value = bound_socket(tmp_path, abstract=False)
    procs = []
    try:
        procs.append(start(tmp_path, configs[0], 0, notify_socket=value))
        assert procs[0].stdout.readline().startswith("READY ")  # listening, not serving
        got = receive_until(sock, "STATUS")
        assert "READY" not in got[-1] and got[-1]["STATUS"].startswith("listening")
        # Alone among three it can never serve: no READY=1, whatever it is asked meanwhile.
        deadline = time.monotonic() + NO_QUORUM_WATCH_S
        while time.monotonic() < deadline:
            message = receive(sock, 0.5)
            assert message is None or "READY" not in message, message
            assert not health(api_of(configs[0]))
        procs += [start(tmp_path, configs[i], i) for i in (1, 2)]  # the others: no notify socket
        got = receive_until(sock, "READY")
        assert got[-1] == {"READY": "1", "STATUS": "serving"}
        assert health(api_of(configs[0])), "READY=1 came before the member serves"
        procs[0].send_signal(signal.SIGTERM)
        got = receive_until(sock, "STOPPING")
        assert got[-1]["STOPPING"] == "1"
        assert procs[0].wait(timeout=START_TIMEOUT_S) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(timeout=START_TIMEOUT_S)
        sock.close()


def test_fencingd_dev_says_ready_once_all_three_serve_and_its_members_do_not_speak_for_it(tmp_path):
    sock, value = bound_socket(tmp_path, abstract=True)
    raft_port, _ = pick_ports((HOST,))
    base = raft_port  # API base..base+2, Raft +100.., metrics +200..: all checked free by dev itself
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.server.fencingd", "dev", "--data-dir", str(tmp_path / "dev"),
         "--base-port", str(base), "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=child_env({sd_notify.NOTIFY_SOCKET_ENV: value}))
    guard = threading.Timer(3 * START_TIMEOUT_S, proc.kill)
    guard.daemon = True
    guard.start()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ENDPOINTS ") or "exited" in line or "not healthy" in line:
                break
        assert lines and lines[-1].startswith("ENDPOINTS "), "".join(lines)
        got = receive_until(sock, "READY", timeout_s=10)
        assert got[-1]["READY"] == "1" and got[-1]["STATUS"].startswith("3 members serving")
        endpoints = lines[-1].split()[1].split(",")
        assert all(health(e) for e in endpoints)
        proc.send_signal(signal.SIGTERM)
        got = receive_until(sock, "STOPPING")
        # Only dev itself spoke: its members had no NOTIFY_SOCKET (each would have said READY=1).
        assert [m for m in got if "READY" in m] == []
        assert proc.wait(timeout=START_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()

"""The process supervisor under every real-process cluster (testsupport/supervisor.py).

Cheap checks with tiny child processes: the one deadline poll, port picking, and the
lifecycle every flavour relies on (exit detection, kill of a paused member, reaping on close).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from testsupport.supervisor import (
    DEFAULT_HOSTS,
    REPO_ROOT,
    Member,
    MemberExited,
    Supervisor,
    child_env,
    pick_ports,
    port_free,
    wait_until,
)


def test_wait_until_returns_the_first_truthy_value():
    calls = []

    def third_time():
        calls.append(1)
        return "ready" if len(calls) >= 3 else None

    assert wait_until(third_time, 5, interval_s=0.001, what="the third call") == "ready"
    assert len(calls) == 3


def test_wait_until_timeout_names_what_and_the_last_error():
    def refused():
        raise ConnectionRefusedError("nobody home")

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 0\.2s waiting for the door.*nobody home") as caught:
        wait_until(refused, 0.2, interval_s=0.01, what="the door")
    assert 0.2 <= time.monotonic() - t0 < 2.0
    assert caught.value.what == "the door"  # as named, for a caller that compares rounds


def test_wait_until_tries_once_even_with_no_time():
    assert wait_until(lambda: 7, 0, what="anything") == 7


def test_wait_until_lets_bugs_and_exits_through_at_once():
    def exited():
        raise MemberExited("node 1 exited with 3")

    t0 = time.monotonic()
    with pytest.raises(MemberExited):
        wait_until(exited, 30, what="a dead member")
    with pytest.raises(KeyError):
        wait_until(lambda: {}["missing"], 30, what="a buggy predicate")
    assert time.monotonic() - t0 < 5.0


def test_pick_ports_gives_a_pair_free_on_every_host():
    port, next_port = pick_ports(DEFAULT_HOSTS)
    assert next_port == port + 1
    for host in DEFAULT_HOSTS:
        assert port_free(host, port) and port_free(host, next_port)


def test_pick_ports_steps_over_a_taken_port():
    with socket.create_server(("127.0.0.2", 0)) as taken:
        port = taken.getsockname()[1]
        assert not port_free("127.0.0.2", port)
        # A seed that lands on the taken port: the next candidate is chosen instead.
        picked, _ = pick_ports(("127.0.0.2",), seed=(port - 20000) % 30000)
        assert picked not in (port, port - 1)


def test_child_env_puts_the_repo_root_first_once():
    env = child_env({"EXTRA": "1"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == REPO_ROOT and parts.count(REPO_ROOT) == 1
    assert env["EXTRA"] == "1"


class Sleepers(Supervisor):
    """Members that sleep (or exit with ``code`` when it is set): the supervisor alone."""

    def __init__(self, base_dir: str, code: int | None = None):
        super().__init__([Member(i, "127.0.0.1", base_dir) for i in range(2)])
        self.code = code

    def command(self, node):
        body = f"raise SystemExit({self.code})" if self.code is not None else "import time; time.sleep(60)"
        return [sys.executable, "-c", body]

    def answers(self, node):
        return self.code is None  # exiting members never become ready


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_lifecycle_pause_kill_restart_and_close(tmp_path):
    with Sleepers(str(tmp_path)) as sup:
        sup.start_all(timeout_s=10)
        assert all(n.up for n in sup.nodes) and os.path.isdir(sup.nodes[0].data_dir)
        with pytest.raises(RuntimeError, match="already running"):
            sup.start(0)
        pid = sup.nodes[0].proc.pid
        sup.pause(0)
        wait_until(lambda: _state(pid) == "T", 5, interval_s=0.01, what="the member to stop")
        assert sup.live() == [sup.nodes[1]] and sup.pids[0] == pid
        sup.kill(0)  # a paused member dies without being resumed first
        assert not sup.nodes[0].alive and not sup.nodes[0].paused and sup.pids[0] is None
        sup.nodes[0].check_running()  # killed on purpose: not a crash
        sup.restart(0)
        assert sup.nodes[0].up and sup.nodes[0].proc.pid != pid
        procs = [n.proc for n in sup.nodes]
        sup.stop(1, timeout_s=10)  # SIGTERM: python's default handler ends the sleep
    assert all(p.poll() is not None for p in procs)


def test_close_reaps_adopted_and_paused_processes(tmp_path):
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Sleepers(str(tmp_path)) as sup:
            sup.start_all(timeout_s=10)
            sup.pause(1)
            sup.adopt(stray.pid)
            procs = [n.proc for n in sup.nodes]
        assert all(p.poll() is not None for p in procs)
        assert stray.wait(timeout=10) is not None
    finally:
        if stray.poll() is None:
            stray.kill()


def test_a_member_that_exits_by_itself_fails_the_wait_at_once(tmp_path):
    with Sleepers(str(tmp_path), code=3) as sup:
        t0 = time.monotonic()
        with pytest.raises(MemberExited, match=r"node \d exited with 3; see .*node\d\.log"):
            sup.start_all(timeout_s=30)
        assert time.monotonic() - t0 < 10

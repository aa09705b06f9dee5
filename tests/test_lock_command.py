"""``fencingctl lock -- CMD`` as a supervisor sees it, and lock waits that end on time.

On a real three-process cluster (testsupport.grpc_cluster) and real ``fencingctl``
processes: SIGTERM, SIGINT and SIGHUP to fencingctl reach CMD, which exits (its status is
fencingctl's) or is SIGKILLed after ``--grace``; CMD's pid is gone afterwards, whatever
killed fencingctl (SIGKILL included), and the lease is free for the next ``lock`` at once; a
lost lease stops CMD with one message; fencingctl's own outcomes are 124-127, never a code
CMD could have; no traceback on any path. Against ports nobody listens on: ``lock(timeout_s)``
(sync and asyncio) and ``--wait`` end within the wait plus one attempt timeout with
LockTimeout / exit 124.

Waits poll with a deadline (``wait_until``), never sleep. Bounds on elapsed time are
generous (a shared 2-core machine): they tell "within the wait plus an attempt" from the
old "the whole-call deadline, and then another".
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from coordinator.client import AsyncFencingClient, FencingClient, durations, lockcmd
from coordinator.client._defaults import ATTEMPT_TIMEOUT_S_DEFAULT
from coordinator.client.exceptions import LockTimeout
from testsupport.supervisor import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A grant, a CMD start (a Python interpreter) or a process's end on a busy machine.
STEP_S = 20.0
# What a fencingctl process costs before it does anything (interpreter, grpc import).
START_S = 4.0
# Slack on top of "wait + one attempt timeout" for scheduling on a shared machine.
SLACK_S = 2.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path_factory.mktemp("lock-command")), request)


def _endpoints(cluster) -> list[str]:
    return [n.api_address for n in cluster.nodes]


def _closed_endpoints(n: int = 3) -> list[str]:
    """Loopback addresses nobody listens on (bound, noted and closed again)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


def _ctl(eps: list[str], *argv: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", ",".join(eps), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **kwargs,
    )


class Running:
    """A ``fencingctl lock`` process whose stdout (CMD's) is read as it comes."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self._reader.start()

    def cmd_pid(self) -> int:
        """CMD's pid, once it has printed ``cmd: started pid N``."""
        def started():
            for line in list(self.lines):
                if line.startswith("cmd: started pid "):
                    return int(line.split()[3])
            if self.proc.poll() is not None:
                raise AssertionError(f"fencingctl exited {self.proc.returncode}: {self.proc.stderr.read()}")
            return None
        return wait_until(started, timeout_s=STEP_S, what="CMD to start")

    def finish(self) -> tuple[int, str, str]:
        self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        err = self.proc.stderr.read()
        print(f"--- fencingctl exit {self.proc.returncode} ---\n{''.join(self.lines)}{err}")
        assert "Traceback" not in err
        return self.proc.returncode, "".join(self.lines), err


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# CMD: reports each forwarded signal and exits as a process killed by it would be reported.
TRAP_SCRIPT = """
import os, signal, sys, time
def stop(signum, frame):
    print(f"cmd: got {signal.Signals(signum).name}", flush=True)
    sys.exit(128 + signum)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, stop)
print(f"cmd: started pid {os.getpid()}", flush=True)
while True:
    time.sleep(0.05)
"""

# CMD: ignores every signal it may ignore.
IGNORE_SCRIPT = """
import os, signal, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
print(f"cmd: started pid {os.getpid()}", flush=True)
while True:
    time.sleep(0.05)
"""


def _lock(eps: list[str], resource: str, script: str, *extra: str) -> Running:
    return Running(_ctl(eps, "lock", resource, "--ttl", "3s", *extra, "--", sys.executable, "-u", "-c", script))


def _assert_free_at_once(eps: list[str], resource: str) -> None:
    """The lease was released, not left to expire: a second lock gets it at once."""
    with FencingClient(eps) as client:
        assert not client.describe(resource).held
        sent = time.monotonic()
        lease = client.lock(resource, ttl_ms=3_000, timeout_s=2.0)
        assert time.monotonic() - sent < 2.0
        lease.release()


# -- arguments, help, durations (no cluster) --------------------------------------------------


def test_lock_help_shows_the_command_signals_and_exit_codes():
    proc = _ctl(_closed_endpoints(1), "lock", "--help")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith("usage: fencingctl lock RESOURCE") and "-- CMD [ARG...]" in out.splitlines()[0]
    for shown in ("--ttl D", "--wait D", "--grace D", "SIGTERM, SIGINT and SIGHUP", "124", "125", "126", "127",
                  "128+N"):
        assert shown in out, shown


@pytest.mark.parametrize("argv, says", [
    (["lock", "jobs/x", "--", ], "lock needs a command to run"),
    (["lock", "jobs/x"], "lock needs a command to run"),
    (["lock", "jobs/x", "--ttl", "10x", "--", "true"], "'10x' is not a duration"),
    (["lock", "jobs/x", "--ttl", "5s", "--ttl-ms", "5000", "--", "true"], "not both"),
    (["lock", "jobs/x", "--ttl", "50ms", "--", "true"], "is outside [100"),
    (["lock", "jobs/x", "--wait", "0", "--", "true"], "--wait must be in (0,"),
    (["lock", "jobs/x", "--no-such-flag", "--", "true"], "unrecognized arguments"),
])
def test_lock_usage_errors_exit_125_not_a_code_cmd_could_have(argv, says):
    proc = _ctl(_closed_endpoints(1), *argv)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == lockcmd.LockExit.FAILED == 125, err
    assert says in err and "Traceback" not in err


def test_durations_take_units_and_the_flags_own_unit_when_bare():
    assert durations.parse_s("10s", default_unit="ms") == 10.0
    assert durations.parse_s("500ms", default_unit="s") == 0.5
    assert durations.parse_s("1.5m", default_unit="s") == 90.0
    assert durations.parse_s("2h", default_unit="s") == 7200.0
    assert durations.parse_s("2", default_unit="s") == 2.0
    assert durations.parse_s("5000", default_unit="ms") == 5.0
    for bad in ("", "s", "-1s", "1e3", "10 sec", "inf", "nan", "1.s"):
        with pytest.raises(ValueError):
            durations.parse_s(bad, default_unit="s")


# -- deadlines against a cluster that is not there ---------------------------------------------


@pytest.fixture
def silent_endpoints():
    """Loopback addresses that accept TCP connections (the kernel's backlog) and never say
    a word: a member that is up but hung."""
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
    yield [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()


@pytest.mark.parametrize("dead", ["closed", "silent"])
def test_lock_timeout_against_a_dead_cluster_ends_within_wait_plus_one_attempt_with_lock_timeout(dead, request):
    eps = _closed_endpoints() if dead == "closed" else request.getfixturevalue("silent_endpoints")
    timeout_s = 1.0
    sent = time.monotonic()
    with FencingClient(eps) as client:
        with pytest.raises(LockTimeout) as raised:
            client.lock("jobs/dead", ttl_ms=5_000, timeout_s=timeout_s)
    elapsed = time.monotonic() - sent
    print(f"lock(timeout_s={timeout_s}) against {dead} ports: {elapsed:.2f} s: {raised.value}")
    assert elapsed < timeout_s + ATTEMPT_TIMEOUT_S_DEFAULT + SLACK_S
    message = str(raised.value)
    assert "Lock call(s) in" in message and "attempt(s) in" in message
    assert "attempt(s) in 10 s" not in message  # the real time, not the whole-call budget


def test_async_lock_timeout_against_closed_ports_ends_within_wait_plus_one_attempt():
    timeout_s = 1.0

    async def main() -> float:
        sent = time.monotonic()
        async with AsyncFencingClient(_closed_endpoints()) as client:
            with pytest.raises(LockTimeout):
                await client.lock("jobs/dead", ttl_ms=5_000, timeout_s=timeout_s)
        return time.monotonic() - sent

    elapsed = asyncio.run(main())
    assert elapsed < timeout_s + ATTEMPT_TIMEOUT_S_DEFAULT + SLACK_S


def test_fencingctl_lock_wait_against_closed_ports_exits_124_within_its_bound(tmp_path):
    marker = tmp_path / "ran"
    wait_s = 2.0
    sent = time.monotonic()
    proc = _ctl(_closed_endpoints(), "lock", "jobs/dead", "--wait", f"{wait_s:g}s", "--",
                "touch", str(marker))
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - sent
    print(f"fencingctl lock --wait {wait_s:g}s against closed ports: {elapsed:.2f} s, exit {proc.returncode}: {err}")
    assert proc.returncode == lockcmd.LockExit.WAIT_TIMED_OUT == 124, err
    assert elapsed < wait_s + ATTEMPT_TIMEOUT_S_DEFAULT + START_S + SLACK_S
    assert err.startswith("fencingctl: timeout: jobs/dead was not granted within 2 s") and "Traceback" not in err
    assert not marker.exists()  # CMD never ran


# -- CMD's status, and fencingctl's own outcomes ------------------------------------------------


def test_fencingctl_lock_runs_the_command_with_the_token_and_exits_with_its_status(cluster):
    eps = _endpoints(cluster)
    script = (
        "import os, sys; "
        "print(os.environ['FENCING_RESOURCE'], os.environ['FENCING_TOKEN'], "
        "repr(os.environ['FENCING_TOKEN_PROOF'])); sys.exit(7)"
    )
    proc = _ctl(eps, "lock", "lock/ctl", "--ttl", "3s", "--", sys.executable, "-c", script)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    resource, token, _proof = out.split(" ", 2)
    assert resource == "lock/ctl" and int(token) >= 1
    _assert_free_at_once(eps, "lock/ctl")


def test_fencingctl_lock_exits_127_for_a_missing_and_126_for_an_unexecutable_command(cluster, tmp_path):
    eps = _endpoints(cluster)
    proc = _ctl(eps, "lock", "lock/missing", "--", str(tmp_path / "no-such-command"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == lockcmd.LockExit.NOT_FOUND == 127, err
    assert "cannot run" in err and "Traceback" not in err
    _assert_free_at_once(eps, "lock/missing")

    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    proc = _ctl(eps, "lock", "lock/noexec", "--", str(script))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == lockcmd.LockExit.NOT_EXECUTABLE == 126, err
    _assert_free_at_once(eps, "lock/noexec")


def test_fencingctl_lock_wait_on_a_held_lease_exits_124_and_leaves_the_queue(cluster, tmp_path):
    eps = _endpoints(cluster)
    marker = tmp_path / "ran"
    with FencingClient(eps) as admin:
        held = admin.lock("lock/held", ttl_ms=60_000)
        proc = _ctl(eps, "lock", "lock/held", "--wait", "1s", "--", "touch", str(marker))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 124, err
        assert not marker.exists()
        wait_until(lambda: admin.describe("lock/held").waiters == 0, timeout_s=STEP_S, what="the waiter to leave")
        held.release()


# -- signals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_fencingctl_reaches_cmd_which_exits_then_the_lease_is_released(cluster, signum):
    eps = _endpoints(cluster)
    resource = f"lock/sig-{signum.name.lower()}"
    running = _lock(eps, resource, TRAP_SCRIPT)
    pid = running.cmd_pid()
    running.proc.send_signal(signum)
    code, out, err = running.finish()
    assert f"cmd: got {signum.name}" in out  # exactly the signal fencingctl got
    assert code == 128 + signum  # CMD's status, as the shell reports it
    assert f"{signum.name} passed on" in err and "SIGKILL" not in err.replace("SIGKILL in", "")
    assert _gone(pid)
    _assert_free_at_once(eps, resource)


def test_a_cmd_that_ignores_sigterm_is_sigkilled_after_the_grace_and_nothing_is_orphaned(cluster):
    eps = _endpoints(cluster)
    resource = "lock/sig-ignored"
    running = _lock(eps, resource, IGNORE_SCRIPT, "--grace", "500ms")
    pid = running.cmd_pid()
    sent = time.monotonic()
    running.proc.send_signal(signal.SIGTERM)
    code, _, err = running.finish()
    assert code == 128 + signal.SIGKILL
    assert "sending SIGKILL" in err
    assert time.monotonic() - sent >= 0.5  # the grace was given
    assert _gone(pid)
    _assert_free_at_once(eps, resource)


def test_sigkill_to_fencingctl_takes_cmd_with_it(cluster):
    eps = _endpoints(cluster)
    running = _lock(eps, "lock/sig-kill", IGNORE_SCRIPT)
    pid = running.cmd_pid()
    running.proc.kill()
    running.proc.wait(timeout=60)
    # The kernel's parent-death signal: CMD does not run on without a lease holder. (The
    # lease itself expires after its TTL: nobody is left to release it.)
    wait_until(lambda: _gone(pid), timeout_s=STEP_S, what="CMD to die with fencingctl")


def test_a_signal_while_waiting_for_the_lease_leaves_the_queue_and_never_runs_cmd(cluster, tmp_path):
    eps = _endpoints(cluster)
    marker = tmp_path / "ran"
    with FencingClient(eps) as admin:
        held = admin.lock("lock/sig-waiting", ttl_ms=60_000)
        proc = _ctl(eps, "lock", "lock/sig-waiting", "--", "touch", str(marker))
        wait_until(lambda: admin.describe("lock/sig-waiting").waiters == 1, timeout_s=STEP_S, what="fencingctl queued")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGINT, err
        assert "SIGINT while waiting" in err and "Traceback" not in err and "KeyboardInterrupt" not in err
        wait_until(
            lambda: admin.describe("lock/sig-waiting").waiters == 0, timeout_s=STEP_S, what="the waiter to leave"
        )
        assert not marker.exists()
        held.release()


def _at_a_terminal(eps: list[str], resource: str, script: str) -> tuple[int, int, Any]:
    """fencingctl lock run as from a shell at a terminal: a pty of its own, fencingctl's group
    in the foreground. (pid, the pty's master fd, read(until_s) -> all it printed so far)."""
    argv = [sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", ",".join(eps),
            "lock", resource, "--", sys.executable, "-u", "-c", script]
    pid, master = pty.fork()
    if pid == 0:  # the child: straight to exec (no Python-level work after fork)
        os.chdir(ROOT)
        os.execv(sys.executable, argv)
    seen = bytearray()

    def read(for_s: float) -> str:
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    seen.extend(os.read(master, 4096))
                except OSError:  # EIO: every process on the pty has exited
                    break
        return seen.decode(errors="replace")

    return pid, master, read


def _exit_of(pid: int, read) -> int:
    """fencingctl's exit code, read while draining the pty (a full pty blocks its writers)."""
    def ended():
        read(0.05)
        done, status = os.waitpid(pid, os.WNOHANG)
        return (os.waitstatus_to_exitcode(status),) if done else None  # a tuple: exit 0 is an answer
    try:
        (code,) = wait_until(ended, timeout_s=STEP_S, what="fencingctl to exit")
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)  # CMD follows it (the parent-death signal)
        os.waitpid(pid, 0)
        raise
    return code


# CMD reads a line from the terminal.
READ_SCRIPT = """
import os
print(f"cmd: started pid {os.getpid()}", flush=True)
print("cmd: read", input(), flush=True)
"""


def test_at_a_terminal_cmd_can_read_it_and_ctrl_c_reaches_cmd_once(cluster):
    eps = _endpoints(cluster)
    pid, master, read = _at_a_terminal(eps, "lock/tty-read", READ_SCRIPT)
    try:
        wait_until(lambda: "cmd: started" in read(0.05), timeout_s=STEP_S, what="CMD to start")
        os.write(master, b"typed\n")  # a background group reading here would be stopped
        code = _exit_of(pid, read)
        out = read(0.2)
        print(out)
        assert code == 0 and "cmd: read typed" in out
    finally:
        os.close(master)

    pid, master, read = _at_a_terminal(eps, "lock/tty-int", TRAP_SCRIPT)
    try:
        wait_until(lambda: "cmd: started" in read(0.05), timeout_s=STEP_S, what="CMD to start")
        os.write(master, b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground group
        code = _exit_of(pid, read)
        out = read(0.2)
        print(out)
        assert code == 128 + signal.SIGINT
        assert out.count("cmd: got SIGINT") == 1 and "Traceback" not in out
    finally:
        os.close(master)
    _assert_free_at_once(eps, "lock/tty-int")


# -- a lost lease --------------------------------------------------------------------------------


def _lose_by_force_release(eps: list[str], resource: str, script: str, *extra: str) -> tuple[int, str, str, int]:
    running = _lock(eps, resource, script, *extra)
    pid = running.cmd_pid()
    with FencingClient(eps) as admin:
        assert admin.describe(resource).held
        admin.force_release(resource)
        code, out, err = running.finish()
        assert not admin.describe(resource).held
    return code, out, err, pid


def test_a_lost_lease_sigterms_cmd_with_one_message(cluster):
    code, out, err, pid = _lose_by_force_release(_endpoints(cluster), "lock/fenced", TRAP_SCRIPT)
    assert code == 128 + signal.SIGTERM
    assert "cmd: got SIGTERM" in out
    lost_lines = [line for line in err.splitlines() if "lost" in line]
    assert len(lost_lines) == 1, err  # once, and with fencingctl's prefix
    assert (
        lost_lines[0].startswith("fencingctl: lock: the lease with token ")
        and "on lock/fenced is lost" in lost_lines[0]
    )
    assert "sending SIGTERM" in lost_lines[0]
    assert "SIGKILL" not in err
    assert _gone(pid)


def test_a_lost_lease_sigkills_a_cmd_that_ignores_sigterm_after_the_grace(cluster):
    code, _, err, pid = _lose_by_force_release(_endpoints(cluster), "lock/lost-kill9", IGNORE_SCRIPT, "--grace", "0.5")
    assert code == 128 + signal.SIGKILL
    assert "sending SIGKILL" in err
    assert _gone(pid)

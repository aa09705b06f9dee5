"""The one process supervisor behind every real-process cluster of the tests, benchmarks and chaos.

Owns: spawning member processes (the repo root first on their PYTHONPATH), their data dirs and
logs, start / stop / kill / pause / resume / power-loss, pids (spawned and adopted), port picking,
and the one deadline poll ``wait_until``. Must never: leave a process behind — ``close()`` sends
SIGCONT then SIGKILL to every pid it ever spawned or adopted, and a Supervisor is a context
manager so callers reach it from ``finally``; nor sleep where a condition can be polled.

What a member runs and how it says it is ready belongs to the flavours built on it:
testsupport/cluster.py (control socket), testsupport/grpc_cluster.py (``fencingd serve``) and
chaos/harness.py (fencingd under faults, with its network teardown).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import grpc

from coordinator.raft.journal import cut_to_synced_length

# The one free-port check: fencingd dev uses it before it starts members.
from coordinator.server.fencingd import port_free

DEFAULT_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A process that ignores SIGKILL for this long is stuck in the kernel; say so rather than hang.
REAP_TIMEOUT_S = 10.0


class MemberExited(RuntimeError):
    """A member process ended without being stopped or killed: no poll can bring it back."""


# What a predicate may raise while the thing it waits for is not there yet: a refused or
# reset connection, a control-protocol error, a gRPC status. Anything else is a bug in the
# predicate and propagates at once, as does MemberExited.
_NOT_YET = (OSError, RuntimeError, grpc.RpcError)


class WaitTimeout(TimeoutError):
    """``wait_until``'s deadline passed; ``what`` is what it waited for, as the caller named it."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


def wait_until(predicate, timeout_s: float, *, interval_s: float = 0.05, what: str = "condition"):
    """Call ``predicate`` until it returns a truthy value, and return that value.

    It is called at least once, and once more at the deadline; between calls it sleeps
    ``interval_s``. Raises WaitTimeout (a TimeoutError) naming ``what`` (and the last error the predicate raised)
    when the deadline passes.
    """
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except MemberExited:
            raise
        except _NOT_YET as exc:
            last_exc = exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"timed out after {timeout_s:.1f}s waiting for {what}"
                              + (f" (last error: {last_exc!r})" if last_exc else ""), what)
        time.sleep(min(interval_s, remaining))


def pick_ports(hosts=DEFAULT_HOSTS, seed: int | None = None) -> tuple[int, int]:
    """A pair of consecutive ports free on every host (the same numbers on each).

    The start depends on the pid and the clock, so tests running side by side rarely
    try the same ports; ``seed`` fixes it.
    """
    base = seed if seed is not None else os.getpid() * 7919 + time.monotonic_ns()
    for attempt in range(300):
        port = 20000 + (base + attempt * 97) % 30000
        if all(port_free(h, port) and port_free(h, port + 1) for h in hosts):
            return port, port + 1
    raise RuntimeError(f"no free port pair found on {', '.join(hosts)}")


def child_env(extra: dict | None = None) -> dict:
    """The environment for a child process: ``testsupport`` (and ``bench``, ``chaos``) are not
    installed, so the repo root goes first on PYTHONPATH whatever the caller's working directory."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != REPO_ROOT]
    return {**os.environ, **(extra or {}), "PYTHONPATH": os.pathsep.join([REPO_ROOT, *parts])}


def reap(procs, pids=()) -> None:
    """SIGCONT then SIGKILL every live process and pid, then wait for the processes.

    Never raises: it runs from teardown paths that must always finish. (SIGKILL alone ends a
    stopped process on Linux; the SIGCONT costs nothing and leaves no process stopped if the
    SIGKILL is refused.)
    """
    pids = (*pids, *(proc.pid for proc in procs if proc.poll() is None))
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in procs:
        try:
            proc.wait(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass


class Member:
    """One member process: where its files are and whether it runs. Flavours add addresses and
    clients, and drop their connections in ``disconnect``."""

    def __init__(self, index: int, host: str, base_dir: str):
        self.index = index
        self.host = host
        self.data_dir = os.path.join(base_dir, f"node{index}")
        self.log_path = os.path.join(base_dir, f"node{index}.log")
        self.proc: subprocess.Popen | None = None
        self.paused = False
        # Set by stop/kill, cleared by a start: an exit we caused is not a crash.
        self.stopped = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.index}, {self.host})"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def up(self) -> bool:
        """Running and not paused: it can answer."""
        return self.alive and not self.paused

    def check_running(self) -> None:
        """Raise MemberExited if the process ended although nobody stopped or killed it."""
        if self.proc is not None and not self.stopped and self.proc.poll() is not None:
            raise MemberExited(f"node {self.index} exited with {self.proc.returncode}; see {self.log_path}")

    def disconnect(self) -> None:
        """Close connections to the process (it died, or a new one replaces it)."""


class Supervisor:
    """Members on ``hosts`` (one per host), each run by ``command(member)``.

    Subclasses give ``command`` and ``answers`` (the member's own readiness check).
    """

    def __init__(self, nodes: list[Member]):
        self.nodes = nodes
        self._spawned: list[subprocess.Popen] = []
        self._adopted: list[int] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what a flavour provides ---------------------------------------------------------

    def command(self, node: Member) -> list[str]:
        raise NotImplementedError

    def env(self, node: Member) -> dict:
        return child_env()

    def answers(self, node: Member) -> bool:
        """The member is ready to be used (called in a poll; may raise a not-yet error)."""
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------

    def spawn(self, i: int) -> None:
        """Start member ``i``, its output appended to its log; does not wait for it."""
        node = self.nodes[i]
        if node.alive:
            raise RuntimeError(f"node {i} is already running")
        node.disconnect()
        os.makedirs(node.data_dir, exist_ok=True)
        with open(node.log_path, "ab") as log:
            node.proc = subprocess.Popen(self.command(node), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env(node))
        node.paused = False
        node.stopped = False
        self._spawned.append(node.proc)

    def start(self, i: int) -> None:
        self.spawn(i)

    def start_all(self, timeout_s: float = 30.0) -> None:
        """Start every member that is not running, then wait until each answers."""
        for node in self.nodes:
            if not node.alive:
                self.spawn(node.index)
        self.wait_answering(None, timeout_s)

    def wait_answering(self, indexes=None, timeout_s: float = 30.0) -> None:
        """Poll until every member of ``indexes`` (default: all) ``answers``; fails at once
        with MemberExited if one of them ends meanwhile."""
        indexes = [n.index for n in self.nodes] if indexes is None else list(indexes)

        def all_answer():
            for i in indexes:
                self.nodes[i].check_running()
            return all(self.answers(self.nodes[i]) for i in indexes)

        wait_until(all_answer, timeout_s, what=f"nodes {indexes} to answer")

    def stop(self, i: int, timeout_s: float = 15.0) -> int:
        """SIGTERM (after SIGCONT if paused: a stopped process cannot shut down) and wait at
        most ``timeout_s`` for the exit; returns the exit code."""
        node = self.nodes[i]
        node.stopped = True
        if node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
            node.paused = False
        node.proc.send_signal(signal.SIGTERM)
        code = node.proc.wait(timeout=timeout_s)
        node.disconnect()
        return code

    def kill(self, i: int) -> None:
        """SIGKILL and reap. No SIGCONT first even when paused: SIGKILL ends a stopped process,
        and letting it run for a moment could sync bytes a power-loss test means to lose."""
        node = self.nodes[i]
        if node.proc is not None:
            node.stopped = True
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=REAP_TIMEOUT_S)
        node.paused = False
        node.disconnect()

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start(i)

    def power_loss(self, i: int) -> tuple[int, int]:
        """kill -9, then drop every journal byte written after the last sync (as a power cut
        loses the page cache); returns (journal length before, after)."""
        self.kill(i)
        return cut_to_synced_length(self.nodes[i].data_dir)

    def pause(self, i: int) -> None:
        node = self.nodes[i]
        os.kill(node.proc.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, i: int) -> None:
        node = self.nodes[i]
        if node.alive and node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.paused = False

    def adopt(self, pid: int) -> None:
        """A pid (a client process, a helper) that ``close`` must also SIGCONT + SIGKILL."""
        self._adopted.append(pid)

    def close(self) -> None:
        """Every spawned and adopted process gone, every connection closed. Never raises."""
        reap(self._spawned, self._adopted)
        for node in self.nodes:
            node.disconnect()
            node.paused = False

    # -- observation ----------------------------------------------------------------------

    @property
    def pids(self) -> dict[int, int | None]:
        return {n.index: (n.proc.pid if n.alive else None) for n in self.nodes}

    def live(self) -> list[Member]:
        """The members that can answer: running and not paused."""
        return [n for n in self.nodes if n.up]

    def logs(self, tail: int = 4000) -> str:
        """The last ``tail`` characters of every member's log, for a failure report."""
        out = []
        for node in self.nodes:
            try:
                with open(node.log_path, encoding="utf-8", errors="replace") as f:
                    out.append(f"--- node {node.index} ---\n" + f.read()[-tail:])
            except OSError:
                pass
        return "\n".join(out)

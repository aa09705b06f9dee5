"""A cluster of real node processes on 127.0.0.2, .3, .4: start, kill, pause, power-cut.

Owns: spawned processes, their data dirs and logs. Must never: leave a process
behind — ``close()`` sends SIGCONT then SIGKILL to every pid it ever spawned, and
the class is a context manager so tests call it from ``finally``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from coordinator.raft.journal import cut_to_synced_length
from testsupport.control import ControlClient

DEFAULT_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
# Control calls on a healthy node answer in milliseconds; 3 s covers a loaded
# 2-core machine and still notices a paused process quickly.
CONTROL_TIMEOUT_S = 3.0


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(extra: dict | None = None) -> dict:
    """The environment for a child process: ``testsupport`` is not installed, so the repo
    root goes first on PYTHONPATH whatever the caller's working directory."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != REPO_ROOT]
    return {**os.environ, **(extra or {}), "PYTHONPATH": os.pathsep.join([REPO_ROOT, *parts])}


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(hosts=DEFAULT_HOSTS) -> tuple[int, int]:
    """A (raft_port, control_port) pair free on every host."""
    seed = os.getpid() * 7919 + time.monotonic_ns()
    for attempt in range(200):
        port = 20000 + (seed + attempt * 97) % 30000
        if all(_port_free(h, port) and _port_free(h, port + 1) for h in hosts):
            return port, port + 1
    raise RuntimeError("no free port pair found on the test hosts")


def reap(procs, pids=()) -> None:
    """SIGCONT then SIGKILL every live process (a paused one cannot die otherwise), then wait.

    Never raises: it runs from teardown paths that must always finish.
    """
    for proc in procs:
        if proc.poll() is None:
            pids = (*pids, proc.pid)
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ConnectionError, RuntimeError) as exc:
            last_exc = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}" + (f" (last error: {last_exc!r})" if last_exc else ""))


@dataclass
class NodeHandle:
    index: int
    host: str
    raft_port: int
    control_port: int
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None
    paused: bool = False
    client: ControlClient | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def call(self, request: dict, timeout_s: float = CONTROL_TIMEOUT_S) -> dict:
        if self.client is None:
            self.client = ControlClient(self.host, self.control_port, timeout_s)
        return self.client.call(request, timeout_s)


class ProcessCluster:
    def __init__(
        self,
        base_dir: str,
        *,
        hosts=DEFAULT_HOSTS,
        fixes: str = "all",
        track_synced: bool = False,
        compaction_entries: int = 5_000,
        raft_min_timeout_s: float = 0.5,
        raft_max_timeout_s: float = 1.0,
        leader_fallback_timeout_s: float = 1.0,
        extra_args: tuple[str, ...] = (),
    ):
        self.base_dir = base_dir
        raft_port, control_port = pick_ports(hosts)
        self.nodes = [
            NodeHandle(i, h, raft_port, control_port, os.path.join(base_dir, f"node{i}"), os.path.join(base_dir, f"node{i}.log"))
            for i, h in enumerate(hosts)
        ]
        self._args = [
            "--fixes", fixes,
            "--compaction-entries", str(compaction_entries),
            "--raft-min-timeout", str(raft_min_timeout_s),
            "--raft-max-timeout", str(raft_max_timeout_s),
            "--leader-fallback-timeout", str(leader_fallback_timeout_s),
            *(["--track-synced"] if track_synced else []),
            *extra_args,
        ]
        self._spawned: list[subprocess.Popen] = []

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start_all(self, timeout_s: float = 20.0) -> None:
        for node in self.nodes:
            self.start(node.index, wait=False)
        for node in self.nodes:
            self.wait_ping(node.index, timeout_s)

    def start(self, i: int, wait: bool = True, timeout_s: float = 20.0) -> None:
        node = self.nodes[i]
        assert not node.alive, f"node {i} already running"
        os.makedirs(node.data_dir, exist_ok=True)
        peers = ",".join(n.address for n in self.nodes if n.index != i)
        cmd = [
            sys.executable, "-m", "testsupport.node_process",
            "--self", node.address, "--peers", peers, "--data-dir", node.data_dir,
            "--control-port", str(node.control_port), *self._args,
        ]
        log = open(node.log_path, "ab")
        node.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=child_env())
        log.close()
        node.paused = False
        self._spawned.append(node.proc)
        if node.client is not None:
            node.client.close()
            node.client = None
        if wait:
            self.wait_ping(i, timeout_s)

    def wait_ping(self, i: int, timeout_s: float = 20.0) -> None:
        node = self.nodes[i]

        def ping():
            if not node.alive:
                raise RuntimeError(f"node {i} exited with {node.proc.returncode}; see {node.log_path}")
            return node.call({"op": "ping"}, timeout_s=1.0).get("pong")

        wait_until(ping, timeout_s, what=f"node {i} to answer ping")

    def kill(self, i: int) -> None:
        """kill -9 and reap."""
        node = self.nodes[i]
        if node.proc is None:
            return
        if node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.proc.kill()
        node.proc.wait(timeout=10)
        node.paused = False
        if node.client is not None:
            node.client.close()
            node.client = None

    def power_loss(self, i: int) -> tuple[int, int]:
        """kill -9, then drop every journal byte written after the last sync."""
        self.kill(i)
        return cut_to_synced_length(self.nodes[i].data_dir)

    def pause(self, i: int) -> None:
        node = self.nodes[i]
        os.kill(node.proc.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, i: int) -> None:
        node = self.nodes[i]
        os.kill(node.proc.pid, signal.SIGCONT)
        node.paused = False

    def close(self) -> None:
        reap(self._spawned)
        for node in self.nodes:
            if node.client is not None:
                node.client.close()
                node.client = None

    # -- observation --------------------------------------------------------------

    def live(self) -> list[NodeHandle]:
        return [n for n in self.nodes if n.alive and not n.paused]

    def statuses(self) -> dict[int, dict]:
        out = {}
        for node in self.live():
            try:
                out[node.index] = node.call({"op": "status"})
            except (OSError, ConnectionError, RuntimeError):
                continue
        return out

    def leader_index(self) -> int | None:
        """The live node that says it leads and has a quorum, if exactly one term agrees."""
        leaders = [(s["term"], i) for i, s in self.statuses().items() if s["is_leader"] and s["has_quorum"]]
        if not leaders:
            return None
        return max(leaders)[1]

    def wait_for_leader(self, timeout_s: float = 15.0, exclude: int | None = None) -> int:
        def find():
            i = self.leader_index()
            return None if i is None or i == exclude else (i,)

        return wait_until(find, timeout_s, what="a leader")[0]

    def digests(self) -> dict[int, dict]:
        return {n.index: n.call({"op": "digest"}) for n in self.live()}

    def wait_converged(self, timeout_s: float = 30.0) -> dict[int, dict]:
        """Every live node applied the same index and holds the same state digest."""

        def same():
            d = self.digests()
            if len(d) == len(self.live()) and len({(v["index"], v["digest"]) for v in d.values()}) == 1:
                return d
            return None

        return wait_until(same, timeout_s, interval_s=0.1, what="replica digests to agree")

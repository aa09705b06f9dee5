"""A chaos cluster: three real ``fencingd serve`` processes on 127.0.0.2, .3, .4.

Owns: config files, data dirs, logs and pids of the spawned members, start / stop / restart /
pause, leader discovery through ``Cluster.Status``, and ``teardown()`` which ALWAYS runs (the
class is a context manager): delete the nft table ``inet chaos``, remove our NFQUEUE rules, SIGCONT
then SIGKILL every pid it ever spawned (and every extra pid registered with ``adopt``).

Each member binds its gRPC server and its Raft sockets (listening and outgoing) to its own
address, so nft rules keyed on ``ip saddr/daddr`` see node-to-node traffic as such. Clients
connect from 127.0.0.1 and are never matched by node-to-node rules: a partitioned node stays
reachable by clients (exercising NO_LEADER and forwarding paths).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.raft.journal import cut_to_synced_length
from testsupport.cluster import reap
from testsupport.grpc_cluster import GrpcNode

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
# Overridable so two runs on one machine (a soak beside CI) never delete each other's
# rules; the default is what tests and docs name.
NFT_TABLE = os.environ.get("FENCING_CHAOS_NFT_TABLE", "chaos")
# Chaos timing: elections in 0.5-1 s keep failover short; an isolated leader steps down after 1 s.
CHAOS_SETTINGS = {
    "raft_min_timeout_s": 0.5,
    "raft_max_timeout_s": 1.0,
    "leader_fallback_timeout_s": 1.0,
    "health_check_interval_s": 0.3,
    "propose_timeout_max_s": 3.0,
    "grpc_threads": 32,
    "grpc_max_concurrent_rpcs": 256,
    "track_synced_for_tests": True,
    "log_level": "INFO",
}
SERVING = health_pb2.HealthCheckResponse.SERVING


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, RuntimeError, grpc.RpcError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}" + (f" ({last!r})" if last else ""))
        time.sleep(interval_s)


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(hosts=HOSTS, seed: int | None = None) -> tuple[int, int]:
    """(raft_port, api_port) free on every host; the same numbers on every host."""
    base = seed if seed is not None else os.getpid() * 7919 + time.monotonic_ns()
    for attempt in range(300):
        port = 20000 + (base + attempt * 97) % 30000
        if all(_port_free(h, port) and _port_free(h, port + 1) for h in hosts):
            return port, port + 1
    raise RuntimeError("no free port pair on the chaos hosts")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_quiet(cmd: list[str], check: bool = False, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


def network_teardown() -> None:
    """Remove every network rule a chaos run may have left: idempotent, never raises."""
    try:
        run_quiet(["nft", "delete", "table", "inet", NFT_TABLE])
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from chaos.nfqueue_delay import remove_rules

        remove_rules()
    except Exception:  # noqa: BLE001 - teardown must go on
        pass


class Node(GrpcNode):
    """A member as the chaos runner sees it: GrpcNode plus quick reconnects and probes."""

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.raft_address})"

    @property
    def up(self) -> bool:
        return self.alive and not self.paused

    @property
    def channel(self) -> grpc.Channel:
        # Reconnect within half a second after a heal: failover figures measure the
        # cluster, not gRPC's default reconnect backoff (up to two minutes).
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                self.api_address,
                options=[("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)],
            )
        return self._channel

    def status(self, timeout_s: float = 1.5) -> pb.StatusResponse:
        return pb_grpc.ClusterStub(self.channel).Status(pb.StatusRequest(), timeout=timeout_s)

    def snapshot(self, timeout_s: float = 5.0, local: bool = False) -> pb.SnapshotResponse:
        return pb_grpc.AdminStub(self.channel).Snapshot(pb.SnapshotRequest(local=local), timeout=timeout_s)

    def healthy(self, timeout_s: float = 1.0) -> bool:
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return reply.status == SERVING


class ChaosCluster:
    """Three members; ``with ChaosCluster(dir) as c: c.start_all()``; teardown always runs."""

    def __init__(self, base_dir: str, *, hosts=HOSTS, settings: dict | None = None):
        self.base_dir = os.path.abspath(base_dir)
        os.makedirs(self.base_dir, exist_ok=True)
        self.raft_port, self.api_port = pick_ports(hosts)
        self.nodes = [Node(i, h, self.raft_port, self.api_port, self.base_dir) for i, h in enumerate(hosts)]
        self.settings = {**CHAOS_SETTINGS, **(settings or {})}
        self._spawned: list[subprocess.Popen] = []
        self._adopted: list[int] = []
        members = [f"{n.raft_address}={n.api_address}" for n in self.nodes]
        for node in self.nodes:
            values = {"data_dir": node.data_dir, "raft_address": node.raft_address, "members": members, **self.settings}
            with open(node.config_path, "w", encoding="utf-8") as f:
                for key, value in values.items():
                    f.write(f"{key} = {_toml(value)}\n")

    # -- context -------------------------------------------------------------------

    def __enter__(self) -> "ChaosCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    @property
    def endpoints(self) -> list[str]:
        return [n.api_address for n in self.nodes]

    @property
    def pids(self) -> dict[int, int | None]:
        return {n.index: (n.proc.pid if n.alive else None) for n in self.nodes}

    def node_by_raft(self, raft: str) -> Node | None:
        return next((n for n in self.nodes if n.raft_address == raft), None)

    def adopt(self, pid: int) -> None:
        """A pid (client process) that teardown must also SIGCONT + SIGKILL."""
        self._adopted.append(pid)

    # -- lifecycle --------------------------------------------------------------------

    def start(self, i: int) -> None:
        node = self.nodes[i]
        if node.alive:
            raise RuntimeError(f"node {i} is already running")
        node.close_channel()
        with open(node.log_path, "ab") as log:
            node.proc = subprocess.Popen(
                [sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", node.config_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        node.paused = False
        self._spawned.append(node.proc)

    def start_all(self, timeout_s: float = 60.0) -> int:
        for node in self.nodes:
            if not node.alive:
                self.start(node.index)
        return self.wait_ready(timeout_s)

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node.proc is None or not node.alive:
            node.paused = False
            return
        if node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.proc.kill()
        node.proc.wait(timeout=10)
        node.paused = False
        node.close_channel()

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start(i)

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
        if node.alive and node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.paused = False

    def teardown(self) -> None:
        """Network rules away, then SIGCONT + SIGKILL every spawned / adopted pid. Never raises."""
        network_teardown()
        reap(self._spawned, self._adopted)
        for node in self.nodes:
            node.close_channel()
            node.paused = False

    # -- observation ----------------------------------------------------------------------

    def statuses(self, timeout_s: float = 1.5, nodes=None) -> dict[int, pb.StatusResponse]:
        """Status of every live, unpaused node that answers (in parallel)."""
        nodes = [n for n in (nodes or self.nodes) if n.up]
        out: dict[int, pb.StatusResponse] = {}
        if not nodes:
            return out
        with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
            futures = {pool.submit(n.status, timeout_s): n for n in nodes}
            for fut, node in futures.items():
                try:
                    out[node.index] = fut.result()
                except grpc.RpcError:
                    pass
        return out

    def leader_index(self) -> int | None:
        """The leader named by the highest-term answering node, if that leader is up."""
        st = self.statuses()
        best = None
        for s in st.values():
            if s.leader and (best is None or s.term > best.term):
                best = s
        if best is None:
            return None
        node = self.node_by_raft(best.leader)
        return node.index if node is not None and node.up else None

    def wait_leader(self, timeout_s: float = 20.0, exclude: int | None = None) -> int:
        def find():
            i = self.leader_index()
            return None if i is None or i == exclude else (i,)

        return wait_until(find, timeout_s, what="a leader")[0]

    def wait_ready(self, timeout_s: float = 60.0) -> int:
        """Every up member answers Status (a barrier through the log) and names the same leader."""

        def agreed():
            for n in self.nodes:
                if n.proc is not None and not n.alive:
                    raise RuntimeError(f"node {n.index} exited with {n.proc.returncode}; see {n.log_path}")
            up = [n for n in self.nodes if n.up]
            st = self.statuses(nodes=up)
            if len(st) != len(up):
                return None
            leaders = {s.leader for s in st.values()}
            if len(leaders) != 1 or "" in leaders:
                return None
            node = self.node_by_raft(leaders.pop())
            return (node.index,) if node is not None else None

        return wait_until(agreed, timeout_s, interval_s=0.2, what="members to agree on a leader")[0]

    def most_up_to_date_follower(self, leader: int) -> int:
        st = self.statuses()
        followers = [i for i in range(len(self.nodes)) if i != leader]
        return max(followers, key=lambda i: (st[i].applied_index, st[i].commit_index) if i in st else (-1, -1))

    def logs(self, tail: int = 3000) -> str:
        out = []
        for node in self.nodes:
            try:
                with open(node.log_path, encoding="utf-8", errors="replace") as f:
                    out.append(f"--- node {node.index} ---\n" + f.read()[-tail:])
            except OSError:
                pass
        return "\n".join(out)

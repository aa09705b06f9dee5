"""Real ``fencingd serve`` processes on 127.0.0.2, .3, .4 for the gRPC tests.

Owns: config files, spawned processes, their logs, gRPC channels. Must never leave a
process behind: ``close()`` sends SIGCONT then SIGKILL to every pid it spawned, and the
class is a context manager. Every wait is a poll with a deadline (``wait_until``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import open_channel
from testsupport.cluster import DEFAULT_HOSTS, pick_ports, reap, wait_until

# Test timing: elections in 0.5-1 s (production 1-2 s) keep failover tests short; the
# health re-check every 0.2 s lets a test see NOT_SERVING within a second.
TEST_SETTINGS = {
    "raft_min_timeout_s": 0.5,
    "raft_max_timeout_s": 1.0,
    "leader_fallback_timeout_s": 1.0,
    "health_check_interval_s": 0.2,
    "log_level": "INFO",
}
# A healthy member answers in milliseconds; a proposal may ride out an election (~1 s).
RPC_TIMEOUT_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class GrpcNode:
    def __init__(self, index: int, host: str, raft_port: int, api_port: int, base_dir: str,
                 credentials: grpc.ChannelCredentials | None = None):
        self.index = index
        self.credentials = credentials  # TLS clusters: how the tests' channels connect
        self.host = host
        self.raft_address = f"{host}:{raft_port}"
        self.api_address = f"{host}:{api_port}"
        self.data_dir = os.path.join(base_dir, f"node{index}")
        self.config_path = os.path.join(base_dir, f"node{index}.toml")
        self.log_path = os.path.join(base_dir, f"node{index}.log")
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self._channel: grpc.Channel | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = open_channel(self.api_address, self.credentials)
        return self._channel

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    @property
    def lease(self) -> pb_grpc.LeaseStub:
        return pb_grpc.LeaseStub(self.channel)

    @property
    def store(self) -> pb_grpc.FencedStoreStub:
        return pb_grpc.FencedStoreStub(self.channel)

    @property
    def cluster(self) -> pb_grpc.ClusterStub:
        return pb_grpc.ClusterStub(self.channel)

    @property
    def admin(self) -> pb_grpc.AdminStub:
        return pb_grpc.AdminStub(self.channel)

    @property
    def health(self) -> health_pb2_grpc.HealthStub:
        return health_pb2_grpc.HealthStub(self.channel)

    def health_status(self, service: str = "", timeout_s: float = 1.0) -> int | None:
        try:
            return self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s).status
        except grpc.RpcError:
            return None


class GrpcCluster:
    """Three ``fencingd serve`` members; per-node config overrides via ``node_settings``."""

    def __init__(self, base_dir: str, *, hosts=DEFAULT_HOSTS, settings: dict | None = None,
                 node_settings: dict[int, dict] | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        self.base_dir = base_dir
        os.makedirs(base_dir, exist_ok=True)
        raft_port, api_port = pick_ports(hosts)
        self.nodes = [GrpcNode(i, h, raft_port, api_port, base_dir, credentials) for i, h in enumerate(hosts)]
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.node_settings = node_settings or {}
        self._spawned: list[subprocess.Popen] = []
        members = [f"{n.raft_address}={n.api_address}" for n in self.nodes]
        for node in self.nodes:
            values = {
                "data_dir": node.data_dir,
                "raft_address": node.raft_address,
                "members": members,
                **self.settings,
                **self.node_settings.get(node.index, {}),
            }
            with open(node.config_path, "w", encoding="utf-8") as f:
                for key, value in values.items():
                    f.write(f"{key} = {_toml_value(value)}\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- lifecycle -------------------------------------------------------------------

    def start(self, i: int) -> None:
        node = self.nodes[i]
        assert not node.alive, f"node {i} is already running"
        with open(node.log_path, "ab") as log:
            node.proc = subprocess.Popen(
                [sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", node.config_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        node.paused = False
        self._spawned.append(node.proc)

    def start_all(self, timeout_s: float = 30.0) -> None:
        for node in self.nodes:
            self.start(node.index)
        self.wait_serving(timeout_s=timeout_s)

    def wait_serving(self, indexes=None, timeout_s: float = 30.0) -> None:
        indexes = [n.index for n in self.nodes] if indexes is None else list(indexes)

        def all_serving():
            for i in indexes:
                node = self.nodes[i]
                if not node.alive:
                    raise AssertionError(f"node {i} exited with {node.proc.returncode}; see {node.log_path}")
            return all(self.nodes[i].health_status() == SERVING for i in indexes)

        wait_until(all_serving, timeout_s, interval_s=0.1, what=f"nodes {indexes} to be SERVING")

    def wait_ready(self, timeout_s: float = 30.0) -> int:
        """Every live member SERVING and answering Status (a read through the log) with the
        same leader; returns the leader's index. Use after a disruption: health alone can be
        SERVING for a moment while an election is still running."""
        live = [n.index for n in self.nodes if n.alive and not n.paused]
        self.wait_serving(live, timeout_s)

        def agreed():
            leaders = set()
            for i in live:
                try:
                    leaders.add(self.nodes[i].cluster.Status(pb.StatusRequest(), timeout=2.0).leader)
                except grpc.RpcError:
                    return None
            if len(leaders) == 1:
                return (self.index_of_raft(leaders.pop()),)
            return None

        return wait_until(agreed, timeout_s, interval_s=0.1, what="members to agree on a leader")[0]

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node.proc is None:
            return
        if node.paused:
            os.kill(node.proc.pid, signal.SIGCONT)
        node.proc.kill()
        node.proc.wait(timeout=10)
        node.paused = False
        node.close_channel()

    def terminate(self, i: int, timeout_s: float = 15.0) -> int:
        node = self.nodes[i]
        node.proc.send_signal(signal.SIGTERM)
        code = node.proc.wait(timeout=timeout_s)
        node.close_channel()
        return code

    def pause(self, i: int) -> None:
        os.kill(self.nodes[i].proc.pid, signal.SIGSTOP)
        self.nodes[i].paused = True

    def resume(self, i: int) -> None:
        os.kill(self.nodes[i].proc.pid, signal.SIGCONT)
        self.nodes[i].paused = False

    def close(self) -> None:
        reap(self._spawned)
        for node in self.nodes:
            node.close_channel()

    # -- observation -------------------------------------------------------------------

    def index_of_raft(self, raft_address: str) -> int | None:
        for node in self.nodes:
            if node.raft_address == raft_address:
                return node.index
        return None

    def leader_index(self, timeout_s: float = 15.0) -> int:
        """The leader, as reported by a live member's Status (a read through the log)."""

        def find():
            for node in self.nodes:
                if not node.alive or node.paused:
                    continue
                try:
                    status = node.cluster.Status(pb.StatusRequest(), timeout=2.0)
                except grpc.RpcError:
                    continue
                i = self.index_of_raft(status.leader)
                if i is not None and self.nodes[i].alive and not self.nodes[i].paused:
                    return (i,)
            return None

        return wait_until(find, timeout_s, interval_s=0.1, what="a leader")[0]

    def logs(self) -> str:
        out = []
        for node in self.nodes:
            try:
                with open(node.log_path, encoding="utf-8", errors="replace") as f:
                    out.append(f"--- node {node.index} ---\n" + f.read()[-4000:])
            except OSError:
                pass
        return "\n".join(out)


def running_cluster(base_dir: str, request, **kwargs):
    """Generator for a pytest fixture: a started GrpcCluster, its logs printed if starting
    it or any test of the session failed, every process gone afterwards."""
    with GrpcCluster(base_dir, **kwargs) as cluster:
        try:
            cluster.start_all()
        except BaseException:
            print(cluster.logs())
            raise
        yield cluster
        if request.session.testsfailed:
            print(cluster.logs())


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    return wait_until(predicate, timeout_s, interval_s=interval_s, what=what)


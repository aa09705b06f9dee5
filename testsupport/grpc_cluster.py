"""Real ``fencingd serve`` processes on 127.0.0.2, .3, .4 for the gRPC tests and benchmarks.

Owns: the fencingd flavour of the supervisor — config files, the command line, SERVING as the
readiness check, gRPC channels, and observation through Cluster.Status (statuses, leader,
readiness after a disruption). Must never: spawn, stop or reap a process itself —
testsupport/supervisor.py does, and ``close()`` leaves none behind. Every wait is a poll with a
deadline (``wait_until``).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import open_channel
from testsupport.supervisor import DEFAULT_HOSTS, Member, Supervisor, pick_ports, wait_until

# Test timing: elections in 0.5-1 s (production 1-2 s) keep failover tests short; the
# health re-check every 0.2 s lets a test see NOT_SERVING within a second. Every test cluster
# starts empty as a brand-new cluster, as the deploy manifests do (the default, "existing",
# would leave its members waiting to be added).
TEST_SETTINGS = {
    "initial_cluster_state": "new",
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


def write_toml(path: str, values: dict) -> None:
    """A flat TOML file of ``values`` (strings, numbers, booleans, lists of those)."""
    with open(path, "w", encoding="utf-8") as f:
        for key, value in values.items():
            f.write(f"{key} = {_toml_value(value)}\n")


class GrpcNode(Member):
    """One ``fencingd serve`` member: its addresses, config file and (lazily) a channel to it."""

    def __init__(self, index: int, host: str, raft_port: int, api_port: int, base_dir: str,
                 credentials: grpc.ChannelCredentials | None = None):
        super().__init__(index, host, base_dir)
        self.credentials = credentials  # TLS clusters: how the tests' channels connect
        self.raft_address = f"{host}:{raft_port}"
        self.api_address = f"{host}:{api_port}"
        self.config_path = os.path.join(base_dir, f"node{index}.toml")
        self._channel: grpc.Channel | None = None

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = open_channel(self.api_address, self.credentials)
        return self._channel

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def disconnect(self) -> None:
        self.close_channel()

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

    def status(self, timeout_s: float = 1.5) -> pb.StatusResponse:
        """Cluster.Status of this member: a read through the log applied here."""
        return self.cluster.Status(pb.StatusRequest(), timeout=timeout_s)


class GrpcCluster(Supervisor):
    """Three ``fencingd serve`` members; per-node config overrides via ``node_settings``."""

    node_class = GrpcNode
    default_settings = TEST_SETTINGS

    def __init__(self, base_dir: str, *, hosts=DEFAULT_HOSTS, settings: dict | None = None,
                 node_settings: dict[int, dict] | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        # Absolute: the config files name the data dirs, whatever the members' working directory.
        self.base_dir = os.path.abspath(base_dir)
        os.makedirs(self.base_dir, exist_ok=True)
        self.raft_port, self.api_port = pick_ports(hosts)
        super().__init__([self.node_class(i, h, self.raft_port, self.api_port, self.base_dir, credentials)
                          for i, h in enumerate(hosts)])
        self.settings = {**self.default_settings, **(settings or {})}
        self.node_settings = node_settings or {}
        self.credentials = credentials
        members = [f"{n.raft_address}={n.api_address}" for n in self.nodes]
        for node in self.nodes:
            write_toml(node.config_path, {
                "data_dir": node.data_dir,
                "raft_address": node.raft_address,
                "members": members,
                **self.settings,
                **self.node_settings.get(node.index, {}),
            })

    def add_node(self, host: str, member_id: str, peers) -> GrpcNode:
        """A new member on ``host`` (same ports), not started: its config file names it and the
        members ``peers`` (indexes) as the ones to contact, under ``member_id`` and without
        bootstrapping, as an operator sets up a member about to be added (RAFT.md)."""
        node = self.node_class(len(self.nodes), host, self.raft_port, self.api_port, self.base_dir, self.credentials)
        members = [f"{n.raft_address}={n.api_address}" for n in (node, *(self.nodes[i] for i in peers))]
        write_toml(node.config_path, {
            "data_dir": node.data_dir, "raft_address": node.raft_address, "members": members,
            **self.settings, "member_id": member_id, "initial_cluster_state": "existing",
        })
        self.nodes.append(node)
        return node

    # -- the flavour -------------------------------------------------------------------

    def command(self, node: GrpcNode) -> list[str]:
        return [sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", node.config_path]

    def answers(self, node: GrpcNode) -> bool:
        return node.health_status() == SERVING

    @property
    def endpoints(self) -> list[str]:
        return [n.api_address for n in self.nodes]

    # -- readiness -----------------------------------------------------------------------

    def wait_serving(self, indexes=None, timeout_s: float = 30.0) -> None:
        self.wait_answering(indexes, timeout_s)

    def wait_ready(self, timeout_s: float = 30.0) -> int:
        """Every running, unpaused member SERVING and answering Status (a read through the log)
        with the same leader; returns the leader's index. Use after a disruption: health alone
        can be SERVING for a moment while an election is still running."""
        up = [n for n in self.nodes if n.up]
        self.wait_serving([n.index for n in up], timeout_s)

        def agreed():
            for n in self.nodes:
                n.check_running()
            st = self.statuses(nodes=up)
            leaders = {s.leader for s in st.values()}
            if len(st) != len(up) or len(leaders) != 1 or "" in leaders:
                return None
            node = self.node_by_raft(leaders.pop())
            return (node.index,) if node is not None else None

        return wait_until(agreed, timeout_s, interval_s=0.1, what="members to agree on a leader")[0]

    # -- observation -------------------------------------------------------------------

    def node_by_raft(self, raft_address: str) -> GrpcNode | None:
        return next((n for n in self.nodes if n.raft_address == raft_address), None)

    def index_of_raft(self, raft_address: str) -> int | None:
        node = self.node_by_raft(raft_address)
        return None if node is None else node.index

    def statuses(self, timeout_s: float = 1.5, nodes=None) -> dict[int, pb.StatusResponse]:
        """Status of every running, unpaused member that answers, asked in parallel."""
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

    def named_leader(self, exclude: int | None = None) -> int | None:
        """The leader named by the highest-term answering member, if it is up (and not ``exclude``)."""
        best = None
        for s in self.statuses().values():
            if s.leader and (best is None or s.term > best.term):
                best = s
        node = None if best is None else self.node_by_raft(best.leader)
        return node.index if node is not None and node.up and node.index != exclude else None

    def leader_index(self, timeout_s: float = 15.0, exclude: int | None = None) -> int:
        """Poll until a member names an up leader (other than ``exclude``); its index."""

        def find():
            i = self.named_leader(exclude)
            return None if i is None else (i,)

        return wait_until(find, timeout_s, interval_s=0.1, what="a leader")[0]


def metered_cluster(base_dir: str, request, **kwargs):
    """``running_cluster`` with every member's Prometheus endpoint on; the cluster's
    ``metrics_urls`` lists them by member index."""
    metrics_port, _ = pick_ports(DEFAULT_HOSTS)
    node_settings = {i: {"metrics_address": f"{h}:{metrics_port}"} for i, h in enumerate(DEFAULT_HOSTS)}
    for cluster in running_cluster(base_dir, request, node_settings=node_settings, **kwargs):
        cluster.metrics_urls = [f"http://{h}:{metrics_port}/metrics" for h in DEFAULT_HOSTS]
        yield cluster


def metric_value(url: str, series: str, default: float | None = None) -> float:
    """The value of one series (``name_total`` or ``name_total{label="x"}``) at a member's
    Prometheus endpoint; ``default`` for a series not there (a labelled counter not counted
    yet), else AssertionError."""
    with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
    if default is None:
        raise AssertionError(f"no {series} series at {url}")
    return default


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


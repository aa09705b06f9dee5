"""Three real etcd members on 127.0.0.2/.3/.4 for the side-by-side benchmark (bench.compare).

Owns: the etcd flavour of testsupport's supervisor — finding the ``etcd`` binary (or saying
how to install it), its command line, readiness and leadership through etcd's own
Maintenance.Status, and gRPC channels to the members. Must never: spawn, stop or reap a
process itself (testsupport/supervisor.py does, and ``close()`` leaves none behind), nor
change etcd's defaults that bear on speed or safety (heartbeat, election timeout, fsync of
its WAL): the comparison is against etcd as Debian ships it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import grpc

from bench.etcdpb import rpc_pb2 as epb
from bench.etcdpb import rpc_pb2_grpc as epb_grpc
from testsupport.supervisor import DEFAULT_HOSTS, Member, Supervisor, pick_ports, wait_until

INSTALL_HINT = "etcd not found: install it with `apt-get install -y etcd-server etcd-client` (Debian 12 ships 3.4)"
STATUS_TIMEOUT_S = 1.0


def etcd_binary() -> str:
    """Path of the ``etcd`` server binary; RuntimeError saying how to install it when missing."""
    path = shutil.which("etcd")
    if path is None:
        raise RuntimeError(INSTALL_HINT)
    return path


def etcd_version() -> str:
    """First line of ``etcd --version`` ("etcd Version: 3.4.23"), or "?"."""
    try:
        out = subprocess.run([etcd_binary(), "--version"], capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.splitlines()[0].split(":", 1)[-1].strip()
    except (OSError, RuntimeError, IndexError, subprocess.SubprocessError):
        return "?"


class EtcdNode(Member):
    """One etcd member: its client and peer URLs and (lazily) a channel to its client port."""

    def __init__(self, index: int, host: str, client_port: int, peer_port: int, base_dir: str):
        super().__init__(index, host, base_dir)
        self.name = f"n{index}"
        self.api_address = f"{host}:{client_port}"
        self.peer_url = f"http://{host}:{peer_port}"
        self._channel: grpc.Channel | None = None

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.api_address)
        return self._channel

    def disconnect(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> epb.StatusResponse:
        return epb_grpc.MaintenanceStub(self.channel).Status(epb.StatusRequest(), timeout=timeout_s)


class EtcdCluster(Supervisor):
    """Three etcd members with etcd's default timings (heartbeat 100 ms, election 1000 ms)."""

    def __init__(self, base_dir: str, *, hosts=DEFAULT_HOSTS):
        self.binary = etcd_binary()
        self.base_dir = os.path.abspath(base_dir)
        os.makedirs(self.base_dir, exist_ok=True)
        client_port, peer_port = pick_ports(hosts)
        super().__init__([EtcdNode(i, h, client_port, peer_port, self.base_dir) for i, h in enumerate(hosts)])
        self.initial_cluster = ",".join(f"{n.name}={n.peer_url}" for n in self.nodes)
        # A fresh token per cluster: members of an earlier run that are still around (they
        # should not be) cannot join this one.
        self.token = f"bench-{os.getpid()}-{client_port}"

    def command(self, node: EtcdNode) -> list[str]:
        # A restarted member finds its WAL in data_dir and ignores the --initial-* flags.
        return [
            self.binary, "--name", node.name, "--data-dir", node.data_dir,
            "--listen-client-urls", f"http://{node.api_address}",
            "--advertise-client-urls", f"http://{node.api_address}",
            "--listen-peer-urls", node.peer_url, "--initial-advertise-peer-urls", node.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-token", self.token,
            "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn",
        ]

    def answers(self, node: EtcdNode) -> bool:
        """Status answers and names a leader: the member can serve requests."""
        return node.status().leader != 0

    def leader_index(self, timeout_s: float = 15.0, exclude: int | None = None) -> int:
        """Poll until an up member (other than ``exclude``) says it is the leader; its index."""

        def find():
            for node in self.live():
                if node.index == exclude:
                    continue
                try:
                    st = node.status()
                except grpc.RpcError:
                    continue
                if st.leader and st.leader == st.header.member_id:
                    return (node.index,)
            return None

        return wait_until(find, timeout_s, interval_s=0.05, what="an etcd leader")[0]

    def wait_ready(self, timeout_s: float = 30.0) -> int:
        """Every up member answers Status and all name the same leader; returns its index."""
        up = self.live()
        self.wait_answering([n.index for n in up], timeout_s)

        def agreed():
            leaders = set()
            for node in up:
                node.check_running()
                leaders.add(node.status().leader)
            return len(leaders) == 1 and 0 not in leaders

        wait_until(agreed, timeout_s, interval_s=0.05, what="etcd members to agree on a leader")
        return self.leader_index(timeout_s)

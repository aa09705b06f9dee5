"""A chaos cluster: three real ``fencingd serve`` processes on 127.0.0.2, .3, .4.

Owns: what is chaos-specific on top of testsupport's GrpcCluster — the chaos settings, members
that reconnect fast after a heal, Admin.Snapshot probes, the follower choice, and a ``close()``
that ALWAYS first deletes the nft table ``inet chaos`` and our NFQUEUE rules, then (through the
supervisor) SIGCONTs and SIGKILLs every pid it ever spawned or adopted. Must never: spawn or reap
processes itself, nor poll other than with testsupport.supervisor.wait_until.

Each member binds its gRPC server and its Raft sockets (listening and outgoing) to its own
address, so nft rules keyed on ``ip saddr/daddr`` see node-to-node traffic as such. Clients
connect from 127.0.0.1 and are never matched by node-to-node rules: a partitioned node stays
reachable by clients (exercising NO_LEADER and forwarding paths).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import email.utils
import hashlib
import http.client
import os
import subprocess
import time

import grpc

from chaos import netns_claim
from chaos.small_fs import SmallFs
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from testsupport.grpc_cluster import GrpcCluster, GrpcNode
from testsupport.supervisor import DEFAULT_HOSTS, child_env, pick_ports, wait_until

HOSTS = DEFAULT_HOSTS
# Overridable so two runs on one machine (a soak beside CI) never delete each other's
# rules; the default is what tests and docs name.
NFT_TABLE = os.environ.get("FENCING_CHAOS_NFT_TABLE", "chaos")
# Chaos timing: elections in 0.5-1 s keep failover short; an isolated leader steps down after 1 s.
CHAOS_SETTINGS = {
    "initial_cluster_state": "new",  # three empty members start a new cluster (default: wait to be added)
    "raft_min_timeout_s": 0.5,
    "raft_max_timeout_s": 1.0,
    "leader_fallback_timeout_s": 1.0,
    "health_check_interval_s": 0.3,
    "propose_timeout_max_s": 3.0,
    "grpc_threads": 32,
    "grpc_max_concurrent_rpcs": 256,
    "track_synced_for_tests": True,
    # Snapshot (and compact) every 20 s instead of every 5 min: a run then has snapshot files,
    # compactions and snapshot installs to lagging members under its faults, and the torn power
    # loss finds a snapshot to tear an update of.
    "log_compaction_min_time_s": 20.0,
    "log_level": "INFO",
}


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
    """A member as the chaos runner sees it: GrpcNode plus quick reconnects and snapshots."""

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.raft_address})"

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

    def snapshot(self, timeout_s: float = 5.0, local: bool = False) -> pb.SnapshotResponse:
        """The member's snapshot, whole, through SnapshotStream: the unary Snapshot refuses a
        state above 4 MiB, which a full dedup table alone reaches (100,000 entries, ~4.7 MB),
        and the run's final comparison of replicas then found nothing to compare. The bytes
        are checked against the size and sha256 the stream's first message names."""
        chunks = pb_grpc.AdminStub(self.channel).SnapshotStream(pb.SnapshotRequest(local=local), timeout=timeout_s)
        first = None
        parts = []
        for chunk in chunks:
            first = first or chunk
            parts.append(chunk.data)
        if first is None:
            raise RuntimeError(f"{self.api_address}: SnapshotStream sent nothing")
        data = b"".join(parts)
        if len(data) != first.size or hashlib.sha256(data).digest() != first.sha256:
            raise RuntimeError(f"{self.api_address}: SnapshotStream bytes differ from the size and sha256 it named")
        return pb.SnapshotResponse(header=first.header, data=data, epoch=first.epoch, index=first.index)


def local_snapshots_at_one_index(nodes, timeout_s: float, min_index: int = 0) -> tuple[list, int]:
    """Every member's local snapshot, taken side by side until all name one applied index
    (at least ``min_index``), and the number of rounds that took. A follower applies the
    leader's last entry only when a later message carries the commit index, so one round
    can find the leader an entry ahead; comparing replicas' bytes means nothing until the
    indices agree. Raises TimeoutError when they never do."""
    rounds = 0

    def one_round():
        nonlocal rounds
        rounds += 1
        with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
            snaps = list(pool.map(lambda n: n.snapshot(5.0, True), nodes))
        indices = {s.index for s in snaps}
        return snaps if len(indices) == 1 and min(indices) >= min_index else None

    snaps = wait_until(one_round, timeout_s, interval_s=0.2, what="local snapshots at one applied index")
    return snaps, rounds


# Steps a member's wall clock from a file (time.time and time_ns; see that file for why not
# libfaketime, which slowed a chaos member's every write ~20-fold).
CLOCK_STEP_SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "testsupport", "clock_step")


class ChaosCluster(GrpcCluster):
    """Three members; ``with ChaosCluster(dir) as c: c.start_all()``; teardown always runs.

    Members start with testsupport/clock_step's wall-clock shim (wall clock only; monotonic
    real) unless ``FENCING_CHAOS_CLOCK_STEP`` is ``0``, so the clock_step fault can step a
    member's wall clock at run time by rewriting ``nodeN.wall`` (seen within 10 ms).
    Every member serves /readyz on ``metrics_port``: its answer's HTTP ``Date`` comes from the
    member's own wall clock, so ``wall_clock_offset_s`` shows whether a step took effect.

    With ``small_fs_bytes``, each member's data dir is on a loop-mounted ext4 of that size of
    its own (``chaos.small_fs``; ``nodeN.img`` mounted on ``nodeN.fs``, data dir
    ``nodeN.fs/data``), for the whole run, so the disk_full fault can fill the filesystem of
    whichever member leads when it strikes; logs stay beside, on the run's own disk, so a full
    disk never loses a member's last words. ``close()`` unmounts them (lazily) after every
    process is gone."""

    node_class = Node
    default_settings = CHAOS_SETTINGS

    def __init__(self, base_dir: str, small_fs_bytes: int | None = None, **kwargs) -> None:
        # First: its teardown deletes the namespace's chaos rules whole (chaos.netns_claim).
        netns_claim.claim()
        self._netns_claimed = True
        try:
            self._init(base_dir, small_fs_bytes, **kwargs)
        except BaseException:
            self._release_netns()
            raise

    def _init(self, base_dir: str, small_fs_bytes: int | None, **kwargs) -> None:
        hosts = kwargs.get("hosts", HOSTS)
        self.metrics_port, _ = pick_ports(hosts)
        self.small_fs: dict[int, SmallFs] = {}
        if small_fs_bytes:
            self._mount_small_fs(os.path.abspath(base_dir), len(hosts), small_fs_bytes)
        extra = kwargs.pop("node_settings", None) or {}
        kwargs["node_settings"] = {i: {"metrics_address": f"{h}:{self.metrics_port}",
                                       **({"data_dir": self.small_fs[i].data_dir} if i in self.small_fs else {}),
                                       **extra.get(i, {})}
                                   for i, h in enumerate(hosts)}
        super().__init__(base_dir, **kwargs)
        for i, fs in self.small_fs.items():
            self.nodes[i].data_dir = fs.data_dir
        self.clock_steppable = os.environ.get("FENCING_CHAOS_CLOCK_STEP") != "0"
        if self.clock_steppable:
            for node in self.nodes:
                self.step_wall_clock(node.index, 0)

    def _mount_small_fs(self, base: str, count: int, size_bytes: int) -> None:
        os.makedirs(base, exist_ok=True)
        atexit.register(self.unmount_small_fs)  # a runner that dies by an exception still unmounts
        try:
            for i in range(count):
                self.small_fs[i] = SmallFs(os.path.join(base, f"node{i}.img"), os.path.join(base, f"node{i}.fs"),
                                           size_bytes)
                self.small_fs[i].mount()
        except BaseException:
            self.unmount_small_fs()
            raise

    def wall_offset_path(self, i: int) -> str:
        return os.path.join(self.base_dir, f"node{i}.wall")

    def step_wall_clock(self, i: int, seconds: int) -> None:
        """Member ``i``'s wall clock reads ``seconds`` off real time from now on."""
        path = self.wall_offset_path(i)
        with open(path + ".tmp", "w", encoding="ascii") as f:
            f.write(f"{seconds:+d}\n")
        os.replace(path + ".tmp", path)  # never half a file to read

    def wall_clock_offset_s(self, i: int, timeout_s: float = 2.0) -> float:
        """Member ``i``'s wall clock minus ours, in seconds, read from the ``Date`` of its
        /readyz answer (formatted from the member's ``time.time()``). Whole seconds, truncated:
        good to about -1.1..+0.1 s, plenty to tell a step of minutes from none."""
        node = self.nodes[i]
        conn = http.client.HTTPConnection(node.host, self.metrics_port, timeout=timeout_s)
        try:
            sent = time.time()
            conn.request("GET", "/readyz")
            reply = conn.getresponse()
            reply.read()
            answered = time.time()
            date = reply.getheader("Date")
        finally:
            conn.close()
        if not date:
            raise RuntimeError(f"member {i}'s /readyz answer has no Date header")
        return email.utils.parsedate_to_datetime(date).timestamp() - (sent + answered) / 2

    def raft_term(self, i: int, timeout_s: float = 2.0) -> int:
        """Member ``i``'s current Raft term as it holds it in memory, from its /metrics: a
        local read (no barrier through the log), so it answers during an election too."""
        return int(self.metric(i, "fencing_raft_term", timeout_s))

    def metric(self, i: int, name: str, timeout_s: float = 2.0) -> float:
        """The value of the unlabelled series ``name`` on member ``i``'s /metrics."""
        node = self.nodes[i]
        conn = http.client.HTTPConnection(node.host, self.metrics_port, timeout=timeout_s)
        try:
            conn.request("GET", "/metrics")
            reply = conn.getresponse()
            body = reply.read().decode("utf-8", "replace")
        finally:
            conn.close()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise RuntimeError(f"member {i}'s /metrics has no {name}")

    def env(self, node) -> dict:
        if not self.clock_steppable:
            return super().env(node)
        env = child_env({"FENCING_TEST_WALL_OFFSET_FILE": self.wall_offset_path(node.index)})
        env["PYTHONPATH"] = CLOCK_STEP_SITE + os.pathsep + env["PYTHONPATH"]
        return env

    def start_all(self, timeout_s: float = 60.0) -> int:
        """Start every member not running; the leader's index once all agree on one."""
        super().start_all(timeout_s)
        return self.wait_ready(timeout_s)

    def close(self) -> None:
        """Network rules away, then every spawned / adopted pid gone, then the small
        filesystems unmounted, then the network namespace's claim given back. Never raises."""
        network_teardown()
        super().close()
        self.unmount_small_fs()
        self._release_netns()

    def _release_netns(self) -> None:
        if self._netns_claimed:  # once, however often close is called
            self._netns_claimed = False
            netns_claim.release()

    def unmount_small_fs(self) -> None:
        """Idempotent, never raises: a filler left behind goes with its filesystem."""
        for fs in self.small_fs.values():
            fs.umount()

    def wait_leader(self, timeout_s: float = 20.0, exclude: int | None = None) -> int:
        return self.leader_index(timeout_s, exclude)

    def most_up_to_date_follower(self, leader: int) -> int:
        st = self.statuses()
        followers = [i for i in range(len(self.nodes)) if i != leader]
        return max(followers, key=lambda i: (st[i].applied_index, st[i].commit_index) if i in st else (-1, -1))

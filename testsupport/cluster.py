"""A cluster of node processes driven over a control socket, on 127.0.0.2, .3, .4.

Owns: the control-socket flavour of the supervisor — the node command line (by default
``testsupport.node_process``; the benchmarks pass their own module), the ping readiness check,
and observation through control calls (statuses, leader, digests). Must never: spawn, stop or
reap a process itself — testsupport/supervisor.py does, and ``close()`` leaves none behind.
"""

from __future__ import annotations

import sys

from testsupport.control import ControlClient
from testsupport.supervisor import DEFAULT_HOSTS, Member, Supervisor, child_env, pick_ports, wait_until

__all__ = ["CONTROL_TIMEOUT_S", "DEFAULT_HOSTS", "NodeHandle", "ProcessCluster", "wait_until"]

# Control calls on a healthy node answer in milliseconds; 3 s covers a loaded
# 2-core machine and still notices a paused process quickly.
CONTROL_TIMEOUT_S = 3.0
NODE_MODULE = "testsupport.node_process"


class NodeHandle(Member):
    """One node process and its control connection (for one thread at a time)."""

    def __init__(self, index: int, host: str, raft_port: int, control_port: int, base_dir: str):
        super().__init__(index, host, base_dir)
        self.raft_port = raft_port
        self.control_port = control_port
        self.client: ControlClient | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    def call(self, request: dict, timeout_s: float = CONTROL_TIMEOUT_S) -> dict:
        if self.client is None:
            self.client = ControlClient(self.host, self.control_port, timeout_s)
        return self.client.call(request, timeout_s)

    def disconnect(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class ProcessCluster(Supervisor):
    """Nodes running ``python -m <module>`` with the node_process command line; ``env`` adds
    variables to their environment."""

    def __init__(
        self,
        base_dir: str,
        *,
        hosts=DEFAULT_HOSTS,
        module: str = NODE_MODULE,
        env: dict | None = None,
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
        super().__init__([NodeHandle(i, h, raft_port, control_port, base_dir) for i, h in enumerate(hosts)])
        self._module = module
        self._env = env
        self._args = [
            "--fixes", fixes,
            "--compaction-entries", str(compaction_entries),
            "--raft-min-timeout", str(raft_min_timeout_s),
            "--raft-max-timeout", str(raft_max_timeout_s),
            "--leader-fallback-timeout", str(leader_fallback_timeout_s),
            *(["--track-synced"] if track_synced else []),
            *extra_args,
        ]

    # -- the flavour ---------------------------------------------------------------

    def command(self, node: NodeHandle) -> list[str]:
        peers = ",".join(n.address for n in self.nodes if n.index != node.index)
        return [
            sys.executable, "-m", self._module,
            "--self", node.address, "--peers", peers, "--data-dir", node.data_dir,
            "--control-port", str(node.control_port), *self._args,
        ]

    def env(self, node: NodeHandle) -> dict:
        return child_env(self._env)

    def answers(self, node: NodeHandle) -> bool:
        return bool(node.call({"op": "ping"}, timeout_s=1.0).get("pong"))

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, i: int, wait: bool = True, timeout_s: float = 20.0) -> None:
        self.spawn(i)
        if wait:
            self.wait_ping(i, timeout_s)

    def wait_ping(self, i: int, timeout_s: float = 20.0) -> None:
        self.wait_answering([i], timeout_s)

    # -- observation --------------------------------------------------------------

    def statuses(self) -> dict[int, dict]:
        out = {}
        for node in self.live():
            try:
                out[node.index] = node.call({"op": "status"})
            except (OSError, RuntimeError):
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

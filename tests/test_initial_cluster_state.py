"""``initial_cluster_state`` on real ``fencingd serve`` processes: bootstrapping is explicit.

Three empty members started with the default, "existing", never form a cluster: each says it
waits to be added, and none is SERVING through a window of several election timeouts. The
same three, restarted on the same data dirs with "new" (what the deploy manifests set), form
one (coordinator/raft/RAFT.md "Member identity": a new cluster needs every initial member).
"""

from __future__ import annotations

import time
import tomllib

from testsupport.grpc_cluster import SERVING, GrpcCluster, write_toml
from testsupport.supervisor import wait_until

# What a member with no configuration that may not bootstrap logs (raft/member_gate.py), once
# at start and then every RAFT_NOT_A_MEMBER_LOG_INTERVAL_MS (5 s).
WAITING_LINE = "has no cluster configuration and may not bootstrap one"
# How long the three "existing" members get to (wrongly) form a cluster once all answer
# health: 8 s is 8 election timeouts at the test settings (0.5-1 s), and a "new" cluster of
# these three is SERVING in about 2 s on this machine.
NO_CLUSTER_WINDOW_S = 8.0
# Starting three interpreters and binding, on a loaded machine.
START_TIMEOUT_S = 30.0


def _logged(node, text: str) -> bool:
    try:
        with open(node.log_path, encoding="utf-8", errors="replace") as f:
            return text in f.read()
    except FileNotFoundError:
        return False


def _set_everywhere(cluster: GrpcCluster, key: str, value) -> None:
    for node in cluster.nodes:
        with open(node.config_path, "rb") as f:
            values = tomllib.load(f)
        write_toml(node.config_path, {**values, key: value})


def test_empty_members_form_a_cluster_only_with_initial_cluster_state_new(tmp_path):
    with GrpcCluster(str(tmp_path / "c"), settings={"initial_cluster_state": "existing"}) as cluster:
        for node in cluster.nodes:
            cluster.spawn(node.index)

        def all_answer_health():
            for node in cluster.nodes:
                node.check_running()
            return all(n.health_status(timeout_s=0.5) is not None for n in cluster.nodes)

        wait_until(all_answer_health, START_TIMEOUT_S, what="every member's API to answer health")
        deadline = time.monotonic() + NO_CLUSTER_WINDOW_S
        polls = 0
        while time.monotonic() < deadline:  # every poll must see no member SERVING
            serving = [n.index for n in cluster.nodes if n.health_status(timeout_s=0.5) == SERVING]
            assert not serving, f"members {serving} serve with initial_cluster_state = existing:\n{cluster.logs()}"
            for node in cluster.nodes:
                node.check_running()
            polls += 1
            time.sleep(0.2)
        assert polls >= 10, "the window was too short to poll"
        # Not serving because each waits to be added, as designed (not for some other reason).
        assert all(_logged(n, WAITING_LINE) for n in cluster.nodes), cluster.logs()
        assert not any(_logged(n, "bootstrapped cluster") for n in cluster.nodes), cluster.logs()

        for node in cluster.nodes:
            cluster.stop(node.index)
        _set_everywhere(cluster, "initial_cluster_state", "new")
        cluster.start_all(timeout_s=START_TIMEOUT_S)
        leader = cluster.wait_ready(timeout_s=START_TIMEOUT_S)
        assert _logged(cluster.nodes[leader], "bootstrapped cluster"), cluster.logs()

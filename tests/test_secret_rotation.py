"""The peer secret rotated on running members, with SIGHUP, while the cluster serves.

Three real ``fencingd serve`` members, each with its own ``raft_secret_file`` holding OLD. The
procedure of SECURITY.md ("What SIGHUP reloads"), one member at a time, a SIGHUP after each
file is written:
  1. OLD, NEW  -- NEW accepted everywhere, OLD still sent;
  2. NEW, OLD  -- NEW sent;
  3. NEW       -- OLD refused.
A client acquires and writes all along. The cluster must serve throughout: every operation
succeeds within its deadline, and the term never changes (no member lost the leader, so no
quorum was lost). Each step is seen to take effect from outside, with a raw Raft-port peer
(testsupport/raft_peer.py) doing the key exchange under chosen secrets, never from the log.
At the end a stranger holding only OLD is refused, and every refusal each member counted
(``fencing_raft_refused_peer_messages_total``) is one of this test's probes: members never
refused each other's frames, established connections and all. Before the rotation, a file
that fails its parse is refused on SIGHUP in one log line and the member keeps OLD.

Before SIGHUP re-read the file, step 1 never took effect (members kept OLD alone).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from itertools import pairwise

import pytest
from cryptography.fernet import InvalidToken, MultiFernet
from pysyncobj.encryptor import getEncryptor

from coordinator.client import FencingClient
from coordinator.client.exceptions import FencingError
from testsupport.grpc_cluster import running_cluster
from testsupport.raft_peer import RaftPeer
from testsupport.supervisor import DEFAULT_HOSTS, pick_ports, wait_until

OLD = "rotation-old-secret-0123456789abcdef0123"
NEW = "rotation-new-secret-0123456789abcdef0123"
# A member acts on SIGHUP within fencingd's SIGNAL_POLL_S (a fraction of a second) and derives
# a key per secret (~25 ms each); a loaded 2-core machine gets far more.
RELOAD_S = 15.0
# A member answers a frame it refuses by hanging up at once; allow for a loaded machine.
HANG_UP_S = 5.0
# Each client operation's whole deadline, retries included. A lost quorum shows as an election
# (raft_max_timeout_s 1 s, leader_fallback_timeout_s 1 s in tests): an operation waiting on
# one would take about this long, and the term check below would fail anyway.
OP_DEADLINE_S = 2.0
# Acknowledged operations the client must add while each member's state is in place, so every
# mixed state (some members reloaded, some not) carries traffic.
OPS_PER_STATE = 10


@pytest.fixture
def cluster(tmp_path, request):
    """Three members, each with a secret file of its own (holding OLD) and a metrics endpoint."""
    files = {i: tmp_path / f"raft-secret-{i}" for i in range(len(DEFAULT_HOSTS))}
    for path in files.values():
        path.write_text(OLD + "\n")
    metrics_port, _ = pick_ports(DEFAULT_HOSTS)
    node_settings = {
        i: {"raft_secret_file": str(files[i]), "metrics_address": f"{host}:{metrics_port}"}
        for i, host in enumerate(DEFAULT_HOSTS)
    }
    for running in running_cluster(str(tmp_path / "cluster"), request, node_settings=node_settings):
        running.secret_files = files
        running.metrics_urls = [f"http://{host}:{metrics_port}/metrics" for host in DEFAULT_HOSTS]
        yield running


class Workload(threading.Thread):
    """Acquire, write, release, one after another, each within OP_DEADLINE_S; records when
    each was acknowledged and the first failure."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(name="rotation-workload", daemon=True)
        self.endpoints = endpoints
        self.stopping = threading.Event()
        self.acked_at: list[float] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        with FencingClient(self.endpoints, timeout_s=OP_DEADLINE_S) as client:
            n = 0
            while not self.stopping.is_set():
                resource = f"rotation/{n % 8}"
                n += 1
                try:
                    lease = client.acquire(resource, holder=f"w{n}", ttl_ms=30_000)
                    self.acked_at.append(time.monotonic())
                    client.write(resource, "k", str(n).encode(), token=lease.token)
                    self.acked_at.append(time.monotonic())
                    client.release(resource, lease.token)
                    self.acked_at.append(time.monotonic())
                except (FencingError, OSError) as exc:
                    self.failure = exc
                    return

    def longest_gap_s(self) -> float:
        times = self.acked_at
        return max((b - a for a, b in pairwise(times)), default=0.0)

    def wait_for_more(self, count: int, what: str) -> None:
        target = len(self.acked_at) + count
        wait_until(lambda: self.failure is not None or len(self.acked_at) >= target, 30,
                   what=f"{count} acknowledged operations {what}")
        assert self.failure is None, f"an operation failed {what}: {self.failure!r}"


def refused(cluster) -> list[float]:
    """Each member's count of refused Raft connections and frames."""
    out = []
    for url in cluster.metrics_urls:
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        out.append(next(float(line.split()[1]) for line in text.splitlines()
                        if line.startswith("fencing_raft_refused_peer_messages_total ")))
    return out


def _log(node) -> str:
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


class Probes:
    """Key exchanges with members under chosen secrets; counts those a member refused (it hangs
    up on a first frame no secret of its own opens, and counts it)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.refused_by = [0] * len(cluster.nodes)

    def passes(self, index: int, *, sends: str, accepts: tuple[str, ...]) -> bool:
        """A peer sending under ``sends`` and reading only what ``accepts`` opens completes the
        key exchange with member ``index`` (hanging up right after, which nobody counts)."""
        address = self.cluster.nodes[index].raft_address
        try:
            RaftPeer(address, encryptor=_SendsAccepts(getEncryptor(sends), accepts), timeout_s=HANG_UP_S).close()
            return True
        except InvalidToken:
            return False  # the member answered under a secret this peer does not accept
        except (ConnectionError, socket.timeout, OSError):
            self.refused_by[index] += 1  # it hung up on our key: counted there
            return False


class _SendsAccepts:
    """An encryptor for RaftPeer that sends under one secret and opens only ``accepts``."""

    def __init__(self, sender, accepts: tuple[str, ...]) -> None:
        self._sender = sender
        self._reader = MultiFernet([getEncryptor(s) for s in accepts])

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return self._sender.encrypt_at_time(data, current_time)

    def decrypt(self, token: bytes) -> bytes:
        return self._reader.decrypt(token)


def rotate_step(cluster, workload: Workload, probes: Probes, step: str, secrets: tuple[str, ...], took_effect) -> None:
    """Write ``secrets`` to each member's file in turn and SIGHUP it; wait until ``took_effect(i)``
    holds for it and the client got OPS_PER_STATE more operations through."""
    for node in cluster.nodes:
        cluster.secret_files[node.index].write_text("".join(s + "\n" for s in secrets))
        os.kill(cluster.pids[node.index], signal.SIGHUP)
        wait_until(lambda node=node: took_effect(node.index), RELOAD_S, interval_s=0.1,
                   what=f"step {step} to take effect on member {node.index} after SIGHUP")
        workload.wait_for_more(OPS_PER_STATE, f"after step {step} on member {node.index}")


def test_the_peer_secret_rotates_with_sighup_while_the_cluster_serves(cluster):
    leader = cluster.wait_ready()
    term = cluster.nodes[leader].status().term
    probes = Probes(cluster)
    for node in cluster.nodes:  # the probes are sound: OLD is the cluster's, NEW is not yet
        assert probes.passes(node.index, sends=OLD, accepts=(OLD,))
        assert not probes.passes(node.index, sends=NEW, accepts=(NEW, OLD))
    # A file that fails its parse keeps the secrets the member has, in one line naming the setting.
    cluster.secret_files[0].write_text(f"{OLD}\n{NEW}\nshort\n")
    os.kill(cluster.pids[0], signal.SIGHUP)
    kept = "SIGHUP: kept the current peer secrets: raft_secret_file: "
    wait_until(lambda: kept in _log(cluster.nodes[0]), RELOAD_S, what="member 0 to refuse the bad file")
    (line,) = [line for line in _log(cluster.nodes[0]).splitlines() if kept in line]
    assert "secret 3 holds 5 characters" in line
    assert probes.passes(0, sends=OLD, accepts=(OLD,))
    assert not probes.passes(0, sends=NEW, accepts=(NEW, OLD))
    refused_at_start = refused(cluster)
    probes.refused_by = [0] * len(cluster.nodes)

    workload = Workload(cluster.endpoints)
    workload.start()
    try:
        workload.wait_for_more(OPS_PER_STATE, "before the rotation")
        # 1. NEW added second: accepted everywhere, while every member still sends OLD.
        rotate_step(cluster, workload, probes, "1 (old, new)", (OLD, NEW),
                    lambda i: probes.passes(i, sends=NEW, accepts=(OLD,)))
        # 2. NEW first: members send it (a peer that opens only NEW understands their answer).
        rotate_step(cluster, workload, probes, "2 (new, old)", (NEW, OLD),
                    lambda i: probes.passes(i, sends=NEW, accepts=(NEW,)))
        # 3. OLD removed: a peer sending it is refused.
        rotate_step(cluster, workload, probes, "3 (new)", (NEW,),
                    lambda i: not probes.passes(i, sends=OLD, accepts=(OLD,)))
    finally:
        workload.stopping.set()
        workload.join(OP_DEADLINE_S * 3)
    assert workload.failure is None, f"an operation failed: {workload.failure!r}"
    gap = workload.longest_gap_s()
    print(f"{len(workload.acked_at)} operations acknowledged; longest gap between two: {gap * 1000:.0f} ms")
    assert {n.status().term for n in cluster.nodes} == {term}, "an election happened: quorum was lost"
    assert gap < OP_DEADLINE_S

    # A stranger with only OLD is refused unread at its first frame, at every member.
    before = refused(cluster)
    for node in cluster.nodes:
        with RaftPeer(node.raft_address, secret=OLD, key_exchange=False, timeout_s=HANG_UP_S) as stranger:
            assert stranger.name(cluster.nodes[(node.index + 1) % 3].raft_address).hung_up(HANG_UP_S)
    wait_until(lambda: refused(cluster) == [b + 1 for b in before], 10, what="each member to count the stranger")
    # Every refusal since the start was one of ours: no member ever refused another's frame.
    expected = [start + ours + 1 for start, ours in zip(refused_at_start, probes.refused_by, strict=True)]
    assert refused(cluster) == expected

"""raft_secret_file: member-to-member traffic needs the shared secret before anything a peer
sent is unpickled (PYSYNCOBJ.md: without it, whoever reaches a Raft port runs code).

The probe sends one frame exactly as a pysyncobj peer would (length, zlib, pickle) whose
unpickling creates a marker file: harmless, and visible. Without a secret the marker
appears (the control: the probe works); with one, the member drops the connection first.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import zlib

import pytest

from coordinator import config as config_mod
from coordinator.client import FencingClient
from coordinator.raft_node import RaftConfig, RaftNode
from coordinator.testing.cluster import pick_ports, wait_until
from coordinator.testing.grpc_cluster import running_cluster
from coordinator.state_machine import FencingStateMachine

SECRET = "0123456789abcdef0123456789abcdef-test"


class _CreatesMarker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def probe(raft_address: str, marker: str) -> None:
    """Send one malicious frame to ``raft_address``; return once the member hung up."""
    host, port = raft_address.rsplit(":", 1)
    frame = zlib.compress(pickle.dumps(_CreatesMarker(marker)))
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack("i", len(frame)) + frame)
        s.settimeout(10)
        try:
            while s.recv(4096):  # whatever it answers, read until it disconnects us
                pass
        except (ConnectionResetError, TimeoutError):
            pass


def test_without_a_secret_the_probe_runs_code(tmp_path):
    """The control: a member with no secret unpickles the frame (the gap this option closes)."""
    host = "127.0.0.2"
    raft_port, _ = pick_ports((host,))
    node = RaftNode(
        RaftConfig(f"{host}:{raft_port}", ("127.0.0.3:1", "127.0.0.4:1"), str(tmp_path / "n")),
        FencingStateMachine(),
    )
    marker = tmp_path / "pwned-plain"
    try:
        probe(node.config.self_address, str(marker))
        wait_until(marker.exists, 10, what="the unpickled frame to create its marker")
    finally:
        node.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("secret")
    secret_file = base / "raft-secret"
    secret_file.write_text(SECRET + "\n")
    yield from running_cluster(str(base), request, settings={"raft_secret_file": str(secret_file)})


def test_members_with_the_secret_replicate_and_a_stranger_is_dropped_unread(cluster, tmp_path):
    endpoints = [n.api_address for n in cluster.nodes]
    with FencingClient(endpoints) as client:
        lease = client.acquire("secret/1", holder="t", ttl_ms=60_000)
        client.write("secret/1", "k", b"v", token=lease.token)
        leader = cluster.wait_ready()
        follower = cluster.nodes[(leader + 1) % 3]
        with FencingClient([follower.api_address]) as direct:
            assert direct.read("secret/1", "k").value == b"v"  # replicated over the encrypted wire
    marker = tmp_path / "pwned-secret"
    for node in cluster.nodes:
        probe(node.raft_address, str(marker))
    assert not marker.exists()
    with FencingClient(endpoints) as client:  # the members are unharmed
        assert client.write("secret/1", "k", b"w", token=lease.token).version >= 2


@pytest.mark.parametrize("content, fragment", [("short", "at least 32"), (None, "cannot read")])
def test_a_missing_or_short_secret_stops_the_member_at_start(tmp_path, content, fragment):
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.build({"data_dir": str(tmp_path / "d"), "raft_address": "127.0.0.1:7000",
                          "members": ["127.0.0.1:7000=127.0.0.1:7100"], "raft_secret_file": str(path)}, {})
    assert str(caught.value).startswith("raft_secret_file: ") and fragment in str(caught.value)


def test_the_secret_never_shows_in_a_config_repr():
    assert SECRET not in repr(RaftConfig("127.0.0.1:1", (), "/nonexistent", secret=SECRET))

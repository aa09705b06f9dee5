"""``fencingd dev``: three local members in one command, stopped cleanly, restarted on the same data."""

from __future__ import annotations

import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import proof
from coordinator.server.fencingd import DEV_METRICS_PORT_OFFSET, DEV_RAFT_PORT_OFFSET
from testsupport.raft_peer import RaftPeer, epoch_floor_entry

OFFSETS = (0, DEV_RAFT_PORT_OFFSET, DEV_METRICS_PORT_OFFSET)  # API, Raft, metrics

# Three fresh Python processes, an election and a read barrier; generous for slow CI.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _base_port() -> int:
    rng = random.Random(os.getpid() * 31 + time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(20_000, 40_000)
        if all(_free(base + offset + i) for offset in OFFSETS for i in range(3)):
            return base
    raise RuntimeError("no free port range for fencingd dev")


class Dev:
    """One ``fencingd dev`` run, its stdout read by a thread into a queue."""

    def __init__(self, data_dir: str, base_port: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator.server.fencingd", "dev", "--data-dir", data_dir,
             "--base-port", str(base_port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, "fencingd dev exited:\n" + "".join(self.output)
                continue
            if line.startswith(prefix):
                return line.strip()
        raise AssertionError(f"no {prefix!r} line within {timeout_s} s:\n" + "".join(self.output))

    def stop(self, sig) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def test_dev_cluster_starts_stops_and_restarts_on_the_same_data(tmp_path):
    data_dir = str(tmp_path / "dev-data")
    base = _base_port()
    dev = Dev(data_dir, base)
    try:
        endpoints = dev.wait_line("ENDPOINTS ", START_TIMEOUT_S).split()[1].split(",")
        assert endpoints == [f"127.0.0.1:{base + i}" for i in range(3)]
        with grpc.insecure_channel(endpoints[0]) as ch0, grpc.insecure_channel(endpoints[2]) as ch2:
            acq = pb_grpc.LeaseStub(ch0).Acquire(pb.AcquireRequest(
                resource="dev/demo", holder="test", ttl_ms=60_000, op_id=os.urandom(16)), timeout=10)
            written = pb_grpc.FencedStoreStub(ch2).Write(pb.WriteRequest(
                resource="dev/demo", key="k", value=b"survives restart", token=acq.token, op_id=os.urandom(16)),
                timeout=10)
        # Acquire signs a token proof; the public key is where dev says (DESIGN §6).
        verify_key = os.path.join(data_dir, "token-signing.pub")
        assert any(verify_key in text for text in dev.output)
        stated = proof.ProofVerifier.from_files(verify_key).verify(acq.token_proof, resource="dev/demo")
        assert stated.token == acq.token
        with open(verify_key, "rb") as f:
            first_key = f.read()
        # Each member serves Prometheus metrics on the port its line prints.
        line = dev.output[[i for i, text in enumerate(dev.output) if text.strip().startswith("member 0:")][0]]
        url = re.search(r"metrics (http://\S+)", line).group(1)
        assert url == f"http://127.0.0.1:{base + DEV_METRICS_PORT_OFFSET}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert "fencing_raft_applied_index" in reply.read().decode()
        # Members authenticate each other: one credential of their own, 0600, on all three.
        secret = os.path.join(data_dir, "raft-secret")
        assert os.stat(secret).st_mode & 0o777 == 0o600
        for i in range(3):
            with open(os.path.join(data_dir, f"node{i}.toml"), "rb") as f:
                assert tomllib.load(f)["raft_secret_file"] == secret
        # State injection: naming a member and sending apply_command at a Raft port commits nothing.
        with grpc.insecure_channel(endpoints[0]) as ch:
            before = pb_grpc.ClusterStub(ch).Status(pb.StatusRequest(), timeout=10).epoch
            for i in range(3):  # a plain connection, as without the secret: named, then the command
                with RaftPeer(f"127.0.0.1:{base + DEV_RAFT_PORT_OFFSET + i}", timeout_s=10) as peer:
                    peer.name_and_command(f"127.0.0.1:{base + DEV_RAFT_PORT_OFFSET + 1}",
                                          epoch_floor_entry(before + 1_000_000))
                    assert peer.hung_up(10), f"member {i} kept the connection"
            assert pb_grpc.ClusterStub(ch).Status(pb.StatusRequest(), timeout=10).epoch == before
        assert dev.stop(signal.SIGTERM) == 0
        assert "fencingd dev: all members stopped\n" in dev.output
    finally:
        dev.kill()
    for i in range(3):  # every member is gone: nobody listens on its ports
        assert all(_free(base + offset + i) for offset in OFFSETS)

    again = Dev(data_dir, base)
    try:
        endpoints = again.wait_line("ENDPOINTS ", START_TIMEOUT_S).split()[1].split(",")
        with grpc.insecure_channel(endpoints[1]) as ch:
            read = pb_grpc.FencedStoreStub(ch).Read(pb.ReadRequest(resource="dev/demo", key="k"), timeout=10)
            assert (read.value, read.version, read.hwm) == (b"survives restart", written.version, acq.token)
            status = pb_grpc.ClusterStub(ch).Status(pb.StatusRequest(), timeout=10)
            assert status.epoch == acq.token and len(status.members) == 3
            with open(verify_key, "rb") as f:
                assert f.read() == first_key, "a restart keeps the signing pair"
        assert again.stop(signal.SIGINT) == 0  # Ctrl-C
    finally:
        again.kill()

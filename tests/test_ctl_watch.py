"""``fencingctl watch`` and ``fencingctl elect`` against the real servicers (in-memory cluster)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from coordinator.client import fencingctl as cli_ctl
from coordinator.client.sync import FencingClient
from testsupport.inmemory import InMemoryCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 30


@pytest.fixture
def cluster():
    with InMemoryCluster(3) as running:
        yield running


def ctl(cluster, capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli_ctl.main(["--endpoints", ",".join(cluster.endpoints), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_watch_prints_one_line_per_event_from_a_revision(cluster, capsys):
    with FencingClient(cluster.endpoints) as client:
        lease = client.acquire("jobs/a", ttl_ms=60_000, holder="w1")
        write = client.write("jobs/a", "k", b"hello", token=lease.token)
        client.release("jobs/a", lease.token)
    code, out, err = ctl(cluster, capsys, "watch", "jobs/", "--rev", str(lease.header.applied_index), "--count", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"{lease.header.applied_index} ACQUIRED jobs/a holder=w1 token={lease.token}" \
        f" expires_at_ms={lease.expires_at_ms}"
    assert lines[1] == f"{write.header.applied_index} WRITTEN jobs/a token={lease.token} key=k version=1 value=hello"
    assert lines[2].split()[1:3] == ["RELEASED", "jobs/a"]
    code, out, _ = ctl(cluster, capsys, "-o", "json", "watch", "jobs/", "--rev", str(lease.header.applied_index),
                       "--count", "1")
    assert json.loads(out)["type"] == "ACQUIRED"


def test_watch_from_a_compacted_revision_exits_with_the_current_revision(cluster, capsys):
    with FencingClient(cluster.endpoints) as client:
        lease = client.acquire("jobs/a", ttl_ms=60_000, holder="w1")
        for member in cluster.members:
            assert member.watch is not None
            member.watch.history_bytes_max = 1
        last = client.write("jobs/a", "k", b"x", token=lease.token)
        client.write("jobs/a", "k", b"y", token=lease.token)
    code, _out, err = ctl(cluster, capsys, "watch", "jobs/", "--rev", "1")
    assert code == cli_ctl.EXIT_OTHER
    assert "compacted" in err and f"current revision {last.header.applied_index + 1}" in err
    assert err.count("\n") == 1


def test_elect_observes_and_campaigns_until_sigterm_then_resigns(cluster, capsys):
    code, out, _ = ctl(cluster, capsys, "elect", "elections/x", "--count", "1")
    assert (code, out) == (0, "(none)\n")
    campaign = subprocess.Popen(
        [sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", ",".join(cluster.endpoints),
         "elect", "elections/x", "alice", "--ttl", "30s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert campaign.stdout is not None
        line = campaign.stdout.readline()
        assert line.startswith("leader elections/x alice token "), line + campaign.stderr.read()
        code, out, _ = ctl(cluster, capsys, "elect", "elections/x", "--count", "1")
        assert out == "alice\n"
        campaign.send_signal(signal.SIGTERM)
        assert campaign.wait(DEADLINE_S) == 0
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.wait(DEADLINE_S)
    with FencingClient(cluster.endpoints) as client:
        assert not client.describe("elections/x").held  # resigned: released at once

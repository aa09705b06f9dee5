"""The README's examples run as written, on fresh real clusters.

The first console block is a transcript, run line by line on a cluster of its own: each
``$ fencingctl ...`` line runs as it is written (endpoints from FENCING_ENDPOINTS).
A comment such as ``# token 1`` or ``# value 43, version 2, hwm 2`` names fields the output
must show; a line under a command is its exact stderr, ending in ``(exit N)``; a command
with no such line must exit 0. ``$ # ... expires ...`` waits until the lease has expired.

Every ``python`` block runs as a script in a directory laid out like ``fencingd dev``'s
(``fencing-dev-data/token-signing.pub``), against a second cluster that signs token proofs;
the only change made to a block is the dev cluster's API addresses (127.0.0.1:7100-7102)
swapped for the test cluster's. A block must exit 0 (the blocks assert what they show), and
a block that catches StaleToken must have printed the refusal: the stale write really was
refused, not skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from coordinator.client import fencingctl as cli_ctl
from testsupport.grpc_cluster import running_cluster
from testsupport.supervisor import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ("token", "version", "value", "hwm")


# What ``fencingd dev`` listens on, as the README's Python blocks spell it.
DEV_ENDPOINTS = ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")


def readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def first_console_block() -> list[str]:
    block = re.search(r"```console\n(.*?)```", readme(), re.S)
    assert block, "the README's first screen must be a console transcript"
    return block.group(1).splitlines()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", readme(), re.S)


def steps(lines: list[str]) -> list[dict]:
    """[{argv, expect: {field: value}, stderr, exit, wait_expiry}] in README order."""
    out: list[dict] = []
    for line in lines:
        if line.startswith("$ #"):
            out.append({"wait_expiry": "expires" in line})
            continue
        if line.startswith("$ "):
            command, _, comment = line[2:].partition("  #")
            expect = {}
            for piece in comment.split(":")[0].split(","):
                m = re.fullmatch(r"\s*(\w+) (\S+)\s*", piece)
                if m and m.group(1) in FIELDS:
                    expect[m.group(1)] = m.group(2)
            argv = shlex.split(command)
            assert argv[0] == "fencingctl", line
            out.append({"argv": argv[1:], "expect": expect, "stderr": None, "exit": 0})
            continue
        m = re.fullmatch(r"(.*?)\s+\(exit (\d+)\)", line)
        assert m and out and "argv" in out[-1], f"README line not understood: {line!r}"
        out[-1]["stderr"], out[-1]["exit"] = m.group(1) + "\n", int(m.group(2))
    return out


def test_the_transcript_parses_into_checks():
    parsed = steps(first_console_block())
    commands = [s for s in parsed if "argv" in s]
    # What the first screen must show (issue: epoch 1 refused after epoch 2 wrote, epoch 2
    # writing twice, a malformed token refused), and that each shows something checkable.
    assert [s["exit"] for s in commands].count(3) >= 1 and [s["exit"] for s in commands].count(2) >= 1
    assert all(s["expect"] or s["stderr"] for s in commands)
    assert any(s.get("wait_expiry") for s in parsed)


# Function scope: the transcript's tokens count from 1, so no other test may touch its
# cluster, and it is gone before the Python blocks' cluster starts.
@pytest.fixture
def fresh_cluster(tmp_path_factory, request):
    yield from running_cluster(str(tmp_path_factory.mktemp("readme")), request)


def run(argv: list[str], endpoints: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.client.fencingctl", *argv],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, cli_ctl.ENDPOINTS_ENV: endpoints},
    )


def table(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        key, _, value = line.partition("  ")
        rows[key.strip()] = value.strip()
    return rows


def test_the_readme_transcript_runs_as_written(fresh_cluster):
    fresh_cluster.wait_ready()
    endpoints = ",".join(n.api_address for n in fresh_cluster.nodes)
    last_resource = None
    for step in steps(first_console_block()):
        if "argv" not in step:
            if step["wait_expiry"] and last_resource:

                def expired():
                    proc = run(["-o", "json", "describe", last_resource], endpoints)
                    return proc.returncode == 0 and not json.loads(proc.stdout)["held"]

                wait_until(expired, timeout_s=30, what=f"the lease on {last_resource} to expire")
            continue
        proc = run(step["argv"], endpoints)
        shown = " ".join(step["argv"])
        assert proc.returncode == step["exit"], f"fencingctl {shown}: {proc.stderr}"
        if step["stderr"] is not None:
            assert proc.stderr == step["stderr"], f"fencingctl {shown}"
        rows = table(proc.stdout)
        for field, value in step["expect"].items():
            assert rows.get(field) == value, f"fencingctl {shown}: {field} {rows.get(field)!r}, README says {value}"
        if step["argv"][0] == "acquire":
            last_resource = step["argv"][1]


# -- the Python blocks ---------------------------------------------------------------------


def test_the_readme_shows_the_clients_and_the_guard_in_python():
    blocks = python_blocks()
    shown = "\n".join(blocks)
    for name in ("FencingClient(", "AsyncFencingClient(", "SqliteGuard(", "except StaleToken"):
        assert name in shown, f"no README Python block uses {name}"
    for block in blocks:
        if "FencingClient(" in block:
            assert all(e in block for e in DEV_ENDPOINTS), f"a block names other endpoints:\n{block}"


@pytest.fixture(scope="module")
def dev_like_dir(tmp_path_factory):
    """A working directory like the one ``fencingd dev`` was started in: the public key in
    ``fencing-dev-data/token-signing.pub``, the private key beside it for the cluster."""
    base = tmp_path_factory.mktemp("readme-py")
    keys = base / "fencing-dev-data"
    keys.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator.server.fencingd", "keygen",
         "--private-key", str(keys / "token-signing.pem"), "--public-key", str(keys / "token-signing.pub")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return base


@pytest.fixture(scope="module")
def signing_cluster(tmp_path_factory, request, dev_like_dir):
    key = str(dev_like_dir / "fencing-dev-data" / "token-signing.pem")
    yield from running_cluster(
        str(tmp_path_factory.mktemp("readme-cluster")), request, settings={"token_signing_key_file": key}
    )


def _with_endpoints(block: str, endpoints: list[str]) -> str:
    for dev, real in zip(DEV_ENDPOINTS, endpoints, strict=True):
        block = block.replace(dev, real)
    # Never reach a dev cluster someone else runs on this machine.
    assert "127.0.0.1:710" not in block, block
    return block


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_the_readme_python_block_runs_as_written(index, signing_cluster, dev_like_dir):
    signing_cluster.wait_ready()
    block = python_blocks()[index]
    script = _with_endpoints(block, [n.api_address for n in signing_cluster.nodes])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=dev_like_dir, env=env,
    )
    assert proc.returncode == 0, f"README Python block {index} failed:\n{block}\n{proc.stdout}{proc.stderr}"
    if "except StaleToken" in block:
        assert "is stale" in proc.stdout, f"README Python block {index} printed no refusal:\n{proc.stdout}"

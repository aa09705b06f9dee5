"""The README's first screen is a transcript: run it, line by line, on a fresh real cluster.

Each ``$ fencingctl ...`` line runs as it is written (endpoints from FENCING_ENDPOINTS).
A comment such as ``# token 1`` or ``# value 43, version 2, hwm 2`` names fields the output
must show; a line under a command is its exact stderr, ending in ``(exit N)``; a command
with no such line must exit 0. ``$ # ... expires ...`` waits until the lease has expired.
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


def first_console_block() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"```console\n(.*?)```", text, re.S)
    assert block, "the README's first screen must be a console transcript"
    return block.group(1).splitlines()


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


@pytest.fixture(scope="module")
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

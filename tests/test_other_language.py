"""The API from another language: a Node.js service with nothing of ours but the ``.proto``.

``examples/node/fencing-example.js`` (README "From any language") runs under Node.js with
``@grpc/grpc-js`` and ``@grpc/proto-loader`` from the npm registry, at the versions its
package-lock.json pins, against three real ``fencingd serve`` members: it acquires a lease,
lets it expire under a waiting second acquire, writes with the new token, and reads the
refusal of the stale token's write (reason and hwm) from the google.rpc.Status in the error's
trailers. Its output is checked line by line, and against the cluster's own answers.

The README shows that file verbatim and a transcript of a run, both checked here
(``tests/test_readme.py`` lists them as not run by it). Node.js and the example's packages come
from .ci/run (Debian's nodejs and npm, then ``npm ci`` in examples/node); where they are
missing this test fails saying what to run, never skips, as the guard tests do for their
servers (``testsupport/store_servers.py``).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shutil
import subprocess

import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_DIR = os.path.join(ROOT, "examples", "node")
EXAMPLE = os.path.join(EXAMPLE_DIR, "fencing-example.js")
# A Node start (~0.3 s), five RPCs and a server-side wait of about 0.5 s for worker-a's lease to
# expire; two busy shared cores make that several seconds, and a hung run must still end.
NODE_RUN_TIMEOUT_S = 90
# What the example prints, line by line: the numbers are checked against each other below.
OUTPUT = [
    r"worker-a: token (?P<a>\d+) for (?P<resource>orders/[0-9a-f]{8})",
    r"worker-b: token (?P<b>\d+)",
    r"worker-b: wrote total=42 with token (?P<b_write>\d+): version 1",
    r"worker-a: write refused: FAILED_PRECONDITION STALE_TOKEN, hwm (?P<hwm>\d+)",
    r"read: total=42 version 1 hwm (?P<read_hwm>\d+)",
]
# The npm packages the example uses, each from the registry at its lock file's version.
PACKAGES = ("@grpc/grpc-js", "@grpc/proto-loader", "protobufjs")


def _node() -> str:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.fail("node not found on PATH: install it with `apt-get install -y nodejs npm` (as .ci/run does)")
    missing = [p for p in PACKAGES if not os.path.isdir(os.path.join(EXAMPLE_DIR, "node_modules", p))]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed for the example: run `npm ci` in examples/node "
                    "(as .ci/run does)")
    return node


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def _section() -> str:
    match = re.search(r"^## From any language\n(.*?)^## ", _readme(), re.S | re.M)
    assert match, "README has no section 'From any language'"
    return match.group(1)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", _section(), re.S | re.M)


def _read_output(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    assert len(lines) == len(OUTPUT), stdout
    found: dict[str, str] = {}
    for pattern, line in zip(OUTPUT, lines, strict=True):
        match = re.fullmatch(pattern, line)
        assert match, f"{line!r} does not match {pattern!r}\n{stdout}"
        found.update(match.groupdict())
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from running_cluster(str(tmp_path_factory.mktemp("other-language")), request)


def test_the_node_service_acquires_writes_and_reads_a_stale_write_refused_with_its_hwm(cluster):
    node = _node()
    follower = cluster.nodes[(cluster.leader_index() + 1) % 3]  # any member serves: followers forward
    proc = subprocess.run([node, EXAMPLE, follower.api_address], cwd=EXAMPLE_DIR, capture_output=True, text=True,
                          timeout=NODE_RUN_TIMEOUT_S)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    got = _read_output(proc.stdout)
    a, b = int(got["a"]), int(got["b"])
    assert a < b and int(got["b_write"]) == int(got["hwm"]) == int(got["read_hwm"]) == b, got
    # The cluster agrees: worker-b's token is the resource's high-water mark, its write the
    # value, and the example released its lease at the end.
    described = cluster.nodes[0].lease.Describe(pb.DescribeRequest(resource=got["resource"]), timeout=RPC_TIMEOUT_S)
    assert (described.held, described.hwm) == (False, b)
    read = cluster.nodes[2].store.Read(pb.ReadRequest(resource=got["resource"], key="total"), timeout=RPC_TIMEOUT_S)
    assert (read.found, read.value, read.version) == (True, b"42", 1)


def test_the_example_runs_on_the_packages_its_lock_file_pins():
    _node()
    with open(os.path.join(EXAMPLE_DIR, "package-lock.json"), encoding="utf-8") as f:
        locked = json.load(f)["packages"]
    with open(os.path.join(EXAMPLE_DIR, "package.json"), encoding="utf-8") as f:
        assert set(json.load(f)["dependencies"]) == set(PACKAGES)
    for name in PACKAGES:
        with open(os.path.join(EXAMPLE_DIR, "node_modules", name, "package.json"), encoding="utf-8") as f:
            installed = json.load(f)
        assert installed["name"] == name and installed["version"] == locked[f"node_modules/{name}"]["version"], name


def test_the_readme_shows_the_example_verbatim_and_a_run_it_prints():
    with open(EXAMPLE, encoding="utf-8") as f:
        assert _blocks("js") == [f.read()], "README's js block differs from examples/node/fencing-example.js"
    (transcript,) = _blocks("console")
    shown = [line for line in transcript.splitlines() if not line.startswith("$ ")]
    got = _read_output("\n".join(shown))
    assert int(got["a"]) < int(got["b"]) == int(got["hwm"]) == int(got["read_hwm"])
    assert "$ node fencing-example.js 127.0.0.1:7100" in transcript.splitlines()


def test_the_proto_the_readme_points_at_is_in_the_installed_package():
    proto = importlib.resources.files("coordinator.api.v1") / "fencing.proto"
    assert proto.is_file() and 'package fencing.v1;' in proto.read_text(encoding="utf-8")
    assert 'importlib.resources.files("coordinator.api.v1") / "fencing.proto"' in _section()

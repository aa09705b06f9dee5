"""deploy/README.md's "Lost volume" procedure, run as written on a real cluster.

The commands are taken from the document's code block, not restated here: the `grep` pattern is
looked for in the wiped member's log (where journalctl would read it), and every `fencingctl`
line runs as a real ``fencingctl`` process with ``FENCING_ENDPOINTS`` set as the document's
conventions say (local addresses; the test cluster has no admin token, so no credential).
A change to the document that the cluster does not do fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from chaos.harness import ChaosCluster
from chaos.workload import make_client
from testsupport.supervisor import child_env, wait_until

RUNBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "README.md")
# A fencingctl process: start-up plus a call that may wait out one election.
CTL_TIMEOUT_S = 30.0


def lost_volume_commands() -> tuple[str, list[list[str]]]:
    """(the grep pattern, the fencingctl command lines) of the "Lost volume" code block."""
    with open(RUNBOOK, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Lost volume\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    grep = next(re.search(r"grep '([^']+)'", line).group(1) for line in lines if "grep '" in line)
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("fencingctl ")]
    return grep, commands


def fencingctl(cluster, *argv: str) -> subprocess.CompletedProcess:
    env = child_env({"FENCING_ENDPOINTS": ",".join(cluster.endpoints)})
    return subprocess.run([sys.executable, "-m", "coordinator.client.fencingctl", *argv], env=env,
                          capture_output=True, text=True, timeout=CTL_TIMEOUT_S)


def member_list(cluster) -> dict[str, dict]:
    done = fencingctl(cluster, "admin", "member", "list", "--output", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    return {m["member_id"]: m for m in json.loads(done.stdout)["members"]}


def test_the_document_names_the_steps_this_test_runs():
    grep, commands = lost_volume_commands()
    assert grep == "is not in the configuration"
    assert [c[:3] for c in commands] == [["admin", "member", "replace"], ["admin", "member", "list"]]


def test_lost_volume_procedure_brings_the_member_back_with_nothing_lost(tmp_path):
    grep, commands = lost_volume_commands()
    with ChaosCluster(str(tmp_path / "cluster")) as cluster:
        cluster.start_all(timeout_s=60)
        client = make_client(cluster.endpoints, timeout_s=10.0)
        try:
            token = client.acquire("runbook/a", ttl_ms=600_000).token
            client.write("runbook/a", "k", b"acked", token=token)
            member_id = commands[0][3]  # the document's example id (m2)
            before = member_list(cluster)
            assert before[member_id]["voter"], before
            node = cluster.node_by_raft(before[member_id]["id"])
            # The volume is lost; the member starts again on an empty one at its address.
            cluster.kill(node.index)
            shutil.rmtree(node.data_dir)
            os.makedirs(node.data_dir)
            cluster.start(node.index)
            wait_until(lambda: grep in open(node.log_path, encoding="utf-8", errors="replace").read(), 30,
                       what="the line the document greps for")
            with open(os.path.join(node.data_dir, "member.identity"), encoding="utf-8") as f:
                fresh = json.load(f)["incarnation"]  # written before it could log that line
            assert member_list(cluster)[member_id]["incarnation"] == before[member_id]["incarnation"]

            for argv in commands:
                done = fencingctl(cluster, *argv)
                assert done.returncode == 0, (argv, done.stdout, done.stderr)
                assert member_id in done.stdout

            # "m2 with the new incarnation, voting" (a learner first, until it caught up).
            def voting():
                entry = member_list(cluster).get(member_id, {})
                return entry.get("voter") and entry.get("incarnation") == fresh

            wait_until(voting, 30, what=f"{member_id} voting with its new incarnation")
            # It counts: with another member gone, the replaced one and the third serve
            # everything acknowledged before the loss.
            cluster.stop(next(n.index for n in cluster.nodes if n.index != node.index))
            read = wait_until(lambda: client.read("runbook/a", "k"), 60, what="the two left serving")
            assert read.found and read.value == b"acked"
        except BaseException:
            print(cluster.logs())
            raise
        finally:
            client.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

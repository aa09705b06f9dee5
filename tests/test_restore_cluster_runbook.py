"""deploy/README.md's "Two of three volumes lost" procedure, run as written on a real cluster.

A three-member cluster issues tokens and writes; a backup is taken with the real
``fencingctl admin snapshot`` process; more tokens are issued after it; two members' data
dirs are wiped and the cluster is stuck. Then the document's steps rebuild a new cluster from
the backup: the ``fencingd restore-cluster`` line and the ``fencingctl`` lines are taken from
the document's code block and run as real processes (the addresses, data dirs and backup file
of the example swapped for the test cluster's), the stop, move and start as the harness does
them. DESIGN I1 and I11 are then checked: every token issued afterwards is above every token
issued before (the ones after the backup included), every old holder's write is refused, and
the backup's data reads back. A change to the document that the cluster does not do fails here.
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
from coordinator.client.exceptions import FencingError, StaleToken, UnknownToken
from coordinator.raft.membership import initial_member_id
from testsupport.supervisor import child_env, wait_until

RUNBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "README.md")
# A fencingctl or fencingd process: start-up plus a call that may wait out one election.
PROCESS_TIMEOUT_S = 60.0


def runbook_block() -> list[str]:
    """The "Two of three volumes lost" code block as command lines: comments dropped,
    backslash continuations joined."""
    with open(RUNBOOK, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Two of three volumes lost\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.split("#", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line]


def restore_argv(cluster, backup: str) -> list[str]:
    """The document's ``fencingd restore-cluster`` line with the example's backup file, Raft
    addresses and data dirs swapped for the test cluster's (its margin and flags as written)."""
    line = next(line for line in runbook_block() if line.startswith("fencingd restore-cluster"))
    argv = shlex.split(line)[1:]
    addresses = [n.raft_address for n in cluster.nodes]
    by_id = {initial_member_id(n.raft_address, addresses): n for n in cluster.nodes}
    out = []
    for i, arg in enumerate(argv):
        previous = argv[i - 1] if i else ""
        if previous == "--backup":
            arg = backup
        elif previous == "--initial-cluster":
            ids = [item.split("=", 1)[0] for item in arg.split(",")]
            arg = ",".join(f"{member_id}={by_id[member_id].raft_address}" for member_id in ids)
        elif previous == "--data-dir":
            member_id = arg.split("=", 1)[0]
            arg = f"{member_id}={by_id[member_id].data_dir}"
        out.append(arg)
    return out


def run(argv: list[str], cluster) -> subprocess.CompletedProcess:
    env = child_env({"FENCING_ENDPOINTS": ",".join(cluster.endpoints)})
    return subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S, check=False)


def test_the_document_names_the_steps_this_test_runs():
    lines = runbook_block()
    kinds = [line.split()[0] + " " + line.split()[1] for line in lines]
    assert kinds == ["systemctl stop", "mv /var/lib/fencing/data", "fencingd restore-cluster", "rsync -a",
                     "systemctl start", "fencingctl admin", "fencingctl status"], kinds
    argv = shlex.split(next(line for line in lines if line.startswith("fencingd ")))
    assert argv.count("--data-dir") == 3 and "--epoch-margin" in argv and "--force" not in argv


def _issue_before_backup(client) -> dict[str, int]:
    tokens = {}
    tokens["a"] = client.acquire("dr/a", holder="holder-a", ttl_ms=600_000).token
    client.write("dr/a", "k", b"in-backup", token=tokens["a"])
    tokens["b"] = client.acquire("dr/b", holder="holder-b", ttl_ms=600_000).token
    client.write("dr/b", "k", b"b-in-backup", token=tokens["b"])
    return tokens


def _issue_after_backup(client, tokens: dict[str, int]) -> None:
    """Tokens and writes the backup never sees: a new resource, and dr/b taken again."""
    client.write("dr/a", "k", b"after-backup", token=tokens["a"])
    tokens["late"] = client.acquire("dr/late", holder="holder-late", ttl_ms=600_000).token
    client.write("dr/late", "k", b"not-in-backup", token=tokens["late"])
    client.release("dr/b", tokens["b"])
    tokens["b2"] = client.acquire("dr/b", holder="holder-b2", ttl_ms=600_000).token
    for i in range(5):
        tokens[f"x{i}"] = client.acquire(f"dr/x{i}", holder="holder-x", ttl_ms=600_000).token


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _wipe_two_and_see_it_stuck(cluster, keep: int) -> None:
    """Two data dirs lost: those members start empty and the cluster has no quorum."""
    wiped = [n for n in cluster.nodes if n.index != keep]
    for node in wiped:
        cluster.kill(node.index)
        shutil.rmtree(node.data_dir)
        cluster.start(node.index)
    for node in wiped:
        wait_until(lambda path=node.log_path: "may not bootstrap one" in _read(path),
                   30, what=f"{node} waiting without a configuration")
    stuck = make_client(cluster.endpoints, timeout_s=3.0)
    try:
        with pytest.raises(FencingError):
            stuck.acquire("dr/stuck", holder="h", ttl_ms=60_000)
    finally:
        stuck.close()


def _follow_runbook(cluster, backup: str) -> str:
    """Steps 1-6 of the document; the restore-cluster output and the status step's output."""
    for node in cluster.nodes:  # 1. stop every member
        cluster.kill(node.index)
    for node in cluster.nodes:  # 2. old data dirs aside
        os.rename(node.data_dir, node.data_dir + ".lost")
    done = run(["coordinator.server.fencingd", *restore_argv(cluster, backup)], cluster)  # 4.
    assert done.returncode == 0, done.stdout + done.stderr
    for node in cluster.nodes:  # 5. (the copy is a no-op: the dirs were written in place)
        cluster.start(node.index)
    cluster.wait_ready(timeout_s=60)
    outputs = []
    for line in runbook_block():  # 6.
        if line.startswith("fencingctl "):
            checked = run(["coordinator.client.fencingctl", *shlex.split(line)[1:]], cluster)
            assert checked.returncode == 0, (line, checked.stdout, checked.stderr)
            outputs.append(checked.stdout)
    return done.stdout, outputs


def test_two_volumes_lost_rebuilt_from_backup_with_every_old_token_fenced(tmp_path):
    backup = str(tmp_path / "latest.bin")
    with ChaosCluster(str(tmp_path / "cluster")) as cluster:
        cluster.start_all(timeout_s=60)
        client = make_client(cluster.endpoints, timeout_s=10.0)
        try:
            tokens = _issue_before_backup(client)
            taken = run(["coordinator.client.fencingctl", "admin", "snapshot", "--out", backup, "--output", "json"],
                        cluster)
            assert taken.returncode == 0, taken.stdout + taken.stderr
            backup_epoch = json.loads(taken.stdout)["epoch"]
            assert backup_epoch == max(tokens.values())
            _issue_after_backup(client, tokens)
            _wipe_two_and_see_it_stuck(cluster, keep=cluster.wait_leader())
            client.close()
            summary, (members, status) = _follow_runbook(cluster, backup)
            argv = restore_argv(cluster, backup)
            margin = int(argv[argv.index("--epoch-margin") + 1])
            epoch = backup_epoch + margin
            assert f"epoch {epoch}, first token {epoch + 1}" in summary, summary
            assert members.count(" yes") == 3, members  # three voters
            assert re.search(rf"\bepoch\W+{epoch}\b", status), status
            client = make_client(cluster.endpoints, timeout_s=10.0)

            # Every token issued afterwards is above every token issued before (I1, I11).
            new = [client.acquire(f"dr/new{i}", holder="holder-new", ttl_ms=60_000).token for i in range(3)]
            assert min(new) > max(tokens.values()), (new, tokens)
            again = client.acquire("dr/late", holder="holder-late2", ttl_ms=60_000).token
            assert again > max(tokens.values())
            assert min(new) == epoch + 1
            # Every old holder is fenced: in the backup (stale), or created after it (unknown).
            with pytest.raises(StaleToken):
                client.write("dr/a", "k", b"old holder", token=tokens["a"])
            with pytest.raises(StaleToken):
                client.write("dr/b", "k", b"old holder", token=tokens["b2"])
            with pytest.raises((StaleToken, UnknownToken)):
                client.write("dr/x0", "k", b"old holder", token=tokens["x0"])
            with pytest.raises(StaleToken):
                client.write("dr/late", "k", b"old holder", token=tokens["late"])
            # The backup's data reads back; what came after it is gone, as the document says.
            read = client.read("dr/a", "k")
            assert read.found and read.value == b"in-backup"
            assert client.read("dr/b", "k").value == b"b-in-backup"
            assert not client.read("dr/x1", "k").found
        except BaseException:
            print(cluster.logs())
            raise
        finally:
            client.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

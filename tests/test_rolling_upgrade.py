"""A rolling upgrade from the previous release to this tree, under the chaos workload (DESIGN §8
"Rolling upgrades", issue 28 point 3).

The previous release is the tree at ``PREVIOUS_RELEASE``, taken from this repository's own
history (``git archive``) and installed (``pip install --no-deps``, no network) into a venv of
its own whose only other packages are the shared venv's, reached through a .pth file. Three
members start on it; two workload clients (chaos.workload.run_client) record every call
while each member in turn is stopped and started on this tree with the same data dir. A
conditional Delete (``expected_version``, entry level 2: an op new in this tree) sent to an
upgraded member is refused with FAILED_PRECONDITION CLUSTER_LEVEL_TOO_LOW while any member
still runs the previous release, and applies once the last one is upgraded (the leader's
LevelPoller raises the cluster level). The history then passes the chaos checker: 0
violations, and the final state of every resource read.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time

import pytest

from chaos.check import check_file, format_report
from chaos.harness import ChaosCluster
from chaos.workload import run_client, write_final_states
from coordinator.client import FencingClient
from coordinator.client.exceptions import Refused, VersionMismatch
from coordinator.core import commands
from coordinator.core.names import ErrorMeta, ErrorReason
from testsupport.supervisor import REPO_ROOT, wait_until

# The commit this change started from (git merge-base of its branch with main): the last
# commit without entry levels, so the release every deployment upgrades from. Pinned, and
# checked to be an ancestor of the tree under test.
PREVIOUS_RELEASE = "e55ea02c71fe94f5ffe9ec79801774a1c4336b31"

RESOURCES = ("up-r0", "up-r1", "up-r2")
CONDITIONAL = "up-conditional"  # the resource the new op is tried on, outside the workload's
# After the last member is upgraded: the leader's poll (LEVEL_POLL_INTERVAL_S) plus one
# SET_CLUSTER_LEVEL through the log, with room for elections on a shared 2-core machine.
LEVEL_RAISED_TIMEOUT_S = 30.0
ACKS_TIMEOUT_S = 60.0


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", REPO_ROOT, *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


@pytest.fixture(scope="module")
def previous_python(tmp_path_factory) -> str:
    """The python of a venv holding the previous release (and the shared venv's packages)."""
    full = _git("rev-parse", f"{PREVIOUS_RELEASE}^{{commit}}").strip()
    assert full == PREVIOUS_RELEASE
    subprocess.run(["git", "-C", REPO_ROOT, "merge-base", "--is-ancestor", PREVIOUS_RELEASE, "HEAD"], check=True,
                   timeout=60)
    base = tmp_path_factory.mktemp("previous-release")
    tree, venv = base / "tree", base / "venv"
    archive = base / "tree.tar"
    _git("archive", "--format=tar", "-o", str(archive), PREVIOUS_RELEASE)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # Plain path lines: the shared packages (grpcio, msgpack, pysyncobj, ...), without running
    # that venv's .pth files, so this tree's own editable install stays out.
    with open(os.path.join(site, "shared-packages.pth"), "w", encoding="utf-8") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", str(tree)], check=True, timeout=300)
    found = subprocess.run([python, "-I", "-c", "import coordinator; print(coordinator.__file__)"],
                           check=True, capture_output=True, text=True, timeout=60).stdout
    assert found.startswith(site), found  # the previous release, not this tree
    return python


class UpgradeCluster(ChaosCluster):
    """A ChaosCluster whose members in ``previous`` run the previous release's python."""

    def __init__(self, base_dir: str, previous_python: str, **kwargs) -> None:
        super().__init__(base_dir, **kwargs)
        self.previous_python = previous_python
        self.previous = set(range(len(self.nodes)))

    def command(self, node) -> list[str]:
        if node.index not in self.previous:
            return super().command(node)
        # -I: neither PYTHONPATH (this tree first) nor the working directory may shadow the
        # installed previous release.
        return [self.previous_python, "-I", "-m", "coordinator.server.fencingd", "serve", "--config",
                node.config_path]


def _acknowledged(paths) -> int:
    count = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            count += sum('"outcome":"ok"' in line for line in f)
    return count


def _conditional_delete(endpoint: str, token: int, version: int):
    """The new op, on an upgraded member only: a member of the previous release does not know
    the field and would delete unconditionally."""
    with FencingClient([endpoint], timeout_s=10.0, attempt_timeout_s=2.0) as client:
        return client.delete(CONDITIONAL, "k", token=token, expected_version=version)


def test_a_rolling_upgrade_from_the_previous_release_under_load(tmp_path, previous_python, monkeypatch):
    monkeypatch.setenv("FENCING_CHAOS_CLOCK_STEP", "0")  # the previous release runs without the clock shim
    histories = [str(tmp_path / f"c{k}.jsonl") for k in range(2)]
    for path in histories:
        open(path, "w").close()
    stop = threading.Event()
    refusals: list[dict[str, str]] = []
    with UpgradeCluster(str(tmp_path / "cluster"), previous_python) as cluster:
        cluster.start_all(timeout_s=60)

        def more_acks(n=15):
            after = _acknowledged(histories)
            wait_until(lambda: _acknowledged(histories) >= after + n, ACKS_TIMEOUT_S,
                       what=f"{n} more acknowledged operations")

        admin = FencingClient(cluster.endpoints, timeout_s=20.0, attempt_timeout_s=3.0)
        try:
            lease = admin.acquire(CONDITIONAL, ttl_ms=600_000, holder="upgrade-test")
            version = admin.write(CONDITIONAL, "k", b"v", token=lease.token).version
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                clients = [pool.submit(run_client, f"c{k}", cluster.endpoints, histories[k], list(RESOURCES), k + 1,
                                       stop) for k in range(2)]
                try:
                    more_acks(20)
                    for i in range(len(cluster.nodes)):
                        cluster.stop(i)
                        cluster.previous.discard(i)
                        cluster.start(i)
                        cluster.wait_answering([i], timeout_s=30.0)
                        more_acks()
                        if cluster.previous:
                            # Still a member of the previous release: refused before proposing.
                            with pytest.raises(Refused) as info:
                                _conditional_delete(cluster.nodes[i].api_address, lease.token, version)
                            assert info.value.reason == ErrorReason.CLUSTER_LEVEL_TOO_LOW, info.value
                            refusals.append(info.value.metadata)
                            assert admin.read(CONDITIONAL, "k").found  # nothing deleted
                            # Status says where the upgrade stands: level 1, this build applies more.
                            seen = admin.status(endpoint=cluster.nodes[i].api_address, local=True)
                            assert (seen.cluster_level, seen.entry_level) == (1, commands.ENTRY_LEVEL)
                    # Every member upgraded: the leader raises the level, and the op applies.
                    newest = cluster.nodes[-1].api_address
                    with pytest.raises(VersionMismatch):
                        _retry_past_level(lambda: _conditional_delete(newest, lease.token, version + 7))
                    assert _conditional_delete(newest, lease.token, version).deleted
                    seen = admin.status()
                    assert (seen.cluster_level, seen.entry_level) == (commands.ENTRY_LEVEL, commands.ENTRY_LEVEL)
                    assert not admin.read(CONDITIONAL, "k").found
                    more_acks()
                finally:
                    stop.set()
                    for client in clients:
                        client.result(timeout=60)
            final = str(tmp_path / "final.jsonl")
            write_final_states(cluster.endpoints, RESOURCES, final)
        except BaseException:
            print(cluster.logs())
            raise
        finally:
            admin.close()
    assert refusals == [{ErrorMeta.NEEDED_LEVEL: "2", ErrorMeta.CLUSTER_LEVEL: "1"}] * 2
    merged = tmp_path / "history.jsonl"
    with open(merged, "w", encoding="utf-8") as out:
        for path in [*histories, final]:
            with open(path, encoding="utf-8") as f:
                out.write(f.read())
    report = check_file(str(merged))
    print(format_report(report))
    assert report.ok, format_report(report)
    assert report.summary["final_states"] == len(RESOURCES)


def _retry_past_level(call):
    """``call()`` once the cluster level allows it: CLUSTER_LEVEL_TOO_LOW is retried until the
    leader's poll raised the level (LEVEL_RAISED_TIMEOUT_S), anything else is the answer."""
    deadline = time.monotonic() + LEVEL_RAISED_TIMEOUT_S
    while True:
        try:
            return call()
        except Refused as exc:
            if exc.reason != ErrorReason.CLUSTER_LEVEL_TOO_LOW or time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # the leader polls every LEVEL_POLL_INTERVAL_S

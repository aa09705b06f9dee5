"""The lock queue on a real three-process cluster: FIFO grants, fencing of each holder,
``fencingctl lock`` running a command (its environment, its exit status, its stop when an
admin force-releases the lease) and the election recipe.

Every test here runs real ``fencingd serve`` processes (testsupport.grpc_cluster) and waits by
polling with a deadline (``wait_until``), never by sleeping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from coordinator.client import FencingClient
from coordinator.client.election import Election
from coordinator.client.exceptions import StaleToken
from testsupport.supervisor import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A grant travels one RELEASE entry and one server-side wake-up: a second is generous.
GRANT_WAIT_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path_factory.mktemp("lock-cluster")), request)


def _endpoints(cluster) -> list[str]:
    return [n.api_address for n in cluster.nodes]


def _waiters(client: FencingClient, resource: str) -> int:
    return client.describe(resource).waiters


def test_three_clients_are_granted_in_arrival_order_and_each_holder_is_fenced(cluster):
    resource = "lock/fifo"
    eps = _endpoints(cluster)
    admin = FencingClient(eps)
    first = admin.lock(resource, ttl_ms=30_000, holder="first")
    granted: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        with FencingClient(eps) as client:
            try:
                lease = client.lock(resource, ttl_ms=30_000, holder=name, timeout_s=60)
                lease.write("owner", name.encode())  # accepted: this holder's token is current
                granted.append((name, lease.token))
                lease.release()  # the next in line is granted in this same entry
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

    threads = []
    for i, name in enumerate(["w1", "w2", "w3"]):
        thread = threading.Thread(target=worker, args=(name,))
        thread.start()
        threads.append(thread)
        # Arrival order is made certain: the next worker starts once this one is queued.
        wait_until(lambda: _waiters(admin, resource) == i + 1, timeout_s=GRANT_WAIT_S, what=f"{name} queued")
    first.release()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert [name for name, _ in granted] == ["w1", "w2", "w3"]
    tokens = [token for _, token in granted]
    assert tokens == sorted(tokens) and tokens[0] > first.token
    # Each holder but the last is fenced by the next grant: its token is stale now.
    for stale in [first.token, *tokens[:-1]]:
        with pytest.raises(StaleToken):
            admin.write(resource, "owner", b"late", token=stale)
    assert admin.read(resource, "owner").value == b"w3"
    admin.close()


def _ctl(eps: list[str], *argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", ",".join(eps), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )


def test_fencingctl_lock_runs_the_command_with_the_token_and_exits_with_its_status(cluster):
    eps = _endpoints(cluster)
    script = (
        "import os, sys; "
        "print(os.environ['FENCING_RESOURCE'], os.environ['FENCING_TOKEN'], "
        "repr(os.environ['FENCING_TOKEN_PROOF'])); sys.exit(7)"
    )
    proc = _ctl(eps, "lock", "lock/ctl", "--ttl-ms", "3000", "--", sys.executable, "-c", script)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    resource, token, _proof = out.split(" ", 2)
    assert resource == "lock/ctl" and int(token) >= 1
    with FencingClient(eps) as client:
        described = client.describe("lock/ctl")
        assert not described.held  # released when CMD exited


TERM_SCRIPT = """
import signal, sys, time
def stop(signum, frame):
    print("cmd: got SIGTERM, exiting", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("cmd: started", flush=True)
while True:
    time.sleep(0.05)
"""

IGNORE_TERM_SCRIPT = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("cmd: started, ignoring SIGTERM", flush=True)
while True:
    time.sleep(0.05)
"""


def _stop_by_force_release(eps: list[str], resource: str, script: str, *extra: str) -> tuple[int, str, str]:
    proc = _ctl(eps, "lock", resource, "--ttl-ms", "3000", *extra, "--", sys.executable, "-u", "-c", script)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    with FencingClient(eps) as admin:
        wait_until(lambda: any(line.startswith("cmd: started") for line in lines), timeout_s=GRANT_WAIT_S,
                   what="the command to start")
        held = admin.describe(resource)
        assert held.held
        admin.force_release(resource)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        assert not admin.describe(resource).held
    return proc.returncode, "".join(lines), proc.stderr.read()


def test_fencingctl_lock_sigterms_its_command_when_an_admin_force_releases_the_lease(cluster):
    code, out, err = _stop_by_force_release(_endpoints(cluster), "lock/kill", TERM_SCRIPT)
    print(f"--- transcript (exit {code}) ---\n{out}{err}")
    assert code == 143
    assert "cmd: got SIGTERM" in out
    assert "lost" in err and "sending SIGTERM" in err and "SIGKILL" not in err


def test_fencingctl_lock_sigkills_a_command_that_ignores_sigterm_after_the_grace(cluster):
    code, out, err = _stop_by_force_release(
        _endpoints(cluster), "lock/kill9", IGNORE_TERM_SCRIPT, "--grace-s", "0.5"
    )
    print(f"--- transcript (exit {code}) ---\n{out}{err}")
    assert code == 128 + 9
    assert "sending SIGKILL" in err


def test_election_campaign_observe_resign(cluster):
    eps = _endpoints(cluster)
    resource = "election/scheduler"
    with FencingClient(eps) as a, FencingClient(eps) as b, FencingClient(eps) as watcher:
        alice, bob = Election(a, resource, ttl_ms=5000), Election(b, resource, ttl_ms=5000)
        lead = alice.campaign("alice")
        seen: list[str | None] = []
        stop = threading.Event()
        observer = threading.Thread(
            target=lambda: seen.extend(Election(watcher, resource, ttl_ms=5000).observe(interval_s=0.1, stop=stop)),
            daemon=True,
        )
        observer.start()
        bob_lead: list = []
        campaigner = threading.Thread(target=lambda: bob_lead.append(bob.campaign("bob", timeout_s=60)))
        campaigner.start()
        wait_until(lambda: _waiters(watcher, resource) == 1, timeout_s=GRANT_WAIT_S, what="bob in line")
        assert alice.leader() == "alice"
        alice.resign()
        campaigner.join(timeout=60)
        assert bob_lead and bob_lead[0].token > lead.token
        wait_until(lambda: seen[-1:] == ["bob"], timeout_s=GRANT_WAIT_S, what="the observer to see bob")
        stop.set()
        observer.join(timeout=10)
        assert seen == ["alice", "bob"]
        with pytest.raises(StaleToken):  # the old leader's term is over at every fenced resource
            a.write(resource, "plan", b"alice's", token=lead.token)
        bob.resign()
        assert bob.leader() is None

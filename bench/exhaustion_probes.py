"""``python -m bench probes``: issue 26's seven exhaustion and impersonation probes, measured
again on real ``fencingd serve`` members, each printed beside the figure the issue quoted.

One three-member cluster as the issue's (peer secret, principals file with two tenants and an
admin, admin token, an audit log and a metrics endpoint per member; every other setting the
default, only election timings shortened as in the tests) runs probes 1, 3, 4, 5 and 7; probe
2 (bench/_exhaustion_term.py) has clusters of its own, probe 6 one member.
The helpers are the tests' (tests/test_stream_admission.py, test_log_bounds.py,
test_peer_auth.py, test_metrics_http.py, test_api_connections.py, testsupport/), so a probe
measures what its test checks. Figures only, nothing asserted: each probe ends with the
SECURITY.md claim it measures and "holds" or "DOES NOT HOLD" (exit 1 if one does not).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2_grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.core import limits
from coordinator.server import config as config_mod
from coordinator.server.auth import token_digest
from tests.test_api_connections import closed_by_server
from tests.test_log_bounds import BIG, big_call
from tests.test_metrics_http import HALF_SENT
from tests.test_peer_auth import RELAY_WINDOW_S
from tests.test_server_limits import auth, token_of
from tests.test_stream_admission import Streams
from testsupport.grpc_cluster import GrpcCluster, metric_value, write_toml
from testsupport.raft_peer import Relay, secret_settings
from testsupport.supervisor import DEFAULT_HOSTS, child_env, pick_ports, wait_until

SECRET = "exhaustion-probes-secret-0123456789abcdef"
ADMIN_TOKEN = "exhaustion-probes-admin-token"
TENANTS, ADMIN = ("x", "y"), "ops"
T = 5.0  # RPC deadline of a setup call
PROBE_DEADLINE_S = 3.0  # the issue's: Health.Check and Status "time out after 3 s"
STREAMS = 64  # probe 1: idle streams on one connection
BIG_CALLS = 50  # probe 3: calls with a 4 MB field per caller
HALF_SENT_CONNECTIONS = 150  # probe 7
CLOSE_MARGIN_S = 3.0  # probe 7: past metrics_request_timeout_s
START_REFUSAL_WAIT_S = 30.0  # probe 6 and 2: a refused start exits in a second or two

ISSUE = {
    1: "64 idle ServerReflectionInfo streams, no token: Health.Check and Status time out after 3 s "
       "(baseline 0.00 s / 0.06 s); threads 14 -> 77",
    2: "prlimit --nofile=400 + 450 idle API connections, then a higher-term vote request: leader went on "
       "leading term 6 with raft.meta at term 1 ('failed _onTick' swallowed); 3,000 idle connections held "
       "3,000 descriptors with no timeout",
    3: "50 unauthenticated MemberAdd/ForceRelease with a 4 MB field: audit file and process log +200 MB each "
       "in 4.1 s (~100 MB/s); non-admin principal ~67 MB/s",
    4: "B stopped, relay on B's Raft address -> A: 30 swaps of C's connection in 8 s; writes 519 ok / 0 failed "
       "in 4 s without, 187 ok / 53 failed in 5 s with the relay",
    5: "X writes 100,000 fresh op_ids (7,297/s): Y's Acquire retry LEASE_HELD against its own lease, Y's Write "
       "retry applied twice; the 600 s retention turned over every 14 s",
    6: "API on 0.0.0.0, no TLS/principals/admin token: starts with a warning; anonymous MemberRemove removed a voter",
    7: "150 half-sent metrics requests: +150 threads, all 150 open after 20 s",
}
CLAIM = {
    1: "streams of every service count under the caps and end when idle; health and unary calls find a thread",
    2: "a member that cannot save a new term exits 71 with one line; raft.meta holds every term it acted in; "
       "connections are capped and descriptors kept for Raft and the journal",
    3: "refused calls cost a few short lines per window, never the bytes sent (a few KB)",
    4: "a relay on a stopped member's address never replaces or disturbs a member's connection",
    5: "one tenant's op_ids cannot evict another's within the retention",
    6: "an API beyond loopback without authentication refuses to start, one line naming insecure_api (exit 2)",
    7: "at most metrics_connections_max connections, each at most metrics_request_timeout_s, on one thread",
}


def report(number: int, title: str, now: list[str], holds: bool) -> bool:
    print(f"\n== {number}. {title}")
    print(f"   issue (main then): {ISSUE[number]}")
    for line in now:
        print(f"   now:               {line}")
    print(f"   SECURITY.md:       {CLAIM[number]} -> {'holds' if holds else 'DOES NOT HOLD'}", flush=True)
    return holds


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def timed(call) -> str:
    """Seconds ``call`` took, or how it failed."""
    started = time.perf_counter()
    try:
        call()
    except grpc.RpcError as err:
        return f"{err.code().name} after {time.perf_counter() - started:.2f} s"
    return f"{time.perf_counter() - started:.2f} s"


def principals_file(base: str) -> str:
    path = os.path.join(base, "principals.toml")
    with open(path, "w", encoding="utf-8") as f:
        for name in TENANTS:
            f.write(f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{token_digest(token_of(name))}"\n'
                    f'prefixes = ["{name}/"]\n\n')
        f.write(f'[[principal]]\nname = "{ADMIN}"\ntoken_sha256 = "{token_digest(token_of(ADMIN))}"\nadmin = true\n')
    return path


def probe_cluster(base: str, cls=GrpcCluster, node_settings: dict | None = None) -> GrpcCluster:
    """A cluster as the issue's: secret, principals, admin token; audit log and metrics per member."""
    os.makedirs(base, exist_ok=True)
    metrics_port, _ = pick_ports(DEFAULT_HOSTS)
    per_node = {i: {"audit_log_path": os.path.join(base, f"audit{i}.log"), "metrics_address": f"{h}:{metrics_port}",
                    **(node_settings or {}).get(i, {})} for i, h in enumerate(DEFAULT_HOSTS)}
    settings = {"principals_file": principals_file(base), "admin_token": ADMIN_TOKEN, **secret_settings(base, SECRET)}
    cluster = cls(base, settings=settings, node_settings=per_node)
    cluster.metrics_urls = [f"http://{h}:{metrics_port}/metrics" for h in DEFAULT_HOSTS]
    return cluster


def leader_of(cluster, among=None) -> int:
    """Index of the leader every member of ``among`` (default: every running one) names."""
    among = [n for n in cluster.nodes if n.up] if among is None else among

    def agreed():
        named = {n.cluster.Status(pb.StatusRequest(), timeout=1.5, metadata=auth("x")).leader for n in among}
        node = cluster.node_by_raft(named.pop()) if len(named) == 1 else None
        return (node.index,) if node is not None and node.up else None

    return wait_until(agreed, 30.0, interval_s=0.1, what="the members to agree on a leader")[0]


def term_of(node) -> int:
    return node.cluster.Status(pb.StatusRequest(), timeout=T, metadata=auth("x")).term


# -- 1: idle streams -------------------------------------------------------------------------
def _flood_streams(channel, kind: str, metadata) -> Streams:
    streams = Streams()
    for _ in range(STREAMS):
        if kind == "Health.Watch":
            stub = health_pb2_grpc.HealthStub(channel)
            streams.open(lambda _s, stub=stub: stub.Watch(health_pb2.HealthCheckRequest(), timeout=120))
        else:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            streams.open(lambda s, stub=stub: stub.ServerReflectionInfo(s, timeout=120, metadata=metadata))
    return streams


def probe_streams(cluster) -> bool:
    node, pid = cluster.nodes[0], cluster.pids[0]
    check = lambda: node.health.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_DEADLINE_S)  # noqa: E731
    status = lambda: node.cluster.Status(pb.StatusRequest(), timeout=PROBE_DEADLINE_S, metadata=auth("x"))  # noqa: E731
    lines = [f"baseline: Health.Check {timed(check)}, Status {timed(status)}"]
    holds = True
    for kind, metadata in (("reflection, no token", ()), ("Health.Watch, no token", ()),
                           ("reflection, tenant token", auth("y"))):
        before = threads(pid)
        channel = grpc.insecure_channel(node.api_address)  # one connection for all of them
        streams = _flood_streams(channel, kind.split(",")[0], metadata)
        try:
            try:  # every stream refused (ended) or admitted (a Watch replies; a reflection stream sends nothing)
                wait_until(lambda s=streams: len(s.ended) + len(s.first_replies) >= STREAMS, 5.0)
            except TimeoutError:
                pass  # admitted reflection streams that sent nothing stay open: counted below
            during, health_s, status_s = threads(pid), timed(check), timed(status)
            outcomes = (f"{code.name}{'/' + lim if lim else ''}" for code, lim in streams.ended.values())
            ended = dict(collections.Counter(outcomes))
            held = STREAMS - len(streams.ended)
        finally:
            streams.close()
            channel.close()
        holds &= "after" not in health_s + status_s
        lines.append(f"{STREAMS} idle {kind}: Health.Check {health_s}, Status {status_s}; threads {before} -> "
                     f"{during}; refused {ended or 0}, held open {held}")
    return report(1, "idle streams take every API thread", lines, holds)


# -- 3: audit amplification ------------------------------------------------------------------
def _sizes(cluster, index: int) -> tuple[int, int]:
    audit = os.path.join(cluster.base_dir, f"audit{index}.log")
    return (os.path.getsize(audit) if os.path.exists(audit) else 0), os.path.getsize(cluster.nodes[index].log_path)


def probe_audit(cluster) -> bool:
    index = 1
    node = cluster.nodes[index]
    lines, holds = [], True
    for who, metadata in (("no credential", ()), ("non-admin principal", auth("x"))):
        audit0, log0 = _sizes(cluster, index)
        started = time.monotonic()
        codes = {big_call(node, i, metadata).name for i in range(BIG_CALLS)}
        took = time.monotonic() - started
        time.sleep(0.5)  # a duration: lets the last lines reach the files (no line to poll for)
        audit1, log1 = _sizes(cluster, index)
        grown = (audit1 - audit0) + (log1 - log0)
        holds &= grown < 64 * 1024  # tests/test_log_bounds.py's LOG_GROWTH_BYTES_MAX
        lines.append(f"{BIG_CALLS} calls with a {len(BIG) / 1e6:.0f} MB field, {who}, in {took:.1f} s "
                     f"({sorted(codes)}): audit file +{(audit1 - audit0) / 1024:.1f} KB, "
                     f"process log +{(log1 - log0) / 1024:.1f} KB")
    return report(3, "audit amplification", lines, holds)


# -- 4: relay on a stopped member's address --------------------------------------------------
def write_for(client, lease, seconds: float) -> tuple[int, int]:
    ok = failed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            client.write(lease.resource, "k", b"v", token=lease.token, timeout_s=1.0)
            ok += 1
        except Exception:  # noqa: BLE001 - every failed write is counted
            failed += 1
    return ok, failed


def log_text(node, offset: int = 0) -> str:
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        return f.read()


def probe_relay(cluster) -> bool:
    a, b, c = cluster.nodes
    url = cluster.metrics_urls[a.index]
    refused = lambda: metric_value(url, 'fencing_raft_refused_bindings_total{reason="misdialled"}', 0.0)  # noqa: E731
    replaced = lambda: metric_value(url, "fencing_raft_peer_connections_replaced_total", 0.0)  # noqa: E731
    cluster.stop(b.index)
    try:
        leader_of(cluster)
        with FencingClient([a.api_address, c.api_address], bearer_token=token_of("x")) as client:
            lease = client.acquire(f"x/relay-{os.urandom(4).hex()}", holder="probe", ttl_ms=600_000)
            base_ok, base_failed = write_for(client, lease, RELAY_WINDOW_S)
            replaced0, refused0, log_from = replaced(), refused(), os.path.getsize(a.log_path)
            with Relay(b.raft_address, a.raft_address) as relay:
                ok, failed = write_for(client, lease, RELAY_WINDOW_S)
                relay.stop_listening()
                forwarded = relay.forwarded
        swaps = log_text(a, log_from).count(f"peer {c.raft_address} connected again")
        swapped = replaced() - replaced0
        lines = [f"B stopped, no relay, {RELAY_WINDOW_S:g} s: writes {base_ok} ok / {base_failed} failed",
                 f"relay on B's Raft address -> A, {RELAY_WINDOW_S:g} s: {forwarded} dials relayed, A swapped C's "
                 f"connection {swaps} times (log) / {swapped:g} (metric), refused {refused() - refused0:g} as "
                 f"misdialled; writes {ok} ok / {failed} failed"]
    finally:
        cluster.start(b.index)
        cluster.wait_serving()
    holds = swaps == 0 and swapped == 0 and failed == 0 and forwarded > 0
    return report(4, "relay on a stopped member's address", lines, holds)


# -- 5: dedup flood --------------------------------------------------------------------------
def _flood(node, token: int, writes_max: int, seconds: float) -> tuple[int, float]:
    """X's WriteMany batches with fresh op_ids from 4 threads until ``writes_max`` or ``seconds``."""
    counter, batch = itertools.count(), limits.WRITE_MANY_ITEMS_MAX
    deadline = time.monotonic() + seconds

    def worker() -> int:
        applied = 0
        while next(counter) * batch < writes_max and time.monotonic() < deadline:
            items = [pb.WriteRequest(resource="x/flood", key="k", value=b"v", token=token, op_id=os.urandom(16))
                     for _ in range(batch)]
            reply = node.store.WriteMany(pb.WriteManyRequest(writes=items), timeout=30, metadata=auth("x"))
            applied += sum(r.WhichOneof("outcome") == "write" for r in reply.results)
        return applied

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        applied = sum(pool.map(lambda _: worker(), range(4)))
    return applied, time.monotonic() - started


def probe_dedup(cluster, writes_max: int, seconds: float) -> bool:
    node = cluster.nodes[leader_of(cluster)]
    acquire = pb.AcquireRequest(resource="y/lock", holder="y", ttl_ms=600_000, op_id=os.urandom(16))
    first = node.lease.Acquire(acquire, timeout=T, metadata=auth("y"))
    write = pb.WriteRequest(resource="y/lock", key="k", value=b"once", token=first.token, op_id=os.urandom(16))
    wrote = node.store.Write(write, timeout=T, metadata=auth("y"))
    x_lease = node.lease.Acquire(pb.AcquireRequest(resource="x/flood", holder="x", ttl_ms=600_000,
                                                   op_id=os.urandom(16)), timeout=T, metadata=auth("x"))
    applied, took = _flood(node, x_lease.token, writes_max, seconds)
    lines = [f"X wrote {applied:,} fresh op_ids in {took:.1f} s ({applied / took:,.0f}/s)"]
    holds = True
    for member in cluster.nodes:
        try:
            again = member.lease.Acquire(acquire, timeout=T, metadata=auth("y"))
            same_acquire = (again.token, again.expires_at_ms) == (first.token, first.expires_at_ms)
            rewrote = member.store.Write(write, timeout=T, metadata=auth("y"))
            same_write = (rewrote.version, rewrote.hwm) == (wrote.version, wrote.hwm)
        except grpc.RpcError as err:
            same_acquire = same_write = False
            lines.append(f"member {member.index}: {err.code().name} {err.details()}")
        holds &= same_acquire and same_write
        lines.append(f"member {member.index}: Y's Acquire retry {'same token' if same_acquire else 'DIFFERENT'}, "
                     f"Write retry {'same version' if same_write else 'DIFFERENT'}")
    read = node.store.Read(pb.ReadRequest(resource="y/lock", key="k"), timeout=T, metadata=auth("y"))
    holds &= read.version == wrote.version
    lines.append(f"Y's key: version {read.version} (first write {wrote.version}: "
                 f"{'applied once' if read.version == wrote.version else 'APPLIED AGAIN'}); X's own window: "
                 f"{limits.PRINCIPAL_DEDUP_ENTRIES_MAX:,} entries at {applied / took:,.0f}/s = "
                 f"{limits.PRINCIPAL_DEDUP_ENTRIES_MAX * took / max(applied, 1):.0f} s")
    return report(5, "one tenant's dedup flood", lines, holds)


# -- 7: metrics port -------------------------------------------------------------------------
def _metrics_counts(url: str) -> tuple[float, float]:
    return (metric_value(url, "fencing_metrics_connections_refused_total", 0.0),
            metric_value(url, "fencing_metrics_connections_timed_out_total", 0.0))


def _half_sent(host: str, port: int) -> list[socket.socket]:
    socks = []
    for _ in range(HALF_SENT_CONNECTIONS):
        sock = socket.create_connection((host, port), timeout=5)
        try:
            sock.sendall(HALF_SENT)
        except OSError:
            pass  # closed on arrival
        socks.append(sock)
    return socks


def probe_metrics(cluster) -> bool:
    index = 2
    pid, url = cluster.pids[index], cluster.metrics_urls[index]
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    defaults = config_mod.ServerConfig()
    refused0, timed_out0 = _metrics_counts(url)
    threads0, fds0 = threads(pid), fds(pid)
    socks = _half_sent(host, int(port))
    opened = time.monotonic()
    try:
        time.sleep(0.5)  # a duration: the member's loop accepts (and refuses) them meanwhile
        threads1, fds1 = threads(pid), fds(pid)
        seen = [(0.5, sum(not closed_by_server(s) for s in socks))]
        for at in (2.0, defaults.metrics_request_timeout_s + CLOSE_MARGIN_S):
            time.sleep(max(0.0, opened + at - time.monotonic()))  # a duration: open after this long
            seen.append((at, sum(not closed_by_server(s) for s in socks)))
        threads2 = threads(pid)
    finally:
        for s in socks:
            s.close()
    refused1, timed_out1 = _metrics_counts(url)  # readable again: nothing of ours is held
    with urllib.request.urlopen(url, timeout=T) as reply:
        scrape = reply.status == 200 and b"fencing_build_info" in reply.read()
    open_seen = ", ".join(f"{n} at {at:g} s" for at, n in seen)
    lines = [f"{HALF_SENT_CONNECTIONS} half-sent requests: threads {threads0} -> {threads1} (after {threads2}), "
             f"descriptors {fds0} -> {fds1}; still open as the client sees them: {open_seen}",
             f"the member's counts: refused on arrival {refused1 - refused0:g}, closed at the deadline "
             f"{timed_out1 - timed_out0:g}; a scrape afterwards {'answers' if scrape else 'FAILS'}"]
    holds = (threads1 - threads0 < 3 and fds1 - fds0 <= defaults.metrics_connections_max + 2
             and seen[-1][1] == 0 and scrape)
    return report(7, "slow metrics clients", lines, holds)


# -- 6: open API defaults --------------------------------------------------------------------
def probe_open_api(base: str) -> bool:
    raft_port, api_port = pick_ports(("127.0.0.2",))
    path = os.path.join(base, "open.toml")
    write_toml(path, {"data_dir": os.path.join(base, "open-data"), "raft_address": f"127.0.0.2:{raft_port}",
                      "members": [f"127.0.0.2:{raft_port}=127.0.0.2:{api_port}"],
                      "listen_address": f"0.0.0.0:{api_port}", "initial_cluster_state": "new",
                      **secret_settings(base, SECRET)})
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        out, err = proc.communicate(timeout=START_REFUSAL_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return report(6, "open API defaults", [f"still running after {START_REFUSAL_WAIT_S:g} s: it STARTED"], False)
    lines = [f"exit {proc.returncode}, {len(err.splitlines())} line(s) on stderr, "
             f"{'READY printed' if 'READY' in out else 'no READY'}: {err.strip()[:400]}"]
    holds = proc.returncode == 2 and len(err.splitlines()) == 1 and "insecure_api" in err
    return report(6, "open API defaults", lines, holds)


# -- the run ---------------------------------------------------------------------------------
def run_probes(probes: list[int], base: str, args) -> dict[int, bool | None]:
    results: dict[int, bool | None] = {}

    def attempt(number: int, run) -> None:
        if number not in probes:
            return
        try:
            results[number] = run()
        except Exception as exc:  # noqa: BLE001 - one probe failing must not hide the others' figures
            results[number] = None
            print(f"\n== {number}. could not be measured: {type(exc).__name__}: {exc}", flush=True)

    if set(probes) & {1, 3, 4, 5, 7}:
        with probe_cluster(os.path.join(base, "main")) as cluster:
            cluster.start_all()
            leader_of(cluster)
            attempt(1, lambda: probe_streams(cluster))
            attempt(3, lambda: probe_audit(cluster))
            attempt(7, lambda: probe_metrics(cluster))
            attempt(4, lambda: probe_relay(cluster))
            attempt(5, lambda: probe_dedup(cluster, args.flood_writes, args.flood_s))
    attempt(6, lambda: probe_open_api(base))
    from bench._exhaustion_term import probe_term_durability  # it builds on this module's helpers

    attempt(2, lambda: probe_term_durability(base))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench probes", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="1,2,3,4,5,6,7", help="comma-separated probe numbers (default: all)")
    p.add_argument("--flood-writes", type=int, default=100_000, help="probe 5: X's writes at most (default 100,000)")
    p.add_argument("--flood-s", type=float, default=60.0, help="probe 5: X's flood lasts at most this (default 60 s)")
    p.add_argument("--keep", action="store_true", help="keep the members' data dirs and logs (printed)")
    args = p.parse_args(argv)
    try:
        probes = sorted({int(n) for n in args.only.split(",") if n.strip()})
    except ValueError:
        probes = [0]
    if not probes or not set(probes) <= set(ISSUE):
        p.error(f"--only: probe numbers among {', '.join(map(str, ISSUE))}, comma-separated (got {args.only!r})")
    base = tempfile.mkdtemp(prefix="exhaustion-probes-")
    started = time.monotonic()
    try:
        results = run_probes(probes, base, args)
    finally:
        if args.keep:
            print(f"\nlogs and data dirs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    verdicts = {n: ("holds" if ok else "DOES NOT HOLD" if ok is False else "not measured") for n, ok in results.items()}
    print(f"\nsummary ({time.monotonic() - started:.0f} s): " + ", ".join(f"{n}: {v}" for n, v in verdicts.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

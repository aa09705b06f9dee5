"""Probe 2 of ``python -m bench probes`` (bench/exhaustion_probes.py): term durability when a
member's descriptors or disk run out (issue 26, finding 2).

Three clusters as the issue's (exhaustion_probes.probe_cluster), in turn:
- member 2 under ``prlimit --nofile=400``: started on the defaults (it should refuse, naming
  ``api_connections_max``), then with the value its refusal names; 450 idle API connections
  with no credential and an election (the leader paused): does it save its new term, can new
  clients connect, do writes go on?
- the same member, its soft descriptor limit then set below what it holds (as
  tests/test_raft_durable_term_process.py does) and the leader paused again: EMFILE;
- member 2's data dir on a small filesystem of its own (chaos.small_fs, loop mount: needs
  root), filled, and the leader paused: ENOSPC.
For the last two: the exit code, the FATAL lines, and ``raft.meta``'s term beside the highest
term the member acted in.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.exhaustion_probes import (
    START_REFUSAL_WAIT_S,
    fds,
    leader_of,
    log_text,
    probe_cluster,
    report,
    term_of,
    timed,
    write_for,
)
from chaos.leader_reports import highest_term_logged
from chaos.small_fs import SmallFs, write_refused_with_enospc
from coordinator.client import FencingClient
from coordinator.raft.fatal import EXIT_DISK_FAILED
from coordinator.raft.journal import META_NAME, read_meta
from coordinator.server import api_conns
from coordinator.server import config as config_mod
from tests.test_server_limits import token_of
from testsupport.grpc_cluster import GrpcCluster
from testsupport.supervisor import wait_until

FD_LIMIT = 400  # the prlimit --nofile=400
IDLE_CONNECTIONS = 450  # idle API connections, no credential
CONNECTION_SOURCES = 5  # ... from this many loopback addresses (90 each, under the per-peer cap)
FRESH_TRIES = 10  # new connections tried at each look
FD_BELOW_HELD = 4  # the soft limit this far below what the member holds (as the test)
EXIT_WAIT_S = 30.0  # an election and a vote round, on a loaded machine
SMALL_FS_BYTES = 16 * 1024 * 1024  # as the test: fills in a fraction of a second


class LimitedCluster(GrpcCluster):
    """Member ``limited`` runs under ``prlimit --nofile=N:N``, as the issue's members did."""

    limited, nofile = 2, FD_LIMIT

    def command(self, node):
        prefix = ["prlimit", f"--nofile={self.nofile}:{self.nofile}"] if node.index == self.limited else []
        return prefix + super().command(node)


def _start_refused(cluster, victim) -> str:
    """Start the limited member on the defaults: how it ends (it should refuse, exit 2)."""
    cluster.spawn(victim.index)
    try:
        code = victim.proc.wait(timeout=START_REFUSAL_WAIT_S)
    except subprocess.TimeoutExpired:
        return f"with the defaults under nofile={FD_LIMIT} it STARTED (no refusal)"
    refusal = [line for line in log_text(victim).splitlines() if "api_connections_max" in line]
    return f"defaults under nofile={FD_LIMIT}: exit {code}: {(refusal or ['(no line)'])[-1][:300]}"


def _idle_connections(node, count: int) -> list[socket.socket]:
    host, port = node.api_address.rsplit(":", 1)
    socks = []
    for i in range(count):
        sock = socket.socket()
        sock.bind((f"127.0.{60 + i % CONNECTION_SOURCES}.1", 0))
        sock.settimeout(2.0)
        try:
            sock.connect((host, int(port)))
        except OSError:
            sock.close()
            continue
        socks.append(sock)
    return socks


def _follower_victim(cluster, victim) -> int:
    """The leader's index once ``victim`` follows (pausing it once if it led)."""
    leader = leader_of(cluster)
    if leader == victim.index:
        cluster.pause(leader)
        leader = leader_of(cluster, [n for n in cluster.nodes if n.up])
        cluster.resume(victim.index)
        leader = leader_of(cluster)
    return leader


def _fresh_health(node) -> str:
    """Health.Check over new connections: can a client still connect while the API is full?"""
    answered = 0
    for _ in range(FRESH_TRIES):
        # a pool of its own: a channel with the same target and options would share the
        # subchannel (the TCP connection) of one opened before, and prove nothing
        with grpc.insecure_channel(node.api_address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answered += "after" not in timed(lambda s=stub: s.Check(health_pb2.HealthCheckRequest(), timeout=1.0))
    return f"{answered}/{FRESH_TRIES}"


def _election_with_connections(cluster, victim) -> tuple[list[str], bool]:
    leader = _follower_victim(cluster, victim)
    term0, fds0 = term_of(victim), fds(victim.proc.pid)
    socks = _idle_connections(victim, IDLE_CONNECTIONS)
    try:
        fresh = [_fresh_health(victim)]
        time.sleep(api_conns.PEER_SCAN_INTERVAL_S + 1.0)  # a duration: the per-address scan runs meanwhile
        held_fds = fds(victim.proc.pid)
        fresh.append(_fresh_health(victim))
        cluster.pause(leader)  # the other two elect: the victim must save a higher term
        try:
            new = leader_of(cluster, [n for n in cluster.nodes if n.up])  # over channels opened before
            term1 = term_of(victim)
            meta = read_meta(os.path.join(victim.data_dir, META_NAME))
            up = sorted((n for n in cluster.nodes if n.up), key=lambda n: n is victim)  # victim's API last
            with FencingClient([n.api_address for n in up], bearer_token=token_of("x")) as client:
                lease = client.acquire(f"x/fd-{os.urandom(4).hex()}", holder="probe", ttl_ms=60_000)
                ok, failed = write_for(client, lease, 2.0)
            fresh.append(_fresh_health(victim))
        finally:
            cluster.resume(leader)
    finally:
        for s in socks:
            s.close()
    return [f"{len(socks)} idle API connections (no credential, {CONNECTION_SOURCES} addresses): member's "
            f"descriptors {fds0} -> {held_fds} (limit {FD_LIMIT}); new connections answering Health.Check at once, "
            f"after 2 s and after the election: {', '.join(fresh)}",
            f"leader paused: member {victim.index}'s term {term0} -> {term1}, raft.meta term "
            f"{meta[0] if meta else None}, member {'running' if victim.alive else 'EXITED'}, new leader member "
            f"{new}; writes meanwhile {ok} ok / {failed} failed"], (term1 == (meta or (0,))[0] and victim.alive)


def _limit_descriptors(victim) -> str:
    held = fds(victim.proc.pid)
    _soft, hard = resource.prlimit(victim.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(victim.proc.pid, resource.RLIMIT_NOFILE, (held - FD_BELOW_HELD, hard))
    return f"EMFILE: soft descriptor limit set to {held - FD_BELOW_HELD} (it held {held})"


def _exhausted_election(cluster, victim, exhaust) -> tuple[list[str], bool]:
    """``exhaust(victim)`` (returns what it did), then the leader paused: how the victim ends."""
    leader = _follower_victim(cluster, victim)
    term0 = term_of(victim)
    wait_until(lambda: (read_meta(os.path.join(victim.data_dir, META_NAME)) or (0,))[0] == term0, 5.0)
    victim.close_channel()
    log_from = os.path.getsize(victim.log_path)
    what = exhaust(victim)
    cluster.pause(leader)
    try:
        code = victim.proc.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        cluster.resume(leader)
    text = log_text(victim, log_from)
    fatal = [line for line in text.splitlines() if "FATAL" in line]
    meta = read_meta(os.path.join(victim.data_dir, META_NAME))
    logged = highest_term_logged(victim.log_path, log_from)
    acted = max(term0, logged or 0)
    lines = [f"{what}, leader paused: exit {code if code is not None else f'NONE within {EXIT_WAIT_S:g} s'}, "
             f"{len(fatal)} FATAL line(s), 'failed _onTick' {text.count('failed _onTick')} times",
             f"FATAL: {fatal[0][:300] if fatal else '-'}",
             f"term before {term0}, highest term in its log since {logged}, raft.meta term "
             f"{meta[0] if meta else None} ({'= ' if meta and meta[0] == acted else 'BELOW '}the highest it acted in)"]
    holds = code == EXIT_DISK_FAILED and len(fatal) == 1 and meta is not None and meta[0] == acted
    return lines, holds


def _full_disk(base: str) -> tuple[list[str], bool]:
    """Member 2's data dir on a small filesystem, filled while it follows: ENOSPC."""
    os.makedirs(base, exist_ok=True)
    fs = SmallFs(os.path.join(base, "fs.img"), os.path.join(base, "fs"), SMALL_FS_BYTES)
    fs.mount()
    try:
        cluster = probe_cluster(os.path.join(base, "disk"), node_settings={2: {"data_dir": fs.data_dir}})
        victim = cluster.nodes[2]
        victim.data_dir = fs.data_dir
        with cluster:
            cluster.start_all()

            def fill(_victim) -> str:
                filled = fs.fill()
                refused = write_refused_with_enospc(fs.data_dir)
                return f"ENOSPC: data dir's filesystem filled ({filled:,} bytes; a new write refused: {refused})"

            return _exhausted_election(cluster, victim, fill)
    finally:
        fs.umount()


def probe_term_durability(run_base: str) -> bool:
    base = os.path.join(run_base, "limited")
    cluster = probe_cluster(base, LimitedCluster)
    victim = cluster.nodes[LimitedCluster.limited]
    with cluster:
        lines = [_start_refused(cluster, victim)]
        fits = FD_LIMIT - api_conns.fd_reserve(config_mod.ServerConfig(metrics_address="x:1"))
        with open(victim.config_path, "a", encoding="utf-8") as f:
            f.write(f"api_connections_max = {fits}\n")
        cluster.start_all()
        more, saved = _election_with_connections(cluster, victim)
        lines += [f"restarted with api_connections_max = {fits}: " + more[0], more[1]]
        exhausted, stopped = _exhausted_election(cluster, victim, _limit_descriptors)
        lines += exhausted
    try:
        full, stopped_full = _full_disk(os.path.join(run_base, "enospc"))
    except Exception as exc:  # noqa: BLE001 - e.g. no loop mount without root: the EMFILE figures stand
        full, stopped_full = [f"ENOSPC: could not be measured: {type(exc).__name__}: {exc}"], False
    lines += full
    return report(2, "term durability under descriptor and disk exhaustion", lines, saved and stopped and stopped_full)

"""One ``fencingd serve`` process: a Raft node plus a gRPC server in front of it.

Owns: building the grpc.server (bounded thread pool, ``maximum_concurrent_rpcs``, message size
limits), wiring and registering the fencing services (``add_services``, which the in-memory
test cluster uses too), the standard health service and server reflection (off with
``reflection = false``), the admission of every streaming RPC under the stream caps
(stream_admission.py), the health updater and lease ticker threads, the audit log, the metrics
endpoint (when ``metrics_address`` is set), the API's connection limits and descriptor budget
(api_conns.py), the API's TLS credentials (their certificate replaced on SIGHUP, certs.py),
the peer secrets' reload on SIGHUP, and graceful shutdown.
Must never: implement an RPC (service.py and admin.py do) or touch the Raft library (coordinator.raft does).

Health (grpc.health.v1), overall ("") and per service: SERVING only while this member is
connected to a quorum *and* a READ_BARRIER has applied on it since it started (so it has
caught up with at least one leader's log); NOT_SERVING otherwise. Re-checked every
``health_check_interval_s``; the updater proposes the barrier itself when none has applied.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import os
import threading
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.core import limits, ops
from coordinator.core.state_machine import FencingStateMachine
from coordinator.raft.node import RaftConfig, RaftNode
from coordinator.server import api_conns, level_poller, listen_check
from coordinator.server.admin import AdminServicer
from coordinator.server.auth import Authenticator
from coordinator.server.certs import ApiCertificates, TlsMaterial
from coordinator.server.config import ConfigError, ServerConfig
from coordinator.server.errors import ServiceError, uncounted
from coordinator.server.lease_ticker import LeaseTicker
from coordinator.server.log_limits import RefusedLines
from coordinator.server.metrics import Metrics
from coordinator.server.proposer import Proposer
from coordinator.server.request_core import Core, error_trailers
from coordinator.server.service import ClusterServicer, FencedStoreServicer, LeaseServicer
from coordinator.server.stream_admission import StreamAdmission
from coordinator.server.streams import SlotGate, StreamGate, waiter_gate
from coordinator.server.watch_hub import WatchHub
from coordinator.server.watch_service import WatchServicer

log = logging.getLogger(__name__)

FENCING_SERVICES = tuple(s.full_name for s in pb.DESCRIPTOR.services_by_name.values())
AUDIT_LOGGER = "coordinator.audit"
# The barrier the health updater proposes: short, so a check never overlaps the next.
HEALTH_BARRIER_TIMEOUT_S = 1.0


# Message size limits both ways (a snapshot or a restore is the largest message); no
# SO_REUSEPORT, so a second server on a taken port fails instead of sharing it.
GRPC_SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.so_reuseport", 0),
)


@dataclasses.dataclass(frozen=True)
class Services:
    """What ``add_services`` built for one member and its owner still needs: the proposer
    (health barriers), the core (error replies) and the Lease servicer (closed at shutdown)."""

    proposer: Proposer
    core: Core
    lease: LeaseServicer
    watch: WatchHub


def add_services(
    server: grpc.Server,
    node: RaftNode,
    config: ServerConfig,
    *,
    members: dict[str, str],
    metrics: Metrics | None,
) -> Services:
    """Build one member's Proposer, Core and four fencing servicers over ``node`` and register
    them on ``server``: the only wiring of the RPCs, used by ``FencingServer`` and by the
    in-memory test cluster alike. ``members``: Raft address -> API address of every member;
    ``metrics``: None when this member exports none."""
    proposer = Proposer(
        node,
        inflight_max=config.inflight_proposals_max,
        timeout_max_s=config.propose_timeout_max_s,
        deadline_margin_s=config.propose_deadline_margin_s,
        members=members,
        metrics=metrics,
    )
    principals = config.principals()
    admin_token = config.resolved_admin_token()
    authenticator = Authenticator(principals, admin_token=admin_token) if principals else None
    core = Core(
        node, proposer, members=members, authenticator=authenticator,
        proof_signer=config.proof_signer(), read_index=config.read_index,
        count_refusal=uncounted if metrics is None else metrics.count_refusal,
    )
    lease = LeaseServicer(core, waiters=acquire_waiter_gate(config))
    pb_grpc.add_LeaseServicer_to_server(lease, server)
    pb_grpc.add_FencedStoreServicer_to_server(FencedStoreServicer(core), server)
    pb_grpc.add_ClusterServicer_to_server(ClusterServicer(core), server)
    hub = WatchHub(per_caller_max=config.watchers_per_principal_max)
    hub.attach(node)
    pb_grpc.add_WatchServicer_to_server(WatchServicer(core, hub, idle_timeout_s=config.stream_idle_timeout_s), server)
    if not principals:
        log.warning("no principals_file: every client may use every resource (fine for dev only)")
        if not admin_token:
            log.warning("no admin token configured: Admin RPCs are open to every client (fine for dev only)")
    pb_grpc.add_AdminServicer_to_server(
        AdminServicer(core, admin_token=admin_token, audit=audit_logger(config),
                      refused_lines=RefusedLines(window_s=config.refused_log_window_s)), server
    )
    return Services(proposer, core, lease, hub)


def raft_config(config: ServerConfig) -> RaftConfig:
    return RaftConfig(
        self_address=config.raft_address,
        peer_addresses=config.peer_addresses,
        data_dir=config.data_dir,
        raft_min_timeout_s=config.raft_min_timeout_s,
        raft_max_timeout_s=config.raft_max_timeout_s,
        leader_fallback_timeout_s=config.leader_fallback_timeout_s,
        leader_lost_election_s=config.leader_lost_election_s,
        heartbeat_s=config.heartbeat_s,
        # The lease answers only read-index reads; without them no round rides on appends.
        lease_reads=config.lease_reads and config.read_index,
        lease_read_clock_drift_s=config.lease_read_clock_drift_s,
        commands_queue_size=config.commands_queue_size,
        log_compaction_min_entries=config.log_compaction_min_entries,
        log_compaction_min_time_s=config.log_compaction_min_time_s,
        log_compaction_min_bytes=config.log_compaction_min_bytes,
        track_synced=config.track_synced_for_tests,
        bootstrap=config.may_bootstrap,
        member_id=config.member_id or None,
        secret=config.resolved_raft_secrets() or None,
    )


def stream_gate(config: ServerConfig) -> StreamGate:
    return StreamGate(
        streams_max=config.streams_max,
        per_caller_max=config.streams_per_principal_max,
        idle_timeout_s=config.stream_idle_timeout_s,
    )


def stream_admission(config: ServerConfig, node: RaftNode, metrics: Metrics | None = None) -> StreamAdmission:
    """The interceptor every streaming RPC of the member passes (stream_admission.py): the
    stream caps and idle timeout, and reflection behind a credential when the member has
    authentication on (a principals file or an admin token); its refusals are counted in
    ``metrics`` (None: not counted)."""
    principals, admin_token = config.principals(), config.resolved_admin_token()
    return StreamAdmission(
        stream_gate(config),
        credentials=Authenticator(principals, admin_token=admin_token) if principals or admin_token else None,
        trailing=functools.partial(error_trailers, node),
        credential_needed=(reflection.SERVICE_NAME,),
        count_refusal=uncounted if metrics is None else metrics.count_refusal,
    )


def acquire_waiter_gate(config: ServerConfig) -> SlotGate:
    return waiter_gate(waiters_max=config.acquire_waiters_max,
                       per_caller_max=config.acquire_waiters_per_principal_max)


def _certificate_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.cert_chain)], root_certificates=material.client_ca
    )


def api_credentials(certificates: ApiCertificates) -> grpc.ServerCredentials:
    """TLS credentials whose certificate a SIGHUP can replace: gRPC asks ``fetch`` at every new
    handshake, and running connections keep the certificate they were made with."""

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        pending = certificates.take_pending()
        return None if pending is None else _certificate_configuration(pending)

    return grpc.dynamic_ssl_server_credentials(
        _certificate_configuration(certificates.current),
        fetch,  # type: ignore[arg-type]  # None: keep the certificate (gRPC's docs); the stubs omit it
        require_client_authentication=certificates.requires_client_certificate,
    )


def audit_logger(config: ServerConfig) -> logging.Logger:
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.setLevel(logging.INFO)
    if config.audit_log_path:
        handler = logging.FileHandler(config.audit_log_path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    return logger


class HealthUpdater(threading.Thread):
    """Keeps the health service's statuses equal to ``is_serving()``, checked periodically."""

    def __init__(self, node: RaftNode, proposer: Proposer, servicer: health.HealthServicer, interval_s: float):
        super().__init__(name="health-updater", daemon=True)
        self.node = node
        self.proposer = proposer
        self.servicer = servicer
        self.interval_s = interval_s
        self._stop = threading.Event()
        self.serving: bool | None = None

    def is_serving(self) -> bool:
        if not self.node.status()["has_quorum"]:
            return False
        if not self.proposer.barrier_applied.is_set():
            try:
                self.proposer.propose(ops.ReadBarrier(), HEALTH_BARRIER_TIMEOUT_S)
            except ServiceError as error:
                log.info("health: read barrier not applied yet: %s", error.reason)
                return False
        return self.proposer.barrier_applied.is_set()

    def check_once(self) -> None:
        try:
            serving = self.is_serving()
        except Exception:  # a probe failing in any way means not serving; the updater lives on
            log.exception("health check failed")
            serving = False
        if serving == self.serving:
            return  # set() sends to every Watch: only a change is news (a steady Watch goes idle)
        log.info("health: %s", "SERVING" if serving else "NOT_SERVING")
        self.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *FENCING_SERVICES):
            self.servicer.set(name, status)

    def run(self) -> None:
        while not self._stop.is_set():
            self.check_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


class StartupError(Exception):
    """The member cannot start; the message is one line that names the setting and says why."""


def _cannot_listen(setting: str, address: str, error: OSError | None) -> StartupError:
    why = error.strerror if error is not None and error.strerror else "cannot bind"
    return StartupError(f"{setting} {address}: cannot listen: {why}")


def _peer_credentials(certificates: ApiCertificates | None) -> grpc.ChannelCredentials | None:
    """How the leader's LevelPoller reaches the other members' API: plaintext when this member
    serves plaintext; else TLS trusting the client CA bundle (the system roots without one),
    presenting this member's own certificate (what a mutual-TLS member asks of a client)."""
    if certificates is None:
        return None
    material = certificates.current
    return grpc.ssl_channel_credentials(
        root_certificates=material.client_ca, private_key=material.private_key,
        certificate_chain=material.cert_chain,
    )


class FencingServer:
    """The Raft node, the gRPC server and the health updater of one member."""

    def __init__(self, config: ServerConfig, *, node: RaftNode | None = None,
                 on_leadership: Callable[[bool], None] | None = None) -> None:
        self.config = config
        if node is None:
            # A real member process: its descriptors are its own to budget (issue 26), before
            # the node opens any.
            try:
                api_conns.ensure_fd_budget(config)
            except api_conns.FdBudgetError as exc:
                raise StartupError(str(exc)) from None
            # Before the node exists (its own bind would collide with the check): the Raft
            # transport retries a failed bind forever and silently, so a port in use would
            # otherwise leave a member that starts and never joins.
            error = listen_check.why_not(config.raft_address)
            if error is not None and listen_check.is_final(error, config.raft_address):
                raise _cannot_listen("raft_address", config.raft_address, error)
            error = listen_check.why_not(config.bind_address)
            if error is not None:
                raise _cannot_listen(config.bind_setting, config.bind_address, error)
        self.node = node or RaftNode(raft_config(config), FencingStateMachine(), on_leadership=on_leadership)
        try:
            self._build(config)
        except BaseException:  # any failed start, interrupts too, closes the node; re-raised
            self.node.close()  # its threads and its Raft port go with the failed start
            raise

    def _build(self, config: ServerConfig) -> None:
        self.metrics = Metrics() if config.metrics_address else None
        self.grpc_server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(config.grpc_threads, thread_name_prefix="grpc"),
            maximum_concurrent_rpcs=config.grpc_max_concurrent_rpcs,
            options=(*GRPC_SERVER_OPTIONS, *api_conns.grpc_options(config)),
            # metrics outermost, so streams refused by the admission are counted too
            interceptors=[*([] if self.metrics is None else [self.metrics.interceptor()]),
                          stream_admission(config, self.node, self.metrics)],
        )
        services = add_services(
            self.grpc_server, self.node, config, members=config.member_map, metrics=self.metrics
        )
        self.proposer = services.proposer
        self.lease = services.lease
        self.watch = services.watch  # its counts go to /metrics (member_status)
        # Blocking: a Watch then waits on its own worker thread, under the stream caps, and
        # set() only hands the status to it; the non-blocking default sends from the thread
        # that calls set() (the health updater), which a Watch client that does not read stalls.
        self.health = health.HealthServicer(experimental_non_blocking=False)
        for name in ("", *FENCING_SERVICES):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in level_poller.announced_services():
            # This build's entry levels (DESIGN §8 "Rolling upgrades"), announced from start:
            # the leader's LevelPoller reads them; NOT_SERVING only once it shuts down.
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        if config.reflection:
            reflection.enable_server_reflection(
                (*FENCING_SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.grpc_server
            )
        # config checked the files (both or neither of cert and key): read them once more here
        self.certificates = (
            ApiCertificates(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
            if config.tls_cert_file else None
        )
        try:
            if self.certificates is None:
                self.port = self.grpc_server.add_insecure_port(config.bind_address)
            else:
                self.port = self.grpc_server.add_secure_port(config.bind_address, api_credentials(self.certificates))
        except RuntimeError:  # gRPC's "Failed to bind to address": taken since the check above
            self.port = 0
        if self.port == 0:
            raise _cannot_listen(config.bind_setting, config.bind_address, listen_check.why_not(config.bind_address))
        self.peer_cap = api_conns.PeerConnectionCap(
            self.port, config.api_connections_per_peer_max,
            refused_lines=RefusedLines(window_s=config.refused_log_window_s),
        )
        self.updater = HealthUpdater(self.node, self.proposer, self.health, config.health_check_interval_s)
        self.ticker = LeaseTicker(
            self.node, self.proposer, interval_s=config.lease_tick_interval_s, timeout_s=config.propose_timeout_max_s
        )
        self.levels = level_poller.LevelPoller(
            self.node, self.proposer, config.member_map, credentials=_peer_credentials(self.certificates),
            timeout_s=config.propose_timeout_max_s,
        )
        if self.metrics is not None:
            self.metrics.watch(self.member_status)
            journal = getattr(self.node, "journal", None)
            if journal is not None and hasattr(journal, "sync_seconds_observer"):
                journal.sync_seconds_observer = self.metrics.fsync_duration.observe

    def member_status(self) -> dict:
        """What the metrics report of this member when scraped: what the node publishes, and
        the epoch and the state's totals (under the apply lock, like any local read)."""
        status = self.node.status()
        status["api_address"] = self.config.api_address
        status["serving"] = bool(self.updater.serving)
        status["epoch"], status["leases"], status["lock_waiters"], status["resources"] = self.node.read(
            lambda sm: (sm.epoch, sm.leases_count, sm.lock_waiters_count, sm.resources_count))
        status["leases_expired"] = self.ticker.leases_expired
        status["api_connections_closed_over_peer_cap"] = self.peer_cap.closed_total
        status["watchers"], status["watchers_left_behind"] = self.watch.open_count(), self.watch.left_behind
        if self.metrics is not None:
            status.update(self.metrics.http_counts())
        return status

    def reload(self) -> None:
        """SIGHUP: read the API's TLS files and the peer secrets again (SECURITY.md, "What
        SIGHUP reloads"); each keeps what it has, and says so in one line, if its files fail."""
        self.reload_certificates()
        self.reload_peer_secrets()

    def reload_peer_secrets(self) -> None:
        """SIGHUP: read ``raft_secret_file`` again; every Raft connection, established or new,
        sends under its first secret and accepts any of them from its next frame on."""
        if not self.config.raft_secret_file:
            log.info("SIGHUP: no raft_secret_file: no peer secret to reload")
            return
        try:
            secrets = self.config.resolved_raft_secrets()
            self.node.replace_peer_secrets(secrets)
        except (ConfigError, ValueError) as exc:
            log.error("SIGHUP: kept the current peer secrets: %s", exc)
            return
        log.info("SIGHUP: peer secrets reloaded from raft_secret_file: %d, sending under the first;"
                 " every Raft connection uses them from its next frame", len(secrets))

    def reload_certificates(self) -> None:
        """SIGHUP: read the API's TLS files again."""
        if self.certificates is None:
            log.info("SIGHUP: the API serves plaintext (no tls_cert_file): no certificate to reload")
            return
        self.certificates.reload()

    def start(self) -> None:
        if self.metrics is not None:
            # fails here, before serving RPCs; /readyz says what the health service says
            self.metrics.serve(self.config.metrics_address, ready=lambda: bool(self.updater.serving),
                               connections_max=self.config.metrics_connections_max,
                               request_timeout_s=self.config.metrics_request_timeout_s)
        self.grpc_server.start()
        self.peer_cap.start()
        self.updater.start()
        self.ticker.start()
        self.levels.start()
        log.info(
            "serving member %s: gRPC on %s, pid %d", self.config.raft_address, self.config.bind_address, os.getpid()
        )

    def serving(self) -> bool:
        """What the health service says now: SERVING (a quorum, and a read barrier applied)."""
        return bool(self.updater.serving)

    def listening(self) -> bool:
        """The Raft port is bound too (the API port is, once the constructor returned)."""
        return self.node.listening()

    def stop(self) -> None:
        """Stop accepting, let running RPCs finish within the grace period, close the node."""
        self.updater.stop()
        self.ticker.stop()
        self.levels.stop()
        self.health.enter_graceful_shutdown()  # probes see NOT_SERVING while we drain
        self.grpc_server.stop(self.config.shutdown_grace_s).wait(self.config.shutdown_grace_s + 1)
        self.peer_cap.stop()
        self.lease.close()
        if self.metrics is not None:
            self.metrics.close()
        self.node.close()
        log.info("stopped member %s", self.config.raft_address)

"""Prometheus metrics of one member: its RPCs, its proposals, its journal and its Raft node.

Owns: the registry of one ``fencingd serve`` process, the gRPC server interceptor that counts
and times RPCs under the gRPC ecosystem's names (go-grpc-prometheus: ``grpc_server_*`` with
``grpc_service``, ``grpc_method``, ``grpc_type``, ``grpc_code``), the proposal counters, the
refusals by ErrorInfo reason (a fixed enum; ``grpc_code`` alone lumps STALE_TOKEN, LEASE_HELD
and VERSION_MISMATCH together as FailedPrecondition), the journal's fsync histogram, the
collector that reads the Raft node and the state's totals (leases, lock waiters) when scraped,
and the HTTP endpoint's replies (``metrics_address``: ``GET /metrics``, ``GET /readyz``, 404
elsewhere; served by metrics_http.py under its connection cap and timeout).
Must never: block an RPC or the Raft thread. Raft figures are read at scrape time from what
the node already publishes (``RaftNode.status()``), plus the epoch and the state's totals
under the apply lock (attribute reads); nothing here runs on the tick thread. No label holds
a resource name, a holder or a principal: every label set is bounded.

Off unless ``metrics_address`` is set: then the interceptor is not installed and proposals
are not timed, so the hot path costs nothing. On, it adds two clock reads and a few
lock-protected updates per RPC and per proposal (a few microseconds).

Our own names start with ``fencing_``; README "Metrics" lists them, with the renames.
"""

from __future__ import annotations

import functools
import platform
import threading
import time
from typing import Any, Callable

import grpc
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from coordinator.client.version import distribution_version
from coordinator.core.names import ErrorReason
from coordinator.raft.patches import library_version
from coordinator.server.metrics_http import MetricsHttpServer

# Every counter and histogram would also export a ``_created`` series (the time it was
# made), which doubles the series count and which nothing here graphs; process-wide.
prometheus_client.disable_created_metrics()

# Seconds. A healthy commit is ~1-2 ms; elections and the proposal deadline (5 s) bound the top.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# Seconds, etcd's wal_fsync_duration_seconds buckets (1 ms doubling to 8 s): an SSD syncs in
# well under 1 ms, a disk in trouble takes seconds, and the same buckets make the two comparable.
FSYNC_BUCKETS_S = tuple(0.001 * 2**i for i in range(14))

# The outcomes of one proposal (label ``outcome``): the values of
# coordinator.raft.interface.ProposeOutcome, and "overloaded" for a proposal refused before
# it reached Raft (inflight_proposals_max).
PROPOSAL_OUTCOMES = ("applied", "refused", "not_applied", "unknown", "overloaded")

# grpc_code values as Go's codes.Code.String() spells them: dashboards made for
# go-grpc-prometheus filter on these ("OK", "Canceled", "InvalidArgument", ...).
GRPC_CODE_NAMES = {
    code: "Canceled" if code is grpc.StatusCode.CANCELLED else
    "OK" if code is grpc.StatusCode.OK else
    "".join(part.capitalize() for part in code.name.split("_"))
    for code in grpc.StatusCode
}
_GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")


def build_versions() -> dict[str, str]:
    """What ``fencing_build_info`` reports (the labels never change while a process runs)."""
    return {"version": distribution_version(), "python_version": platform.python_version(),
            "raft_library_version": library_version(), "grpc_version": grpc.__version__}


class Metrics:
    """The metric objects of one member, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # CPU seconds, resident memory, open fds
        self.rpc_started = Counter(
            "grpc_server_started", "RPCs started on the server", _GRPC_LABELS, registry=self.registry,
        )
        self.rpc_handled = Counter(
            "grpc_server_handled", "RPCs completed on the server, whatever their status",
            (*_GRPC_LABELS, "grpc_code"), registry=self.registry,
        )
        self.rpc_seconds = Histogram(
            "grpc_server_handling_seconds", "Time from handler start to its return (streams: whole stream)",
            _GRPC_LABELS, buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received", "Request messages received", _GRPC_LABELS, registry=self.registry,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent", "Response messages sent", _GRPC_LABELS, registry=self.registry,
        )
        self.proposals = Counter(
            "fencing_proposals", "Commands proposed by this member, by outcome "
            "(refused = applied as a refusal, e.g. STALE_TOKEN; unknown = may still commit)",
            ("outcome",), registry=self.registry,
        )
        self.proposal_duration = Histogram(
            "fencing_proposal_duration_seconds", "Time from proposal to its outcome on this member",
            buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.fsync_duration = Histogram(
            "fencing_journal_fsync_duration_seconds", "Time of each fdatasync of the Raft journal",
            buckets=FSYNC_BUCKETS_S, registry=self.registry,
        )
        self.refusals = Counter(
            "fencing_refusals", "Calls (and items of batch calls) this member answered with an error, "
            "by its ErrorInfo reason (STALE_TOKEN, LEASE_HELD, VERSION_MISMATCH, NO_LEADER, ...)",
            ("reason",), registry=self.registry,
        )
        Gauge("fencing_build_info", "Versions this member runs (value always 1)", tuple(build_versions()),
              registry=self.registry).labels(**build_versions()).set(1)
        # Label children resolved once: .labels() takes a lock and hashes on every call.
        self._outcome = {name: self.proposals.labels(outcome=name) for name in PROPOSAL_OUTCOMES}
        # Every reason from the start (a fixed enum: bounded, and each series exists at 0
        # before its first refusal, so a rate() over it has a start).
        self._refused = {reason: self.refusals.labels(reason=reason) for reason in ErrorReason}
        self._handled: dict[tuple[tuple[str, str, str], grpc.StatusCode], Any] = {}
        self._rpc_lock = threading.Lock()
        self._http: MetricsHttpServer | None = None

    # -- proposals ------------------------------------------------------------------------

    def proposal_done(self, outcome: str, seconds: float | None) -> None:
        """Count one proposal; ``seconds`` None: refused before it reached Raft (not timed)."""
        self._outcome[outcome].inc()
        if seconds is not None:
            self.proposal_duration.observe(seconds)

    def count_refusal(self, reason: ErrorReason) -> None:
        """Count one error sent to a client (a call's, or one batch item's), by its reason."""
        self._refused[reason].inc()

    # -- RPCs ---------------------------------------------------------------------------------

    def method_children(self, labels: tuple[str, str, str]) -> tuple:
        """(started, handling seconds, received, sent) of one method: resolved once per method."""
        return (self.rpc_started.labels(*labels), self.rpc_seconds.labels(*labels),
                self.msg_received.labels(*labels), self.msg_sent.labels(*labels))

    def rpc_done(self, labels: tuple[str, str, str], code: grpc.StatusCode) -> None:
        child = self._handled.get((labels, code))
        if child is None:
            with self._rpc_lock:
                child = self._handled.setdefault(
                    (labels, code), self.rpc_handled.labels(*labels, GRPC_CODE_NAMES[code]))
        child.inc()

    def interceptor(self) -> grpc.ServerInterceptor:
        return _RpcInterceptor(self)

    # -- the member's state, read when scraped ------------------------------------------------

    def watch(self, status: Callable[[], dict[str, Any]]) -> None:
        """Report ``status()`` (see ``member_status``) on every scrape."""
        self.registry.register(_MemberCollector(status))

    # -- HTTP -----------------------------------------------------------------------------

    def serve(self, address: str, ready: Callable[[], bool], *, connections_max: int,
              request_timeout_s: float) -> None:
        """Serve ``GET /metrics`` and ``GET /readyz`` (200 iff ``ready()``) on ``address``
        (HOST:PORT) from one event loop thread (metrics_http.py), at most ``connections_max``
        connections of at most ``request_timeout_s`` each; OSError naming metrics_address if it
        cannot bind."""
        server = MetricsHttpServer(address, functools.partial(render, self.registry, ready),
                                   connections_max=connections_max, request_timeout_s=request_timeout_s)
        server.serve()
        self._http = server

    def http_counts(self) -> dict[str, int]:
        """What the metrics endpoint refused (over ``metrics_connections_max``) and closed at
        ``metrics_request_timeout_s``; empty while it does not serve."""
        if self._http is None:
            return {}
        return {"metrics_connections_refused": self._http.refused_connections,
                "metrics_connections_timed_out": self._http.timed_out_connections}

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


def render(registry: CollectorRegistry, ready: Callable[[], bool], path: str, accept: str) -> tuple[int, bytes, str]:
    """/metrics (Prometheus text, or OpenMetrics when asked), /readyz, and 404 for anything
    else: a typo in a scrape config must fail loudly, not scrape metrics under another name."""
    if path == "/metrics":
        encoder, content_type = choose_encoder(accept)  # no Accept header (""): the text format
        return 200, encoder(registry), content_type
    if path == "/readyz":
        is_ready = ready()
        return (200, b"ok\n", _TEXT) if is_ready else (503, b"not serving\n", _TEXT)
    return 404, b"not found: try /metrics or /readyz\n", _TEXT


_TEXT = "text/plain; charset=utf-8"


# How each handler kind is named in grpc_type (go-grpc-prometheus's values).
_GRPC_TYPES = {"unary_unary": "unary", "stream_unary": "client_stream",
               "unary_stream": "server_stream", "stream_stream": "bidi_stream"}


class _RpcInterceptor(grpc.ServerInterceptor):
    """Wraps every method's handler once (cached by method name) to count and time it."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = continuation(handler_call_details)
            if handler is None:
                return None  # unknown method: gRPC answers UNIMPLEMENTED
            wrapped = self._wrapped.setdefault(method, self._wrap(method, handler))
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kind = next(k for k in _GRPC_TYPES if getattr(handler, k) is not None)
        service, _, name = method.lstrip("/").rpartition("/")
        labels = (_GRPC_TYPES[kind], service, name)
        started_c, seconds_h, received_c, sent_c = self._metrics.method_children(labels)
        done = self._metrics.rpc_done
        inner = getattr(handler, kind)

        def finish(context, started: float, failed: bool) -> None:
            # abort() sets the code before it raises; a handler that returned set none (OK);
            # one that crashed set none either, and gRPC answers UNKNOWN for it.
            code = context.code()
            if code is None and failed:
                code = grpc.StatusCode.UNKNOWN if context.is_active() else grpc.StatusCode.CANCELLED
            elif code is None:
                code = grpc.StatusCode.OK
            seconds_h.observe(time.perf_counter() - started)
            done(labels, code)

        def counted(requests):
            for request in requests:
                received_c.inc()
                yield request

        client_streams = kind.startswith("stream_")

        if kind in ("unary_unary", "stream_unary"):

            @functools.wraps(inner)
            def single(request, context):
                started = time.perf_counter()
                started_c.inc()
                if client_streams:
                    request = counted(request)
                else:
                    received_c.inc()
                try:
                    response = inner(request, context)
                except BaseException:  # every exit, aborts and interrupts too, counts as failed; re-raised
                    finish(context, started, True)
                    raise
                finish(context, started, False)
                sent_c.inc()
                return response

            return handler._replace(**{kind: single})  # type: ignore[attr-defined]  # a namedtuple at run time; the stubs know only the ABC

        @functools.wraps(inner)
        def streaming(request, context):
            started = time.perf_counter()
            started_c.inc()
            if client_streams:
                request = counted(request)
            else:
                received_c.inc()
            try:
                for response in inner(request, context):
                    sent_c.inc()
                    yield response
            except BaseException:  # every exit, aborts and interrupts too, counts as failed; re-raised
                finish(context, started, True)
                raise
            finish(context, started, False)

        return handler._replace(**{kind: streaming})  # type: ignore[attr-defined]  # a namedtuple at run time; the stubs know only the ABC


class _MemberCollector:
    """Gauges and counters of the member's Raft node and health, read at scrape time."""

    _GAUGES = (
        ("term", "fencing_raft_term", "Current Raft term"),
        ("commit_index", "fencing_raft_commit_index", "Highest log index known committed"),
        ("last_applied", "fencing_raft_applied_index", "Highest log index applied to the state machine"),
        ("log_len", "fencing_raft_log_entries", "Entries in the in-memory log (since the last snapshot)"),
        ("is_leader", "fencing_raft_is_leader", "1 while this member is the Raft leader"),
        ("has_quorum", "fencing_raft_has_quorum", "1 while this member reaches a majority"),
        ("ready", "fencing_raft_ready", "1 once this member applied a commit of the current term since start"),
        ("serving", "fencing_serving", "1 while the health service reports SERVING"),
        ("epoch", "fencing_epoch", "Last fencing token issued, as applied on this member (a local read)"),
        ("leases", "fencing_leases", "Leases held, as applied on this member (an expired one counts "
         "until the leader's next TICK ends it, within lease_tick_interval_s)"),
        ("lock_waiters", "fencing_lock_waiters", "Lock waiters queued behind held leases, across all "
         "resources, as applied on this member"),
        ("resources", "fencing_resources", "Resources the state holds (a lease, data, waiters or a "
         "fence), as applied on this member (at most RESOURCES_MAX, core/limits.py)"),
        ("watchers", "fencing_watchers", "Watch streams open on this member (each also holds a stream slot)"),
        ("snapshot_seconds", "fencing_raft_snapshot_seconds",
         "Wall time of this member's last snapshot, state read to file fsynced and renamed "
         "(on the snapshot writer thread, beside the Raft thread)"),
        ("snapshot_apply_paused_seconds", "fencing_raft_snapshot_apply_paused_seconds",
         "Of the last snapshot, the time its state was read in: committed entries are applied "
         "only after it (writes wait that long; the Raft thread does not)"),
    )
    _COUNTERS = (
        ("journal_syncs", "fencing_journal_syncs", "fdatasync calls of this member's Raft journal"),
        ("leases_expired", "fencing_lease_expiries",
         "Leases ended by expiry in the TICKs this member proposed as leader (sum over the members: "
         "the cluster's expiries)"),
        ("leader_changes", "fencing_raft_leader_changes_seen",
         "Times this member saw a leader other than the one it saw before (a lost leader found again counts)"),
        ("shared_entries", "fencing_raft_shared_entries", "Raft entries that carried more than one command"),
        ("truncated_applied", "fencing_raft_truncated_applied",
         "Times a leader asked to truncate an applied entry (refused; should stay 0)"),
        ("refused_old_snapshots", "fencing_raft_refused_old_snapshots",
         "Snapshots older than the applied state that were refused"),
        ("refused_peer_messages", "fencing_raft_refused_peer_messages",
         "Raft connections and messages refused: ones no member of ours sends, frames over "
         "the size bound, connections that named no member in time"),
        ("peer_connections_replaced", "fencing_raft_peer_connections_replaced",
         "Established Raft connections a newly bound one of the same member took the place of "
         "(a member that restarted before its old connection reported closed)"),
        ("listen_losses", "fencing_raft_listen_losses",
         "Times this member's Raft port closed under it because an accept failed (out of "
         "descriptors); it listens again within bindRetryTime (1 s) once it can"),
        ("refused_entries", "fencing_raft_refused_entries",
         "Committed log entries skipped because no member of ours writes them (should stay 0)"),
        ("read_index_rounds", "fencing_raft_read_index_rounds",
         "Read-index confirmation rounds this member sent as leader (one per batch of reads; "
         "read_index, RAFT.md)"),
        ("lease_reads", "fencing_raft_lease_reads",
         "Read and Describe calls this member answered as leader by its read lease, with no round "
         "(lease_reads, RAFT.md \"Lease reads\")"),
        ("lease_read_fallbacks", "fencing_raft_lease_read_fallbacks",
         "Read and Describe calls on this member as leader that found no lease holding and took a "
         "read-index round instead (a new leader, a lapsed or voided lease)"),
        ("lease_clock_steps_back", "fencing_raft_lease_clock_steps_back",
         "Times this member's monotonic clock read below an earlier reading, which voided its read "
         "lease (should stay 0: a monotonic clock never goes back)"),
        ("votes_refused_leader_heard", "fencing_raft_votes_refused_leader_heard",
         "Vote requests of a later term this member dropped because it heard a live leader within "
         "its vote window (RAFT.md \"Lease reads\"; a leadership transfer's are granted)"),
        ("pre_votes_started", "fencing_raft_pre_votes_started",
         "Pre-vote rounds this member started: it heard no leader for an election timeout "
         "(RAFT.md \"Pre-vote\"; a member cut off from the others counts up here, its term does not)"),
        ("pre_votes_won", "fencing_raft_pre_votes_won",
         "Pre-vote rounds a majority granted: each is followed by an election in the next term"),
        ("pre_votes_refused", "fencing_raft_pre_votes_refused",
         "Pre-vote requests this member answered with no (it heard a live leader, led, or the "
         "asker's term or log was behind)"),
        ("elections_without_pre_vote", "fencing_raft_elections_without_pre_vote",
         "Elections this member stood in with no pre-vote round won: the unanimous bootstrap, or "
         "pre-vote turned off; otherwise a defect (RAFT.md \"Pre-vote\"; its term line says why)"),
        ("term_notices_adopted", "fencing_raft_term_notices_adopted",
         "Later terms this member adopted from a member's answer to its append (it led or followed "
         "a term behind that member: RAFT.md \"Pre-vote\"; should stay rare)"),
        ("refused_cluster_ids", "fencing_raft_refused_cluster_ids",
         "Votes and acks refused because they named another cluster id (a member of another "
         "cluster, or one whose data dir belongs to another cluster; should stay 0)"),
        ("api_connections_closed_over_peer_cap", "fencing_api_connections_closed_over_peer_cap",
         "API connections the member shut down because their address held more than "
         "api_connections_per_peer_max (the newest go; checked once a second)"),
        ("metrics_connections_refused", "fencing_metrics_connections_refused",
         "Connections to this metrics endpoint closed on arrival: metrics_connections_max were open"),
        ("metrics_connections_timed_out", "fencing_metrics_connections_timed_out",
         "Connections to this metrics endpoint closed at metrics_request_timeout_s before a reply"),
        ("watchers_left_behind", "fencing_watchers_left_behind",
         "Watch streams this member ended because its history moved past them: a watcher too slow "
         "for WATCH_HISTORY_BYTES_MAX, or a snapshot installed here (the client resumes elsewhere or "
         "reads the state again)"),
        ("snapshot_failures", "fencing_raft_snapshot_failures",
         "Snapshot writes that failed (the previous snapshot stays; the journal is not compacted; "
         "tried again later). Above 0: look at the disk"),
    )

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def describe(self):
        return []  # values come only at collect time

    def collect(self):
        status = self._status()
        for key, name, doc in self._GAUGES:
            if key in status and status[key] is not None:
                yield GaugeMetricFamily(name, doc, value=float(status[key]))
        for key, name, doc in self._COUNTERS:
            if key in status and status[key] is not None:
                yield CounterMetricFamily(name, doc, value=float(status[key]))
        refused = CounterMetricFamily(
            "fencing_raft_refused_bindings",
            "Raft connections refused by the binding handshake, or for a message naming another incarnation"
            " than the connection's, by reason (also in fencing_raft_refused_peer_messages)",
            labels=("reason",),
        )
        for reason, count in sorted((status.get("refused_bindings") or {}).items()):
            refused.add_metric((reason,), float(count))
        yield refused
        yield GaugeMetricFamily("fencing_raft_has_leader", "1 while this member knows a leader",
                                value=float(status.get("leader") is not None))
        # Labels that never change while the process runs: who leads is the gauges above, so
        # an election does not end one series and start another.
        info = GaugeMetricFamily("fencing_member_info", "This member's ids (value always 1)",
                                 labels=("member_id", "api_address"))
        info.add_metric((status.get("self", ""), status.get("api_address", "")), 1.0)
        yield info

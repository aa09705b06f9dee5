"""Prometheus metrics of one member: its RPCs, its proposals and its Raft node.

Owns: the registry of one ``fencingd serve`` process, the gRPC server interceptor that counts
and times RPCs, the proposal counters, the collector that reads the Raft node when scraped,
and the HTTP endpoint (``metrics_address``, ``GET /metrics``).
Must never: block an RPC or the Raft thread. Raft figures are read at scrape time from what
the node already publishes (``RaftNode.status()``), plus the epoch under the apply lock (one
attribute read); nothing here runs on the tick thread.

Off unless ``metrics_address`` is set: then the interceptor is not installed and proposals
are not timed, so the hot path costs nothing. On, it adds two clock reads and two
lock-protected updates per RPC and per proposal (a few microseconds).

Every name starts with ``fencing_``; README "Metrics" lists them.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Seconds. A healthy commit is ~1-2 ms; elections and the proposal deadline (5 s) bound the top.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

# The outcomes of one proposal (label ``outcome``): the values of
# coordinator.raft.interface.ProposeOutcome, and "overloaded" for a proposal refused before
# it reached Raft (inflight_proposals_max).
PROPOSAL_OUTCOMES = ("applied", "refused", "not_applied", "unknown", "overloaded")


class Metrics:
    """The metric objects of one member, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # CPU seconds, resident memory, open fds
        self.rpc_requests = Counter(
            "fencing_rpc_requests", "RPCs served, by full method name and final status code",
            ("method", "code"), registry=self.registry,
        )
        self.rpc_duration = Histogram(
            "fencing_rpc_duration_seconds", "Time from handler start to its return (streams: whole stream)",
            ("method",), buckets=LATENCY_BUCKETS_S, registry=self.registry,
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
        # Label children resolved once: .labels() takes a lock and hashes on every call.
        self._outcome = {name: self.proposals.labels(outcome=name) for name in PROPOSAL_OUTCOMES}
        self._rpc_children: dict[tuple[str, str], Any] = {}
        self._rpc_lock = threading.Lock()
        self._http = None

    # -- proposals ------------------------------------------------------------------------

    def proposal_done(self, outcome: str, seconds: float | None) -> None:
        """Count one proposal; ``seconds`` None: refused before it reached Raft (not timed)."""
        self._outcome[outcome].inc()
        if seconds is not None:
            self.proposal_duration.observe(seconds)

    # -- RPCs ---------------------------------------------------------------------------------

    def rpc_done(self, method: str, code: grpc.StatusCode | None, seconds: float) -> None:
        name = "UNKNOWN" if code is None else code.name
        child = self._rpc_children.get((method, name))
        if child is None:
            with self._rpc_lock:
                child = self._rpc_children.setdefault(
                    (method, name), (self.rpc_requests.labels(method, name), self.rpc_duration.labels(method))
                )
        child[0].inc()
        child[1].observe(seconds)

    def interceptor(self) -> grpc.ServerInterceptor:
        return _RpcInterceptor(self)

    # -- the member's state, read when scraped ------------------------------------------------

    def watch(self, status: Callable[[], dict[str, Any]]) -> None:
        """Report ``status()`` (see ``member_status``) on every scrape."""
        self.registry.register(_MemberCollector(status))

    # -- HTTP -----------------------------------------------------------------------------

    def serve(self, address: str) -> None:
        """Serve ``GET /metrics`` on ``address`` (HOST:PORT) from a daemon thread."""
        host, _, port = address.rpartition(":")
        try:
            self._http, _thread = start_http_server(int(port), addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics_address {address}: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


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
        done = self._metrics.rpc_done

        def finish(context, started: float, failed: bool) -> None:
            # abort() sets the code before it raises; a handler that returned set none (OK);
            # one that crashed set none either, and gRPC answers UNKNOWN for it.
            code = context.code()
            if code is None and failed:
                code = grpc.StatusCode.UNKNOWN if context.is_active() else grpc.StatusCode.CANCELLED
            elif code is None:
                code = grpc.StatusCode.OK
            done(method, code, time.perf_counter() - started)

        if handler.unary_unary is not None or handler.stream_unary is not None:
            kind = "unary_unary" if handler.unary_unary is not None else "stream_unary"
            inner = getattr(handler, kind)

            @functools.wraps(inner)
            def single(request, context):
                started = time.perf_counter()
                try:
                    response = inner(request, context)
                except BaseException:
                    finish(context, started, True)
                    raise
                finish(context, started, False)
                return response

            return handler._replace(**{kind: single})

        kind = "unary_stream" if handler.unary_stream is not None else "stream_stream"
        inner = getattr(handler, kind)

        @functools.wraps(inner)
        def streaming(request, context):
            started = time.perf_counter()
            try:
                yield from inner(request, context)
            except BaseException:
                finish(context, started, True)
                raise
            finish(context, started, False)

        return handler._replace(**{kind: streaming})


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
    )
    _COUNTERS = (
        ("journal_syncs", "fencing_journal_syncs", "fdatasync calls of this member's Raft journal"),
        ("shared_entries", "fencing_raft_shared_entries", "Raft entries that carried more than one command"),
        ("truncated_applied", "fencing_raft_truncated_applied",
         "Times a leader asked to truncate an applied entry (refused; should stay 0)"),
        ("refused_old_snapshots", "fencing_raft_refused_old_snapshots",
         "Snapshots older than the applied state that were refused"),
        ("refused_peer_messages", "fencing_raft_refused_peer_messages",
         "Raft connections and messages refused: ones no member of ours sends, frames over "
         "the size bound, connections that named no member in time"),
        ("refused_entries", "fencing_raft_refused_entries",
         "Committed log entries skipped because no member of ours writes them (should stay 0)"),
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
        info = GaugeMetricFamily("fencing_member_info", "This member's ids (value always 1)",
                                 labels=("member_id", "api_address", "leader"))
        info.add_metric((status.get("self", ""), status.get("api_address", ""), status.get("leader") or ""), 1.0)
        yield info

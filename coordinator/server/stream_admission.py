"""Admission of every streaming RPC a member serves, whoever's service it belongs to: ours
(Lease.KeepAliveStream, Admin.SnapshotStream, Admin.RestoreStream, Watch.Watch), the health service's
Watch and server reflection's ServerReflectionInfo (issue 26: 64 idle reflection streams with
no credential held every worker thread, because the stream caps counted KeepAliveStream only).

Owns: the ``grpc.ServerInterceptor`` that wraps each streaming method's handler, once per
method: the slot of the member's ``StreamGate`` (streams.py: ``streams_max``,
``streams_per_principal_max``) a stream holds for as long as its handler runs; who it counts
against (``caller_key``: the principal whose credential it presents, else its peer's host);
the idle timeout on what its worker thread waits for (``stream_idle_timeout_s``: the client's
next request, or for a server-streaming call the servicer's next response); and the valid
credential the services named in ``credential_needed`` (server reflection) require while the
member has authentication on. Must never: implement an RPC, authorize a resource or an Admin
call (the servicers do, after admission), or run a streaming handler without a slot.

What "idle" means, by kind: a call whose client streams (KeepAliveStream,
ServerReflectionInfo, RestoreStream) is idle while no request arrives; a server-streaming
call (Health.Watch, SnapshotStream) has no more requests to wait for, and is idle while its
servicer has nothing to send -- for Health.Watch, while the health status does not change, so
a Watch on a steady member ends after ``stream_idle_timeout_s`` and its client watches again
(the health checking protocol's clients re-open an ended Watch). Either way the worker thread
is given back with RESOURCE_EXHAUSTED / LIMIT_EXCEEDED naming ``stream_idle_timeout_s``.
A stream past a cap is refused the same way naming the cap, before its handler runs; an
unauthenticated reflection stream is refused UNAUTHENTICATED before it takes a slot.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

import grpc

from coordinator.server import errors
from coordinator.server.auth import Authenticator
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.streams import StreamGate, caller_key

__all__ = ["StreamAdmission"]


class StreamAdmission(grpc.ServerInterceptor):
    """Admits every streaming RPC under ``gate`` and ends it when idle. ``credentials``: the
    member's principals and admin token (None: no authentication configured); ``trailing``:
    the trailers every refusal carries (the member's header, as the servicers' errors do)."""

    def __init__(self, gate: StreamGate, *, credentials: Authenticator | None,
                 trailing: Callable[[], Iterable[tuple[str, str]]] = tuple,
                 credential_needed: Iterable[str] = (),
                 count_refusal: errors.CountRefusal = errors.uncounted) -> None:
        self.gate = gate
        self._count_refusal = count_refusal
        self._credentials = credentials
        self._trailing = trailing
        self._credential_needed = frozenset(credential_needed)  # service names, e.g. reflection's
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler  # unknown (gRPC answers UNIMPLEMENTED) or unary: nothing to hold
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            wrapped = self._wrapped.setdefault(method, self._wrap(method, handler))
        return wrapped

    @contextlib.contextmanager
    def _slot(self, context, needs_credential: bool) -> Iterator[None]:
        """Hold a slot for the caller of ``context`` while the block runs; ServiceError when
        it lacks a credential it needs or a cap is reached (nothing held then)."""
        caller = None
        if self._credentials is not None:
            caller = self._credentials.principal(context.invocation_metadata() or ())
            if caller is None and needs_credential:
                raise ServiceError(
                    Failure.UNAUTHENTICATED,
                    "this member has authentication on: this service needs 'authorization: Bearer TOKEN'"
                    " of a known principal or the admin token",
                )
        with self.gate.admit(caller_key(None if caller is None else caller.name, context.peer())):
            yield

    def _abort(self, context, error: ServiceError):
        self._count_refusal(error.reason)
        errors.abort(context, error, self._trailing())

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        service = method.lstrip("/").rpartition("/")[0]
        needs_credential = service in self._credential_needed
        gate = self.gate
        if handler.request_streaming:
            kind = "stream_stream" if handler.response_streaming else "stream_unary"
        else:
            kind = "unary_stream"
        inner = getattr(handler, kind)
        if getattr(inner, "experimental_non_blocking", False):
            # Such a handler returns at once and sends from other threads: a slot taken here
            # would be given back while the stream stays open (app.py builds the health
            # servicer blocking for this reason).
            raise TypeError(f"{method}: a non-blocking streaming handler cannot be admitted")

        def stream_unary(request_iterator: Iterator[Any], context) -> Any:
            try:
                with self._slot(context, needs_credential), \
                        contextlib.closing(gate.requests(request_iterator)) as requests:
                    return inner(requests, context)
            except ServiceError as error:
                self._abort(context, error)

        def stream_stream(request_iterator: Iterator[Any], context) -> Iterator[Any]:
            try:
                with self._slot(context, needs_credential), \
                        contextlib.closing(gate.requests(request_iterator)) as requests:
                    yield from inner(requests, context)
            except ServiceError as error:
                self._abort(context, error)

        def unary_stream(request: Any, context) -> Iterator[Any]:
            try:
                with self._slot(context, needs_credential), \
                        contextlib.closing(gate.responses(inner(request, context))) as responses:
                    yield from responses
            except ServiceError as error:
                self._abort(context, error)

        behaviours = {"stream_unary": stream_unary, "stream_stream": stream_stream, "unary_stream": unary_stream}
        return handler._replace(**{kind: behaviours[kind]})  # type: ignore[attr-defined]  # a namedtuple at run time; the stubs know only the ABC

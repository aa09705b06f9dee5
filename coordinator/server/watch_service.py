"""The Watch servicer: a stream of the changes under a prefix, read from this member's hub.

Owns: ``WatchServicer.Watch`` -- the request's checks (the prefix, and that the caller may
read everything under it), opening a cursor on the hub (watch_hub.py) for the caller, and
turning what the cursor reads into responses: ``created`` first, one response per revision
with events, and a progress response (no events) every ``progress_s`` while nothing matches,
which keeps the stream inside the member's idle timeout and tells the client how far it may
resume from. A watcher the hub's history left behind is ended with "watcher too slow" when
it reads next, or cancelled by the hub if its client stopped reading (its resume is then
answered COMPACTED). Must never: wait on the apply path, keep a cursor open after its RPC ended
(``close`` runs however it ends), or map an error to a status anywhere but ``errors``.

Admission: Watch is a server-streaming RPC, so the member's stream interceptor admits it
before this runs (stream_admission.py: ``streams_max``, ``streams_per_principal_max``) and
ends it if it sends nothing for ``stream_idle_timeout_s``; the progress responses come well
inside that. The hub adds its own cap per caller (``watchers_per_principal_max``).
"""

from __future__ import annotations

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.core import validation
from coordinator.core.changes import Change
from coordinator.server import errors
from coordinator.server.auth import Principal
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.request_core import Core
from coordinator.server.streams import caller_key
from coordinator.server.watch_hub import WatchHub

# Seconds between progress responses on a quiet watch, at most (and at most a third of the
# member's stream_idle_timeout_s, so a quiet watch is never ended as idle).
WATCH_PROGRESS_INTERVAL_S = 10.0


def checked_prefix(prefix: str) -> str:
    """"" (every resource) or a name's characters within a resource name's length."""
    if not prefix:
        return ""
    try:
        return validation.check_resource(prefix)
    except validation.InvalidField as exc:
        raise errors.invalid("prefix", str(exc).replace("field 'resource'", "field 'prefix'")) from None


def authorize_prefix(core: Core, caller: Principal | None, prefix: str) -> None:
    """A caller may watch a prefix only if it may use every resource under it: the prefix
    starts with one of its principal's prefixes (an admin, or an open data plane: any)."""
    if caller is None or caller.admin:
        core.authorize(caller, None)
        return
    if not any(prefix.startswith(mine) for mine in caller.prefixes):
        raise ServiceError(
            Failure.PERMISSION_DENIED,
            f"principal {caller.name!r} may not watch prefix {prefix!r}: it is not inside its prefixes"
            f" ({', '.join(repr(p) for p in caller.prefixes) or 'none'})",
        )


def event(revision: int, change: Change) -> pb.WatchEvent:
    return pb.WatchEvent(
        type=change.kind.name, revision=revision, resource=change.resource, holder=change.holder,
        token=change.token, expires_at_ms=change.expires_at_ms, key=change.key, value=change.value,
        version=change.version,
    )


class WatchServicer(pb_grpc.WatchServicer):
    def __init__(self, core: Core, hub: WatchHub, *, idle_timeout_s: float) -> None:
        self.core = core
        self.hub = hub
        self.progress_s = min(WATCH_PROGRESS_INTERVAL_S, idle_timeout_s / 3)

    def Watch(self, request: pb.WatchRequest, context):
        try:
            caller = self.core.principal(context)
            prefix = checked_prefix(request.prefix)
            authorize_prefix(self.core, caller, prefix)
            who = caller_key(None if caller is None else caller.name, context.peer())
            cursor, _current = self.hub.open(prefix, request.start_revision, who)
        except ServiceError as error:
            self.core.abort(context, error)
        cursor.cancel = context.cancel  # the hub ends it if it falls behind while blocked sending
        # Wakes a cursor waiting in ``next`` when the client goes away, and gives its slot back.
        if not context.add_callback(lambda: self.hub.close(cursor)):
            self.hub.close(cursor)
            return
        try:
            yield pb.WatchResponse(header=self.core.header(), revision=cursor.next_revision - 1, created=True)
            while not cursor.closed:
                batches, upto = self.hub.next(cursor, self.progress_s)
                if cursor.closed:
                    return
                if not batches:
                    yield pb.WatchResponse(header=self.core.header(), revision=upto)
                for revision, changes in batches:
                    yield pb.WatchResponse(
                        header=self.core.header(), revision=revision,
                        events=[event(revision, change) for change in changes],
                    )
        except ServiceError as error:
            self.core.abort(context, error)
        finally:
            self.hub.close(cursor)

"""The request core every servicer shares: who calls, what it sent, and its one proposal or read.

Owns: reading a request's fields by its RPC's row of ``requests.REQUESTS`` (``request_fields``)
and checking them (``checked_request``), ``Core`` (authentication and authorization of the
caller, DESIGN I10; building an op's body once from a request, with the caller's charges to its
quotas, which the state machine checks; proposing it with the RPC's deadline; the read
barrier, DESIGN I9, by read index or through the log; response headers and the trailers of
every error), and ``unary``, the decorator that authenticates a unary call once and turns its
ServiceError into a status.
Must never: decide a domain rule (the state machine does), build a response message (the
servicers do), or map an error to a status anywhere but ``errors``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import grpc

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client.proof import ProofSigner
from coordinator.core import limits, listing, ops, requests, validation
from coordinator.core.names import Trailer
from coordinator.core.results import ReadResult, Result, expect
from coordinator.raft.node import RaftNode
from coordinator.server import errors
from coordinator.server.auth import Authenticator, Principal
from coordinator.server.errors import Failure, ServiceError
from coordinator.server.proposer import PROPOSE_TIMEOUT_S_MIN, Proposer
from coordinator.server.stream_slots import StreamSlots

B = TypeVar("B", bound=ops.Body)


def request_fields(rpc: str, request: Any) -> dict[str, Any]:
    """The fields ``requests.REQUESTS[rpc]`` names, read from ``request`` (not yet checked).
    An optional field the caller left unset is None: unset is ``not HasField`` for a field
    with presence and the zero value for the rest (an empty op_id, a ttl_ms of 0), except a
    bool, whose False is a choice, not an absence."""
    fields: dict[str, Any] = {}
    for name, required, has_presence, zero in _presence_plan(rpc, request.DESCRIPTOR):
        value = getattr(request, name)
        unset = (not request.HasField(name)) if has_presence else (zero is not _NEVER_UNSET and value == zero)
        fields[name] = None if unset and not required else value
    return fields


def checked_request(rpc: str, request: Any) -> dict[str, Any]:
    """The fields of ``rpc``'s request (an RPC that proposes no op body of its own: a read,
    a restore), checked by its row of ``requests.REQUESTS``; a bad one is INVALID_ARGUMENT
    naming it."""
    try:
        return requests.check_request(rpc, request_fields(rpc, request))
    except validation.InvalidField as exc:
        raise errors.invalid(exc.field, str(exc)) from None


def body(cls: type[B], fields: Mapping[str, Any], caller: Principal | None) -> B:
    """``cls``'s op body holding ``fields`` and ``caller``'s charges (its principal and
    the quotas the op's checks read, ``ops.charge_fields``): built once, every field
    checked as it is built; a bad one is INVALID_ARGUMENT naming it."""
    try:
        if caller is not None:
            charges = ops.charge_fields(cls, fields, principal=caller.name, quota=caller.quota.replicated())
            fields = {**fields, **charges}
        return cls(**fields)
    except validation.InvalidField as exc:
        raise errors.invalid(exc.field, str(exc)) from None

def build(cls: type[B], request: Any, caller: Principal | None) -> B:
    """The op body ``request`` asks for (its RPC's is ``cls``, ``requests.BODY_OF``),
    charged to ``caller``."""
    rpc = request.DESCRIPTOR.name.removesuffix("Request")
    assert requests.BODY_OF[rpc] is cls, (rpc, cls)
    return body(cls, request_fields(rpc, request), caller)


_NEVER_UNSET = object()  # a bool's False is a value the caller chose


@functools.cache
def _presence_plan(rpc: str, descriptor: Any) -> tuple[tuple[str, bool, bool, Any], ...]:
    """Per RPC, once (not per request on the hot path): each field of its table row with
    whether it is required, whether the wire tracks its presence, and the zero value that
    means "unset" where it does not."""
    plan = []
    for name, spec in requests.REQUESTS[rpc].items():
        field = descriptor.fields_by_name[name]
        zero = _NEVER_UNSET if field.type == field.TYPE_BOOL else field.default_value
        plan.append((name, spec.required, field.has_presence, zero))
    return tuple(plan)


def error_trailers(node: RaftNode, index: int = 0) -> tuple[tuple[str, str], ...]:
    """The trailers every error of this member carries: its id, term and applied index (or
    ``index``, the entry the error is about)."""
    term, applied = node.term_and_applied()
    return (
        (Trailer.MEMBER_ID, node.config.self_address),
        (Trailer.RAFT_TERM, str(term)),
        (Trailer.APPLIED_INDEX, str(index or applied)),
    )


class Core:
    """What every servicer shares: the node, the proposer, who may call, headers and error replies."""

    def __init__(
        self,
        node: RaftNode,
        proposer: Proposer,
        *,
        members: dict[str, str],
        authenticator: Authenticator | None = None,
        proof_signer: ProofSigner | None = None,
        read_index: bool = True,
        count_refusal: errors.CountRefusal = errors.uncounted,
    ) -> None:
        self.node = node
        self.read_index = read_index  # Read and Describe on the leader without a log entry
        self.proposer = proposer
        self.member_id = node.config.self_address
        self.members = members
        self.authenticator = authenticator  # None: open data plane (no principals file)
        self.proof_signer = proof_signer  # None: Acquire returns no token_proof
        self.streams = StreamSlots()  # open KeepAliveStreams per principal
        self.count_refusal = count_refusal  # each error sent, by reason (metrics.py)

    def principal(self, context) -> Principal | None:
        """The authenticated caller (None when there is no principals file); raises
        UNAUTHENTICATED for a missing or unknown bearer token."""
        if self.authenticator is None:
            return None
        found = self.authenticator.principal(context.invocation_metadata() or ())
        if found is None:
            raise ServiceError(
                Failure.UNAUTHENTICATED, "this cluster needs 'authorization: Bearer TOKEN' of a known principal"
            )
        return found

    def authorize(self, caller: Principal | None, resource: str | None) -> None:
        """DESIGN I10: ``caller`` (what ``principal`` found) may act on ``resource`` (any
        resource: admin principals; anyone: no principals file)."""
        if caller is None:
            if self.authenticator is not None:  # only an open data plane has no caller
                raise ServiceError(Failure.UNAUTHENTICATED, "no authenticated caller for this call")
            return
        if resource is None or caller.admin or caller.may_use(resource):
            return
        raise ServiceError(
            Failure.PERMISSION_DENIED,
            f"principal {caller.name!r} may not use resource {resource!r}"
            f" (its prefixes: {', '.join(repr(p) for p in caller.prefixes) or 'none'})",
        )

    def list_prefixes(self, caller: Principal | None, prefix: str) -> tuple[str, ...]:
        """The prefixes a List of ``prefix`` by ``caller`` covers: ``prefix`` narrowed to the
        caller's own prefixes (all of it for an admin or on an open data plane), so a page
        never names a resource the caller may not use. PERMISSION_DENIED when they cover
        nothing; INVALID_ARGUMENT past LIST_PREFIXES_MAX of them (one entry carries them)."""
        self.authorize(caller, None)
        grants = None if caller is None or caller.admin else caller.prefixes
        covered = listing.narrowed(prefix, grants)
        if not covered:
            assert caller is not None, "only a principal's grants can cover nothing"
            raise ServiceError(
                Failure.PERMISSION_DENIED,
                f"principal {caller.name!r} may use no resource under prefix {prefix!r}"
                f" (its prefixes: {', '.join(repr(p) for p in caller.prefixes) or 'none'})",
            )
        if len(covered) > limits.LIST_PREFIXES_MAX:
            raise errors.invalid(
                "prefix",
                f"{prefix!r} covers {len(covered)} of your prefixes, more than one List may"
                f" ({limits.LIST_PREFIXES_MAX}, LIST_PREFIXES_MAX): list under a longer prefix",
            )
        return covered

    def header(self, index: int = 0) -> pb.ResponseHeader:
        term, applied = self.node.term_and_applied()
        return pb.ResponseHeader(member_id=self.member_id, raft_term=term, applied_index=index or applied)

    def trailing(self, index: int = 0) -> tuple[tuple[str, str], ...]:
        return error_trailers(self.node, index)

    def abort(self, context: grpc.ServicerContext, error: ServiceError):
        self.count_refusal(error.reason)
        errors.abort(context, error, self.trailing(error.index))

    def run(
        self,
        command: ops.Body,
        context,
        caller: Principal | None,
        *,
        max_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> tuple[Result, int]:
        """Authorize, then propose with the RPC's deadline (or ``timeout_s``); (its result,
        Raft index) or ServiceError. ``command`` carries its charges already (``body``)."""
        self.authorize(caller, command.resource)
        wait_s = self.proposer.timeout_s(context) if timeout_s is None else timeout_s
        result = self.proposer.propose(command, wait_s, max_bytes=max_bytes)
        applied: Result = result.value.result
        return applied, result.index

    def barrier(
        self, context, caller: Principal | None, resource: str | None = None, key: str | None = None,
        *, read_index: bool = False,
    ) -> tuple[ReadResult, int]:
        """A READ_BARRIER's result (DESIGN I9). ``read_index``: on the leader, with the setting
        on, try the read-index barrier first (no log entry); the log whenever it cannot answer."""
        result, index = self.read(ops.ReadBarrier(resource=resource, key=key), context, caller, read_index=read_index)
        return expect(ReadResult, result), index

    def read(
        self, command: ops.ReadBarrier, context, caller: Principal | None, *, read_index: bool = False,
    ) -> tuple[Result, int]:
        """``command``'s (a READ_BARRIER's) result, by read index when ``read_index`` allows
        (``barrier``), else through the log."""
        if read_index and self.read_index and self.node.is_leader():
            self.authorize(caller, command.resource)
            started = time.monotonic()
            wait_s = self.proposer.timeout_s(context)
            answered = self.proposer.read_index(command, wait_s)
            if answered is not None:
                return answered
            # Not the leader (any more), no entry of its term committed yet, or too many
            # waiting: the entry answers, within what is left of the deadline.
            left = wait_s - (time.monotonic() - started)
            return self.run(command, context, caller, timeout_s=max(PROPOSE_TIMEOUT_S_MIN, left))
        return self.run(command, context, caller)


def unary(method):
    """Authenticate the caller once, pass it on as ``caller``, and turn a ServiceError raised
    by the handler into a rich status with header trailers."""

    @functools.wraps(method)
    def handler(self, request, context):
        try:
            caller = self.core.principal(context)  # who is calling comes first, before any input check
            return method(self, request, context, caller)
        except ServiceError as error:
            self.core.abort(context, error)

    return handler

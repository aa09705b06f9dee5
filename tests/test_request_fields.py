"""One table of each RPC's request fields (``validation.REQUESTS``), and its four readers.

The service and the client check a request's fields through it, fencingctl takes from it
which fields a command takes and which the user must give, and the state machine's command schemas must
agree with it field for field (they are a different layer, with their own wire format, so
they are compared here rather than derived).
"""

from __future__ import annotations

import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient, ctl_request
from coordinator.client import exceptions as E
from coordinator.core import bodies, validation
from coordinator.core.commands import CHARGE_FIELDS, Op
from coordinator.server import errors, request_core

GOOD_OP_ID = bytes(16)

# The RPCs that propose a command of their own, and that command's op. (Restore proposes the
# chunked RESTORE_BEGIN, CHUNK..., COMMIT, whose fields are not the request's.)
OP_OF_RPC = {
    "Acquire": Op.ACQUIRE,
    "KeepAlive": Op.KEEP_ALIVE,
    "Release": Op.RELEASE,
    "Write": Op.WRITE,
    "Delete": Op.DELETE,
    "ForceRelease": Op.FORCE_RELEASE,
    "SetEpochFloor": Op.SET_EPOCH_FLOOR,
}


def _request_type(rpc: str):
    for svc in pb.DESCRIPTOR.services_by_name.values():
        if rpc in svc.methods_by_name:
            return svc.methods_by_name[rpc].input_type
    raise AssertionError(f"{rpc} is not an RPC of fencing.proto")


@pytest.mark.parametrize("rpc", sorted(validation.REQUESTS))
def test_every_field_of_the_table_is_a_field_of_the_rpcs_request(rpc):
    request_fields = set(_request_type(rpc).fields_by_name)
    assert set(validation.REQUESTS[rpc]) <= request_fields


@pytest.mark.parametrize("rpc", sorted(OP_OF_RPC))
def test_the_state_machines_command_schema_agrees_with_the_table(rpc):
    required, optional = bodies.SCHEMAS[OP_OF_RPC[rpc]]
    optional -= CHARGE_FIELDS  # the caller's principal and quota: from the server, not the request
    spec = validation.REQUESTS[rpc]
    assert {n for n, f in spec.items() if f.required} == required
    assert {n for n, f in spec.items() if not f.required} == optional
    for name, field in spec.items():
        assert field.check is bodies.FIELD_CHECKS[name], name


def test_check_request_reports_the_first_bad_field_in_table_order():
    with pytest.raises(validation.InvalidField) as caught:
        validation.check_request(
            "Write", {"resource": "r", "key": "", "value": b"v", "token": 0, "op_id": GOOD_OP_ID}
        )
    assert caught.value.field == "key"  # key comes before token in the table


def test_check_request_leaves_absent_optional_fields_none_and_checks_required_ones():
    checked = validation.check_request("KeepAlive", {"resource": "r", "token": 3})
    assert checked == {"resource": "r", "token": 3, "ttl_ms": None}
    with pytest.raises(validation.InvalidField) as caught:
        validation.check_request("KeepAlive", {"resource": "r"})
    assert caught.value.field == "token"


def test_check_request_refuses_a_field_the_rpc_does_not_take():
    with pytest.raises(validation.InvalidField, match="not a field of Read") as caught:
        validation.check_request("Read", {"resource": "r", "key": "k", "token": 3})
    assert caught.value.field == "token"


# -- the service reads proto requests through the table -------------------------------------


def test_service_reads_unset_optional_fields_as_absent():
    fields = request_core.checked_request("KeepAlive", pb.KeepAliveRequest(resource="r", token=3))
    assert fields["ttl_ms"] is None  # 0 on the wire: keep the lease's TTL
    fields = request_core.checked_request("Release", pb.ReleaseRequest(resource="r", token=3))
    assert fields["op_id"] is None
    fields = request_core.checked_request(
        "Write", pb.WriteRequest(resource="r", key="k", value=b"", token=3, op_id=GOOD_OP_ID)
    )
    assert fields["expected_version"] is None and fields["value"] == b""


def test_service_keeps_values_that_equal_the_proto_default_where_they_mean_something():
    # expected_version has presence: 0 set means "the key must be absent", not "any".
    request = pb.WriteRequest(
        resource="r", key="k", value=b"v", token=3, op_id=GOOD_OP_ID, expected_version=0
    )
    assert request_core.checked_request("Write", request)["expected_version"] == 0
    # A bool has no "unset": fence_all=False is the caller's choice.
    fields = request_core.checked_request("SetEpochFloor", pb.SetEpochFloorRequest(floor=5, fence_all=False))
    assert fields == {"floor": 5, "fence_all": False}


def test_service_refuses_a_bad_field_as_invalid_argument_naming_it():
    with pytest.raises(errors.ServiceError) as caught:
        request_core.checked_request("Acquire", pb.AcquireRequest(resource="r", holder="h", ttl_ms=5))
    assert caught.value.key is errors.Failure.INVALID_INPUT
    assert caught.value.metadata == {"field": "ttl_ms"}


# A request of each RPC whose op_id is required, valid but for the op_id left unset: what a
# caller in another language sends when it does not know the field is required.
WITHOUT_OP_ID = {
    "Acquire": pb.AcquireRequest(resource="r", holder="h", ttl_ms=5_000),
    "Write": pb.WriteRequest(resource="r", key="k", value=b"v", token=3),
    "Delete": pb.DeleteRequest(resource="r", key="k", token=3),
    "ForceRelease": pb.ForceReleaseRequest(resource="r"),
}
SEND_AN_OP_ID = ("field 'op_id': is 0 bytes, not in [16, 64]: send 16-64 random bytes, new for each operation "
                 "and reused only to retry it (a retry with the same op_id applies once: DESIGN I5)")


def test_every_rpc_that_requires_an_op_id_is_checked_here():
    required = {rpc for rpc, spec in validation.REQUESTS.items() if "op_id" in spec and spec["op_id"].required}
    assert required == set(WITHOUT_OP_ID)


@pytest.mark.parametrize("rpc", sorted(WITHOUT_OP_ID))
def test_a_request_without_an_op_id_is_refused_saying_what_to_send(rpc):
    with pytest.raises(errors.ServiceError) as caught:
        request_core.checked_request(rpc, WITHOUT_OP_ID[rpc])
    assert caught.value.key is errors.Failure.INVALID_INPUT
    assert (caught.value.message, caught.value.metadata) == (SEND_AN_OP_ID, {"field": "op_id"})
    too_short = type(WITHOUT_OP_ID[rpc])()
    too_short.CopyFrom(WITHOUT_OP_ID[rpc])
    too_short.op_id = b"x" * 15
    with pytest.raises(errors.ServiceError) as caught:
        request_core.checked_request(rpc, too_short)
    assert caught.value.message == SEND_AN_OP_ID.replace("is 0 bytes", "is 15 bytes")


def test_a_lock_without_a_waiter_id_is_refused_saying_what_to_send():
    with pytest.raises(errors.ServiceError) as caught:
        request_core.checked_request("Lock", pb.LockRequest(resource="r", holder="h", ttl_ms=5_000))
    assert caught.value.message == ("field 'waiter_id': is 0 bytes, not in [16, 64]: send 16-64 random bytes, "
                                    "chosen once per lock wait and sent on each of its Lock calls")


# -- the client checks requests by the table --------------------------------------------------


@pytest.fixture
def offline_client():
    # Nothing listens on port 1: a request that got past the checks would fail as Unavailable.
    with FencingClient(["127.0.0.1:1"], timeout_s=0.5, retry_max_attempts=1) as client:
        yield client


def test_client_checks_a_request_by_the_tables_row(monkeypatch, offline_client):
    # A rule put into the table reaches the client: it has no field list of its own.
    def only_k(value):
        if value != "k":
            raise validation.InvalidField("key", "must be 'k' in this test")
        return value

    monkeypatch.setitem(validation.REQUESTS["Write"], "key", validation.Field(only_k))
    with pytest.raises(E.InvalidArgument, match="must be 'k' in this test") as caught:
        offline_client.write("r", "other", b"v", token=3)
    assert caught.value.field == "key"
    assert caught.value.metadata == {"field": "key"}
    with pytest.raises(E.Unavailable):  # a good key passes the checks and is sent
        offline_client.write("r", "k", b"v", token=3)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda c: c.acquire("r", ttl_ms=5, holder="h"), "ttl_ms"),
        (lambda c: c.keep_alive("r", 0), "token"),
        (lambda c: c.release("r", 3, op_id=b"short"), "op_id"),
        (lambda c: c.describe("r r"), "resource"),
        (lambda c: c.write("r", "k", "text", token=3), "value"),
        (lambda c: c.write("r", "k", b"v", token=3, expected_version=-1), "expected_version"),
        (lambda c: c.delete("r", "", token=3), "key"),
        (lambda c: c.read("r", "k k"), "key"),
        (lambda c: c.force_release("r", op_id=b""), "op_id"),
        (lambda c: c.set_epoch_floor(0), "floor"),
        (lambda c: c.restore(b"backup", epoch_floor=0), "epoch_floor"),
    ],
)
def test_client_refuses_a_bad_field_of_every_rpc_naming_it(offline_client, call, field):
    with pytest.raises(E.InvalidArgument) as caught:
        call(offline_client)
    assert caught.value.field == field


# -- fencingctl takes the table's fields ------------------------------------------------------


@pytest.mark.parametrize("command", sorted(ctl_request._RPC_OF))
def test_fencingctl_takes_the_rpcs_fields_and_requires_what_the_client_cannot_fill_in(command):
    spec = validation.REQUESTS[ctl_request._RPC_OF[command]]
    taken = dict(ctl_request._fields_of(command))
    extra = set(ctl_request._EXTRA_FIELDS.get(command, ()))
    assert set(taken) - extra == set(spec) - {"data"}  # restore's data is the --in file
    for name, field in spec.items():
        if name in taken and field.filled_by_client:
            assert not taken[name], f"{command} must not require {name}: the client fills it in"
        if name in taken and not field.required:
            assert not taken[name], f"{command} must not require optional {name}"


def test_fencingctl_requires_exactly_these_fields():
    required = {c: [n for n, r in ctl_request._fields_of(c) if r] for c in ctl_request._RPC_OF}
    assert required == {
        "acquire": ["resource", "ttl_ms"],
        "keepalive": ["resource", "token"],
        "release": ["resource", "token"],
        "describe": ["resource"],
        "write": ["resource", "key", "token"],  # the value: VALUE, --value-file or value_base64
        "read": ["resource", "key"],
        "delete": ["resource", "key", "token"],
        "force-release": ["resource"],
        "set-epoch-floor": ["floor"],
        "restore": ["epoch_floor"],
    }

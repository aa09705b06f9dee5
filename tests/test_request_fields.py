"""One typed body per op (``core/ops.py``), the RPC request rows taken from it
(``requests.REQUESTS``), and their readers.

The service builds an op's body from a request (every field checked by the rule its class
names), the client checks a request by the same row before sending, fencingctl takes from it
which fields a command takes and which the user must give, and the proto stays the wire
contract: every field of an RPC's request is a field of its row (or one of the few the row
leaves out, each for a reason below) and every field of the row is a field of the request.
"""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient, ctl_request
from coordinator.client import exceptions as E
from coordinator.core import ops, requests, validation
from coordinator.core.commands import Op
from coordinator.server import errors, request_core
from coordinator.server.auth import Principal, Quota

GOOD_OP_ID = bytes(16)

# Request fields that are no op's field, and why: they shape the call, not the entry.
NOT_IN_A_BODY = {
    "Acquire": {"wait_ms"},  # how long the server waits in line: clamped, never logged
    "Lock": {"wait_ms"},
    "KeepAlive": {"lease_id"},  # must equal the token (a rule between fields), or be 0
    "RestoreStream": {"data"},  # the stream's chunks, checked whole when it ends
}


def _request_type(rpc: str):
    for svc in pb.DESCRIPTOR.services_by_name.values():
        if rpc in svc.methods_by_name:
            return svc.methods_by_name[rpc].input_type
    raise AssertionError(f"{rpc} is not an RPC of fencing.proto")


@pytest.mark.parametrize("rpc", sorted(requests.REQUESTS))
def test_the_rows_fields_are_the_rpcs_request_fields_both_ways(rpc):
    request_fields = set(_request_type(rpc).fields_by_name)
    row = set(requests.REQUESTS[rpc])
    assert row - request_fields == set(), "a field of the row that the proto request lacks"
    assert request_fields - row == NOT_IN_A_BODY.get(rpc, set()), "a proto request field with no schema field"


@pytest.mark.parametrize("rpc", sorted(requests.BODY_OF))
def test_an_rpc_that_builds_an_op_body_carries_exactly_its_fields_but_the_charges(rpc):
    cls = requests.BODY_OF[rpc]
    fields = {f.name for f in dataclasses.fields(cls)} - ops.CHARGE_FIELDS
    assert set(_request_type(rpc).fields_by_name) - NOT_IN_A_BODY.get(rpc, set()) == fields
    for name, check, required in cls.plan():
        if name in fields:
            spec = requests.REQUESTS[rpc][name]
            assert (spec.check, spec.required) == (check, required), name


def test_every_op_has_one_body_class_whose_fields_each_name_a_rule():
    assert set(ops.SCHEMAS) == set(Op)
    for op, cls in ops.SCHEMAS.items():
        assert cls.OP is op
        for name, check, _required in cls.plan():
            assert callable(check) and check.__module__ == validation.__name__, (op, name)


def test_a_body_is_checked_as_it_is_built_and_reports_the_first_bad_field():
    with pytest.raises(validation.InvalidField) as caught:
        ops.Write(resource="r", key="", value=b"v", token=0, op_id=GOOD_OP_ID)
    assert caught.value.field == "key"
    with pytest.raises(validation.InvalidField, match="needs a principal"):
        ops.Acquire(resource="r", holder="h", ttl_ms=5_000, op_id=GOOD_OP_ID, quota={"leases": 1})
    with pytest.raises(validation.InvalidField, match="not a field of WRITE"):
        ops.Write.from_map({"resource": "r", "owner": "me"})
    with pytest.raises(validation.InvalidField, match="is required by WRITE"):
        ops.Write.from_map({"resource": "r"})


def test_a_body_encodes_and_decodes_to_itself_with_its_stamp():
    body = ops.Write(resource="r", key="k", value=b"v", token=3, op_id=GOOD_OP_ID, principal="p",
                     quota={"stored_bytes": 10})
    assert ops.decode(ops.encode(body, 1234)) == (1234, body)
    listing = ops.ReadBarrier(prefixes=["a/", "b/"], limit=5)  # a list is checked into a tuple
    assert listing.prefixes == ("a/", "b/") and ops.decode(ops.encode(listing, 0)) == (0, listing)


def test_the_charges_are_the_callers_and_only_the_quotas_the_op_reads():
    quota = {"resources": 1, "leases": 2, "stored_bytes": 3, "dedup_entries": 4}
    fields = {"resource": "r", "op_id": GOOD_OP_ID}
    assert ops.charge_fields(ops.Write, fields, principal="p", quota=quota) == {
        "principal": "p", "quota": {"stored_bytes": 3, "dedup_entries": 4}}
    assert ops.charge_fields(ops.Acquire, fields, principal="p", quota=quota) == {"principal": "p", "quota": quota}
    assert ops.charge_fields(ops.Release, {"resource": "r"}, principal="p", quota=quota) == {}  # no op_id
    assert ops.charge_fields(ops.KeepAlive, fields, principal="p", quota=quota) == {}  # not charged


def test_check_request_reports_the_first_bad_field_in_table_order():
    with pytest.raises(validation.InvalidField) as caught:
        requests.check_request(
            "Write", {"resource": "r", "key": "", "value": b"v", "token": 0, "op_id": GOOD_OP_ID}
        )
    assert caught.value.field == "key"  # key comes before token in the table


def test_check_request_leaves_absent_optional_fields_none_and_checks_required_ones():
    checked = requests.check_request("KeepAlive", {"resource": "r", "token": 3})
    assert checked == {"resource": "r", "token": 3, "ttl_ms": None}
    with pytest.raises(validation.InvalidField) as caught:
        requests.check_request("KeepAlive", {"resource": "r"})
    assert caught.value.field == "token"


def test_check_request_refuses_a_field_the_rpc_does_not_take():
    with pytest.raises(validation.InvalidField, match="not a field of Read") as caught:
        requests.check_request("Read", {"resource": "r", "key": "k", "token": 3})
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
    request = pb.AcquireRequest(resource="r", holder="h", ttl_ms=5, op_id=GOOD_OP_ID)
    with pytest.raises(errors.ServiceError) as caught:
        request_core.build(ops.Acquire, request, None)
    assert caught.value.key is errors.Failure.INVALID_INPUT
    assert caught.value.metadata == {"field": "ttl_ms"}


def test_service_builds_a_body_once_with_the_callers_charges():
    caller = Principal("team-a", ("jobs/",), admin=False, quota=Quota(leases_max=3, stored_bytes_max=100))
    write = pb.WriteRequest(resource="jobs/1", key="k", value=b"v", token=3, op_id=GOOD_OP_ID)
    assert request_core.build(ops.Write, write, caller) == ops.Write(
        resource="jobs/1", key="k", value=b"v", token=3, op_id=GOOD_OP_ID, principal="team-a",
        quota={"stored_bytes": 100})  # a write reads no lease quota: it stays out of the entry
    keep_alive = request_core.build(ops.KeepAlive, pb.KeepAliveRequest(resource="jobs/1", token=3), caller)
    assert keep_alive == ops.KeepAlive(resource="jobs/1", token=3)  # charged to nobody
    assert request_core.build(ops.Write, write, None).principal is None  # an open data plane


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
    required = {rpc for rpc, spec in requests.REQUESTS.items() if "op_id" in spec and spec["op_id"].required}
    assert required == set(WITHOUT_OP_ID)


@pytest.mark.parametrize("rpc", sorted(WITHOUT_OP_ID))
def test_a_request_without_an_op_id_is_refused_saying_what_to_send(rpc):
    with pytest.raises(errors.ServiceError) as caught:
        request_core.build(requests.BODY_OF[rpc], WITHOUT_OP_ID[rpc], None)
    assert caught.value.key is errors.Failure.INVALID_INPUT
    assert (caught.value.message, caught.value.metadata) == (SEND_AN_OP_ID, {"field": "op_id"})
    too_short = type(WITHOUT_OP_ID[rpc])()
    too_short.CopyFrom(WITHOUT_OP_ID[rpc])
    too_short.op_id = b"x" * 15
    with pytest.raises(errors.ServiceError) as caught:
        request_core.build(requests.BODY_OF[rpc], too_short, None)
    assert caught.value.message == SEND_AN_OP_ID.replace("is 0 bytes", "is 15 bytes")


def test_a_lock_without_a_waiter_id_is_refused_saying_what_to_send():
    with pytest.raises(errors.ServiceError) as caught:
        request_core.build(ops.Enqueue, pb.LockRequest(resource="r", holder="h", ttl_ms=5_000), None)
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

    monkeypatch.setitem(requests.REQUESTS["Write"], "key", requests.Field(only_k))
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
    spec = requests.REQUESTS[ctl_request._RPC_OF[command]]
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

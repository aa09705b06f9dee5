"""DESIGN I10: who is calling, and may they use this resource. Separate from the epoch check.

Unit tests for the principals file and bearer parsing; then a three-process cluster with a
principals file, called through raw stubs and the client library.
"""

from __future__ import annotations

import os

import grpc
import pytest

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.client.exceptions import AuthError
from coordinator.core import limits
from coordinator.core.names import ErrorReason
from coordinator.server import config as config_mod
from coordinator.server.auth import (
    ADMIN_TOKEN_PRINCIPAL,
    Authenticator,
    PrincipalsError,
    Quota,
    load_principals,
    token_digest,
)
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster

T = RPC_TIMEOUT_S
ORDERS, OPS, ADMIN = "orders-secret", "ops-secret", "admin-secret"


def principals_toml(*entries: str) -> str:
    return "\n".join(f"[[principal]]\n{e}\n" for e in entries)


ORDERS_ENTRY = f'name = "orders"\ntoken_sha256 = "{token_digest(ORDERS)}"\nprefixes = ["orders/"]'
OPS_ENTRY = f'name = "ops"\ntoken_sha256 = "{token_digest(OPS)}"\nadmin = true'


# -- the principals file --------------------------------------------------------------------


def test_a_good_file_loads(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(principals_toml(ORDERS_ENTRY, OPS_ENTRY))
    loaded = dict(load_principals(str(path)))
    orders = loaded[token_digest(ORDERS)]
    assert (orders.name, orders.prefixes, orders.admin) == ("orders", ("orders/",), False)
    assert orders.may_use("orders/7") and not orders.may_use("billing/7") and not orders.may_use("order")
    assert loaded[token_digest(OPS)].admin


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "no [[principal]]"),
        ("x = 1", "unknown key(s) x"),
        (principals_toml('name = "a"\ntoken_sha256 = "ABC"\nprefixes = ["a/"]'), "64 lowercase hex"),
        (principals_toml(ORDERS_ENTRY, ORDERS_ENTRY.replace('"orders"', '"o2"', 1)), "used by another"),
        (principals_toml(ORDERS_ENTRY, OPS_ENTRY.replace('"ops"', '"orders"')), "name is used twice"),
        (principals_toml(ORDERS_ENTRY.replace('"orders/"', '"orders/*"')), "resource-name characters"),
        (principals_toml(ORDERS_ENTRY + "\nrole = 1"), "unknown field(s) role"),
        (principals_toml(f'name = "idle"\ntoken_sha256 = "{token_digest("x")}"'), "could do nothing"),
        (principals_toml(ORDERS_ENTRY + '\nadmin = "yes"'), "admin must be true or false"),
        (principals_toml(ORDERS_ENTRY + "\nresources_max = -1"), "resources_max must be an integer"),
        (principals_toml(ORDERS_ENTRY + '\nstreams_max = "8"'), "streams_max must be an integer"),
        (principals_toml(ORDERS_ENTRY + "\nleases_max = true"), "leases_max must be an integer"),
        (principals_toml(ORDERS_ENTRY + f"\nstored_bytes_max = {2**63}"), "stored_bytes_max must be"),
        # A dedup budget of 0 would keep no op_id: every retry could apply twice.
        (principals_toml(ORDERS_ENTRY + "\ndedup_entries_max = 0"), "dedup_entries_max must be an integer in [1,"),
        (principals_toml(ORDERS_ENTRY.replace('"orders"', '"' + "o" * 129 + '"', 1)), "longer than 128 bytes"),
        ("[[principal", "not valid TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_what_is_wrong(tmp_path, text, fragment):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PrincipalsError) as caught:
        load_principals(str(path))
    assert fragment in str(caught.value)
    # ... and fencingd refuses to start with it, naming the key.
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.build({
            "data_dir": str(tmp_path / "d"), "raft_address": "127.0.0.1:7000",
            "members": ["127.0.0.1:7000=127.0.0.1:7100"], "principals_file": str(path),
        }, {})
    assert str(caught.value).startswith("principals_file: ")


def test_quotas_default_for_tenants_and_are_absent_for_admins_unless_set(tmp_path):
    path = tmp_path / "p.toml"
    capped_ops = OPS_ENTRY.replace('"ops"', '"ops2"').replace(token_digest(OPS), token_digest("x"))
    path.write_text(principals_toml(ORDERS_ENTRY, OPS_ENTRY, capped_ops + "\nstreams_max = 1\nresources_max = 0"))
    loaded = {p.name: p for _, p in load_principals(str(path))}
    assert loaded["orders"].quota == Quota(
        resources_max=limits.PRINCIPAL_RESOURCES_MAX,
        leases_max=limits.PRINCIPAL_LEASES_MAX,
        stored_bytes_max=limits.PRINCIPAL_STORED_BYTES_MAX,
        streams_max=limits.PRINCIPAL_STREAMS_MAX,
        dedup_entries_max=limits.PRINCIPAL_DEDUP_ENTRIES_MAX,
    )
    assert loaded["orders"].quota.replicated() == {
        "resources": limits.PRINCIPAL_RESOURCES_MAX,
        "leases": limits.PRINCIPAL_LEASES_MAX,
        "stored_bytes": limits.PRINCIPAL_STORED_BYTES_MAX,
        "dedup_entries": limits.PRINCIPAL_DEDUP_ENTRIES_MAX,
    }
    assert loaded["ops"].quota == Quota() and loaded["ops"].quota.replicated() == {}
    assert loaded["ops2"].quota == Quota(resources_max=0, streams_max=1)
    assert ADMIN_TOKEN_PRINCIPAL.quota == Quota()


def test_bearer_tokens_authenticate_only_exactly():
    auth = Authenticator([(token_digest(ORDERS), object())], admin_token=ADMIN)
    assert auth.principal([("authorization", f"Bearer {ORDERS}")]) is not None
    assert auth.principal([("authorization", f"bearer {ORDERS}")]) is not None  # scheme is case-blind
    assert auth.principal([("authorization", f"Bearer {ADMIN}")]) is ADMIN_TOKEN_PRINCIPAL
    for metadata in ([], [("authorization", ORDERS)], [("authorization", f"Basic {ORDERS}")],
                     [("authorization", f"Bearer {ORDERS}x")], [("authorization", "Bearer ")],
                     [("x-token", ORDERS)]):
        assert auth.principal(metadata) is None, metadata


# -- a cluster with principals -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("auth")
    path = base / "principals.toml"
    path.write_text(principals_toml(ORDERS_ENTRY, OPS_ENTRY))
    settings = {"principals_file": str(path), "admin_token": ADMIN}
    yield from running_cluster(str(base), request, settings=settings)


def bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, timeout=T, **kwargs)
    return caught.value.code()


def test_no_or_unknown_credential_is_unauthenticated_and_health_stays_open(cluster):
    node = cluster.nodes[0]
    acquire = pb.AcquireRequest(resource="orders/1", holder="h", ttl_ms=60_000, op_id=os.urandom(16))
    for metadata in ((), bearer("nobody")):
        assert code_of(node.lease.Acquire, acquire, metadata=metadata) is grpc.StatusCode.UNAUTHENTICATED
        assert code_of(node.cluster.Status, pb.StatusRequest(), metadata=metadata) is grpc.StatusCode.UNAUTHENTICATED
        many = pb.KeepAliveManyRequest(leases=[pb.KeepAliveRequest(resource="orders/1", token=1)])
        assert code_of(node.lease.KeepAliveMany, many, metadata=metadata) is grpc.StatusCode.UNAUTHENTICATED
    # Who is calling is checked before the input: a stranger learns nothing from validation.
    bad = pb.WriteRequest(resource="orders/1", key="k", value=b"v", token=0, op_id=b"short")
    assert code_of(node.store.Write, bad) is grpc.StatusCode.UNAUTHENTICATED
    assert node.health_status() is not None  # probes need no credential


def test_a_principal_uses_its_prefixes_only_and_a_refusal_changes_nothing(cluster):
    endpoints = [n.api_address for n in cluster.nodes]
    with FencingClient(endpoints, bearer_token=ORDERS) as orders, FencingClient(endpoints, bearer_token=OPS) as ops:
        lease = orders.acquire("orders/7", holder="svc", ttl_ms=60_000)
        assert orders.write("orders/7", "k", b"v", token=lease.token).version >= 1
        before = ops.describe("billing/7")
        for attempt in (
            lambda: orders.acquire("billing/7", holder="svc", ttl_ms=60_000),
            lambda: orders.write("billing/7", "k", b"v", token=before.hwm or 1),
            lambda: orders.read("billing/7", "k"),
            lambda: orders.describe("billing/7"),
            lambda: orders.force_release("orders/7"),  # not an admin
        ):
            with pytest.raises(AuthError) as caught:
                attempt()
            assert caught.value.reason == ErrorReason.PERMISSION_DENIED
        after = ops.describe("billing/7")  # an admin principal sees every resource
        assert (after.held, after.hwm) == (before.held, before.hwm)
        assert orders.status().has_quorum  # Status needs a principal, any principal
        fenced = ops.force_release("orders/7")  # ops is an admin: fences the old holder
        assert fenced.hwm > lease.token
    with FencingClient(endpoints, admin_token=ADMIN) as admin:  # the admin token is an admin principal
        assert admin.describe("orders/7").hwm == fenced.hwm


def acquire_as_orders(node, resource: str) -> int:
    """The token of a lease the orders principal takes on ``resource``."""
    request = pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=os.urandom(16))
    return node.lease.Acquire(request, timeout=T, metadata=bearer(ORDERS)).token


def test_write_many_refuses_each_foreign_item_alone(cluster):
    node = cluster.nodes[0]
    token = acquire_as_orders(node, "orders/write-many")
    items = [pb.WriteRequest(resource="orders/write-many", key="k", value=b"v", token=token, op_id=os.urandom(16)),
             pb.WriteRequest(resource="billing/write-many", key="k", value=b"v", token=1, op_id=os.urandom(16))]
    reply = node.store.WriteMany(pb.WriteManyRequest(writes=items), timeout=T, metadata=bearer(ORDERS))
    assert reply.results[0].WhichOneof("outcome") == "write"
    refused = reply.results[1].error
    assert (refused.code, refused.reason) == ("PERMISSION_DENIED", ErrorReason.PERMISSION_DENIED)
    # Without a credential the whole call is refused, as a Write would be.
    assert code_of(node.store.WriteMany, pb.WriteManyRequest(writes=items[:1])) is grpc.StatusCode.UNAUTHENTICATED


def test_acquire_many_and_release_many_refuse_each_foreign_item_alone(cluster):
    node = cluster.nodes[0]
    items = [pb.AcquireRequest(resource="orders/acquire-many", holder="h", ttl_ms=60_000, op_id=os.urandom(16)),
             pb.AcquireRequest(resource="billing/acquire-many", holder="h", ttl_ms=60_000, op_id=os.urandom(16))]
    reply = node.lease.AcquireMany(pb.AcquireManyRequest(acquires=items), timeout=T, metadata=bearer(ORDERS))
    assert reply.results[0].WhichOneof("outcome") == "acquire"
    refused = reply.results[1].error
    assert (refused.code, refused.reason) == ("PERMISSION_DENIED", ErrorReason.PERMISSION_DENIED)
    token = reply.results[0].acquire.token
    releases = [pb.ReleaseRequest(resource="orders/acquire-many", token=token, op_id=os.urandom(16)),
                pb.ReleaseRequest(resource="billing/acquire-many", token=1, op_id=os.urandom(16))]
    released = node.lease.ReleaseMany(pb.ReleaseManyRequest(releases=releases), timeout=T, metadata=bearer(ORDERS))
    assert released.results[0].release.released
    assert released.results[1].error.reason == ErrorReason.PERMISSION_DENIED
    # Without a credential the whole call is refused, as an Acquire or Release would be.
    assert code_of(node.lease.AcquireMany, pb.AcquireManyRequest(acquires=items[:1])) is grpc.StatusCode.UNAUTHENTICATED
    assert (
        code_of(node.lease.ReleaseMany, pb.ReleaseManyRequest(releases=releases[:1])) is grpc.StatusCode.UNAUTHENTICATED
    )


def test_keep_alive_many_refuses_each_foreign_item_alone(cluster):
    node = cluster.nodes[0]
    token = acquire_as_orders(node, "orders/many")
    reply = node.lease.KeepAliveMany(
        pb.KeepAliveManyRequest(leases=[
            pb.KeepAliveRequest(resource="orders/many", token=token),
            pb.KeepAliveRequest(resource="billing/many", token=1),
        ]),
        timeout=T, metadata=bearer(ORDERS),
    )
    assert [(r.ok, r.reason) for r in reply.results] == [(True, ""), (False, ErrorReason.PERMISSION_DENIED)]


def test_keep_alive_stream_checks_its_caller_once_and_every_item_alone(cluster):
    node = cluster.nodes[0]
    token = acquire_as_orders(node, "orders/stream")
    mine = pb.KeepAliveRequest(resource="orders/stream", token=token)
    for metadata in ((), bearer("nobody")):
        got = []
        with pytest.raises(grpc.RpcError) as caught:
            got.extend(node.lease.KeepAliveStream(iter([mine]), timeout=T, metadata=metadata))
        assert (caught.value.code(), got) == (grpc.StatusCode.UNAUTHENTICATED, [])
    got = []
    foreign = pb.KeepAliveRequest(resource="billing/stream", token=1)
    with pytest.raises(grpc.RpcError) as caught:
        got.extend(node.lease.KeepAliveStream(iter([mine, foreign, mine]), timeout=T, metadata=bearer(ORDERS)))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert [(r.resource, r.token) for r in got] == [("orders/stream", token)]  # the first item only

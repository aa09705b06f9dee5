"""Lease.List, pure parts and end to end in process (issue 29 point 4).

The core: a listing READ_BARRIER answers a sorted page under some prefixes, with remaining TTLs
on the log clock, and changes nothing; its bad bodies are refused MALFORMED. The page token,
the narrowing of a prefix to a caller's grants and the reply's byte bound. Then the real
servicers over ``testsupport.inmemory`` (real gRPC sockets, an in-memory log): paging, bad
input as INVALID_ARGUMENT naming the field, a principal that sees only its own prefixes, the
sync and asyncio clients' ``list_all``, and ``fencingctl ls``. A real three-process cluster:
tests/test_list_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
import os

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import exceptions as exc
from coordinator.client.aio import AsyncFencingClient
from coordinator.client.fencingctl import main as fencingctl
from coordinator.client.sync import FencingClient
from coordinator.core import commands as cmds
from coordinator.core import limits, listing, ops, validation
from coordinator.core.results import ListedResource, ListResult
from coordinator.core.state_machine import Applied, FencingStateMachine, Reason, Rejected
from coordinator.server.auth import token_digest
from testsupport.inmemory import InMemoryCluster

TTL = 10_000


def _acquire(sm: FencingStateMachine, name: str, stamp: int, holder: str = "h") -> int:
    out = sm.execute(cmds.acquire(resource=name, holder=holder, ttl_ms=TTL, op_id=os.urandom(16), stamp_ms=stamp))
    assert isinstance(out, Applied), out
    return out.result.token


def _page(sm: FencingStateMachine, prefixes=("",), limit=10, after=None) -> ListResult:
    out = sm.execute(cmds.list_page(prefixes=tuple(prefixes), limit=limit, after=after, stamp_ms=0))
    assert isinstance(out, Applied), out
    assert isinstance(out.result, ListResult), out
    return out.result


def _names(result: ListResult) -> list[str]:
    return [item.resource for item in result.resources]


# -- the core ---------------------------------------------------------------------------


def test_a_page_is_sorted_by_name_under_its_prefixes_and_continues_after_a_name():
    sm = FencingStateMachine()
    for stamp, name in enumerate(["orders/3", "billing/1", "orders/1", "orders/10", "orders/2", "ordersx"], 1000):
        _acquire(sm, name, stamp)
    first = _page(sm, ("orders/",), limit=2)
    assert _names(first) == ["orders/1", "orders/10"] and first.more is True
    second = _page(sm, ("orders/",), limit=2, after="orders/10")
    assert _names(second) == ["orders/2", "orders/3"] and second.more is False
    assert _names(_page(sm, ("billing/", "orders/1"), limit=10)) == ["billing/1", "orders/1", "orders/10"]
    assert _names(_page(sm, ("",), limit=100)) == sorted(["orders/3", "billing/1", "orders/1", "orders/10",
                                                          "orders/2", "ordersx"])
    assert _page(sm, ("nothing/",)).resources == ()


def test_each_item_has_holder_token_hwm_remaining_ttl_on_the_log_clock_and_waiters():
    sm = FencingStateMachine()
    token = _acquire(sm, "jobs/a", 1000, holder="worker-1")
    for n in range(2):
        queued = sm.execute(cmds.enqueue(resource="jobs/a", holder=f"w{n}", ttl_ms=TTL,
                                         waiter_id=bytes([n]) * 16, stamp_ms=1000))
        assert isinstance(queued, Applied) and queued.result.queued
    sm.execute(cmds.tick(stamp_ms=4000))  # the log clock moves to 4000: 7 s of 10 left
    [item] = _page(sm).resources
    assert dict(zip(listing.ITEM_FIELDS, item.to_list(), strict=True)) == {
        "resource": "jobs/a", "held": True, "holder": "worker-1", "token": token, "hwm": token,
        "remaining_ms": 7000, "waiters": 2,
    }
    assert _page(sm).log_clock_ms == 4000


def test_a_lease_expired_by_the_log_clock_is_listed_not_held_before_its_tick():
    sm = FencingStateMachine()
    token = _acquire(sm, "jobs/a", 1000)
    sm.execute(cmds.write(resource="jobs/a", key="k", value=b"v", token=token, op_id=os.urandom(16), stamp_ms=1000))
    out = sm.execute(cmds.list_page(prefixes=("",), limit=10, stamp_ms=1000 + TTL + 1))
    assert isinstance(out, Applied)
    assert out.result == ListResult(
        log_clock_ms=1000 + TTL + 1, resources=(ListedResource("jobs/a", False, "", 0, token, 0, 0),), more=False
    )
    assert out.result.to_map()["resources"] == [["jobs/a", False, "", 0, token, 0, 0]]


def test_a_listing_changes_nothing_and_the_read_index_path_answers_alike():
    sm = FencingStateMachine()
    for stamp, name in enumerate(["a/1", "a/2", "b/1"], 1000):
        _acquire(sm, name, stamp)
    before, clock = sm.digest(), sm.log_clock_ms
    command = cmds.list_page(prefixes=("a/",), limit=1, stamp_ms=0)
    applied = sm.apply(command.encode())  # as a log entry: encoded, decoded, applied
    assert isinstance(applied, Applied)
    now = sm.read_now(ops.ReadBarrier(prefixes=("a/",), limit=1))
    assert isinstance(now, Applied) and now.result == applied.result
    assert sm.digest() == before and sm.log_clock_ms == clock


@pytest.mark.parametrize("body, field", [
    ({"prefixes": ["a/"]}, "limit"),  # a limit goes with prefixes
    ({"prefixes": ["a/"], "limit": 0}, "limit"),
    ({"prefixes": ["a/"], "limit": limits.LIST_LIMIT_MAX + 1}, "limit"),
    ({"prefixes": [], "limit": 5}, "prefixes"),
    ({"prefixes": ["a/", "a/b"], "limit": 5}, "prefixes"),  # one inside another
    ({"prefixes": ["a/", "a/"], "limit": 5}, "prefixes"),
    ({"prefixes": ["a b"], "limit": 5}, "prefixes"),
    ({"prefixes": "a/", "limit": 5}, "prefixes"),
    ({"prefixes": ["a/"], "limit": 5, "resource": "a/1"}, "prefixes"),  # lists or reads, not both
    ({"limit": 5}, "limit"),
    ({"after": "a/1"}, "after"),
    ({"prefixes": ["a/"], "limit": 5, "after": ""}, "after"),
])
def test_a_bad_listing_body_is_refused_malformed_naming_the_field_and_changes_nothing(body, field):
    sm = FencingStateMachine()
    _acquire(sm, "a/1", 1000)
    before, clock = sm.digest(), sm.log_clock_ms
    out = sm.execute(cmds.Command(cmds.Op.READ_BARRIER, 5000, body))
    assert isinstance(out, Rejected) and out.reason is Reason.MALFORMED, out
    assert out.details["field"] == field
    assert sm.digest() == before and sm.log_clock_ms == clock


def test_more_prefixes_than_one_entry_may_carry_is_refused():
    prefixes = [f"p{n}/" for n in range(limits.LIST_PREFIXES_MAX + 1)]
    out = FencingStateMachine().execute(cmds.list_page(prefixes=tuple(prefixes), limit=5, stamp_ms=0))
    assert isinstance(out, Rejected) and out.details["field"] == "prefixes"
    assert limits.LIST_PREFIXES_MAX <= limits.COMMAND_ITEMS_MAX  # what the decoder allows an array


@pytest.mark.parametrize("prefix, grants, covered", [
    ("", None, ("",)),
    ("orders/", None, ("orders/",)),
    ("", ("orders/", "billing/"), ("billing/", "orders/")),
    ("orders/7", ("orders/",), ("orders/7",)),
    ("o", ("orders/", "billing/"), ("orders/",)),
    ("x/", ("orders/",), ()),
    ("", ("a/", "a/b/"), ("a/",)),  # a grant inside another adds nothing
])
def test_a_prefix_is_narrowed_to_the_callers_grants(prefix, grants, covered):
    assert listing.narrowed(prefix, grants) == covered


def test_the_page_token_round_trips_and_anything_else_is_refused():
    token = validation.page_token("orders/", "orders/9")
    assert validation.check_page_token(token) == ("orders/", "orders/9")
    assert len(validation.page_token("p" * 256, "p" * 256)) <= limits.LIST_PAGE_TOKEN_BYTES_MAX
    for bad in ("", "junk", "v1.zz", "v1." + b"orders/".hex(), "v1." + b"a/\nb/1".hex(),
                "v1." + b"a/\na b".hex(), "v2." + b"a/\na/1".hex(), "v1." + "61" * 2000, 7):
        with pytest.raises(validation.InvalidField) as caught:
            validation.check_page_token(bad)
        assert caught.value.field == "page_token"


def test_a_full_page_of_the_largest_items_stays_under_the_reply_bound():
    item = pb.ListedResource(
        resource="r" * limits.RESOURCE_NAME_BYTES_MAX, held=True, holder="h" * limits.HOLDER_BYTES_MAX,
        token=limits.TOKEN_MAX, hwm=limits.TOKEN_MAX, remaining_ms=limits.LEASE_TTL_MS_MAX, waiters=2**32 - 1,
    )
    assert item.ByteSize() + 3 <= limits.LIST_ITEM_BYTES_MAX  # + its tag and length in the reply
    reply = pb.ListResponse(
        header=pb.ResponseHeader(member_id="m" * 255, raft_term=2**63, applied_index=2**63),
        resources=[item] * limits.LIST_LIMIT_MAX,
        next_page_token=validation.page_token("r" * 256, "r" * 256), log_clock_ms=2**53,
    )
    assert reply.ByteSize() <= limits.LIST_PAGE_BYTES_MAX < limits.GRPC_MESSAGE_BYTES_MAX


# -- in process: the real servicers over an in-memory log ----------------------------------


def _at_this_build(cluster: InMemoryCluster) -> InMemoryCluster:
    """``cluster`` at this build's entry level, as a cluster of it reaches once its leader
    polled the members: a listing READ_BARRIER needs level 3, and the in-memory cluster reads
    through the log (it has no read index)."""
    cluster.log.append(cmds.set_cluster_level(level=cmds.ENTRY_LEVEL, stamp_ms=0).encode())
    assert cluster.state_machine.cluster_level == cmds.ENTRY_LEVEL == 4
    return cluster


@pytest.fixture
def cluster():
    with InMemoryCluster() as cluster:
        yield _at_this_build(cluster)


def test_a_listing_through_the_log_waits_for_the_cluster_level_that_applies_it():
    # During a rolling upgrade an older member would stop at a READ_BARRIER with prefixes: the
    # proposer refuses to send one below level 3, and nothing is appended.
    with InMemoryCluster() as cluster, FencingClient(cluster.endpoints, timeout_s=3.0) as client:
        client.status()  # the client's discovery reads through the log first
        entries = cluster.log.applied_index
        with pytest.raises(exc.Refused) as info:
            client.list("orders/")
        assert info.value.reason == "CLUSTER_LEVEL_TOO_LOW" and info.value.metadata["needed_level"] == "3"
        assert cluster.log.applied_index == entries
        _at_this_build(cluster)
        assert client.list("orders/").resources == ()


def _invalid_field(call) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value
    status = rpc_status.from_call(caught.value)
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return info.metadata["field"]


def test_bad_list_requests_are_invalid_argument_naming_the_field_and_send_no_read(cluster):
    client = FencingClient(cluster.endpoints)
    client.acquire("orders/1", ttl_ms=TTL)
    stub = pb_grpc.LeaseStub(grpc.insecure_channel(cluster.endpoints[0]))
    entries = len(cluster.log.ops)
    other = validation.page_token("billing/", "billing/1")
    assert _invalid_field(lambda: stub.List(pb.ListRequest(prefix="orders/", limit=0), timeout=5)) == "limit"
    assert _invalid_field(lambda: stub.List(pb.ListRequest(limit=limits.LIST_LIMIT_MAX + 1), timeout=5)) == "limit"
    assert _invalid_field(lambda: stub.List(pb.ListRequest(prefix="a b"), timeout=5)) == "prefix"
    assert _invalid_field(lambda: stub.List(pb.ListRequest(page_token="junk"), timeout=5)) == "page_token"
    assert _invalid_field(lambda: stub.List(pb.ListRequest(prefix="orders/", page_token=other), timeout=5)) \
        == "page_token"
    assert len(cluster.log.ops) == entries  # no read went through the log for them
    # The client refuses the same before sending anything.
    with pytest.raises(exc.InvalidArgument) as caught:
        client.list("orders/", limit=0)
    assert caught.value.field == "limit"
    with pytest.raises(exc.InvalidArgument) as caught:
        client.list("orders/", page_token=other)
    assert caught.value.field == "page_token"


def test_pages_cover_every_resource_once_and_an_unset_limit_is_the_default(cluster):
    client = FencingClient(cluster.endpoints)
    names = [f"jobs/{n:03d}" for n in range(limits.LIST_LIMIT_DEFAULT + 5)]
    for name in names:
        client.acquire(name, ttl_ms=TTL, holder="worker")
    client.acquire("other/1", ttl_ms=TTL)
    first = client.list("jobs/")
    assert [r.resource for r in first.resources] == names[:limits.LIST_LIMIT_DEFAULT] and first.next_page_token
    rest = client.list("jobs/", page_token=first.next_page_token)
    assert [r.resource for r in rest.resources] == names[limits.LIST_LIMIT_DEFAULT:] and not rest.next_page_token
    assert [r.resource for r in client.list_all("jobs/", page_size=7)] == names
    held = rest.resources[0]
    assert held.held and held.holder == "worker" and 0 < held.remaining_ms <= TTL and held.token == held.hwm

    async def listed() -> list[str]:
        async with AsyncFencingClient(cluster.endpoints) as aclient:
            page = await aclient.list("jobs/", limit=3)
            assert len(page.resources) == 3 and page.next_page_token
            return [r.resource async for r in aclient.list_all("jobs/", page_size=9)]

    assert asyncio.run(listed()) == names


def _principals(tmp_path) -> str:
    path = tmp_path / "principals.toml"
    path.write_text(
        f'[[principal]]\nname = "orders"\ntoken_sha256 = "{token_digest("orders-token")}"\n'
        'prefixes = ["orders/", "shared/orders-"]\n'
        f'[[principal]]\nname = "ops"\ntoken_sha256 = "{token_digest("ops-token")}"\nadmin = true\n'
    )
    return str(path)


def test_a_principal_lists_only_resources_under_its_own_prefixes(tmp_path):
    with InMemoryCluster(principals_file=_principals(tmp_path)) as cluster:
        _at_this_build(cluster)
        ops = FencingClient(cluster.endpoints, bearer_token="ops-token")
        for name in ("billing/1", "orders/1", "orders/2", "shared/billing-x", "shared/orders-y"):
            ops.acquire(name, ttl_ms=TTL)
        orders = FencingClient(cluster.endpoints, bearer_token="orders-token")
        assert [r.resource for r in orders.list_all()] == ["orders/1", "orders/2", "shared/orders-y"]
        assert [r.resource for r in orders.list_all("shared/")] == ["shared/orders-y"]
        assert [r.resource for r in orders.list_all("orders/2")] == ["orders/2"]
        page = orders.list("", limit=1)  # a full page even though most names are others'
        assert [r.resource for r in page.resources] == ["orders/1"]
        with pytest.raises(exc.AuthError):
            orders.list("billing/")
        with pytest.raises(exc.AuthError):
            FencingClient(cluster.endpoints, retry_max_attempts=1).list("")  # no credential
        assert len(list(ops.list_all())) == 5  # an admin sees everything


def test_fencingctl_ls_prints_a_table_with_durations_and_json(cluster, capsys):
    client = FencingClient(cluster.endpoints)
    client.acquire("orders/1", ttl_ms=60_000, holder="worker-1")
    token = client.acquire("orders/2", ttl_ms=TTL, holder="worker-2").token
    client.release("orders/2", token)
    client.acquire("billing/1", ttl_ms=TTL)
    endpoints = ["--endpoints", ",".join(cluster.endpoints)]
    capsys.readouterr()

    assert fencingctl([*endpoints, "ls", "orders/"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RESOURCE", "HOLDER", "TOKEN", "TTL", "HWM", "WAITERS"]
    assert len(lines) == 2 and lines[1].split()[:3] == ["orders/1", "worker-1", "1"]
    ttl = lines[1].split()[3]
    assert ttl.endswith("s") and 55 <= float(ttl.rstrip("s")) <= 60, ttl  # "59.9s": a duration

    assert fencingctl([*endpoints, "-o", "json", "ls", "--limit", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["resource"] for r in doc["resources"]] == ["billing/1"] and doc["next_page_token"]
    assert fencingctl([*endpoints, "-o", "json", "ls", "--limit", "1", "--page-token", doc["next_page_token"]]) == 0
    assert [r["resource"] for r in json.loads(capsys.readouterr().out)["resources"]] == ["orders/1"]

    calls = len(cluster.calls_to("List"))
    for argv in (["ls", "--limit", "0"], ["ls", "--limit", "1001"], ["ls", "--page-token", "x"],
                 ["ls", "x/", "--limit", "2", "--page-token", doc["next_page_token"]], ["ls", "a b"]):
        assert fencingctl([*endpoints, *argv]) == 2, argv
        assert "fencingctl: invalid argument" in capsys.readouterr().err
    assert len(cluster.calls_to("List")) == calls  # refused before anything was sent


# -- the sorted names a page reads -----------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["acquire", "release", "tick", "restore", "list"]),
                          st.sampled_from(["a", "a/1", "a/2", "a/10", "b", "b/x", "ab", "c/3"])),
                max_size=40))
def test_the_sorted_names_stay_the_tables_keys_through_any_history(steps):
    sm = FencingStateMachine()
    tokens: dict[str, int] = {}
    stamp = 1000
    for op, name in steps:
        stamp += 700
        if op == "acquire":
            out = sm.execute(cmds.acquire(resource=name, holder="h", ttl_ms=1000, op_id=os.urandom(16),
                                          stamp_ms=stamp))
            if isinstance(out, Applied):
                tokens[name] = out.result.token
        elif op == "release" and name in tokens:
            sm.execute(cmds.release(resource=name, token=tokens[name], stamp_ms=stamp))
        elif op == "tick":
            sm.execute(cmds.tick(stamp_ms=stamp))
        elif op == "restore":
            copy = FencingStateMachine()
            copy.restore(sm.snapshot())
            sm = copy
        table = sm._resources
        assert list(table.names) == sorted(table) and len(table.names) == len(table)
        for prefix in ("", "a", "a/", "b/", "z"):
            for after in (None, "a/1", "ab", "b"):
                got = _names(_page(sm, (prefix,), limit=3, after=after))
                want = sorted(n for n in table if n.startswith(prefix) and (after is None or n > after))[:3]
                assert got == want, (prefix, after)


def test_the_sorted_names_split_and_merge_their_blocks():
    from coordinator.core.name_index import BLOCK_NAMES, SortedNames

    names = SortedNames()
    pool = [f"r/{n:06d}" for n in range(5 * BLOCK_NAMES)]
    order = pool[::7] + [n for i, n in enumerate(pool) if i % 7]
    for name in order:
        names.add(name)
    assert list(names) == pool and len(names._blocks) > 2
    for name in pool[::2]:
        names.discard(name)
    names.discard("r/none")
    assert list(names) == pool[1::2] and len(names) == len(pool) // 2
    assert list(names.from_name("r/000003", inclusive=False))[:2] == ["r/000005", "r/000007"]
    assert list(names.from_name("r/000003", inclusive=True))[:1] == ["r/000003"]
    for name in pool[1::2]:
        names.discard(name)
    assert list(names) == [] and names._blocks == [] and list(names.from_name("", inclusive=True)) == []
    in_order = SortedNames()  # as a snapshot loads: each name past the last, the last block splits
    for name in pool:
        in_order.add(name)
    assert list(in_order) == pool and len(in_order._blocks) > 2 and in_order._firsts == [b[0] for b in in_order._blocks]
    assert list(SortedNames(reversed(pool))) == pool


def test_a_listing_that_would_cover_more_prefixes_than_one_entry_carries_is_refused(tmp_path):
    path = tmp_path / "principals.toml"
    grants = ", ".join(f'"p{n:02d}/"' for n in range(limits.LIST_PREFIXES_MAX + 1))
    path.write_text(f'[[principal]]\nname = "many"\ntoken_sha256 = "{token_digest("many-token")}"\n'
                    f"prefixes = [{grants}]\n")
    with InMemoryCluster(principals_file=str(path)) as cluster:
        _at_this_build(cluster)
        many = FencingClient(cluster.endpoints, bearer_token="many-token")
        many.acquire("p03/x", ttl_ms=TTL)
        with pytest.raises(exc.InvalidArgument) as caught:
            many.list("")
        assert caught.value.field == "prefix" and "LIST_PREFIXES_MAX" in str(caught.value)
        assert [r.resource for r in many.list_all("p0")] == ["p03/x"]  # p00/-p09/: ten prefixes, fine
        assert [r.resource for r in many.list_all("p03/")] == ["p03/x"]

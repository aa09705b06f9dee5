"""What keeps a million resources within a member's memory (issue 17, point 4), held to the
behaviour it replaced: ``KeyData`` answers like the dict it stands for, a resource nobody waits
on shares the read-only ``NO_WAITERS`` and gets a queue of its own only while someone waits,
and repeated holders, keys and owners are stored once. ``python -m bench scale --in-process``
prints what they save.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import commands as c
from coordinator.core import ops as core_ops
from coordinator.core.state import NO_WAITERS, KeyData, ResourceState
from coordinator.core.state_machine import Applied, FencingStateMachine

KEYS = ["a", "b", "c", "d"]
ops = st.lists(st.tuples(st.sampled_from(["set", "del"]), st.sampled_from(KEYS), st.integers(1, 9)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_key_data_answers_like_a_dict_through_any_sets_and_deletes(steps):
    model: dict[str, tuple[bytes, int]] = {}
    data = KeyData()
    for kind, key, version in steps:
        if kind == "set":
            model[key] = data_pair = (bytes([version]), version)
            data[key] = data_pair
        else:
            if key in model:
                del model[key]
                del data[key]
            else:
                with pytest.raises(KeyError):
                    del data[key]
        assert len(data) == len(model) and bool(data) == bool(model)
        assert sorted(data) == sorted(model) and data == model and dict(data.items()) == model
        for k in KEYS:
            assert (k in data) == (k in model)
            assert data.get(k) == model.get(k)
            if k not in model:
                with pytest.raises(KeyError):
                    data[k]
    assert KeyData(model) == model


def test_a_resource_without_waiters_shares_the_read_only_empty_queue():
    assert ResourceState().waiters is NO_WAITERS
    with pytest.raises(TypeError):
        NO_WAITERS[b"w" * 16] = None  # a missed swap raises rather than queueing on every resource


def test_a_queue_is_the_resources_own_while_someone_waits_and_shared_again_after():
    sm = FencingStateMachine()
    wid = b"w" * 16
    sm.execute(c.acquire(resource="r", holder="h", ttl_ms=1_000, op_id=b"a" * 16, stamp_ms=1))
    sm.execute(c.acquire(resource="other", holder="h", ttl_ms=1_000, op_id=b"b" * 16, stamp_ms=1))
    out = sm.execute(c.enqueue(resource="r", holder="w", ttl_ms=1_000, waiter_id=wid, stamp_ms=2))
    assert out.result.queued is True
    queued = sm._resources["r"]
    assert queued.waiters is not NO_WAITERS and list(queued.waiters) == [wid]
    assert sm._resources["other"].waiters is NO_WAITERS  # the first waiter's dict is r's alone
    assert isinstance(sm.execute(c.dequeue(resource="r", waiter_id=wid, stamp_ms=3)), Applied)
    assert sm._resources["r"].waiters is NO_WAITERS


def test_holders_keys_and_owners_decoded_from_separate_entries_are_stored_once():
    sm = FencingStateMachine()
    for i, name in enumerate(["r1", "r2"]):
        # Built from bytes each time, as a member decodes each entry: equal, not the same object.
        holder, key = b"worker-7".decode(), b"config".decode()
        got = sm.execute(core_ops.charged(c.acquire(resource=name, holder=holder, ttl_ms=1_000, op_id=bytes([i]) * 16,
                                             stamp_ms=1), principal=b"team".decode(), quota={}))
        sm.execute(c.write(resource=name, key=key, value=b"v", token=got.result.token,
                           op_id=bytes([i + 10]) * 16, stamp_ms=2))
    r1, r2 = sm._resources["r1"], sm._resources["r2"]
    assert r1.lease.holder is r2.lease.holder and r1.owner is r2.owner
    assert next(iter(r1.data)) is next(iter(r2.data))
    # A snapshot's load shares them too.
    copy = FencingStateMachine()
    copy.restore(sm.backup())
    c1, c2 = copy._resources["r1"], copy._resources["r2"]
    assert next(iter(c1.data)) is next(iter(c2.data)) and c1.owner is c2.owner
    assert msgpack.unpackb(copy.backup()) == msgpack.unpackb(sm.backup())

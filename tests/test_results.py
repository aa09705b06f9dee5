"""The typed result of each op (coordinator/core/results.py): its map form is the one the
handlers answered as a dict, byte for byte, and reading a map back takes only what
``to_map`` makes."""

from __future__ import annotations

import dataclasses
import hashlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import commands as cmds
from coordinator.core.commands import Op
from coordinator.core.outcomes import (
    Applied,
    Reason,
    Rejected,
    check_stored_wire,
    is_flat_map,
    outcome_from_wire,
    outcome_to_wire,
)
from coordinator.core.results import (
    RESULT_TYPES,
    AcquireResult,
    DeleteResult,
    LeaseView,
    ListedResource,
    ListResult,
    LockState,
    ReadResult,
    Result,
    WriteResult,
    check_result_map,
    expect,
    result_from_map,
)
from coordinator.core.state_machine import FencingStateMachine

INTS = st.integers(min_value=0, max_value=2**63 - 1)
NAMES = st.text(alphabet="ab/-", min_size=1, max_size=8)
_FLAT = {"int": INTS, "bool": st.booleans(), "str": NAMES}


def _flat(cls: type[Result]) -> st.SearchStrategy[Result]:
    """Any value of a type of required flat fields."""
    return st.builds(cls, **{field.name: _FLAT[str(field.type)] for field in dataclasses.fields(cls)})


_LEASES = st.none() | _flat(LeaseView)
_ITEMS = st.builds(ListedResource, NAMES, st.booleans(), NAMES, INTS, INTS, INTS, INTS)
_SHAPED: dict[type[Result], st.SearchStrategy[Result]] = {
    # granted / queued / neither: the three shapes lock_state answers
    LockState: st.one_of(
        st.builds(LockState, granted=st.just(True), token=INTS, expires_at_ms=INTS, hwm=INTS),
        st.builds(LockState, granted=st.just(False), queued=st.just(True), position=INTS),
        st.just(LockState(granted=False, queued=False)),
    ),
    # no resource / a resource / a resource and a key
    ReadResult: st.one_of(
        st.builds(ReadResult, epoch=INTS, log_clock_ms=INTS),
        st.builds(ReadResult, epoch=INTS, log_clock_ms=INTS, hwm=INTS, lease=_LEASES,
                  waiters=st.none() | st.integers(1, 10**6)),
        st.builds(ReadResult, epoch=INTS, log_clock_ms=INTS, hwm=INTS, lease=_LEASES,
                  waiters=st.none() | st.integers(1, 10**6), version=INTS, value=st.none() | st.binary(max_size=8)),
    ),
    ListResult: st.builds(ListResult, log_clock_ms=INTS, resources=st.lists(_ITEMS, max_size=3).map(tuple),
                          more=st.booleans()),
}
KINDS = sorted({kind for kinds in RESULT_TYPES.values() for kind in kinds}, key=lambda kind: kind.__name__)
STRATEGIES = {kind: _SHAPED[kind] if kind in _SHAPED else _flat(kind) for kind in KINDS}
PAIRS = [(op, kind) for op, kinds in RESULT_TYPES.items() for kind in kinds]


def test_every_op_has_a_result_type_and_every_type_is_tested():
    assert set(RESULT_TYPES) == set(Op)
    assert all(RESULT_TYPES[op] for op in Op)
    assert set(STRATEGIES) == set(KINDS) and set(_SHAPED) <= set(KINDS)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_from_map_inverts_to_map(kind, data):
    value = data.draw(STRATEGIES[kind])
    assert type(value).from_map(value.to_map()) == value
    # and through msgpack, as the dedup table and snapshots hold it
    packed = msgpack.packb(value.to_map(), use_bin_type=True)
    assert kind.from_map(msgpack.unpackb(packed, raw=False)) == value


@pytest.mark.parametrize("op, kind", PAIRS, ids=lambda x: getattr(x, "__name__", None) or getattr(x, "name", x))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_an_outcome_of_every_op_survives_its_wire_form(op, kind, data):
    outcome = Applied(op=op, result=data.draw(STRATEGIES[kind]))
    wire = msgpack.packb(outcome_to_wire(outcome), use_bin_type=True)
    assert outcome_from_wire(msgpack.unpackb(wire, raw=False)) == outcome


def _required(kind: type[Result]) -> set[str]:
    return {field.name for field in dataclasses.fields(kind) if field.default is dataclasses.MISSING}


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_from_map_refuses_a_missing_or_extra_field_and_never_guesses(kind, data):
    m = data.draw(STRATEGIES[kind]).to_map()
    with pytest.raises(ValueError):
        kind.from_map({**m, "extra": 1})
    for key in m:
        short = {k: v for k, v in m.items() if k != key}
        if key in _required(kind) or key == "lease":  # a resource's lease is there, even when nil
            with pytest.raises(ValueError):
                kind.from_map(short)
        else:  # an optional field: then it is another shape, read exactly as it is
            try:
                assert kind.from_map(short).to_map() == short
            except ValueError:
                pass


_WRONG = (None, True, 1, -1, "x", b"x", 1.5, [], {}, [1])


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_from_map_refuses_a_wrongly_typed_field(kind, data):
    m = data.draw(STRATEGIES[kind]).to_map()
    for key, value in m.items():
        for wrong in _WRONG:
            if type(wrong) is type(value) or (type(value) is int and wrong == value):
                continue
            changed = {**m, key: wrong}
            if value is not None and wrong is not None:
                with pytest.raises(ValueError):
                    kind.from_map(changed)
            else:  # nil for a nullable field, or a value for a nil one: read exactly or refused
                try:
                    assert kind.from_map(changed).to_map() == changed
                except ValueError:
                    pass


def _verdict(fn, *args) -> str:
    """"ok", or the ValueError's message: two checks agree when they give the same."""
    try:
        fn(*args)
    except ValueError:
        return "refused"
    return "ok"


def _variants(m: dict) -> list[object]:
    """``m`` and maps near it: each field dropped, retyped, and one field added."""
    out: list[object] = [m, {**m, "extra": 1}, None, [], {1: 2}]
    for key in m:
        out.append({k: v for k, v in m.items() if k != key})
        out.extend({**m, key: wrong} for wrong in _WRONG)
    return out


@pytest.mark.parametrize("op, kind", PAIRS, ids=lambda x: getattr(x, "__name__", None) or getattr(x, "name", x))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_checking_a_result_map_refuses_exactly_what_reading_it_refuses(op, kind, data):
    """A restore checks stored results without building them (check_result_map,
    check_stored_wire): it must refuse every map reading one refuses, and no other, also once
    a map of the same keys has passed (its shape is then checked by the values' types)."""
    for m in _variants(data.draw(STRATEGIES[kind]).to_map()):
        assert _verdict(check_result_map, op, m) == _verdict(result_from_map, op, m), m
        if isinstance(m, dict):  # and with the keys in another order
            backwards = dict(reversed(list(m.items())))
            assert _verdict(check_result_map, op, backwards) == _verdict(result_from_map, op, backwards), m
        for wire in ([1, int(op), m], [1, int(op), m, 0], [2, int(op), m], [True, int(op), m]):
            def read_as_applied(w=wire):
                outcome = outcome_from_wire(w)
                if not (isinstance(outcome, Applied) and outcome.op is op and is_flat_map(w[2])):
                    raise ValueError("not an Applied of this op with a flat result")
            assert _verdict(check_stored_wire, wire, op) == _verdict(read_as_applied), wire
    other = next(o for o in Op if o is not op)
    with pytest.raises(ValueError):
        check_stored_wire([1, int(other), data.draw(STRATEGIES[kind]).to_map()], op)
    with pytest.raises(ValueError):
        check_stored_wire(outcome_to_wire(Rejected(op=op, reason=Reason.MALFORMED, message="m")), op)


@pytest.mark.parametrize("m", [
    None, [], "granted", {}, {1: 2},
    {"granted": True, "queued": False},  # a grant says nothing of a queue
    {"granted": True, "token": 1, "expires_at_ms": 2},  # no hwm
    {"granted": False, "queued": True},  # queued without a position
    {"granted": False, "queued": False, "position": 0},
    {"granted": False, "token": 1, "queued": False},
    {"granted": 1, "queued": False},
], ids=repr)
def test_a_lock_state_of_no_shape_is_refused(m):
    with pytest.raises(ValueError):
        LockState.from_map(m)


@pytest.mark.parametrize("m", [
    {"epoch": 1, "log_clock_ms": 2, "hwm": 1},  # a resource's lease is there, nil or not
    {"epoch": 1, "log_clock_ms": 2, "lease": None},  # a lease without a resource
    {"epoch": 1, "log_clock_ms": 2, "hwm": 1, "lease": None, "version": 3},  # a version without its value
    {"epoch": 1, "log_clock_ms": 2, "hwm": 1, "lease": None, "value": b"v"},
    {"epoch": 1, "log_clock_ms": 2, "hwm": 1, "lease": {"holder": "h", "token": 1}, "value": None, "version": 0},
    {"epoch": 1, "log_clock_ms": 2, "hwm": 1, "lease": None, "value": "v", "version": 1},
    {"epoch": 1, "log_clock_ms": 2, "waiters": 2},
    {"log_clock_ms": 2, "resources": [["a", True, "h", 1, 1, 5]], "more": False},  # an item short
    {"log_clock_ms": 2, "resources": [["a", 1, "h", 1, 1, 5, 0]], "more": False},
    {"log_clock_ms": 2, "resources": "a", "more": False},
], ids=repr)
def test_a_read_barrier_of_no_shape_is_refused(m):
    with pytest.raises(ValueError):
        result_from_map(Op.READ_BARRIER, m)


def test_a_read_barrier_map_is_read_as_a_read_or_as_a_page():
    read = result_from_map(Op.READ_BARRIER, {"epoch": 3, "log_clock_ms": 4})
    page = result_from_map(Op.READ_BARRIER, {"log_clock_ms": 4, "resources": [], "more": False})
    assert read == ReadResult(epoch=3, log_clock_ms=4) and page == ListResult(log_clock_ms=4, resources=(), more=False)


def test_an_outcome_holds_only_its_ops_result_type():
    with pytest.raises(TypeError):
        Applied(op=Op.WRITE, result=DeleteResult(version=1, deleted=True))
    with pytest.raises(TypeError):
        Applied(op=Op.WRITE, result={"version": 1, "hwm": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        outcome_from_wire([1, int(Op.WRITE), {"version": 1, "deleted": True}])  # a DELETE's, as a WRITE's
    assert expect(WriteResult, WriteResult(version=1, hwm=1)).version == 1
    with pytest.raises(TypeError):
        expect(WriteResult, DeleteResult(version=1, deleted=True))


# -- the wire bytes are those of the dict results ------------------------------------------------
# Each expected map is written out as the handlers built it before results were typed; the
# outcome's wire form must pack to exactly the bytes that dict packed to (keys sorted, as
# ``outcome_to_wire`` always stored them).


def _dict_wire(op: Op, result: dict) -> bytes:
    def sort(value):
        if isinstance(value, dict):
            return {k: sort(value[k]) for k in sorted(value)}
        return [sort(v) for v in value] if isinstance(value, list) else value

    return msgpack.packb([1, int(op), sort(result)], use_bin_type=True)


def _wire(outcome) -> bytes:
    assert isinstance(outcome, Applied), outcome
    return msgpack.packb(outcome_to_wire(outcome), use_bin_type=True)


def test_real_handler_results_pack_to_the_bytes_of_their_dict_form():
    sm = FencingStateMachine()
    acquired = sm.execute(cmds.acquire(resource="a/1", holder="h", ttl_ms=1000, op_id=b"o" * 16, stamp_ms=10))
    assert _wire(acquired) == _dict_wire(Op.ACQUIRE, {"token": 1, "expires_at_ms": 1010, "hwm": 1})
    written = sm.execute(cmds.write(resource="a/1", key="k", value=b"v", token=1, op_id=b"w" * 16, stamp_ms=11))
    assert _wire(written) == _dict_wire(Op.WRITE, {"version": 1, "hwm": 1})
    absent = sm.execute(cmds.delete(resource="a/1", key="x", token=1, op_id=b"d" * 16, stamp_ms=12))
    assert _wire(absent) == _dict_wire(Op.DELETE, {"version": 0, "deleted": False})
    queued = sm.execute(cmds.enqueue(resource="a/1", holder="q", ttl_ms=500, waiter_id=b"q" * 16, stamp_ms=13))
    assert _wire(queued) == _dict_wire(Op.ENQUEUE, {"granted": False, "queued": True, "position": 0})
    read = sm.execute(cmds.read_barrier(resource="a/1", key="k", stamp_ms=14))
    assert _wire(read) == _dict_wire(Op.READ_BARRIER, {
        "epoch": 1, "log_clock_ms": 14, "hwm": 1, "waiters": 1,
        "lease": {"holder": "h", "token": 1, "expires_at_ms": 1010}, "value": b"v", "version": 1,
    })
    bare = sm.execute(cmds.read_barrier(resource="b/2", stamp_ms=15))
    assert _wire(bare) == _dict_wire(Op.READ_BARRIER, {"epoch": 1, "log_clock_ms": 15, "hwm": 0, "lease": None})
    page = sm.execute(cmds.list_page(prefixes=("a/",), limit=5, stamp_ms=16))
    assert _wire(page) == _dict_wire(Op.READ_BARRIER, {
        "log_clock_ms": 16, "resources": [["a/1", True, "h", 1, 1, 994, 1]], "more": False,
    })
    released = sm.execute(cmds.release(resource="a/1", token=1, stamp_ms=17))
    assert _wire(released) == _dict_wire(Op.RELEASE, {"hwm": 2, "released": True})  # granted to q at 2
    ticked = sm.execute(cmds.tick(stamp_ms=10_000))
    assert _wire(ticked) == _dict_wire(Op.TICK, {"expired": 1})
    fenced = sm.execute(cmds.force_release(resource="a/1", op_id=b"f" * 16, stamp_ms=10_001))
    assert _wire(fenced) == _dict_wire(Op.FORCE_RELEASE, {"hwm": 3})
    floor = sm.execute(cmds.set_epoch_floor(floor=10, stamp_ms=10_002))
    assert _wire(floor) == _dict_wire(Op.SET_EPOCH_FLOOR, {"epoch": 11})
    # What a retry is answered from the dedup table: the dict it stored, read back typed.
    again = sm.execute(cmds.write(resource="a/1", key="k", value=b"v", token=1, op_id=b"w" * 16, stamp_ms=10_003))
    assert again.result == WriteResult(version=1, hwm=1) and again.first_applied_index == 0
    assert acquired.result == AcquireResult(token=1, expires_at_ms=1010, hwm=1)


# sha256 of the snapshot this history leaves, as the build before typed results wrote it: the
# dedup table holds each result's map form, so typing the results changes no snapshot byte.
_HISTORY_SNAPSHOT_SHA256 = "7f4f013605d27f8a2ccb43f26023fac54b8efe9843582ccd9ae09b8305ac1e1d"


def _history() -> FencingStateMachine:
    sm = FencingStateMachine()
    sm.execute(cmds.acquire(resource="a/1", holder="h", ttl_ms=1000, op_id=b"o" * 16, stamp_ms=10))
    sm.execute(cmds.write(resource="a/1", key="k", value=b"v", token=1, op_id=b"w" * 16, stamp_ms=11))
    sm.execute(cmds.delete(resource="a/1", key="x", token=1, op_id=b"d" * 16, stamp_ms=12))
    sm.execute(cmds.delete(resource="a/1", key="k", token=1, op_id=b"e" * 16, stamp_ms=13))
    sm.execute(cmds.release(resource="a/1", token=1, op_id=b"r" * 16, stamp_ms=14))
    sm.execute(cmds.force_release(resource="b/2", op_id=b"f" * 16, stamp_ms=15))
    return sm


def test_a_snapshot_holding_typed_results_has_the_bytes_of_the_dict_results():
    sm = _history()
    assert sm.dedup_size == 6
    assert hashlib.sha256(sm.snapshot()).hexdigest() == _HISTORY_SNAPSHOT_SHA256
    copy = FencingStateMachine()
    copy.restore(sm.snapshot())  # and read back: every stored map is one its op's type makes
    assert copy.digest() == sm.digest()

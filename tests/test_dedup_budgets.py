"""Per-principal dedup budgets (issue 26, finding 5): one principal's op_ids never evict
another's within the retention window.

Before, the dedup table was one shared DEDUP_ENTRIES_MAX: a tenant writing with fresh op_ids
turned the 600 s window over in 14 s, and another tenant's Acquire retry then answered
LEASE_HELD against its own lease while its Write retry applied a second time. These tests
drive the state machine itself (core/dedup.py has the rules): a flood far past every cap,
the rules against a naive model of them, and snapshot + restore in the middle of it all.
"""

from __future__ import annotations

import dataclasses

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import commands as cmds
from coordinator.core import ops
from coordinator.core.state_machine import Applied, FencingStateMachine, Reason, Rejected

ENTRIES_MAX = 24  # small, so a flood passes it many times over inside one example
RETENTION_MS = 10_000
TTL_MS = 60_000


def op_id(tag: str, n: int) -> bytes:
    return f"{tag}-{n}".encode().ljust(16, b".")


def charged(command: cmds.Command, principal: str, budget: int | None) -> cmds.Command:
    """``command`` as the service charges it: the caller's principal and quota."""
    quota = {} if budget is None else {"dedup_entries": budget}
    return ops.charged(command, principal=principal, quota=quota)


def machine() -> FencingStateMachine:
    return FencingStateMachine(dedup_entries_max=ENTRIES_MAX, dedup_retention_ms=RETENTION_MS)


def run(sm: FencingStateMachine, command: cmds.Command, index: int = 0):
    return sm.apply(command.encode(), index)


@settings(max_examples=60, deadline=None)
@given(
    x_budget=st.one_of(st.none(), st.integers(min_value=0, max_value=3 * ENTRIES_MAX)),
    y_budget=st.one_of(st.none(), st.integers(min_value=2, max_value=ENTRIES_MAX)),
    flood=st.integers(min_value=ENTRIES_MAX, max_value=8 * ENTRIES_MAX),
    retry_every=st.integers(min_value=1, max_value=40),
    step_ms=st.integers(min_value=0, max_value=RETENTION_MS // (8 * ENTRIES_MAX + 4)),
)
def test_a_flood_of_fresh_op_ids_never_evicts_another_principals_retries(
    x_budget, y_budget, flood, retry_every, step_ms
):
    # X floods fresh op_ids far past its budget and the table's cap (or has no budget of its
    # own: an admin, or a principals file that sets none), all within Y's retention window.
    # Y's retries keep their first outcome throughout: the Acquire its own token, the Write
    # its first version, applied once.
    sm = machine()
    now = 1
    y_acquire = charged(cmds.acquire(resource="y/lock", holder="y", ttl_ms=TTL_MS, op_id=op_id("ya", 0),
                                     stamp_ms=now), "y", y_budget)
    got = run(sm, y_acquire, 1)
    token = got.result.token
    y_write = charged(cmds.write(resource="y/lock", key="k", value=b"once", token=token, op_id=op_id("yw", 0),
                                 stamp_ms=now), "y", y_budget)
    wrote = run(sm, y_write, 2)
    assert isinstance(wrote, Applied)
    x_token = run(sm, charged(cmds.acquire(resource="x/r", holder="x", ttl_ms=TTL_MS, op_id=op_id("xa", 0),
                                           stamp_ms=now), "x", x_budget), 3).result.token
    for n in range(flood):
        now += step_ms
        write = cmds.write(resource="x/r", key="k", value=b"v", token=x_token, op_id=op_id("xw", n), stamp_ms=now)
        assert isinstance(run(sm, charged(write, "x", x_budget), 4 + n), Applied)
        if n % retry_every == 0 or n == flood - 1:
            again = run(sm, dataclasses.replace(y_acquire, stamp_ms=now))
            assert isinstance(again, Applied), again  # not LEASE_HELD against its own lease
            assert (again.result, again.first_applied_index) == (got.result, 1)
            rewrote = run(sm, dataclasses.replace(y_write, stamp_ms=now))
            assert (rewrote.result, rewrote.first_applied_index) == (wrote.result, 2)
            assert sm.read("y/lock", "k") == (b"once", wrote.result.version)  # applied once
            assert sm.describe("y/lock")["revision"] == 1
    assert sm.dedup_size <= ENTRIES_MAX
    # X's own window is what gave way: its first writes are gone when it passed its budget.
    x_kept = ENTRIES_MAX - 2 if x_budget is None else max(1, min(x_budget, ENTRIES_MAX - 2))
    assert sm.dedup_count("x") == min(flood + 1, x_kept)
    assert sm.dedup_count("y") == 2


def test_a_principal_past_its_budget_loses_its_own_oldest_entry_and_nobody_elses():
    # The trade-off, shown: the over-budget principal's oldest retry is no longer answered
    # (it applies again), while a principal holding fewer entries keeps all of its own.
    sm = machine()
    x_token = run(sm, charged(cmds.acquire(resource="x/r", holder="x", ttl_ms=TTL_MS, op_id=op_id("xa", 0),
                                           stamp_ms=1), "x", 3)).result.token
    y_token = run(sm, charged(cmds.acquire(resource="y/r", holder="y", ttl_ms=TTL_MS, op_id=op_id("ya", 0),
                                           stamp_ms=1), "y", 3)).result.token
    writes = [
        charged(cmds.write(resource="x/r", key="k", value=b"v", token=x_token, op_id=op_id("xw", n), stamp_ms=2),
                "x", 3)
        for n in range(4)
    ]
    first = [run(sm, w) for w in writes]
    assert sm.dedup_count("x") == 3 and sm.dedup_count("y") == 1
    # x's acquire and first write went (its budget is 3): that write applies again, a new version.
    again = run(sm, writes[0])
    assert again.result.version > first[-1].result.version
    # y's acquire is still answered from the table.
    retry = run(sm, charged(cmds.acquire(resource="y/r", holder="y", ttl_ms=TTL_MS, op_id=op_id("ya", 0),
                                         stamp_ms=3), "y", 3))
    assert isinstance(retry, Applied) and retry.result.token == y_token


def test_a_full_table_makes_room_from_the_largest_holder():
    # Budgets that add up past the table's cap: the principal holding the most entries gives
    # up its oldest, whoever adds (ties: the adder itself, else the smallest name).
    sm = FencingStateMachine(dedup_entries_max=6, dedup_retention_ms=RETENTION_MS)
    tokens = {}
    for p in ("a", "b", "c"):
        tokens[p] = run(sm, charged(cmds.acquire(resource=f"{p}/r", holder=p, ttl_ms=TTL_MS, op_id=op_id(p, 0),
                                                 stamp_ms=1), p, 5)).result.token

    def write(p: str, n: int) -> None:
        command = cmds.write(resource=f"{p}/r", key="k", value=b"v", token=tokens[p], op_id=op_id(p, n), stamp_ms=2)
        assert isinstance(run(sm, charged(command, p, 5)), Applied)

    write("a", 1)
    write("a", 2)
    write("b", 1)  # a 3, b 2, c 1: full
    write("c", 1)  # c adds: a is the largest -> a 2, b 2, c 2
    assert [sm.dedup_count(p) for p in "abc"] == [2, 2, 2]
    write("c", 2)  # c ties with a and b: its own oldest goes
    assert [sm.dedup_count(p) for p in "abc"] == [2, 2, 2]
    write("a", 3)  # a is among the largest: its own
    assert [sm.dedup_count(p) for p in "abc"] == [2, 2, 2]
    write("b", 2)
    write("b", 3)  # b ties: its own
    assert [sm.dedup_count(p) for p in "abc"] == [2, 2, 2]
    kept = [item[0] for item in msgpack.unpackb(sm.snapshot(), raw=False)[5]]
    assert kept == [op_id("a", 2), op_id("c", 1), op_id("c", 2), op_id("a", 3), op_id("b", 2), op_id("b", 3)]


# -- the rules against a naive model, with snapshot + restore in the middle -------------------

PRINCIPALS = ["", "alpha", "beta", "gamma"]  # "": the anonymous principal (charged to nobody)


def model_add(table: list[tuple[bytes, str, int]], op: bytes, principal: str, budget: int | None, now: int,
              entries_max: int, retention_ms: int) -> None:
    """core/dedup.py's docstring, written out the slow way: [(op_id, principal, applied_at)]."""
    table[:] = [e for e in table if e[2] > now - retention_ms]  # 1. by age
    own_max = entries_max if budget is None else max(1, min(budget, entries_max))

    def count(p):
        return sum(1 for e in table if e[1] == p)

    def drop_oldest_of(p):
        table.remove(next(e for e in table if e[1] == p))

    while count(principal) >= own_max:  # 2. its own oldest, past its budget
        drop_oldest_of(principal)
    while len(table) >= entries_max:  # 3. the largest holder's oldest
        most = max(count(p) for _, p, _ in table)
        drop_oldest_of(principal if count(principal) == most else min(p for _, p, _ in table if count(p) == most))
    table.append((op, principal, now))


steps = st.lists(
    st.tuples(
        st.sampled_from(PRINCIPALS),
        st.one_of(st.none(), st.integers(min_value=0, max_value=12)),  # the command's budget
        st.integers(min_value=0, max_value=9).map(lambda n: [0, 0, 0, 1, 7, 50, 300, 1_000, 2_000, 4_001][n]),
        st.integers(min_value=0, max_value=30),  # 0: snapshot + restore here; else a fresh op_id
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps, entries_max=st.integers(min_value=1, max_value=10))
def test_the_table_keeps_what_the_rules_say_and_a_restored_copy_evicts_alike(steps, entries_max):
    retention_ms = 4_000
    sm = FencingStateMachine(dedup_entries_max=entries_max, dedup_retention_ms=retention_ms)
    token = run(sm, cmds.acquire(resource="r", holder="h", ttl_ms=3_600_000, op_id=op_id("acq", 0), stamp_ms=0))
    token = token.result.token
    model: list[tuple[bytes, str, int]] = [(op_id("acq", 0), "", 0)]
    copy = None
    now = 0
    for n, (principal, budget, delta, what) in enumerate(steps):
        now += delta
        if what == 0:
            copy = FencingStateMachine(dedup_entries_max=entries_max, dedup_retention_ms=retention_ms)
            copy.restore(sm.snapshot())
            continue
        command = cmds.write(resource="r", key="k", value=b"v", token=token, op_id=op_id("w", n), stamp_ms=now)
        if principal:
            command = charged(command, principal, budget)
        for machine_ in (sm, copy):
            if machine_ is not None:
                assert isinstance(run(machine_, command, n + 1), Applied)
        model_add(model, op_id("w", n), principal, budget if principal else None, now, entries_max, retention_ms)
        document = msgpack.unpackb(sm.snapshot(), raw=False)
        assert [(e[0], e[6], e[4]) for e in document[5]] == model
        for p in PRINCIPALS:
            assert sm.dedup_count(p) == sum(1 for e in model if e[1] == p)
        if copy is not None:
            assert copy.digest() == sm.digest()


def test_a_retry_is_answered_until_the_log_clock_is_the_retention_past_its_entry():
    # The boundary of rule 1: an entry leaves only once the log clock is RETENTION_MS past
    # it, so a retry at RETENTION_MS - 1 is answered and one at RETENTION_MS is applied anew
    # (the first write's outcome is gone), for the anonymous principal as for any.
    sm = machine()
    token = run(sm, cmds.acquire(resource="r", holder="h", ttl_ms=3_600_000, op_id=op_id("a", 0), stamp_ms=0))
    write = cmds.write(resource="r", key="k", value=b"v", token=token.result.token, op_id=op_id("w", 0),
                       stamp_ms=1)
    first = run(sm, write)
    late = run(sm, dataclasses.replace(write, stamp_ms=RETENTION_MS))
    assert late.result == first.result and late.first_applied_index == 0
    run(sm, cmds.tick(stamp_ms=RETENTION_MS + 1))
    gone = run(sm, dataclasses.replace(write, stamp_ms=RETENTION_MS + 1))
    assert isinstance(gone, Applied) and gone.result.version == first.result.version + 1


def test_every_command_with_an_op_id_is_charged_to_its_principal_with_the_quotas_it_reads():
    quota = {"resources": 5, "leases": 5, "stored_bytes": 100, "dedup_entries": 7}
    oid = op_id("c", 0)
    made = {
        "acquire": cmds.acquire(resource="r", holder="h", ttl_ms=TTL_MS, op_id=oid, stamp_ms=1),
        "write": cmds.write(resource="r", key="k", value=b"v", token=1, op_id=oid, stamp_ms=1),
        "delete": cmds.delete(resource="r", key="k", token=1, op_id=oid, stamp_ms=1),
        "release": cmds.release(resource="r", token=1, op_id=oid, stamp_ms=1),
        "force_release": cmds.force_release(resource="r", op_id=oid, stamp_ms=1),
    }
    read = {"acquire": set(quota), "write": {"stored_bytes", "dedup_entries"}}
    for name, command in made.items():
        body = ops.charged(command, principal="p", quota=quota).body
        assert body["principal"] == "p", name
        assert set(body["quota"]) == read.get(name, {"dedup_entries"}), name
        sm = machine()  # and the state machine takes every one of them (no MALFORMED)
        outcome = run(sm, ops.charged(command, principal="p", quota=quota))
        assert not (isinstance(outcome, Rejected) and outcome.reason is Reason.MALFORMED), (name, outcome)
    # A Release without an op_id keeps no dedup entry: nothing to charge.
    plain = cmds.release(resource="r", token=1, stamp_ms=1)
    assert ops.charged(plain, principal="p", quota=quota) is plain

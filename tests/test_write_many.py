"""FencedStore.WriteMany and the multiplexed client, end to end on three real ``fencingd serve``
processes.

Each WriteMany item must come out as the same Write alone would (its status, ErrorInfo and
effect), retries of an item are deduplicated by its op_id, a call past a limit applies
nothing, and ``FencingClient(multiplex=True)`` gives every one of many threads its own
answer: its result, or the exception a plain write raises. The threads' history goes through
the chaos checker. Every wait is a poll with a deadline; no timing is asserted.
"""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from chaos import check as chaos_check
from chaos import history as chaos_history
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.client import exceptions as E
from coordinator.core import limits
from coordinator.core.names import ErrorMeta as M
from coordinator.core.names import ErrorReason as R
from tests.test_server import failure
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S


def op_id() -> bytes:
    return os.urandom(16)


def unique(prefix: str) -> str:
    return f"{prefix}/{os.urandom(4).hex()}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from running_cluster(str(tmp_path_factory.mktemp("write-many")), request)


def acquire(node, resource: str) -> int:
    reply = node.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=op_id()),
                               timeout=T)
    return reply.token


def fenced_twice(node, resource: str) -> tuple[int, int]:
    """(an old token, the current one) of ``resource``: acquired, released, acquired again."""
    old = acquire(node, resource)
    node.lease.Release(pb.ReleaseRequest(resource=resource, token=old, op_id=op_id()), timeout=T)
    return old, acquire(node, resource)


def read(node, resource: str, key: str) -> pb.ReadResponse:
    return node.store.Read(pb.ReadRequest(resource=resource, key=key), timeout=T)


def alone(node, item: pb.WriteRequest) -> tuple[str, str, dict[str, str]]:
    """What the same item answers as a Write of its own (only for items that are refused)."""
    code, reason, metadata, _ = failure(node.store.Write, item, timeout=T)
    return code.name, reason, metadata


def test_a_mixed_batch_gives_each_item_the_outcome_it_would_have_alone(cluster):
    node = cluster.nodes[1]  # a follower or the leader: every member serves WriteMany
    resource, other = unique("mixed"), unique("mixed-other")
    old, current = fenced_twice(node, resource)
    other_token = acquire(node, other)
    items = [
        pb.WriteRequest(resource=resource, key="ok", value=b"1", token=current, op_id=op_id()),
        pb.WriteRequest(resource=resource, key="stale", value=b"2", token=old, op_id=op_id()),
        pb.WriteRequest(resource=resource, key="", value=b"3", token=current, op_id=op_id()),  # bad input
        pb.WriteRequest(resource=resource, key="unknown", value=b"4", token=other_token + 1000, op_id=op_id()),
        pb.WriteRequest(resource=other, key="ok", value=b"5", token=other_token, op_id=op_id()),
        pb.WriteRequest(resource=resource, key="short-op-id", value=b"6", token=current, op_id=b"x"),
    ]
    reply = node.store.WriteMany(pb.WriteManyRequest(writes=items), timeout=T)

    kinds = [r.WhichOneof("outcome") for r in reply.results]
    assert kinds == ["write", "error", "error", "error", "write", "error"], reply
    first, fifth = reply.results[0].write, reply.results[4].write
    assert (first.version, first.hwm) == (1, current) and (fifth.version, fifth.hwm) == (1, other_token)
    assert first.header.member_id == node.raft_address and first.header.applied_index >= 1
    assert reply.header.applied_index >= max(first.header.applied_index, fifth.header.applied_index)
    stale, bad, unknown, short = (reply.results[i].error for i in (1, 2, 3, 5))
    assert (stale.code, stale.reason, dict(stale.metadata)) == ("FAILED_PRECONDITION", R.STALE_TOKEN,
                                                                {M.HWM: str(current)})
    assert (bad.code, bad.reason, dict(bad.metadata)) == ("INVALID_ARGUMENT", R.INVALID_FIELD, {M.FIELD: "key"})
    assert (unknown.code, unknown.reason) == ("FAILED_PRECONDITION", R.UNKNOWN_TOKEN)
    assert (short.code, short.reason, short.metadata[M.FIELD]) == ("INVALID_ARGUMENT", R.INVALID_FIELD, "op_id")
    # Each refused item answers exactly as the same Write alone (which changes nothing either).
    for i, error in zip((1, 2, 3, 5), (stale, bad, unknown, short), strict=True):
        assert (error.code, error.reason, dict(error.metadata)) == alone(node, items[i]), i
    # Only the two good items applied.
    assert read(node, resource, "ok").value == b"1" and read(node, other, "ok").value == b"5"
    for key in ("stale", "unknown", "short-op-id"):
        assert not read(node, resource, key).found, key


def test_a_retried_item_with_the_same_op_id_applies_once(cluster):
    node = cluster.nodes[0]
    resource = unique("retry")
    token = acquire(node, resource)
    item = pb.WriteRequest(resource=resource, key="k", value=b"once", token=token, op_id=op_id())
    other = pb.WriteRequest(resource=resource, key="j", value=b"j", token=token, op_id=op_id())

    first = node.store.WriteMany(pb.WriteManyRequest(writes=[item, other]), timeout=T)
    again = node.store.WriteMany(pb.WriteManyRequest(writes=[item]), timeout=T)  # the retry
    alone_again = node.store.Write(item, timeout=T)  # and as a plain Write with that op_id

    assert first.results[0].write.version == again.results[0].write.version == alone_again.version == 1
    assert again.results[0].write.header.applied_index == first.results[0].write.header.applied_index
    assert read(node, resource, "k").version == 1  # applied once, not three times
    # A new op_id is a new write (versions are the resource's revision: "j" took 2).
    fresh = pb.WriteRequest(resource=resource, key="k", value=b"twice", token=token, op_id=op_id())
    assert node.store.WriteMany(pb.WriteManyRequest(writes=[fresh]), timeout=T).results[0].write.version == 3
    assert (read(node, resource, "k").value, read(node, resource, "k").version) == (b"twice", 3)


def test_a_call_past_a_limit_is_refused_whole_and_applies_nothing(cluster):
    node = cluster.nodes[cluster.leader_index(timeout_s=T)]  # 64 proposals, none forwarded
    resource = unique("limits")
    token = acquire(node, resource)

    def items(n: int, value: bytes) -> list[pb.WriteRequest]:
        return [pb.WriteRequest(resource=resource, key=f"k{i}", value=value, token=token, op_id=op_id())
                for i in range(n)]

    too_many = items(limits.WRITE_MANY_ITEMS_MAX + 1, b"v")
    code, reason, metadata, err = failure(node.store.WriteMany, pb.WriteManyRequest(writes=too_many), timeout=T)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, R.INVALID_FIELD)
    assert metadata == {M.FIELD: "writes", M.LIMIT: "write_many_items", M.MAX: str(limits.WRITE_MANY_ITEMS_MAX)}
    assert "WRITE_MANY_ITEMS_MAX" in err.details() and "nothing was applied" in err.details()

    big = items(limits.WRITE_MANY_BYTES_MAX // limits.VALUE_BYTES_MAX + 1, b"b" * limits.VALUE_BYTES_MAX)
    assert len(big) <= limits.WRITE_MANY_ITEMS_MAX
    code, reason, metadata, err = failure(node.store.WriteMany, pb.WriteManyRequest(writes=big), timeout=T)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, R.INVALID_FIELD)
    assert metadata == {M.FIELD: "writes", M.LIMIT: "write_many_bytes", M.MAX: str(limits.WRITE_MANY_BYTES_MAX)}
    assert "WRITE_MANY_BYTES_MAX" in err.details()

    assert not any(read(node, resource, f"k{i}").found for i in range(len(too_many)))
    # At the limit it is served: every item applied.
    at_limit = node.store.WriteMany(pb.WriteManyRequest(writes=items(limits.WRITE_MANY_ITEMS_MAX, b"v")), timeout=T)
    refused = [r.error for r in at_limit.results if r.WhichOneof("outcome") == "error"]
    assert len(at_limit.results) == limits.WRITE_MANY_ITEMS_MAX and not refused, refused[:3]


class _Store:
    """A FencedStore stub whose Write and WriteMany run ``before(batch size)`` first."""

    def __init__(self, real, before) -> None:
        self.real, self.before = real, before

    def Write(self, request, **kwargs):
        self.before(1)
        return self.real.Write(request, **kwargs)

    def WriteMany(self, request, **kwargs):
        self.before(len(request.writes))
        return self.real.WriteMany(request, **kwargs)


class _GatedFirstBatch:
    """Wraps the batcher's stub lookup: the first batch waits until ``hold_for`` more writes
    are queued behind it (so the next batch carries them together whatever the scheduling),
    and every batch's size is recorded."""

    def __init__(self, client: FencingClient, hold_for: int) -> None:
        self.batcher = client._batcher
        self.batcher.batches_in_flight_max = 1  # so the queue builds behind the held batch
        self.real = self.batcher._stub_for
        self.hold_for = hold_for
        self.sizes: list[int] = []
        self.batcher._stub_for = lambda endpoint, service: _Store(self.real(endpoint, service), self.before)

    def queued(self) -> int:
        with self.batcher._lock:
            return sum(len(q) for q in self.batcher._queues.values())

    def before(self, size: int) -> None:
        first = not self.sizes
        self.sizes.append(size)
        if first:
            wait_until(lambda: self.queued() >= self.hold_for, timeout_s=30,
                       what=f"{self.hold_for} writes queued behind the first batch")


def test_the_multiplexed_client_gives_each_of_32_threads_its_own_answer(cluster):
    threads_n, writes_per_thread, resources_n = 32, 4, 8
    setup = cluster.nodes[0]
    resources = [unique("mux") for _ in range(resources_n)]
    records: list[dict] = []
    records_lock = threading.Lock()
    errors: list[str] = []
    versions: dict[int, int] = {}  # thread -> version of its last write

    def record(**fields) -> None:
        with records_lock:
            records.append({"type": "op", **fields})

    def recorded_acquire(resource: str) -> int:
        mine, invoke = op_id(), time.monotonic_ns()
        reply = setup.lease.Acquire(pb.AcquireRequest(resource=resource, holder="h", ttl_ms=60_000, op_id=mine),
                                    timeout=T)
        record(process="setup", op_id=mine.hex(), f="acquire", resource=resource, invoke_ns=invoke,
               complete_ns=time.monotonic_ns(), outcome="ok",
               result={"token": reply.token, "hwm": reply.token, "expires_at_ms": reply.expires_at_ms,
                       "applied_index": reply.header.applied_index})
        return reply.token

    def recorded_release(resource: str, token: int) -> None:
        mine, invoke = op_id(), time.monotonic_ns()
        reply = setup.lease.Release(pb.ReleaseRequest(resource=resource, token=token, op_id=mine), timeout=T)
        record(process="setup", op_id=mine.hex(), f="release", resource=resource, token=token, invoke_ns=invoke,
               complete_ns=time.monotonic_ns(), outcome="ok",
               result={"hwm": reply.hwm, "applied_index": reply.header.applied_index})

    tokens: dict[str, tuple[int, int]] = {}  # resource -> (a fenced token, the current one)
    for r in resources:
        old = recorded_acquire(r)
        recorded_release(r, old)
        tokens[r] = (old, recorded_acquire(r))

    client = FencingClient(cluster.endpoints, multiplex=True)
    client.status()  # learn the leader first: batches form per endpoint, and all go there then
    gate = _GatedFirstBatch(client, hold_for=threads_n - 1)
    start = threading.Barrier(threads_n)

    def writer(i: int) -> None:
        resource = resources[i % resources_n]
        old, current = tokens[resource]
        stale = i % 4 == 0  # every fourth thread writes with the fenced token
        token = old if stale else current
        start.wait(timeout=30)
        last_version = 0
        for n in range(writes_per_thread):
            key, value, mine = f"t{i}", f"t{i}-{n}", op_id()
            invoke = time.monotonic_ns()
            try:
                result = client.write(resource, key, value.encode(), token=token, op_id=mine)
            except E.StaleToken as exc:
                record(process=f"t{i}", op_id=mine.hex(), f="write", resource=resource, key=key, value=value,
                       token=token, invoke_ns=invoke, complete_ns=time.monotonic_ns(), outcome="refused",
                       reason=exc.reason)
                if not stale or exc.hwm != current or exc.request.get("op_id") != mine:
                    errors.append(f"t{i} write {n}: unexpected {exc!r} (hwm {exc.hwm})")
                continue
            except Exception as exc:  # noqa: BLE001 - any other answer fails the test below
                errors.append(f"t{i} write {n}: {type(exc).__name__}: {exc}")
                continue
            record(process=f"t{i}", op_id=mine.hex(), f="write", resource=resource, key=key, value=value,
                   token=token, invoke_ns=invoke, complete_ns=time.monotonic_ns(), outcome="ok",
                   result={"version": result.version, "hwm": result.hwm,
                           "applied_index": result.header.applied_index})
            # A version is the resource's revision (threads share resources): it only grows.
            if stale or result.op_id != mine or result.hwm != current or result.version <= last_version:
                errors.append(f"t{i} write {n}: unexpected {result!r}")
            last_version = result.version
            versions[i] = result.version

    threads = [threading.Thread(target=writer, args=(i,), name=f"mux-writer-{i}") for i in range(threads_n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a writer is still waiting"
    finally:
        client.close()
    assert not errors, "\n".join(errors)
    # The writes really travelled together: the gate made the second batch wait for the rest.
    assert len(gate.sizes) < threads_n * writes_per_thread and max(gate.sizes) > 1, gate.sizes

    # What the cluster holds afterwards, as the checker's final state.
    for r, (_, current) in tokens.items():
        data = {}
        for i in range(threads_n):
            if resources[i % resources_n] != r:
                continue
            found = read(setup, r, f"t{i}")
            if i % 4 == 0:
                assert not found.found, f"a stale thread's write applied: t{i}"
            else:
                assert (found.value, found.version) == (f"t{i}-{writes_per_thread - 1}".encode(), versions[i])
                data[f"t{i}"] = {"value": found.value.decode(), "version": found.version}
        records.append({"type": "final_state", "resource": r, "hwm": current, "data": data})
    report = chaos_check.check_history(chaos_history.History.of(records))
    assert report.ok, chaos_check.format_report(report)


def test_close_fails_writes_still_waiting_to_be_sent(cluster):
    node = cluster.nodes[0]
    resource = unique("close")
    token = acquire(node, resource)
    client = FencingClient(cluster.endpoints, multiplex=True)
    client.status()  # learn the leader first, so every write queues for the same endpoint
    released = threading.Event()
    batcher = client._batcher
    batcher.batches_in_flight_max = 1  # the writes after the first queue behind it
    real = batcher._stub_for
    # The first batch stays in flight until the test says.
    batcher._stub_for = lambda endpoint, service: _Store(
        real(endpoint, service), lambda size: released.wait(timeout=30)
    )
    outcomes: dict[int, object] = {}

    def writer(i: int) -> None:
        try:
            outcomes[i] = client.write(resource, f"k{i}", b"v", token=token)
        except BaseException as exc:  # noqa: BLE001 - recorded and checked below
            outcomes[i] = exc

    first = threading.Thread(target=writer, args=(0,))
    first.start()
    wait_until(lambda: batcher._in_flight, timeout_s=30, what="the first batch in flight")
    rest = [threading.Thread(target=writer, args=(i,)) for i in range(1, 4)]
    for t in rest:
        t.start()
    wait_until(lambda: sum(len(q) for q in batcher._queues.values()) == 3, timeout_s=30, what="3 writes queued")
    client.close()
    for t in rest:
        t.join(timeout=30)
    assert all(isinstance(outcomes[i], RuntimeError) and "closed" in str(outcomes[i]) for i in range(1, 4)), outcomes
    released.set()
    first.join(timeout=30)
    assert not first.is_alive()
    # The batch in flight ends as a plain write would on a closed client: its answer or an error.
    assert isinstance(outcomes[0], (RuntimeError, E.FencingError)) or outcomes[0].version == 1, outcomes[0]
    for i in range(1, 4):
        assert not read(node, resource, f"k{i}").found


class _HeldNode:
    """A stand-in RaftNode for ``Proposer.propose_many``: the first proposal is refused at once,
    in the proposing thread (as a full Raft queue answers), the rest are held until released."""

    def __init__(self) -> None:
        self.held: list = []
        self.lock = threading.Lock()

    def next_stamp_ms(self) -> int:
        return 1

    def propose_async_result(self, command: bytes, on_result, *, batch_key=None) -> None:
        from coordinator.raft.interface import ProposeFailure, ProposeResult

        with self.lock:
            first = not self.held
            self.held.append(on_result)
        if first:
            on_result(ProposeResult.failed(ProposeFailure.QUEUE_FULL))

    def release_rest(self) -> None:
        import types

        from coordinator.raft.interface import ProposeOutcome, ProposeResult

        for n, on_result in enumerate(self.held[1:], start=2):
            on_result(ProposeResult(ProposeOutcome.APPLIED, value=types.SimpleNamespace(result={"n": n}), index=n))

    def leader_address(self) -> str:
        return ""


def test_propose_many_waits_for_every_proposal_even_when_one_answers_at_once():
    # A proposal answered before the next one is made (QUEUE_FULL calls back at once) must
    # not end the wait for the others: they would come back OUTCOME_UNKNOWN without waiting.
    from coordinator.core import ops
    from coordinator.server import errors as server_errors
    from coordinator.server.proposer import Proposer

    node = _HeldNode()
    proposer = Proposer(node, inflight_max=8, timeout_max_s=5.0, deadline_margin_s=0.1, members={})
    fields = {"resource": "orders/1", "key": "k", "value": b"v", "token": 1}
    batch = [ops.Write(**fields, op_id=op_id()) for _ in range(3)]
    answers: list = []
    waiting = threading.Thread(target=lambda: answers.extend(proposer.propose_many(batch, 30.0)))
    waiting.start()
    wait_until(lambda: len(node.held) == 3, timeout_s=30, what="all three proposed")
    assert waiting.is_alive(), f"propose_many returned before two of its proposals settled: {answers}"
    node.release_rest()
    waiting.join(timeout=30)
    assert isinstance(answers[0], server_errors.ServiceError) and answers[0].reason == R.OVERLOADED
    assert [a.value.result for a in answers[1:]] == [{"n": 2}, {"n": 3}]


class _Boom(BaseException):
    """What interrupts the thread sending the first batch (a KeyboardInterrupt, say)."""


def test_a_sender_interrupted_mid_call_passes_the_turn_on_and_the_others_are_sent():
    from coordinator.client.multiplex import Batcher

    calls: list[int] = []
    batcher: Batcher

    def queued() -> int:
        with batcher._lock:
            return sum(len(q) for q in batcher._queues.values())

    class Store:
        def Write(self, request, **kwargs):
            calls.append(1)
            wait_until(lambda: queued() == 2, timeout_s=30, what="two writes queued behind the first")
            raise _Boom()

        def WriteMany(self, request, **kwargs):
            calls.append(len(request.writes))
            return pb.WriteManyResponse(results=[
                pb.WriteManyResult(write=pb.WriteResponse(version=n + 1)) for n in range(len(request.writes))])

    batcher = Batcher(lambda endpoint, service: Store(), ())
    batcher.batches_in_flight_max = 1  # the two writes after the first queue behind it
    request = pb.WriteRequest(resource="r", key="k", value=b"v", token=1, op_id=op_id())
    outcomes: dict[str, object] = {}

    def write(name: str) -> None:
        try:
            outcomes[name] = batcher.write("e", request, 30.0)
        except _Boom as exc:
            outcomes[name] = exc

    first = threading.Thread(target=write, args=("first",))
    first.start()
    wait_until(lambda: calls, timeout_s=30, what="the first batch sent")
    rest = [threading.Thread(target=write, args=(name,)) for name in ("second", "third")]
    for t in rest:
        t.start()
    for t in (first, *rest):
        t.join(timeout=30)
    assert isinstance(outcomes["first"], _Boom)
    assert calls == [1, 2], calls  # the two queued writes went out together, after the interruption
    assert sorted(o.response.version for o in (outcomes["second"], outcomes["third"])) == [1, 2]
    assert not batcher._in_flight  # the turn was given back


def test_a_second_batch_starts_while_one_is_in_flight_and_the_rest_queue():
    # BATCHES_IN_FLIGHT_MAX (2): a caller that finds one batch in flight sends at once; one
    # that finds two queues and goes with the next batch; every turn is given back after.
    from coordinator.client import multiplex

    assert multiplex.BATCHES_IN_FLIGHT_MAX == 2
    calls: list[int] = []
    go = threading.Event()

    class Store:
        def Write(self, request, **kwargs):
            calls.append(1)
            go.wait(timeout=30)
            return pb.WriteResponse(version=1)

        def WriteMany(self, request, **kwargs):
            calls.append(len(request.writes))
            return pb.WriteManyResponse(results=[
                pb.WriteManyResult(write=pb.WriteResponse(version=n + 1)) for n in range(len(request.writes))])

    batcher = multiplex.Batcher(lambda endpoint, service: Store(), ())
    request = pb.WriteRequest(resource="r", key="k", value=b"v", token=1, op_id=op_id())
    outcomes: list = []
    threads = [threading.Thread(target=lambda: outcomes.append(batcher.write("e", request, 30.0))) for _ in range(5)]
    threads[0].start()
    wait_until(lambda: len(calls) == 1, timeout_s=30, what="the first batch sent")
    threads[1].start()
    wait_until(lambda: len(calls) == 2, timeout_s=30, what="a second batch sent while the first is in flight")
    for t in threads[2:]:
        t.start()

    def queued() -> int:
        with batcher._lock:
            return sum(len(q) for q in batcher._queues.values())

    wait_until(lambda: queued() == 3, timeout_s=30, what="three writes queued behind two batches")
    assert calls == [1, 1]
    go.set()
    for t in threads:
        t.join(timeout=30)
    assert len(outcomes) == 5 and all(o.response is not None for o in outcomes), outcomes
    assert sum(calls) == 5 and max(calls) > 1, calls  # the three queued ones went together (at most two batches)
    assert not batcher._in_flight  # every turn was given back


def test_many_threads_through_two_turns_each_get_their_own_answer_and_every_turn_comes_back():
    # The turn accounting with two batches in flight: attempts handed a turn are taken into
    # the other sender's batch, expire, or send themselves; none is lost and none left over.
    import random

    from coordinator.client import multiplex

    rng = random.Random(20261205)
    print("seed 20261205")

    class Store:
        def Write(self, request, **kwargs):
            return pb.WriteResponse(version=int(request.key))

        def WriteMany(self, request, **kwargs):
            if rng.random() < 0.5:
                threading.Event().wait(rng.random() / 1000)  # let queues build now and then
            return pb.WriteManyResponse(results=[
                pb.WriteManyResult(write=pb.WriteResponse(version=int(w.key))) for w in request.writes])

    batcher = multiplex.Batcher(lambda endpoint, service: Store(), ())
    errors: list[str] = []

    def writer(i: int) -> None:
        for n in range(50):
            key = i * 1000 + n
            request = pb.WriteRequest(resource="r", key=str(key), value=b"v", token=1, op_id=op_id())
            outcome = batcher.write("e", request, 30.0)
            if outcome.response is None or outcome.response.version != key:
                errors.append(f"{i}/{n}: {outcome}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:5]
    assert not batcher._in_flight and not any(batcher._queues.values())

"""Stateful property test: the fencing state machine against a small reference model.

Hypothesis drives random sequences of acquire / keep-alive / release / write / delete / tick /
force-release / set-epoch-floor / read-barrier / malformed commands and snapshot-restore over a
few resources, keys, holders and reused op_ids, with stamps that sometimes go backwards. After
every step the machine and the model must agree. On failure Hypothesis prints the seed and the
shortest failing program of steps.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from coordinator.core import commands as cmds
from coordinator.core.commands import Command, Op
from coordinator.core.state_machine import (
    Applied,
    FencingStateMachine,
    Reason,
    Rejected,
    UnappliableEntry,
    outcome_from_wire,
    outcome_to_wire,
)

RESOURCES = ["r1", "r2", "r3"]
KEYS = ["a", "b", "c"]
HOLDERS = ["h1", "h2"]
TTLS = [100, 700, 2_500, 10_000]
DEDUP_ENTRIES_MAX = 5  # small, so eviction by count happens inside one run
DEDUP_RETENTION_MS = 4_000  # small, so eviction by age happens inside one run
RESOURCES_MAX = 2  # below len(RESOURCES), so the resource limit is reached
KEYS_PER_RESOURCE_MAX = 2  # below len(KEYS), so the key limit is reached

# r1 half the time, so its lease, data and key limit see long histories.
resources = st.integers(min_value=0, max_value=3).map(lambda n: RESOURCES[max(0, n - 1)])
keys = st.sampled_from(KEYS)
holders = st.sampled_from(HOLDERS)


def op_ids(op: str) -> st.SearchStrategy[bytes]:
    """Few op_ids per op, so retries happen often; now and then one shared by every op, so
    conflicts happen too."""
    own = st.sampled_from([f"{op}-{n}".ljust(16, ".").encode() for n in range(5)])
    shared = st.sampled_from([b"shared-0".ljust(16, b"."), b"shared-1".ljust(16, b".")])
    return st.integers(min_value=0, max_value=9).flatmap(lambda n: shared if n == 0 else own)


ttls = st.sampled_from(TTLS)
# Wall-clock steps of the proposer: mostly forward, sometimes backwards (the clock must not).
# Mostly whole multiples of 100 ms, so stamps often land exactly on an expiry or on the dedup
# retention horizon, where off-by-one mistakes live.
# "expiry" and "expiry-1" jump straight to (just before) a lease's expiry.
stamp_deltas = st.integers(min_value=0, max_value=9).flatmap(
    lambda n: (
        st.integers(min_value=-800, max_value=1_500)
        if n == 0
        else st.sampled_from(["expiry", "expiry-1"])
        if n == 1
        else st.integers(min_value=-8, max_value=15).map(lambda k: 100 * k)
    )
)
# How a test picks a token, resolved against the model's hwm of the target resource.
token_choices = st.sampled_from(["current"] * 6 + ["stale", "next", "issued", "huge"])
values = st.binary(max_size=6)


# -- the reference model ---------------------------------------------------------------------


@dataclasses.dataclass
class ModelResource:
    hwm: int = 0
    lease: tuple[str, int, int, int] | None = None  # holder, token, ttl_ms, expires_at_ms
    revision: int = 0
    data: dict[str, tuple[bytes, int]] = dataclasses.field(default_factory=dict)
    fenced: bool = False  # the hwm only fenced it (force-release, floor with fence_all): never issued


# What the model expects: ("applied", result dict) or ("rejected", reason, details or None).
Expected = tuple


class Model:
    """The rules of the brief, written as plainly as possible, without sharing any code."""

    def __init__(self) -> None:
        self.epoch = 0
        self.clock = 0
        self.res: dict[str, ModelResource] = {}
        self.dedup: collections.OrderedDict[bytes, tuple[Op, str, dict, int]] = (
            collections.OrderedDict()
        )

    def hwm(self, name: str) -> int:
        return self.res[name].hwm if name in self.res else 0

    def forget_if_idle(self, name: str) -> None:
        """A resource with no lease and no data is forgotten (its hwm with it)."""
        r = self.res[name]
        if r.lease is None and not r.data:
            del self.res[name]

    def step(
        self,
        op: Op,
        stamp: int,
        decide: Callable[[int], tuple[Expected, Callable[[], None] | None]],
        *,
        resource: str | None = None,
        op_id: bytes | None = None,
    ) -> tuple[Expected, bool]:
        """Run one command; returns (expected, was_a_dedup_replay)."""
        if op_id is not None and op_id in self.dedup:
            first_op, first_resource, result, _ = self.dedup[op_id]
            if (first_op, first_resource) == (op, resource):
                return ("applied", result), True
            return ("rejected", Reason.OP_ID_CONFLICT, None), False
        now = max(self.clock, stamp)
        expected, commit = decide(now)
        if expected[0] == "applied":
            if commit is not None:
                commit()
            self.clock = now
            if op_id is not None:
                self.dedup[op_id] = (op, resource, expected[1], now)
            while self.dedup:
                oldest_at = next(iter(self.dedup.values()))[3]
                too_old = oldest_at <= self.clock - DEDUP_RETENTION_MS
                if too_old or len(self.dedup) > DEDUP_ENTRIES_MAX:
                    self.dedup.popitem(last=False)
                else:
                    break
        return expected, False

    def fence(self, name: str, token: int) -> Expected | None:
        hwm = self.hwm(name)
        if token > hwm or (token == hwm and name in self.res and self.res[name].fenced):
            return ("rejected", Reason.UNKNOWN_TOKEN, None)
        if token < hwm:
            return ("rejected", Reason.STALE_TOKEN, {"hwm": hwm})
        return None

    # Each decide_* returns (expected, commit) and changes nothing itself.

    def decide_acquire(self, name, holder, ttl):
        def decide(now):
            r = self.res.get(name)
            if r is not None and r.lease is not None and r.lease[3] > now:
                holder_, token_, _, expires_ = r.lease
                return (
                    "rejected",
                    Reason.LEASE_HELD,
                    {"holder": holder_, "expires_at_ms": expires_, "token": token_, "remaining_ms": expires_ - now},
                ), None
            if name not in self.res and len(self.res) >= RESOURCES_MAX:
                return ("rejected", Reason.LIMIT_EXCEEDED, None), None
            token = self.epoch + 1

            def commit():
                self.epoch = token
                target = self.res.setdefault(name, ModelResource())
                target.hwm = token
                target.lease = (holder, token, ttl, now + ttl)
                target.fenced = False

            return ("applied", {"token": token, "expires_at_ms": now + ttl, "hwm": token}), commit

        return decide

    def decide_keep_alive(self, name, token, ttl):
        def decide(now):
            refused = self.fence(name, token)
            if refused:
                return refused, None
            r = self.res[name]
            if r.lease is None or r.lease[1] != token or r.lease[3] <= now:
                return ("rejected", Reason.LEASE_EXPIRED, None), None
            new_ttl = r.lease[2] if ttl is None else ttl

            def commit():
                r.lease = (r.lease[0], token, new_ttl, now + new_ttl)

            return ("applied", {"token": token, "expires_at_ms": now + new_ttl}), commit

        return decide

    def decide_release(self, name, token):
        def decide(now):
            refused = self.fence(name, token)
            if refused:
                return refused, None
            r = self.res[name]
            holds = r.lease is not None and r.lease[1] == token

            def commit():
                if holds:
                    r.lease = None
                self.forget_if_idle(name)

            released = holds and r.lease[3] > now
            return ("applied", {"hwm": r.hwm, "released": released}), commit

        return decide

    def decide_write(self, name, key, value, token, expected_version):
        def decide(now):
            refused = self.fence(name, token)
            if refused:
                return refused, None
            r = self.res[name]
            current = r.data[key][1] if key in r.data else 0
            if expected_version is not None and expected_version != current:
                return ("rejected", Reason.VERSION_MISMATCH, {"version": current}), None
            if key not in r.data and len(r.data) >= KEYS_PER_RESOURCE_MAX:
                return ("rejected", Reason.LIMIT_EXCEEDED, None), None

            def commit():
                r.revision += 1
                r.data[key] = (value, r.revision)

            return ("applied", {"version": r.revision + 1, "hwm": r.hwm}), commit

        return decide

    def decide_delete(self, name, key, token):
        def decide(now):
            refused = self.fence(name, token)
            if refused:
                return refused, None
            r = self.res[name]
            if key not in r.data:
                return ("applied", {"version": 0, "deleted": False}), None

            def commit():
                r.revision += 1
                del r.data[key]
                self.forget_if_idle(name)

            return ("applied", {"version": r.revision + 1, "deleted": True}), commit

        return decide

    def decide_force_release(self, name):
        def decide(now):
            if name not in self.res and len(self.res) >= RESOURCES_MAX:
                return ("rejected", Reason.LIMIT_EXCEEDED, None), None
            token = self.epoch + 1

            def commit():
                self.epoch = token
                target = self.res.setdefault(name, ModelResource())
                target.hwm = token
                target.lease = None
                target.fenced = True

            return ("applied", {"hwm": token}), commit

        return decide

    def decide_set_epoch_floor(self, floor, fence_all):
        def decide(now):
            new_epoch = max(self.epoch, floor) + (1 if fence_all else 0)

            def commit():
                self.epoch = new_epoch
                if fence_all:
                    for r in self.res.values():
                        r.hwm = new_epoch
                        r.lease = None
                        r.fenced = True

            return ("applied", {"epoch": new_epoch}), commit

        return decide

    def decide_tick(self):
        def decide(now):
            ending = [n for n, r in self.res.items() if r.lease is not None and r.lease[3] <= now]

            def commit():
                for name in ending:
                    self.res[name].lease = None
                    self.forget_if_idle(name)

            return ("applied", {"expired": len(ending)}), commit

        return decide

    def decide_read_barrier(self, name, key):
        def decide(now):
            result: dict[str, Any] = {"epoch": self.epoch, "log_clock_ms": now}
            if name is not None:
                r = self.res.get(name, ModelResource())
                live = r.lease is not None and r.lease[3] > now
                result["hwm"] = r.hwm
                result["lease"] = (
                    {"holder": r.lease[0], "token": r.lease[1], "expires_at_ms": r.lease[3]}
                    if live
                    else None
                )
                if key is not None:
                    value, version = r.data.get(key, (None, 0))
                    result["value"] = value
                    result["version"] = version
            return ("applied", result), None

        return decide


# -- the test -------------------------------------------------------------------------------


class FencingStateMachineTest(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sm = self.new_machine()
        self.model = Model()
        self.wall_ms = 0
        self.issued_tokens: list[int] = []
        self.clock_seen = 0

    @staticmethod
    def new_machine() -> FencingStateMachine:
        return FencingStateMachine(
            dedup_entries_max=DEDUP_ENTRIES_MAX,
            dedup_retention_ms=DEDUP_RETENTION_MS,
            resources_max=RESOURCES_MAX,
            keys_per_resource_max=KEYS_PER_RESOURCE_MAX,
        )

    @initialize(start=st.integers(min_value=0, max_value=10**12), ttl=ttls)
    def start(self, start, ttl):
        """Start the clock anywhere and give r1 a lease, so every run has something to fence."""
        self.wall_ms = start
        self.acquire("r1", "h1", ttl, b"initial-acquire.", 0)

    # -- helpers ------------------------------------------------------------------------

    def stamp(self, delta: int | str, resource: str | None = None) -> int:
        """The proposer's next stamp; may go backwards, or jump to a lease's expiry."""
        if isinstance(delta, str):
            expiries = [
                r.lease[3]
                for name, r in self.model.res.items()
                if r.lease is not None and resource in (None, name)
            ]
            if expiries:
                self.wall_ms = min(expiries) - (1 if delta == "expiry-1" else 0)
                return self.wall_ms
            delta = 0
        self.wall_ms = max(0, self.wall_ms + delta)
        return self.wall_ms

    def token(self, choice: str, resource: str, pick: int) -> int:
        hwm = self.model.hwm(resource)
        if choice == "current":
            return max(hwm, 1)
        if choice == "stale":
            return max(hwm - 1, 1)
        if choice == "next":
            return hwm + 1
        if choice == "issued" and self.issued_tokens:
            return self.issued_tokens[pick % len(self.issued_tokens)]
        if choice == "huge":
            return 2**63
        return 1

    def run(self, cmd: Command, expected: Expected) -> Applied | Rejected:
        """Apply ``cmd`` through the byte path and check the outcome against ``expected``."""
        before = self.sm.digest()
        outcome = self.sm.apply(cmd.encode())
        # every outcome survives the wire format used by the dedup table and replies
        assert outcome_from_wire(outcome_to_wire(outcome)) == outcome
        if expected[0] == "applied":
            assert isinstance(outcome, Applied), (cmd, outcome, expected)
            assert outcome.op is cmd.op
            assert outcome.result.to_map() == expected[1], (cmd, outcome.result, expected[1])
        else:
            assert isinstance(outcome, Rejected), (cmd, outcome, expected)
            assert outcome.reason is expected[1], (cmd, outcome, expected)
            if expected[2] is not None:
                assert outcome.details == expected[2], (cmd, outcome.details, expected[2])
        if isinstance(outcome, Rejected):
            assert self.sm.digest() == before, f"refused {cmd} changed state"
        # coverage report for --hypothesis-show-statistics
        event(f"{cmd.op.name} {getattr(outcome, 'reason', None) or 'APPLIED'}")
        return outcome

    # -- rules ---------------------------------------------------------------------------

    @rule(resource=resources, holder=holders, ttl=ttls, op_id=op_ids("acquire"), delta=stamp_deltas)
    def acquire(self, resource, holder, ttl, op_id, delta):
        cmd = cmds.acquire(
            resource=resource,
            holder=holder,
            ttl_ms=ttl,
            op_id=op_id,
            stamp_ms=self.stamp(delta, resource),
        )
        expected, replay = self.model.step(
            Op.ACQUIRE,
            cmd.stamp_ms,
            self.model.decide_acquire(resource, holder, ttl),
            resource=resource,
            op_id=op_id,
        )
        outcome = self.run(cmd, expected)
        if isinstance(outcome, Applied) and not replay:
            token = outcome.result.token
            # I1: every new token is above every token issued before it
            assert all(token > earlier for earlier in self.issued_tokens)
            assert token == self.sm.epoch
            self.issued_tokens.append(token)

    @rule(
        resource=resources,
        choice=token_choices,
        pick=st.integers(0, 50),
        ttl=st.none() | ttls,
        delta=stamp_deltas,
    )
    def keep_alive(self, resource, choice, pick, ttl, delta):
        token = self.token(choice, resource, pick)
        cmd = cmds.keep_alive(
            resource=resource, token=token, ttl_ms=ttl, stamp_ms=self.stamp(delta, resource)
        )
        expected, _ = self.model.step(
            Op.KEEP_ALIVE, cmd.stamp_ms, self.model.decide_keep_alive(resource, token, ttl)
        )
        self.run(cmd, expected)

    @rule(
        resource=resources,
        choice=token_choices,
        pick=st.integers(0, 50),
        op_id=st.none() | op_ids("release"),
        delta=stamp_deltas,
    )
    def release(self, resource, choice, pick, op_id, delta):
        token = self.token(choice, resource, pick)
        cmd = cmds.release(
            resource=resource, token=token, op_id=op_id, stamp_ms=self.stamp(delta, resource)
        )
        expected, _ = self.model.step(
            Op.RELEASE,
            cmd.stamp_ms,
            self.model.decide_release(resource, token),
            resource=resource,
            op_id=op_id,
        )
        self.run(cmd, expected)

    @rule(
        resource=resources,
        key=keys,
        value=values,
        choice=token_choices,
        pick=st.integers(0, 50),
        op_id=op_ids("write"),
        version_choice=st.sampled_from([None, None, "current", "zero", "wrong"]),
        delta=stamp_deltas,
    )
    def write(self, resource, key, value, choice, pick, op_id, version_choice, delta):
        token = self.token(choice, resource, pick)
        r = self.model.res.get(resource)
        current = r.data[key][1] if r is not None and key in r.data else 0
        expected_version = {None: None, "current": current, "zero": 0, "wrong": current + 1}[
            version_choice
        ]
        cmd = cmds.write(
            resource=resource,
            key=key,
            value=value,
            token=token,
            op_id=op_id,
            stamp_ms=self.stamp(delta, resource),
            expected_version=expected_version,
        )
        expected, _ = self.model.step(
            Op.WRITE,
            cmd.stamp_ms,
            self.model.decide_write(resource, key, value, token, expected_version),
            resource=resource,
            op_id=op_id,
        )
        self.run(cmd, expected)

    @rule(
        resource=resources,
        key=keys,
        choice=token_choices,
        pick=st.integers(0, 50),
        op_id=op_ids("delete"),
        delta=stamp_deltas,
    )
    def delete(self, resource, key, choice, pick, op_id, delta):
        token = self.token(choice, resource, pick)
        cmd = cmds.delete(
            resource=resource,
            key=key,
            token=token,
            op_id=op_id,
            stamp_ms=self.stamp(delta, resource),
        )
        expected, _ = self.model.step(
            Op.DELETE,
            cmd.stamp_ms,
            self.model.decide_delete(resource, key, token),
            resource=resource,
            op_id=op_id,
        )
        self.run(cmd, expected)

    @rule(delta=stamp_deltas)
    def tick(self, delta):
        cmd = cmds.tick(stamp_ms=self.stamp(delta))
        expected, _ = self.model.step(Op.TICK, cmd.stamp_ms, self.model.decide_tick())
        self.run(cmd, expected)

    @rule(resource=resources, op_id=op_ids("force_release"), delta=stamp_deltas)
    def force_release(self, resource, op_id, delta):
        cmd = cmds.force_release(
            resource=resource, op_id=op_id, stamp_ms=self.stamp(delta, resource)
        )
        expected, replay = self.model.step(
            Op.FORCE_RELEASE,
            cmd.stamp_ms,
            self.model.decide_force_release(resource),
            resource=resource,
            op_id=op_id,
        )
        outcome = self.run(cmd, expected)
        if isinstance(outcome, Applied) and not replay:
            assert all(outcome.result.hwm > t for t in self.issued_tokens)
            self.issued_tokens.append(outcome.result.hwm)

    @rule(
        offset=st.integers(min_value=-2, max_value=3), fence_all=st.booleans(), delta=stamp_deltas
    )
    def set_epoch_floor(self, offset, fence_all, delta):
        floor = max(1, self.model.epoch + offset)
        cmd = cmds.set_epoch_floor(floor=floor, fence_all=fence_all, stamp_ms=self.stamp(delta))
        expected, _ = self.model.step(
            Op.SET_EPOCH_FLOOR, cmd.stamp_ms, self.model.decide_set_epoch_floor(floor, fence_all)
        )
        self.run(cmd, expected)
        if fence_all:
            # I11: every token issued before is now refused everywhere
            for resource in self.model.res:
                assert all(self.sm.describe(resource)["hwm"] > t for t in self.issued_tokens)

    @rule(resource=st.none() | resources, key=st.none() | keys, delta=stamp_deltas)
    def read_barrier(self, resource, key, delta):
        if resource is None:
            key = None
        cmd = cmds.read_barrier(resource=resource, key=key, stamp_ms=self.stamp(delta, resource))
        expected, _ = self.model.step(
            Op.READ_BARRIER, cmd.stamp_ms, self.model.decide_read_barrier(resource, key)
        )
        self.run(cmd, expected)

    @rule(
        resource=resources,
        bad=st.sampled_from([None, "2", True, False, 0, -1, 2**64, 1.5]),
        op=st.sampled_from([Op.WRITE, Op.DELETE, Op.KEEP_ALIVE, Op.RELEASE]),
        op_id=op_ids("write"),
        delta=stamp_deltas,
    )
    def malformed_token(self, resource, bad, op, op_id, delta):
        body: dict[str, Any] = {"resource": resource, "token": bad}
        if op in (Op.WRITE, Op.DELETE):
            body.update(key="a", op_id=op_id)
        if op is Op.WRITE:
            body["value"] = b"x"
        before = self.sm.digest()
        # execute(), not apply(): msgpack cannot even encode 2**64
        outcome = self.sm.execute(Command(op, self.stamp(delta, resource), body))
        assert isinstance(outcome, Rejected) and outcome.reason is Reason.MALFORMED, outcome
        assert self.sm.digest() == before

    @rule(data=st.binary(max_size=24))
    def garbage_entry(self, data):
        # An entry no build writes: the member stops (DESIGN §8), with nothing changed.
        before = self.sm.digest()
        with pytest.raises(UnappliableEntry):
            self.sm.apply(data)
        assert self.sm.digest() == before

    @rule()
    def snapshot_and_restore(self):
        snapshot = self.sm.snapshot()
        restored = self.new_machine()
        restored.restore(snapshot)
        assert restored.snapshot() == snapshot
        assert restored.digest() == self.sm.digest()
        self.sm = restored  # carry on with the copy: later steps check its behaviour

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self):
        sm, model = self.sm, self.model
        assert sm.epoch == model.epoch
        assert sm.log_clock_ms == model.clock
        assert sm.log_clock_ms >= self.clock_seen, "the log clock went backwards"
        self.clock_seen = sm.log_clock_ms
        assert sm.dedup_size == len(model.dedup)
        for resource in RESOURCES:
            described = sm.describe(resource)
            expected = model.res.get(resource)
            if expected is None:
                assert described is None
                continue
            assert described["hwm"] == expected.hwm
            assert described["hwm"] <= sm.epoch
            if expected.lease is None:
                assert described["lease"] is None
            else:
                holder, token, ttl, expires = expected.lease
                assert described["lease"] == {
                    "holder": holder,
                    "token": token,
                    "ttl_ms": ttl,
                    "expires_at_ms": expires,
                }
                assert token == described["hwm"]
            assert described["revision"] == expected.revision
            assert described["keys"] == len(expected.data)
            for key in KEYS:
                assert sm.read(resource, key) == expected.data.get(key, (None, 0))


FencingStateMachineTest.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fencing_state_machine_matches_model = FencingStateMachineTest.TestCase

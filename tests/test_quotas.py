"""Quotas per principal and forgetting resources that hold nothing, in the state machine.

Issue 14 findings: one tenant filled the 100,000-resource limit for everyone, forever (released
resources were never forgotten), and one principal could grow every member without bound with
64 KiB writes. Example tests first; then a Hypothesis stateful test over random acquire / write /
delete / release / tick / restore sequences of two principals with small quotas, run on two
replicas, that checks I1-I3 still hold once resources are forgotten, that every quota holds,
that the usage kept incrementally equals the usage derived from state, and that the replicas'
digests stay equal.
"""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from coordinator.core import commands as cmds
from coordinator.core import ops
from coordinator.core.commands import Command, Op
from coordinator.core.results import Result
from coordinator.core.state import Usage
from coordinator.core.state_machine import (
    Applied,
    FencingStateMachine,
    Reason,
    Rejected,
)

TTL = 1_000
_op_ids = (n.to_bytes(16, "big") for n in itertools.count(1))


def acquire(sm, resource, *, stamp=0, principal=None, quota=None, ttl_ms=TTL):
    cmd = cmds.acquire(resource=resource, holder="h", ttl_ms=ttl_ms, op_id=next(_op_ids), stamp_ms=stamp)
    if principal is not None:
        cmd = ops.charged(cmd, principal=principal, quota=quota or {})
    return sm.execute(cmd)


def write(sm, resource, token, *, key="k", value=b"v", stamp=0, quota=None):
    cmd = cmds.write(resource=resource, key=key, value=value, token=token, op_id=next(_op_ids), stamp_ms=stamp)
    if quota is not None:
        cmd = ops.charged(cmd, principal="ignored-for-writes", quota=quota)
    return sm.execute(cmd)


def release(sm, resource, token, *, stamp=0):
    return sm.execute(cmds.release(resource=resource, token=token, stamp_ms=stamp))


def applied(outcome) -> Result:
    assert isinstance(outcome, Applied), outcome
    return outcome.result


def refused(sm, outcome, reason) -> Rejected:
    assert isinstance(outcome, Rejected) and outcome.reason is reason, outcome
    return outcome


def refused_unchanged(sm, make, reason) -> Rejected:
    before = sm.digest()
    outcome = refused(sm, make(), reason)
    assert sm.digest() == before, "a refusal changed state"
    return outcome


# -- forgetting ------------------------------------------------------------------------------


def test_released_resources_with_no_data_no_longer_count_toward_the_resource_limit():
    sm = FencingStateMachine(resources_max=2)
    for n in range(10):  # before: the third name was LIMIT_EXCEEDED, for everyone, forever
        token = applied(acquire(sm, f"job/{n}", stamp=n)).token
        applied(release(sm, f"job/{n}", token, stamp=n))
        assert sm.describe(f"job/{n}") is None
    assert sm.resources_count == 0 and sm.epoch == 10
    # a resource with data is kept (its data is state), and counts
    token = applied(acquire(sm, "kept", stamp=20)).token
    applied(write(sm, "kept", token, stamp=20))
    applied(release(sm, "kept", token, stamp=20))
    assert sm.describe("kept")["hwm"] == token and sm.resources_count == 1


def test_a_forgotten_resources_old_tokens_stay_refused_and_later_tokens_stay_above_them():
    sm = FencingStateMachine()
    old = applied(acquire(sm, "r", stamp=0)).token
    applied(release(sm, "r", old, stamp=1))
    assert sm.describe("r") is None
    # not re-acquired: the old holder's write finds no hwm above it and is never applied
    for make in (
        lambda: write(sm, "r", old, stamp=2),
        lambda: sm.execute(cmds.delete(resource="r", key="k", token=old, op_id=next(_op_ids), stamp_ms=2)),
        lambda: sm.execute(cmds.keep_alive(resource="r", token=old, stamp_ms=2)),
    ):
        refused_unchanged(sm, make, Reason.UNKNOWN_TOKEN)
    # re-acquired: the global epoch issues a token above every token "r" ever had
    new = applied(acquire(sm, "r", stamp=3)).token
    assert new > old
    stale = refused_unchanged(sm, lambda: write(sm, "r", old, stamp=4), Reason.STALE_TOKEN)
    assert stale.details == {"hwm": new}
    assert sm.read("r", "k") == (None, 0)


def test_an_expired_lease_on_no_data_is_forgotten_by_a_tick_and_deleting_the_last_key_forgets():
    sm = FencingStateMachine()
    token = applied(acquire(sm, "r", stamp=0, ttl_ms=100)).token
    applied(sm.execute(cmds.tick(stamp_ms=100)))
    assert sm.describe("r") is None
    token = applied(acquire(sm, "r", stamp=200)).token
    applied(write(sm, "r", token, stamp=200))
    applied(release(sm, "r", token, stamp=201))
    assert sm.describe("r") is not None  # data keeps it
    applied(sm.execute(cmds.delete(resource="r", key="k", token=token, op_id=next(_op_ids), stamp_ms=202)))
    assert sm.describe("r") is None


# -- quotas ------------------------------------------------------------------------------------


def test_a_principal_at_its_resource_quota_is_refused_while_another_still_acquires():
    sm = FencingStateMachine()
    quota = {"resources": 3}
    for n in range(3):
        applied(acquire(sm, f"a/{n}", principal="a", quota=quota))
    refusal = refused_unchanged(
        sm, lambda: acquire(sm, "a/3", principal="a", quota=quota), Reason.QUOTA_EXCEEDED
    )
    assert refusal.details == {"quota": "resources", "max": 3, "principal": "a"}
    applied(acquire(sm, "b/0", principal="b", quota=quota))
    assert sm.usage("a") == {"resources": 3, "leases": 3, "stored_bytes": 0}
    # releasing one frees its slot at once (it held no data, so it is forgotten)
    applied(release(sm, "a/0", sm.describe("a/0")["hwm"]))
    applied(acquire(sm, "a/3", principal="a", quota=quota))


def test_expired_leases_do_not_count_and_the_idle_resources_found_are_forgotten():
    sm = FencingStateMachine()
    quota = {"resources": 2, "leases": 2}
    applied(acquire(sm, "a/0", principal="a", quota=quota, stamp=0, ttl_ms=100))
    token = applied(acquire(sm, "a/1", principal="a", quota=quota, stamp=0, ttl_ms=100)).token
    applied(write(sm, "a/1", token, stamp=0))
    refused_unchanged(sm, lambda: acquire(sm, "a/2", principal="a", quota=quota, stamp=50), Reason.QUOTA_EXCEEDED)
    # both leases expired (a crashed holder): a/0 is idle, a/1 keeps its data
    applied(acquire(sm, "a/2", principal="a", quota=quota, stamp=100))
    assert sm.describe("a/0") is None and sm.describe("a/1") is not None
    assert sm.usage("a")["resources"] == 2
    refusal = refused(sm, acquire(sm, "a/3", principal="a", quota=quota, stamp=100), Reason.QUOTA_EXCEEDED)
    assert refusal.details["quota"] == "resources"


def test_the_leases_quota_counts_live_leases():
    sm = FencingStateMachine()
    quota = {"leases": 1}
    token = applied(acquire(sm, "a/0", principal="a", quota=quota)).token
    applied(write(sm, "a/0", token))
    refusal = refused_unchanged(sm, lambda: acquire(sm, "a/1", principal="a", quota=quota), Reason.QUOTA_EXCEEDED)
    assert refusal.details["quota"] == "leases"
    applied(release(sm, "a/0", token))  # the data stays, the lease ends
    applied(acquire(sm, "a/1", principal="a", quota=quota))


def test_the_stored_bytes_quota_counts_keys_and_values_of_the_owners_resources():
    sm = FencingStateMachine()
    quota = {"stored_bytes": 100}
    token = applied(acquire(sm, "a/0", principal="a", quota=quota)).token
    applied(write(sm, "a/0", token, key="k", value=b"x" * 60, quota=quota))  # 61 bytes
    refusal = refused_unchanged(
        sm, lambda: write(sm, "a/0", token, key="j", value=b"x" * 39, quota=quota), Reason.QUOTA_EXCEEDED
    )
    assert refusal.details == {"quota": "stored_bytes", "max": 100, "principal": "a"}
    applied(write(sm, "a/0", token, key="j", value=b"x" * 38, quota=quota))  # 100 exactly
    assert sm.usage("a")["stored_bytes"] == 100
    applied(write(sm, "a/0", token, key="k", value=b"", quota=quota))  # shrinking: always
    assert sm.usage("a")["stored_bytes"] == 40
    applied(sm.execute(cmds.delete(resource="a/0", key="j", token=token, op_id=next(_op_ids), stamp_ms=0)))
    assert sm.usage("a")["stored_bytes"] == 1
    # another principal taking the resource over takes its bytes with it, within its quota
    applied(release(sm, "a/0", token))
    refused_unchanged(sm, lambda: acquire(sm, "a/0", principal="b", quota={"stored_bytes": 0}), Reason.QUOTA_EXCEEDED)
    applied(acquire(sm, "a/0", principal="b", quota={"stored_bytes": 1}))
    assert sm.usage("a")["stored_bytes"] == 0 and sm.usage("b")["stored_bytes"] == 1


def test_commands_without_a_principal_apply_as_before_and_are_charged_to_nobody():
    sm = FencingStateMachine()
    token = applied(acquire(sm, "r")).token
    applied(write(sm, "r", token, value=b"x" * 1000))
    assert sm.usage("") == {"resources": 0, "leases": 0, "stored_bytes": 0}
    # the snapshot of a state without principals has the layout it had before quotas
    resources = msgpack.unpackb(sm.snapshot())[4]
    assert [len(item) for item in resources] == [5]


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"quota": {"resources": 1}}, "quota"),  # a quota needs a principal to charge
        ({"principal": ""}, "principal"),
        ({"principal": "p" * 129}, "principal"),
        ({"principal": "p", "quota": {"resources": -1}}, "quota"),
        ({"principal": "p", "quota": {"resources": True}}, "quota"),
        ({"principal": "p", "quota": {"streams": 1}}, "quota"),  # never replicated
        ({"principal": "p", "quota": [1]}, "quota"),
    ],
    ids=repr,
)
def test_bad_principal_or_quota_fields_are_malformed_and_change_nothing(extra, field):
    sm = FencingStateMachine()
    body = {"resource": "r", "holder": "h", "ttl_ms": TTL, "op_id": next(_op_ids), **extra}
    refusal = refused_unchanged(sm, lambda: sm.execute(Command(Op.ACQUIRE, 0, body)), Reason.MALFORMED)
    assert refusal.details == {"field": field}


def test_owners_and_usage_survive_snapshot_and_restore_and_replicas_agree():
    replicas = [FencingStateMachine(), FencingStateMachine()]
    entries = []
    token = None
    for n in range(4):
        cmd = ops.charged(
            cmds.acquire(resource=f"a/{n}", holder="h", ttl_ms=TTL, op_id=next(_op_ids), stamp_ms=n),
            principal="a", quota={"resources": 10},
        )
        entries.append(cmd.encode())
    for sm in replicas:
        for entry in entries:
            token = applied(sm.apply(entry)).token
    entry = cmds.write(resource="a/3", key="k", value=b"abc", token=token, op_id=next(_op_ids), stamp_ms=9).encode()
    for sm in replicas:
        applied(sm.apply(entry))
    assert replicas[0].digest() == replicas[1].digest()
    restored = FencingStateMachine()
    restored.restore(replicas[0].snapshot())
    assert restored.digest() == replicas[0].digest()
    assert restored.usage("a") == replicas[0].usage("a") == {"resources": 4, "leases": 4, "stored_bytes": 4}
    assert restored.describe("a/3") == replicas[0].describe("a/3")


# -- the property test ---------------------------------------------------------------------------

PRINCIPALS = {"p": "p/", "q": "q/"}  # principal -> its prefix
NAMES = [f"{prefix}{n}" for prefix in PRINCIPALS.values() for n in range(4)]
QUOTA = {"resources": 2, "leases": 2, "stored_bytes": 12}  # reached often in a short run
RESOURCES_MAX = 6  # below len(NAMES): the cluster-wide limit is reached too
TTLS = [100, 400]


class QuotaMachine(RuleBasedStateMachine):
    """Two replicas apply the same entries; a ledger keeps every token ever issued per resource."""

    def __init__(self) -> None:
        super().__init__()
        self.replicas = [FencingStateMachine(resources_max=RESOURCES_MAX) for _ in range(2)]
        self.clock = 0
        self.issued: dict[str, list[int]] = {name: [] for name in NAMES}
        self.all_issued: list[int] = []

    @property
    def sm(self) -> FencingStateMachine:
        return self.replicas[0]

    def apply(self, cmd: Command):
        before = self.sm.digest()
        outcomes = [sm.apply(cmd.encode()) for sm in self.replicas]
        assert outcomes[0] == outcomes[1]
        if isinstance(outcomes[0], Rejected):
            assert self.sm.digest() == before, f"refused {cmd} changed state"
        return outcomes[0]

    def hwm(self, name: str) -> int:
        described = self.sm.describe(name)
        return 0 if described is None else described["hwm"]

    @initialize()
    def start(self):
        self.clock = 1_000

    @rule(n=st.integers(0, len(NAMES) - 1), ttl=st.sampled_from(TTLS), step=st.integers(0, 150))
    def acquire(self, n, ttl, step):
        self.clock += step
        name = NAMES[n]
        principal = name.split("/")[0]
        cmd = ops.charged(
            cmds.acquire(resource=name, holder="h", ttl_ms=ttl, op_id=next(_op_ids), stamp_ms=self.clock),
            principal=principal, quota=QUOTA,
        )
        outcome = self.apply(cmd)
        if isinstance(outcome, Applied):
            token = outcome.result.token
            assert all(token > t for t in self.all_issued)  # I1
            assert self.hwm(name) == token  # I2
            self.issued[name].append(token)
            self.all_issued.append(token)

    @rule(n=st.integers(0, len(NAMES) - 1), key=st.sampled_from("ab"), size=st.integers(0, 8), pick=st.integers(0, 9))
    def write(self, n, key, size, pick):
        name = NAMES[n]
        tokens = self.issued[name]
        token = tokens[-1 - pick % len(tokens)] if tokens else 1
        hwm = self.hwm(name)
        cmd = ops.charged(
            cmds.write(
                resource=name, key=key, value=b"x" * size, token=token, op_id=next(_op_ids), stamp_ms=self.clock
            ),
            principal="-",
            quota=QUOTA,
        )
        outcome = self.apply(cmd)
        if token != hwm:  # I3: only the current hwm writes; a forgotten resource has none
            assert isinstance(outcome, Rejected), (name, token, hwm, outcome)
            assert outcome.reason is (Reason.STALE_TOKEN if token < hwm else Reason.UNKNOWN_TOKEN)

    @rule(n=st.integers(0, len(NAMES) - 1), key=st.sampled_from("ab"))
    def delete(self, n, key):
        name = NAMES[n]
        token = max(self.hwm(name), 1)
        self.apply(cmds.delete(resource=name, key=key, token=token, op_id=next(_op_ids), stamp_ms=self.clock))

    @rule(n=st.integers(0, len(NAMES) - 1), pick=st.integers(0, 9))
    def release(self, n, pick):
        name = NAMES[n]
        tokens = self.issued[name]
        token = tokens[-1 - pick % len(tokens)] if tokens else 1
        self.apply(cmds.release(resource=name, token=token, stamp_ms=self.clock))

    @rule(step=st.integers(0, 500))
    def tick(self, step):
        self.clock += step
        self.apply(cmds.tick(stamp_ms=self.clock))

    @rule()
    def snapshot_and_restore(self):
        copy = FencingStateMachine(resources_max=RESOURCES_MAX)
        copy.restore(self.sm.snapshot())
        assert copy.digest() == self.sm.digest()
        self.replicas[1] = copy  # the second replica carries on from its restored copy

    @invariant()
    def replicas_agree(self):
        assert self.replicas[0].digest() == self.replicas[1].digest()

    @invariant()
    def every_forgotten_or_superseded_token_is_refused(self):
        for name, tokens in self.issued.items():
            hwm = self.hwm(name)
            assert all(t <= hwm or self.sm.describe(name) is None for t in tokens)
            if self.sm.describe(name) is None:
                assert hwm == 0  # every token it had is now refused as unknown (I3)

    @invariant()
    def quotas_and_limits_hold_and_usage_is_exact(self):
        sm = self.sm
        assert sm.resources_count <= RESOURCES_MAX
        derived = Usage.of(sm._resources)
        assert (derived.owned, derived.leased, derived.stored_bytes, derived.leases) == (
            sm._usage.owned, sm._usage.leased, sm._usage.stored_bytes, sm.leases_count
        )
        for principal in PRINCIPALS:
            usage = sm.usage(principal)
            assert usage["stored_bytes"] <= QUOTA["stored_bytes"]
            live = [
                d for d in (sm.describe(n) for n in NAMES if n.startswith(PRINCIPALS[principal]))
                if d is not None and d["lease"] is not None and d["lease"]["expires_at_ms"] > sm.log_clock_ms
            ]
            assert len(live) <= QUOTA["leases"]
        for name in NAMES:
            described = sm.describe(name)
            if described is not None:  # nothing is kept that holds nothing
                assert described["lease"] is not None or described["keys"] > 0


QuotaMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_quota_state_machine_keeps_fencing_and_quotas = QuotaMachine.TestCase

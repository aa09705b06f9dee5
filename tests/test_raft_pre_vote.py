"""Pre-vote (coordinator/raft/pre_vote.py, RAFT.md "Pre-vote"): a member cut off from the others
raises no term of its own, so coming back it deposes nobody; with the fix off it does.

Runs in the deterministic simulation (tests/sim) with explicit schedules: the first leader is
elected with no fault, then one member is partitioned (it keeps running and timing out) or
one-way cut, for several election timeouts, and healed.
"""

from __future__ import annotations

import pytest

from coordinator.raft.syncobj import ALL_FIXES
from tests.sim.harness import Fault, Simulation

PARTITION_US = 4_000_000  # two to four election timeouts (1-2 s each)
SEED = 5


def _run(schedule, fixes=ALL_FIXES):
    result = Simulation(SEED, profile="network", schedule=schedule, fixes=fixes).run()
    assert result.ok, result.describe()
    return result


@pytest.mark.parametrize("kind", ["partition", "pause"])
def test_a_returning_follower_deposes_nobody(kind):
    schedule = [Fault(1_500_000, kind, "follower", "any" if kind == "partition" else "", PARTITION_US)]
    result = _run(schedule)
    assert result.stats[f"{kind}s"] == 1, dict(result.stats)
    assert result.stats["elections_won"] == 1, dict(result.stats)


def test_without_pre_vote_a_returning_partitioned_follower_deposes_the_leader():
    """The same run with the fix off: the check above can fail."""
    schedule = [Fault(1_500_000, "partition", "follower", "any", PARTITION_US)]
    result = _run(schedule, ALL_FIXES - {"pre_vote"})
    assert result.stats["elections_won"] > 1, dict(result.stats)


def test_a_leader_partitioned_away_is_replaced():
    """Pre-vote keeps failover: the two members left grant each other once the leader is silent."""
    result = _run([Fault(1_500_000, "partition", "leader", "any", PARTITION_US)])
    assert result.stats["elections_won"] >= 2, dict(result.stats)
    assert result.stats["acked"] > 0

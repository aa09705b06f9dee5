"""The clock-step and torn-power-loss faults prove they did what they claim, on three real
``fencingd serve`` members (chaos/disk_clock_faults.py):

- a clock step is read back from the stepped member (the ``Date`` of its /readyz answer); a
  step that did not take effect fails the inject, a clock that did not come back fails heal;
- a torn power loss that must tear a snapshot update waits for snapshot files, tears the
  ``.tmp`` beside one, and the member restarts with the intact snapshot; with no snapshot
  file anywhere it fails instead of passing without the snapshot tear.
"""

from __future__ import annotations

import os
import types

import pytest

from chaos import disk_clock_faults as DC
from chaos.harness import ChaosCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Snapshots every second (chaos runs: 20 s) so the torn power loss finds one at once.
    with ChaosCluster(str(tmp_path_factory.mktemp("proofs")), settings={"log_compaction_min_time_s": 1.0}) as c:
        try:
            c.start_all()
        except BaseException:
            print(c.logs())
            raise
        assert c.clock_steppable
        yield c


def test_a_clock_step_is_read_back_from_the_member_and_so_is_its_heal(cluster):
    fault = DC.ClockStep("follower", 3600)
    fault.inject(cluster)
    assert abs(fault.info["offset_seen_s"] - 3600) <= DC.CLOCK_OFFSET_TOLERANCE_S
    # the other members' clocks did not move
    others = [n.index for n in cluster.nodes if n.index != fault.i]
    assert all(abs(cluster.wall_clock_offset_s(i)) <= DC.CLOCK_OFFSET_TOLERANCE_S for i in others)
    fault.heal(cluster)
    assert fault.info["ok"] is True
    assert abs(fault.info["offset_after_heal_s"]) <= DC.CLOCK_OFFSET_TOLERANCE_S
    assert "stepped +3600 s" in fault.info["summary"]


def test_a_clock_step_that_did_not_take_effect_fails_the_inject(cluster, monkeypatch):
    # The offset file is never written: as if the member had no clock-step shim.
    monkeypatch.setattr(cluster, "step_wall_clock", lambda i, seconds: None)
    monkeypatch.setattr(DC, "CLOCK_STEP_SEEN_S", 1.0)
    fault = DC.ClockStep("leader", -3600)
    with pytest.raises(DC.ClockNotStepped, match="-3600 s off real time"):
        fault.inject(cluster)


def test_a_clock_that_did_not_come_back_fails_the_heal(cluster, monkeypatch):
    fault = DC.ClockStep("follower", 3600)
    fault.inject(cluster)
    real_step = cluster.step_wall_clock
    try:
        monkeypatch.setattr(cluster, "step_wall_clock", lambda i, seconds: None)
        monkeypatch.setattr(DC, "CLOCK_STEP_SEEN_S", 1.0)
        fault.heal(cluster)
        assert fault.info["ok"] is False
        assert "+0 s off real time" in fault.info["heal_error"]
    finally:
        real_step(fault.i, 0)  # the module's cluster goes on with real clocks


def test_a_torn_power_loss_tears_a_snapshot_update_and_the_snapshot_survives(cluster):
    fault = DC.TornPowerLoss("leader", seed=7, require_snapshot=True)
    try:
        fault.inject(cluster)
    finally:
        fault.heal(cluster)
    (torn,) = fault.info["torn"].values()
    assert torn["dump_tmp_bytes"] > 0
    assert torn["cut_seen"] is True and torn["rolled_back"] is False
    assert torn["snapshot_index"] > 0
    assert fault.info["ok"] is True, fault.info
    assert "raft.dump.tmp" in fault.info["summary"]
    cluster.wait_ready(30.0)


def test_a_torn_power_loss_requiring_a_snapshot_fails_without_one(tmp_path):
    # No member has a snapshot file: the fault must not go on and pass without the tear.
    nodes = [types.SimpleNamespace(index=i, data_dir=str(tmp_path / f"n{i}")) for i in range(3)]
    for n in nodes:
        os.makedirs(n.data_dir)
    stub = types.SimpleNamespace(nodes=nodes)
    fault = DC.TornPowerLoss("leader", seed=1, require_snapshot=True, snapshot_wait_s=0.5)
    with pytest.raises(TimeoutError, match="snapshot file"):
        fault.inject(stub)

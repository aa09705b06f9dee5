"""``python -m chaos run --profile soak --only KINDS``: a soak restricted to some fault kinds,
for replaying one kind many times (the lost-disk soaks). Checked without starting a cluster."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import types

from chaos import runner


def _fake_run(seed: int):
    return types.SimpleNamespace(rng=random.Random(seed), out="", recorder=lambda name: None)


def test_only_draws_just_the_named_kinds():
    plan = runner.soak_plan(minutes=60, only=frozenset({"disk_loss", "pause_leader"}))
    kinds = {f.kind for f, _ in itertools.islice(plan(_fake_run(5)), 40)}
    assert kinds and kinds <= {"disk_loss_leader", "disk_loss_follower", "pause_leader"}
    assert "disk_loss_leader" in kinds and "pause_leader" in kinds


def test_without_only_the_soak_draws_many_kinds():
    kinds = {f.kind for f, _ in itertools.islice(runner.soak_plan(minutes=60)(_fake_run(5)), 200)}
    assert len(kinds) > 10


def test_the_same_seed_replays_the_same_restricted_schedule():
    only = frozenset({"kill", "disk_loss"})
    a = [f.kind for f, _ in itertools.islice(runner.soak_plan(60, only)(_fake_run(9)), 20)]
    b = [f.kind for f, _ in itertools.islice(runner.soak_plan(60, only)(_fake_run(9)), 20)]
    assert a == b


def test_unknown_kinds_are_named():
    assert runner.unmatched_only(frozenset({"disk_loss", "kill_leader", "disk-loss", "bogus"})) == [
        "bogus",
        "disk-loss",
    ]
    assert runner.unmatched_only(frozenset()) == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos", "run", *args], capture_output=True, text=True, timeout=60)


def test_cli_refuses_an_unknown_kind_before_starting_anything(tmp_path):
    out = tmp_path / "run"
    r = _cli("--profile", "soak", "--minutes", "1", "--only", "disk_lost", "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert "no soak fault kind starts with disk_lost" in r.stderr
    assert not out.exists()


def test_cli_refuses_only_outside_the_soak_profile(tmp_path):
    r = _cli("--profile", "ci", "--only", "disk_loss", "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert "--only applies to --profile soak" in r.stderr

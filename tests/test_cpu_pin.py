"""cpu_affinity: which CPU a member takes, and that pinning covers threads old and new."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coordinator.server import config, cpu_pin

MEMBERS = ["127.0.0.2:7000=127.0.0.2:7100", "127.0.0.3:7000=127.0.0.3:7100", "127.0.0.4:7000=127.0.0.4:7100"]


@pytest.mark.parametrize("setting, index, allowed, expected", [
    ("auto", 0, {0, 1}, 0),
    ("auto", 1, {0, 1}, 1),
    ("auto", 2, {0, 1}, 0),  # three members on two cores: wrap around
    ("auto", 1, {2, 5, 7}, 5),  # only the CPUs we may use (cpuset, taskset), in order
    ("auto", 4, {2, 5, 7}, 5),
    ("auto", 0, {3}, None),  # one CPU: nothing to choose
    ("auto", 0, set(), None),  # not Linux: nothing known
    ("off", 1, {0, 1}, None),
    ("1", 0, {0, 1}, 1),
    ("0", 2, {0, 1}, 0),
])
def test_choose_cpu(setting, index, allowed, expected):
    assert cpu_pin.choose_cpu(setting, index, allowed) == expected


@pytest.mark.parametrize("setting, fragment", [
    ("2", "CPU 2 is not one this process may use (0,1)"),
    ("two", "must be 'auto', 'off' or a CPU number"),
    ("-1", "must be 'auto', 'off' or a CPU number"),
    ("", "must be 'auto', 'off' or a CPU number"),
    ("AUTO", "must be 'auto', 'off' or a CPU number"),
])
def test_a_cpu_that_cannot_be_used_is_refused(setting, fragment):
    with pytest.raises(cpu_pin.AffinityError) as caught:
        cpu_pin.choose_cpu(setting, 0, {0, 1})
    assert fragment in str(caught.value)


def test_config_refuses_a_cpu_this_machine_does_not_offer(tmp_path):
    impossible = str(max(cpu_pin.allowed_cpus(), default=0) + 1)
    with pytest.raises(config.ConfigError) as caught:
        config.build({"data_dir": str(tmp_path), "raft_address": "127.0.0.3:7000", "members": MEMBERS,
                      "cpu_affinity": impossible}, {})
    assert str(caught.value).startswith(f"cpu_affinity: CPU {impossible} is not one")


def test_config_member_index_follows_the_members_list(tmp_path):
    cfg = config.build({"data_dir": str(tmp_path), "raft_address": "127.0.0.4:7000", "members": MEMBERS}, {})
    assert cfg.cpu_affinity == "auto" and cfg.member_index == 2
    assert cfg.pinned_cpu() == cpu_pin.choose_cpu("auto", 2, cpu_pin.allowed_cpus())


_CHILD = r"""
import json, os, sys, threading
from coordinator.server import cpu_pin

def cpus_by_thread():
    return {"threads": len(os.listdir("/proc/self/task")),
            "cpus": sorted(sorted(cpus) for cpus in cpu_pin.threads_cpus(os.getpid()))}

stop = threading.Event()
def start_thread():
    ready = threading.Event()
    threading.Thread(target=lambda: (ready.set(), stop.wait(60))).start()
    ready.wait(30)

setting, index, allowed = sys.argv[1], int(sys.argv[2]), {int(c) for c in sys.argv[3].split(",")}
steps = {}
start_thread()  # a thread from before start()
placement = cpu_pin.Placement(setting, index, allowed, log=lambda m: None)
placement.start()
steps["start"] = cpus_by_thread()
placement.on_leadership(True)
start_thread()  # a thread started while leading
steps["leader"] = cpus_by_thread()
placement.on_leadership(False)
steps["follower"] = cpus_by_thread()
stop.set()
print(json.dumps(steps))
"""


def placement_steps(setting: str, index: int, allowed: set[int]) -> dict[str, set[frozenset[int]]]:
    """Run a Placement in a child process; per step, the distinct CPU sets of its threads."""
    out = subprocess.run([sys.executable, "-c", _CHILD, setting, str(index), cpu_pin.cpu_list(allowed)],
                         capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    steps = json.loads(out.stdout)
    assert steps["start"]["threads"] == 2 and steps["leader"]["threads"] == 3  # main + the threads started
    return {step: {frozenset(cpus) for cpus in seen["cpus"]} for step, seen in steps.items()}


ALLOWED = cpu_pin.allowed_cpus()


def test_auto_pins_every_thread_while_leading_and_frees_them_after():
    cpu = cpu_pin.choose_cpu("auto", 1, ALLOWED)
    steps = placement_steps("auto", 1, ALLOWED)
    everything = {frozenset(ALLOWED)}
    expected_leading = {frozenset({cpu})} if cpu is not None else everything
    assert steps == {"start": everything, "leader": expected_leading, "follower": everything}


def test_a_cpu_number_pins_from_the_start_whatever_the_role():
    cpu = max(ALLOWED)
    steps = placement_steps(str(cpu), 0, ALLOWED)
    pinned = {frozenset({cpu})}
    assert steps == {"start": pinned, "leader": pinned, "follower": pinned}


def test_off_leaves_every_thread_where_it_was():
    everything = {frozenset(ALLOWED)}
    assert placement_steps("off", 1, ALLOWED) == {"start": everything, "leader": everything, "follower": everything}

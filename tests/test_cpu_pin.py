"""cpu_affinity: which CPU a member takes, and that pinning covers threads old and new."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coordinator import config, cpu_pin

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
from coordinator import cpu_pin
ready, stop = threading.Event(), threading.Event()
def park():
    ready.set(); stop.wait(30)
before = threading.Thread(target=park); before.start(); ready.wait(30)  # exists before pinning
cpu_pin.pin_process(int(sys.argv[1]))
ready.clear(); after = threading.Thread(target=park); after.start(); ready.wait(30)  # started after
allowed = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/status") as f:
        allowed[tid] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("Cpus_allowed_list"))
stop.set(); before.join(); after.join()
print(json.dumps(allowed))
"""


def test_pin_process_moves_every_thread_and_threads_started_later_follow():
    cpu = max(cpu_pin.allowed_cpus())
    out = subprocess.run([sys.executable, "-c", _CHILD, str(cpu)], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    allowed = json.loads(out.stdout)
    assert len(allowed) == 3  # main, one thread from before, one from after
    assert set(allowed.values()) == {str(cpu)}, allowed

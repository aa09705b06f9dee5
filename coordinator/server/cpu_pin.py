"""Run the leader on one CPU (``cpu_affinity``), because a member's threads share one GIL.

Owns: choosing the CPU from the ``cpu_affinity`` setting, and ``Placement``, which pins every
thread of this process to it (for ``auto``: while this member leads) and lets them go again.
Must never: decide anything about Raft; it only hears whether this member leads.

Why: a member is one Python process whose gRPC workers, Raft thread and gRPC's own threads
hand one GIL to each other several times per request (bench/README.md counts ~20 context
switches per fenced write on the leader). When those threads sit on different cores, each
handoff wakes a thread on another core and the GIL sits idle meanwhile; on one core the
handoff is an ordinary switch. A member cannot use much more than one core anyway (the
GIL); what it gives up is running gRPC's C++ threads beside the Python ones.

Only the leader is pinned by default (``auto``): it does most of the work, and a follower is
mostly one Raft thread with little to hand over. When members share a machine (``fencingd
dev``, the benchmark) a pinned follower can sit on the leader's CPU and take time from it;
a free one is moved away by the scheduler. Measured here (2 cores, three members, 16
clients, alternating in one benchmark run): every thread free ~1,100 fenced writes/s, every
member pinned ~1,380/s, only the leader ~1,610/s (bench/README.md has the other runs).
"""

from __future__ import annotations

import os
from typing import Callable

AUTO = "auto"
OFF = "off"


class AffinityError(ValueError):
    """``cpu_affinity`` names no usable CPU; the message says which ones are."""


def allowed_cpus() -> set[int]:
    """CPUs this process may run on (its cgroup cpuset and any taskset), or an empty set off Linux."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


def choose_cpu(setting: str, member_index: int, allowed: set[int]) -> int | None:
    """The CPU to pin to, or None to leave placement to the OS.

    ``auto``: the ``member_index``-th of the allowed CPUs, wrapping around, so the members of a
    cluster on one machine (``fencingd dev``) spread over its cores; None with a single CPU.
    ``off``: None. A number: that CPU, which must be allowed.
    """
    if setting == OFF or not allowed:
        return None
    if setting == AUTO:
        if len(allowed) < 2:
            return None  # nothing to choose: the OS has one CPU for us already
        return sorted(allowed)[member_index % len(allowed)]
    if not setting.isdigit():
        raise AffinityError(f"must be {AUTO!r}, {OFF!r} or a CPU number, got {setting!r}")
    cpu = int(setting)
    if cpu not in allowed:
        raise AffinityError(f"CPU {cpu} is not one this process may use ({cpu_list(allowed)})")
    return cpu


def pin_process(cpus: set[int], pid: int | None = None) -> None:
    """Every thread of process ``pid`` (default: this one) on ``cpus`` only; threads this
    process starts later inherit it too."""
    if pid is None:
        os.sched_setaffinity(0, cpus)  # the calling thread first: threads it starts inherit this
    for tid in _thread_ids(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def threads_cpus(pid: int) -> set[frozenset[int]]:
    """The distinct CPU sets the threads of ``pid`` may run on (one set: they all agree)."""
    found = set()
    for tid in _thread_ids(pid):
        try:
            found.add(frozenset(os.sched_getaffinity(tid)))
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    return found


def cpu_list(cpus) -> str:
    """``cpus`` as "0,1,3", for logs and reports."""
    return ",".join(str(c) for c in sorted(cpus))


def _thread_ids(pid: int | None) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{'self' if pid is None else pid}/task")]
    except OSError:
        return []


class Placement:
    """Where this process's threads run, as ``cpu_affinity`` asks.

    ``start()`` once, before the member starts threads; ``on_leadership(is_leader)`` from the
    Raft thread whenever that changes (coordinator.raft.node.RaftNode's ``on_leadership``).
    """

    def __init__(self, setting: str, member_index: int, allowed: set[int] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.setting = setting
        self.allowed = allowed_cpus() if allowed is None else set(allowed)
        self.cpu = choose_cpu(setting, member_index, self.allowed)
        self._log = log or (lambda message: None)

    def start(self) -> None:
        if self.cpu is None:
            self._log(f"cpu_affinity={self.setting}: threads placed by the OS")
        elif self.setting == AUTO:
            self._log(f"cpu_affinity={self.setting}: every thread on CPU {self.cpu} while this member leads")
        else:
            self._move({self.cpu}, f"every thread on CPU {self.cpu}")

    def on_leadership(self, is_leader: bool) -> None:
        if self.cpu is None or self.setting != AUTO:
            return
        if is_leader:
            self._move({self.cpu}, f"leader: every thread on CPU {self.cpu}")
        else:
            self._move(self.allowed, f"not the leader: threads on CPUs {cpu_list(self.allowed)}")

    def _move(self, cpus: set[int], what: str) -> None:
        try:
            pin_process(cpus)
        except OSError as exc:  # e.g. a seccomp profile that forbids it: run as placed, say so
            self._log(f"cpu_affinity={self.setting}: could not place threads on CPUs {cpu_list(cpus)} ({exc})")
            return
        self._log(f"cpu_affinity={self.setting}: {what}")

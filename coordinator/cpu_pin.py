"""Run one member process on one CPU (``cpu_affinity``), because its threads share one GIL.

Owns: choosing the CPU from the ``cpu_affinity`` setting and pinning every thread of this
process to it. Must never: be called after the member started its threads from anywhere
but ``fencingd serve`` (threads started later inherit the calling thread's CPU set).

Why: a member is one Python process whose gRPC workers, Raft thread and gRPC's own threads
hand one GIL to each other several times per request (bench/README.md counts ~20 context
switches per fenced write on the leader). When those threads sit on different cores, each
handoff wakes a thread on another core and the GIL sits idle meanwhile; on one core the
handoff is an ordinary switch. Measured here (2 cores, three members, 16 clients): ~1,000
fenced writes/s with the OS placing threads, ~1,450-2,000/s with each member on one CPU.
A member cannot use much more than one core anyway (the GIL); what it gives up is running
gRPC's C++ threads beside the Python ones.
"""

from __future__ import annotations

import os

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
        raise AffinityError(f"CPU {cpu} is not one this process may use ({_ranges(allowed)})")
    return cpu


def pin_process(cpu: int) -> None:
    """Pin every thread of this process, and every thread it starts later, to ``cpu``."""
    os.sched_setaffinity(0, {cpu})  # the calling thread; threads it starts inherit this
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {cpu})
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def _ranges(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))

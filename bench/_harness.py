"""Shared helpers for the benchmarks: stats, /proc readings, host and repo state.

Benchmark-only. Clusters come from testsupport: the stock pysyncobj baseline (bench.stock_node)
and the instrumented node (bench.instrumented_node) run as ``ProcessCluster(..., module=...)``,
through the same supervisor (lifecycle and cleanup) as the product node.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def ensure_repo_on_path() -> None:
    """Node processes run ``python -m coordinator...``/``bench...``: make that work from any cwd."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if REPO_ROOT not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, *parts])
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 1])."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all threads), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_ctx_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over all threads of ``pid``."""
    per_thread = thread_ctx_switches(pid).values()
    return sum(v for v, _ in per_thread), sum(i for _, i in per_thread)


def _per_thread(pid: int, name: str, parse) -> dict:
    """{native thread id: parse(text of /proc/<pid>/task/<tid>/<name>)} for every thread that
    could be read; ``parse`` returns None to leave a thread out."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                text = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        value = parse(text)
        if value is not None:
            out[int(tid)] = value
    return out


def _ctx_switches(status: str) -> tuple[int, int]:
    vol = invol = 0
    for line in status.splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            vol = int(line.split()[1])
        elif line.startswith("nonvoluntary_ctxt_switches"):
            invol = int(line.split()[1])
    return vol, invol


def thread_ctx_switches(pid: int) -> dict[int, tuple[int, int]]:
    """Per-thread (voluntary, involuntary) context switches of ``pid``, keyed by native thread id."""
    return _per_thread(pid, "status", _ctx_switches)


def thread_names(pid: int) -> dict[int, str]:
    """Per-thread OS name (``comm``; fencingd sets it from the Python name), keyed by native thread id."""
    return _per_thread(pid, "comm", str.strip)


def fs_type(path: str) -> str:
    """Filesystem type of the mount holding ``path`` (longest mount-point prefix)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def fdatasync_cost(directory: str, n: int = 200, record_bytes: int = 64) -> dict:
    """Append ``record_bytes`` and fdatasync, ``n`` times, in ``directory``; latencies in ms."""
    path = os.path.join(directory, "fdatasync-probe.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lat = []
    try:
        payload = b"x" * record_bytes
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, payload)
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t0) * 1e3)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return {
        "n": n,
        "record_bytes": record_bytes,
        "mean_ms": sum(lat) / len(lat),
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": lat[-1],
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def host_cpu_s() -> tuple[float, float]:
    """(CPU seconds all cores spent busy, of which stolen by the hypervisor) since boot.

    Busy is user, nice, system, irq, softirq and steal, from /proc/stat; NaN when unreadable.
    """
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return float("nan"), float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK, steal / CLK_TCK


def host_cpu_busy_s() -> float:
    """CPU seconds all processes on the host spent busy (user, nice, system, irq, softirq, steal)."""
    return host_cpu_s()[0]


def git_state(repo: str = REPO_ROOT) -> str:
    """``<short commit>`` plus ``-dirty`` when the work tree has changes (figures depend on it)."""
    try:
        out = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty", "--abbrev=10"],
                             capture_output=True, text=True, timeout=5, check=False)
        state = out.stdout.strip() or "?"
        if state.endswith("-dirty"):
            # Identify the uncommitted product code that was measured.
            diff = subprocess.run(["git", "-C", repo, "diff", "HEAD", "--", "coordinator"],
                                  capture_output=True, timeout=10, check=False).stdout
            if diff:
                import hashlib

                state += f" (coordinator/ diff sha1 {hashlib.sha1(diff).hexdigest()[:10]})"
        return state
    except (OSError, subprocess.SubprocessError):
        return "?"


def _user_system_s(stat: str) -> tuple[float, float]:
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def thread_cpu_s(pid: int) -> dict[int, tuple[float, float]]:
    """Per-thread (user, system) CPU seconds of ``pid``, keyed by native thread id."""
    return _per_thread(pid, "stat", _user_system_s)


def proc_cpu_split_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, exited threads included."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan"), float("nan")
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def _run_and_wait_s(schedstat: str) -> tuple[float, float] | None:
    try:
        run_ns, wait_ns, _slices = (int(x) for x in schedstat.split()[:3])
    except ValueError:
        return None
    return run_ns / 1e9, wait_ns / 1e9


def thread_schedstat(pid: int) -> dict[int, tuple[float, float]]:
    """Per-thread (on-CPU seconds, run-queue wait seconds) from /proc/<pid>/task/<tid>/schedstat."""
    return _per_thread(pid, "schedstat", _run_and_wait_s)


def wait_for_idle_host(timeout_s: float, threshold_cores: float = 0.15, window_s: float = 2.0, log=None) -> float:
    """Wait until the host's busy CPU over ``window_s`` is below ``threshold_cores``.

    Returns the last measured busy cores (the caller reports it; it never fails).
    """
    deadline = time.monotonic() + timeout_s
    busy = float("nan")
    rounds = 0
    while True:
        rounds += 1
        b0, t0 = host_cpu_busy_s(), time.monotonic()
        time.sleep(window_s)
        busy = (host_cpu_busy_s() - b0) / (time.monotonic() - t0)
        if busy < threshold_cores or time.monotonic() >= deadline:
            return busy
        if log and rounds % 5 == 1:
            log(f"  (host busy: {busy:.2f} cores used by other processes; waiting)")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM raises KeyboardInterrupt, so a benchmark that is told to stop
    runs its ``finally`` and leaves no cluster behind; the old handler is back afterwards."""

    def on_term(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)

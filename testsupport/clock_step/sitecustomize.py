"""Loaded at start-up into a member of the clock-step tests and of the chaos suite (they put
this directory first on the member's PYTHONPATH); never part of the product.

Owns: a wall-clock step for the chaos suite's members (``FENCING_TEST_WALL_OFFSET_FILE``):
``time.time`` and ``time.time_ns`` add the seconds in that file, looked at again at most every
``_WALL_RECHECK_S`` of real monotonic time. Every wall-clock read of the product is one of those
two (the stamp clock, leases and pysyncobj's timers read monotonic clocks; the audit log, log
records, peer-key tokens and the /readyz ``Date`` read ``time.time``/``time_ns``), so a step
reaches all of them, as libfaketime's does, without what libfaketime costs a member here: under
it (with FAKETIME_NO_CACHE) a three-member chaos cluster acknowledged a write in ~50-110 ms at
the median and ~200 ms at the 90th percentile, against ~3 and ~4 ms with this shim, on the same
machine in the same minute (each gRPC call and each Raft round pays inside libfaketime's
interposed clock and wait calls). C code (gRPC core, OpenSSL) keeps the real wall clock; the
clock-step tests (tests/test_clock_step.py) still run members under libfaketime for that.

And what libfaketime cannot do for a Python member on this machine (as measured here):
- ``time.sleep`` under libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1 (a wall-only step)
  fails with EINVAL (libfaketime shifts clock_nanosleep's absolute monotonic deadline as if
  monotonic were faked); pysyncobj sleeps on its Raft thread, so it would die. Replaced by a
  wait on an Event that is never set (a semaphore wait libfaketime leaves alone).
- a monotonic jump: with monotonic faked by libfaketime, every timed wait of the process
  (sem_clockwait) hangs. So the jump is made here: ``time.monotonic`` and
  ``time.monotonic_ns`` add the seconds in FENCING_TEST_MONOTONIC_OFFSET_FILE (re-read
  whenever the file changes), as a VM resumed after that long would look from inside.
- a jump of CLOCK_MONOTONIC_RAW, the clock pysyncobj's timers and the Raft layer (pre-vote's
  vote window, the read lease) read (pysyncobj/monotonic.py): ``time.clock_gettime`` adds the
  seconds in FENCING_TEST_RAW_MONOTONIC_OFFSET_FILE to that clock only
  (tests/test_lease_clock_step.py).
Must never: be imported by anything but a member started by those tests.
"""

import os
import threading
import time

_WALL_RECHECK_S = 0.01  # a step shows within 10 ms; the file is not looked at on every read
_wall_path = os.environ.get("FENCING_TEST_WALL_OFFSET_FILE")

if _wall_path:
    _real_time_ns = time.time_ns
    _real_monotonic_for_wall = time.monotonic
    _wall = {"checked": float("-inf"), "mtime_ns": None, "offset_ns": 0}

    def _wall_offset_ns() -> int:
        now = _real_monotonic_for_wall()
        if now - _wall["checked"] < _WALL_RECHECK_S:
            return _wall["offset_ns"]
        _wall["checked"] = now
        try:
            mtime_ns = os.stat(_wall_path).st_mtime_ns
            if mtime_ns != _wall["mtime_ns"]:
                with open(_wall_path, encoding="ascii") as f:
                    _wall["offset_ns"] = int(float(f.read().strip() or 0) * 1_000_000_000)
                _wall["mtime_ns"] = mtime_ns
        except (OSError, ValueError):
            pass  # mid-replace or gone: the last offset read stands
        return _wall["offset_ns"]

    def _time_ns() -> int:
        return _real_time_ns() + _wall_offset_ns()

    def _time() -> float:
        return _time_ns() / 1_000_000_000

    time.time_ns = _time_ns
    time.time = _time

_offset_path = os.environ.get("FENCING_TEST_MONOTONIC_OFFSET_FILE")

if os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":
    _never = threading.Event()

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        _never.wait(seconds)

    time.sleep = _sleep

if _offset_path:
    _real_monotonic_ns = time.monotonic_ns
    _cache = {"mtime_ns": None, "offset_ns": 0}

    def _offset_ns() -> int:
        try:
            mtime_ns = os.stat(_offset_path).st_mtime_ns
        except OSError:
            return _cache["offset_ns"]
        if mtime_ns != _cache["mtime_ns"]:
            with open(_offset_path, encoding="ascii") as f:
                _cache["offset_ns"] = int(float(f.read().strip() or 0) * 1_000_000_000)
            _cache["mtime_ns"] = mtime_ns
        return _cache["offset_ns"]

    def _monotonic_ns() -> int:
        return _real_monotonic_ns() + _offset_ns()

    def _monotonic() -> float:
        return _monotonic_ns() / 1_000_000_000

    time.monotonic_ns = _monotonic_ns
    time.monotonic = _monotonic


_raw_offset_path = os.environ.get("FENCING_TEST_RAW_MONOTONIC_OFFSET_FILE")

if _raw_offset_path:
    _real_clock_gettime = time.clock_gettime
    _raw_cache = {"mtime_ns": None, "offset_s": 0.0}

    def _raw_offset_s() -> float:
        try:
            mtime_ns = os.stat(_raw_offset_path).st_mtime_ns
        except OSError:
            return _raw_cache["offset_s"]
        if mtime_ns != _raw_cache["mtime_ns"]:
            with open(_raw_offset_path, encoding="ascii") as f:
                _raw_cache["offset_s"] = float(f.read().strip() or 0)
            _raw_cache["mtime_ns"] = mtime_ns
        return _raw_cache["offset_s"]

    def _clock_gettime(clock_id: int) -> float:
        value = _real_clock_gettime(clock_id)
        return value + _raw_offset_s() if clock_id == time.CLOCK_MONOTONIC_RAW else value

    time.clock_gettime = _clock_gettime

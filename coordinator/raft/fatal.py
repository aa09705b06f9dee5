"""How the Raft layer stops the process when it can no longer keep its promises.

Owns: the exit codes (``EXIT_APPLY_FAILED``, ``EXIT_DISK_FAILED``; deploy/'s unit does not
restart on them: a member that stopped for one of them needs an operator), which of them an
exception means (``exit_code_for``), the default fatal handler, which writes one line and exits
at once, and ``once``, which lets only the first fatal of a node act.
Must never: be caught and carried on from: a node that called it must not serve again.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable

EXIT_APPLY_FAILED = 70  # a programmer error inside apply: stop, never wedge
EXIT_DISK_FAILED = 71  # a write, fsync or rename of durable state failed: durability can no longer be promised

# on_fatal(message, exit_code): tests pass one that records and raises instead of exiting.
FatalHandler = Callable[[str, int], None]

# Taken by the first fatal of the process and never released: a second thread reaching
# default_fatal meanwhile (the leader's sync thread and the Raft thread can fail on the same
# full disk) waits here until the first one's os._exit ends the process, printing nothing.
_exiting = threading.Lock()


def exit_code_for(exc: BaseException) -> int:
    """The exit code a failure means: an OSError is the disk or the descriptor table refusing
    a write of durable state (ENOSPC, EMFILE, EIO), EXIT_DISK_FAILED, the code journal fsync
    failures always used; anything else is a bug, EXIT_APPLY_FAILED."""
    return EXIT_DISK_FAILED if isinstance(exc, OSError) else EXIT_APPLY_FAILED


def default_fatal(message: str, exit_code: int) -> None:
    # One line, on stderr, and no logging call: fencingd's log handler writes to stderr as well,
    # which would make it two; print needs no new descriptor (EMFILE) and no disk (ENOSPC).
    _exiting.acquire()
    try:
        print(f"FATAL: {message} (exit {exit_code})", file=sys.stderr, flush=True)
    finally:
        os._exit(exit_code)


def once(handler: FatalHandler) -> FatalHandler:
    """``handler``, called for the first fatal only: a later one (another failure the same stop
    causes, say the exception a test's handler raised climbing out of a tick) waits until the
    first call is over and does nothing. ``default_fatal`` is never over, so a second thread
    stays quiet until the process is gone; a test's handler raises, and the node has stopped
    in the test's eyes. A handler wrapped already is returned as it is."""
    if getattr(handler, "first_only", False):
        return handler
    lock = threading.Lock()
    first_done = threading.Event()
    fired = False

    def first_only(message: str, exit_code: int) -> None:
        nonlocal fired
        with lock:
            is_first, fired = not fired, True
        if not is_first:
            first_done.wait()
            return
        try:
            handler(message, exit_code)
        finally:
            first_done.set()

    # A marker on the function (once() above tests for it); a function takes any attribute.
    first_only.first_only = True  # type: ignore[attr-defined]
    return first_only

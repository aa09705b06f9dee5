"""How the Raft layer stops the process when it can no longer keep its promises.

Owns: the exit codes (``EXIT_APPLY_FAILED``, ``EXIT_DISK_FAILED``; deploy/ restarts on them)
and the default fatal handler, which logs and exits at once.
Must never: be caught and carried on from: a node that called it must not serve again.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable

log = logging.getLogger(__name__)

EXIT_APPLY_FAILED = 70  # a programmer error inside apply: stop, never wedge
EXIT_DISK_FAILED = 71  # fsync or write failed: durability can no longer be promised

# on_fatal(message, exit_code): tests pass one that records and raises instead of exiting.
FatalHandler = Callable[[str, int], None]


def default_fatal(message: str, exit_code: int) -> None:
    log.critical(message)
    print(f"FATAL: {message}", file=sys.stderr, flush=True)
    os._exit(exit_code)

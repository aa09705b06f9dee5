"""``fencingctl lock RESOURCE [--ttl D] -- CMD...``: run a command while holding a lease.

Owns: the lock subcommand's arguments, its help, its exit codes, and the order of things:
wait for the lease, run CMD (coordinator/client/lock_child.py) with the lease's token in its
environment, release the lease once CMD is gone. Must never: run CMD before the lease is
granted, release the lease while CMD may still run, or exit with a code of its own that CMD's
status could be mistaken for.

CMD's environment gets FENCING_TOKEN (the fencing token, decimal), FENCING_RESOURCE and
FENCING_TOKEN_PROOF (the proof's text form, ``fp1.…``; empty when the cluster signs nothing),
for CMD to pass to the resources it writes: they refuse it once a newer token exists. The
lease renews itself while CMD runs. When it is lost (fenced by a force-release, or renewals
failing past its expiry) CMD gets SIGTERM, then SIGKILL after ``--grace``. That stop is
advisory, like every client-side notice: the fence at the resource is the guarantee.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import signal
import sys
from typing import Any

from coordinator.client import durations, lock_child, proof
from coordinator.client.exceptions import FencingError, LockTimeout
from coordinator.client.sync import FencingClient
from coordinator.core import validation

TOKEN_ENV = "FENCING_TOKEN"
RESOURCE_ENV = "FENCING_RESOURCE"
TOKEN_PROOF_ENV = "FENCING_TOKEN_PROOF"
# The lease's TTL when none is given: renewed every third of it while CMD runs, so a
# fencingctl that dies or is cut off frees the lock for the next holder within 15 s, yet a
# renewal can fail twice (a leader election is 1-2 s) before the lease is at risk.
TTL_MS_DEFAULT = 15_000
# Time CMD has to exit after SIGTERM (a signal passed on, or its lease lost), before SIGKILL:
# enough to finish a write and exit cleanly, short next to lease TTLs (a lost lease's writes
# are refused meanwhile anyway). Supervisors wait longer than this before their own SIGKILL
# (systemd's TimeoutStopSec 90 s, Kubernetes' terminationGracePeriodSeconds 30 s).
KILL_GRACE_S_DEFAULT = 10.0
KILL_GRACE_S_MAX = 3600.0  # a grace past an hour is a typo, not a plan
# --wait: longer than any wait a person or a cron job means (none: no deadline); past it
# the number is a typo, e.g. milliseconds given as seconds.
WAIT_S_MAX = 365 * 24 * 3600.0


class LockExit(enum.IntEnum):
    """fencingctl lock's own exit codes, above any status CMD is likely to use and the same
    as timeout(1)'s and the shell's; everything else is CMD's status (128 + N: signal N)."""

    WAIT_TIMED_OUT = 124  # --wait passed without a grant (timeout(1)'s code); CMD never ran
    FAILED = 125  # fencingctl's own failure: usage, cluster unreachable, refused; CMD never ran
    NOT_EXECUTABLE = 126  # CMD exists but cannot be run (the shell's code)
    NOT_FOUND = 127  # no such CMD (the shell's code)


USAGE = "fencingctl lock RESOURCE [--ttl D] [--holder H] [--wait D] [--grace D] [options] -- CMD [ARG...]"
HELP_EPILOG = f"""\
CMD runs in a process group of its own with FENCING_TOKEN, FENCING_RESOURCE and
FENCING_TOKEN_PROOF in its environment, while the lease renews itself (every TTL/3).
Durations: 10s, 500ms, 1.5m, 2h (a bare number: the flag's unit, seconds for --wait/--grace,
milliseconds for --ttl-ms, seconds for --ttl).

signals: SIGTERM, SIGINT and SIGHUP are passed on to CMD's process group (at a terminal it
  is the foreground group while CMD runs: Ctrl-C reaches CMD directly); SIGKILL follows
  after --grace (default {KILL_GRACE_S_DEFAULT:g} s) if CMD has not exited. The lease is released only
  once CMD is gone. A lost lease (fenced, or renewals failing past its TTL) stops CMD the
  same way: SIGTERM, then SIGKILL after --grace. On Linux, if fencingctl itself is killed
  (even by SIGKILL), the kernel kills CMD. A signal while waiting for the lease leaves the
  queue and exits 128+N. What CMD leaves running in its group when it exits is killed.

exit codes (CMD's status is passed on, like Consul's lock -child-exit-code):
  N    CMD's own exit status; 128+N if signal N ended it (as a shell reports it)
  124  --wait passed before the lease was granted (CMD never ran)
  125  fencingctl's own failure: usage error, cluster unreachable, refused (CMD never ran)
  126  CMD cannot be executed (permission denied, not an executable)
  127  CMD not found
  128+N  fencingctl got signal N while waiting for the lease (CMD never ran)
"""


def add_parser(sub: Any, command: Any) -> None:
    """Add ``lock`` to fencingctl's subcommands (``command`` makes a subparser)."""
    p = command("lock", "hold the lease on RESOURCE (waiting in line) while running CMD", json_form=False)
    p.usage = USAGE
    p.epilog = HELP_EPILOG
    p.usage_exit = LockExit.FAILED  # a usage error must not look like CMD's status 2
    p.add_argument("resource", nargs="?")
    p.add_argument("--ttl", metavar="D",
                   help=f"the lease's TTL, renewed while CMD runs (default {TTL_MS_DEFAULT // 1000} s)")
    p.add_argument("--ttl-ms", dest="ttl_ms", metavar="N", help="the TTL in milliseconds (older spelling of --ttl)")
    p.add_argument("--holder")
    p.add_argument("--wait", "--wait-s", dest="wait_s", metavar="D",
                   help="give up waiting for the lease after D, exit 124 (default: wait as long as it takes)")
    p.add_argument("--grace", "--grace-s", dest="grace_s", metavar="D", default=f"{KILL_GRACE_S_DEFAULT:g}",
                   help=f"SIGKILL CMD this long after it was told to stop (default {KILL_GRACE_S_DEFAULT:g} s)")
    # CMD is every word after the first "--", split off before argparse sees the line
    # (split_command): argparse would take CMD's own options for fencingctl's.


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(fencingctl's words, CMD's words): for a ``lock`` command line, CMD is everything after
    the first "--"; any other command line is left whole for argparse."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    if "lock" not in argv[:cut]:
        return argv, []
    return argv[:cut], argv[cut + 1 :]


class LockUsage(ValueError):
    """A bad argument of ``lock``: fencingctl reports it as a usage error (exit 125)."""


def _seconds(name: str, text: str | None, high: float) -> float | None:
    if text is None:
        return None
    try:
        value = durations.parse_s(text, default_unit="s")
    except ValueError as error:
        raise LockUsage(f"--{name}: {error}") from None
    if not 0 < value <= high:
        raise LockUsage(f"--{name} must be in (0, {high:g}] seconds, got {text!r}")
    return value


def _ttl_ms(args: argparse.Namespace) -> int:
    if args.ttl is not None and args.ttl_ms is not None:
        raise LockUsage("give the TTL as --ttl or as --ttl-ms, not both")
    if args.ttl is None and args.ttl_ms is None:
        return TTL_MS_DEFAULT
    flag, text, unit = ("ttl", args.ttl, "s") if args.ttl is not None else ("ttl-ms", args.ttl_ms, "ms")
    try:
        ms = durations.parse_s(text, default_unit=unit) * 1000
    except ValueError as error:
        raise LockUsage(f"--{flag}: {error}") from None
    if ms != int(ms):
        raise LockUsage(f"--{flag} must be a whole number of milliseconds, got {text!r}")
    try:
        return validation.check_ttl_ms(int(ms))
    except validation.InvalidField as error:
        raise LockUsage(f"--{flag}: {error}") from None


def parse(args: argparse.Namespace, cmd: list[str]) -> dict[str, Any]:
    """The checked arguments of ``lock`` and its CMD; LockUsage names the first bad one."""
    if not cmd:
        raise LockUsage(f"lock needs a command to run: {USAGE}")
    try:
        resource = validation.check_resource(args.resource)
        holder = None if args.holder is None else validation.check_holder(args.holder)
    except validation.InvalidField as error:
        raise LockUsage(str(error)) from None
    return {
        "resource": resource, "ttl_ms": _ttl_ms(args), "holder": holder, "cmd": cmd,
        "wait_s": _seconds("wait", args.wait_s, WAIT_S_MAX),
        "grace_s": _seconds("grace", args.grace_s, KILL_GRACE_S_MAX),
    }


def exit_code_for(error: FencingError) -> int:
    """The exit code of a failure before CMD ran."""
    return LockExit.WAIT_TIMED_OUT if isinstance(error, LockTimeout) else LockExit.FAILED


def _say(message: str) -> None:
    print(f"fencingctl: lock: {message}", file=sys.stderr, flush=True)


class _Prefixed(logging.Handler):
    """The client library's warnings (a release that failed, ...) as fencingctl's one-line
    messages, not Python's bare last-resort lines."""

    def emit(self, record: logging.LogRecord) -> None:
        _say(" ".join(record.getMessage().split()))


def run(client: FencingClient, options: dict[str, Any]) -> int:
    """Wait for the lease, run CMD under it, and return CMD's exit status (LockExit for what
    is not CMD's). Raises FencingError for a failure before CMD ran (exit_code_for)."""
    resource, argv = options["resource"], options["cmd"]
    library_log = logging.getLogger("coordinator")
    handler = _Prefixed(logging.WARNING)
    library_log.addHandler(handler)
    child = lock_child.Child(argv[0], grace_s=options["grace_s"], say=_say)
    child.install()
    lease = None
    try:
        try:
            lease = client.lock(
                resource, ttl_ms=options["ttl_ms"], timeout_s=options["wait_s"], holder=options["holder"],
                on_lost=child.lease_lost,
            )
            child.granted()
        except lock_child.Interrupted as stop:
            # lock() has left the queue. A grant that landed between its return and here is
            # the client's only lease: release it too.
            for stray in list(client._leases):
                stray.close()
            _say(f"{signal.Signals(stop.signum).name} while waiting for {resource}; left the queue")
            return 128 + stop.signum
        env = {
            **os.environ,
            TOKEN_ENV: str(lease.token),
            RESOURCE_ENV: resource,
            TOKEN_PROOF_ENV: proof.to_text(lease.token_proof) if lease.token_proof else "",
        }
        _say(f"{resource} granted with token {lease.token}; running {argv[0]}")
        child.start(argv, env)  # a CMD that cannot be run exits 127 or 126 (LockExit)
        status = child.wait(resource)
        _say(f"{argv[0]} exited with status {status}")
        return status
    finally:
        child.close()
        if lease is not None:
            lease.close()  # released if still held (CMD is gone); a lost lease has nothing to release
        child.restore()
        library_log.removeHandler(handler)

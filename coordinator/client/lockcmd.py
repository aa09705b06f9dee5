"""``fencingctl lock RESOURCE --ttl-ms N -- CMD...``: run a command while holding a lease.

Owns: the lock subcommand's arguments, running CMD with the lease's token in its environment,
stopping CMD when the lease is lost, releasing the lease when CMD exits, and passing CMD's exit
status on. Must never: run CMD before the lease is granted, leave CMD running once the lease
is known lost, or keep a lease after CMD has exited.

CMD's environment gets FENCING_TOKEN (the fencing token, decimal), FENCING_RESOURCE and
FENCING_TOKEN_PROOF (the proof's text form, ``fp1.…``; empty when the cluster signs nothing),
for CMD to pass to the resources it writes: they refuse it once a newer token exists. The
lease renews itself while CMD runs. When it is lost (fenced by a force-release, or renewals
failing past its expiry) CMD gets SIGTERM, then SIGKILL after ``--grace-s``. That stop is
advisory, like every client-side notice: the fence at the resource is the guarantee.
fencingctl exits with CMD's status (128 + N when a signal N ended it); fencingctl's own
failures (no grant in time, no cluster) use fencingctl's exit codes before CMD starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from coordinator.client import proof
from coordinator.client.sync import FencingClient
from coordinator.core import validation

TOKEN_ENV = "FENCING_TOKEN"
RESOURCE_ENV = "FENCING_RESOURCE"
TOKEN_PROOF_ENV = "FENCING_TOKEN_PROOF"
# Time CMD has to exit after SIGTERM once its lease is lost, before SIGKILL: enough to finish
# a write and exit cleanly, short next to lease TTLs (its writes are refused meanwhile anyway).
KILL_GRACE_S_DEFAULT = 10.0
KILL_GRACE_S_MAX = 3600.0  # a grace past an hour is a typo, not a plan
# --wait-s: longer than any wait a person or a cron job means (none: no deadline); past it
# the number is a typo, e.g. milliseconds given as seconds.
WAIT_S_MAX = 365 * 24 * 3600.0


def add_parser(sub: Any, command: Any) -> None:
    """Add ``lock`` to fencingctl's subcommands (``command`` makes a subparser)."""
    p = command("lock", "hold the lease on RESOURCE (waiting in line) while running CMD", json_form=False)
    p.add_argument("resource", nargs="?")
    p.add_argument("--ttl-ms", dest="ttl_ms", metavar="N", help="the lease's TTL (renewed while CMD runs)")
    p.add_argument("--holder")
    p.add_argument("--wait-s", dest="wait_s", metavar="S",
                   help="give up waiting for the lease after S seconds (default: wait as long as it takes)")
    p.add_argument("--grace-s", dest="grace_s", metavar="S", default=str(KILL_GRACE_S_DEFAULT),
                   help=f"SIGKILL CMD this long after SIGTERM once the lease is lost (default {KILL_GRACE_S_DEFAULT:g})")
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
    """A bad argument of ``lock``: fencingctl reports it as a usage error (exit 2)."""


def _seconds(name: str, text: str | None, high: float) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise LockUsage(f"--{name} must be a number of seconds, got {text!r}") from None
    if not 0 < value <= high:
        raise LockUsage(f"--{name} must be in (0, {high:g}] seconds, got {text!r}")
    return value


def parse(args: argparse.Namespace, cmd: list[str]) -> dict[str, Any]:
    """The checked arguments of ``lock`` and its CMD; LockUsage names the first bad one."""
    if not cmd:
        raise LockUsage("lock needs a command to run: fencingctl lock RESOURCE --ttl-ms N -- CMD...")
    try:
        resource = validation.check_resource(args.resource)
        if args.ttl_ms is None or not args.ttl_ms.isdigit():
            raise validation.InvalidField("ttl_ms", f"--ttl-ms must be a whole number of milliseconds, got {args.ttl_ms!r}")
        ttl_ms = validation.check_ttl_ms(int(args.ttl_ms))
        holder = None if args.holder is None else validation.check_holder(args.holder)
    except validation.InvalidField as error:
        raise LockUsage(str(error)) from None
    return {
        "resource": resource, "ttl_ms": ttl_ms, "holder": holder, "cmd": cmd,
        "wait_s": _seconds("wait-s", args.wait_s, WAIT_S_MAX),
        "grace_s": _seconds("grace-s", args.grace_s, KILL_GRACE_S_MAX),
    }


def _say(message: str) -> None:
    print(f"fencingctl: lock: {message}", file=sys.stderr, flush=True)


def _exit_status(returncode: int) -> int:
    """CMD's exit status as a shell reports it: 128 + N when signal N ended it."""
    return returncode if returncode >= 0 else 128 - returncode


def run(client: FencingClient, options: dict[str, Any]) -> int:
    """Wait for the lease, run CMD under it, and return CMD's exit status."""
    resource = options["resource"]
    wake = threading.Event()  # CMD exited, or the lease was lost: whichever comes first
    lease = client.lock(
        resource, ttl_ms=options["ttl_ms"], timeout_s=options["wait_s"], holder=options["holder"],
        on_lost=lambda _lost: wake.set(),
    )
    try:
        env = {
            **os.environ,
            TOKEN_ENV: str(lease.token),
            RESOURCE_ENV: resource,
            TOKEN_PROOF_ENV: proof.to_text(lease.token_proof) if lease.token_proof else "",
        }
        _say(f"{resource} granted with token {lease.token}; running {options['cmd'][0]}")
        try:
            child = subprocess.Popen(options["cmd"], env=env)
        except OSError as error:
            _say(f"cannot run {options['cmd'][0]}: {error}")
            return 127  # the shell's "command not found"
        threading.Thread(target=lambda: (child.wait(), wake.set()), name="lock-cmd-wait", daemon=True).start()
        wake.wait()  # no timeout: one of the two always comes (CMD exits, or the lease ends)
        if child.poll() is None:  # the lease was lost while CMD runs
            _say(f"lease on {resource} lost ({lease.lost_error}); sending SIGTERM to {options['cmd'][0]}")
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=options["grace_s"])
            except subprocess.TimeoutExpired:
                _say(f"{options['cmd'][0]} still running {options['grace_s']:g} s after SIGTERM; sending SIGKILL")
                child.kill()
                child.wait()
        status = _exit_status(child.returncode)
        _say(f"{options['cmd'][0]} exited with status {status}")
        return status
    finally:
        lease.close()  # released if still held; a lost lease has nothing to release

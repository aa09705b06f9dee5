"""``fencingctl watch`` and ``fencingctl elect``: the Watch stream and elections on a command line.

Owns: both commands' arguments and help (``add_parsers``), and their run (``run``):
``watch PREFIX`` prints one line per event (``REVISION TYPE RESOURCE field=value...``, or one
JSON object per line with ``-o json``) until interrupted or ``--count`` events; ``elect NAME``
prints the leader of election NAME now and after each change (``(none)`` when nobody leads),
and ``elect NAME PROPOSAL`` campaigns as PROPOSAL, prints ``leader NAME PROPOSAL token N``
once it leads and holds the lead until SIGINT or SIGTERM, then resigns (the next in line
leads at once). Must never: print an error (fencingctl's ``main`` does), or leave a lead held
after it exits: the lease is released on the signal, and lapses with its TTL if fencingctl is
killed.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from coordinator.client import durations
from coordinator.client.ctl_request import UsageError
from coordinator.client.election import Election
from coordinator.client.exceptions import LeaseLost
from coordinator.client.sync import FencingClient
from coordinator.client.watch import WatchEvent

COMMANDS = ("watch", "elect")
ELECT_TTL_S_DEFAULT = 10.0  # the lead's lease TTL: how long a killed leader blocks the next

WATCH_HELP = """\
output, one line per event: REVISION TYPE RESOURCE FIELD=VALUE...
  TYPE: ACQUIRED, RELEASED, EXPIRED, FORCE_RELEASED, WRITTEN, DELETED, RESET
  REVISION: the log index of the change; --rev REVISION+1 resumes after it
A stream that fails is resumed on another endpoint from the last revision + 1 (nothing
missed or repeated); a revision the member no longer keeps ends it with "compacted, current
revision N" (exit 1).
"""

ELECT_HELP = """\
elect NAME           print the leader now and after each change ("(none)": nobody)
elect NAME PROPOSAL  campaign as PROPOSAL: wait in line, print "leader NAME PROPOSAL token N"
                     once leading, hold the lead until SIGINT/SIGTERM, then resign (exit 0)
"""


def add_parsers(sub: Any, command: Any) -> None:
    """Add ``watch`` and ``elect`` to fencingctl's subcommands (``command`` makes a subparser)."""
    p = command("watch", "print each change under PREFIX as it is applied (lease and key events)", json_form=False)
    p.epilog = WATCH_HELP + (p.epilog or "")
    p.add_argument("prefix", help='resource name prefix ("" for every resource)')
    p.add_argument("--rev", type=int, default=0, metavar="N", help="start at revision N (default: from now)")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="exit after N events (default: run until interrupted)")

    p = command("elect", "observe election NAME, or campaign in it as PROPOSAL", json_form=False)
    p.epilog = ELECT_HELP + (p.epilog or "")
    p.add_argument("name", help="the election: a resource name")
    p.add_argument("proposal", nargs="?", help="campaign as this holder label")
    p.add_argument("--ttl", metavar="D", default=f"{ELECT_TTL_S_DEFAULT:g}s",
                   help=f"the lead's lease TTL (default {ELECT_TTL_S_DEFAULT:g}s)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="observe: exit after N lines")


def _event_line(event: WatchEvent, out: str) -> str:
    doc: dict[str, Any] = {k: v for k, v in vars(event).items() if k != "value"}
    if event.type == "WRITTEN":
        doc["value"] = event.value.decode("utf-8", "backslashreplace")
    if out == "json":
        return json.dumps(doc, sort_keys=True)
    fields = {k: v for k, v in doc.items() if v not in ("", 0) and k not in ("type", "revision", "resource")}
    return " ".join([str(event.revision), event.type, event.resource or "-",
                     *(f"{k}={v}" for k, v in fields.items())])


def run(client: FencingClient, args: argparse.Namespace, name: str) -> None:
    if args.count < 0:
        raise UsageError("--count must be >= 0")
    if name == "watch":
        _watch(client, args)
    elif args.proposal is None:
        _observe(client, args)
    else:
        _campaign(client, args)


def _watch(client: FencingClient, args: argparse.Namespace) -> None:
    if args.rev < 0:
        raise UsageError("--rev must be >= 0")
    printed = 0
    with client.watch(args.prefix, start_revision=args.rev) as watcher:
        for event in watcher:
            print(_event_line(event, args.output), flush=True)
            printed += 1
            if printed == args.count:
                return


def _observe(client: FencingClient, args: argparse.Namespace) -> None:
    printed = 0
    for leader in Election(client, args.name, ttl_ms=1).observe():
        if args.output == "json":
            print(json.dumps({"election": args.name, "leader": leader}), flush=True)
        else:
            print(leader if leader is not None else "(none)", flush=True)
        printed += 1
        if printed == args.count:
            return


def _campaign(client: FencingClient, args: argparse.Namespace) -> None:
    try:
        ttl_ms = int(durations.parse_s(args.ttl, default_unit="s") * 1000)
    except ValueError as error:
        raise UsageError(f"--ttl: {error}") from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    election = Election(client, args.name, ttl_ms=ttl_ms)
    try:
        lease = election.campaign(args.proposal)
        if args.output == "json":
            print(json.dumps({"election": args.name, "leader": args.proposal, "token": lease.token}), flush=True)
        else:
            print(f"leader {args.name} {args.proposal} token {lease.token}", flush=True)
        while not stop.wait(0.2):
            if lease.lost.is_set():
                raise LeaseLost(f"lost the lead of {args.name}: its lease could not be renewed")
        election.resign()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

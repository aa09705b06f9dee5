"""fencingctl: the command-line client and admin tool of the fencing coordinator.

Owns: the command's run from argv to exit code: parse (ctl_parser), check what the user
typed (or the ``--json`` request) before anything is sent (ctl_request), make the client
from the options and the environment, run the command (ctl_run), the exit codes below
and the one line of each error. Must never: retry or interpret outcomes itself
(``coordinator.client.sync`` does), or print more than one line per error.

Usage::

    fencingctl [--endpoints HOST:PORT,...] [--output table|json] [--timeout S]
               [--credential TOKEN] [--admin-token TOKEN] [--ca-file F [--cert-file F --key-file F]]
               COMMAND ...   (these options may also follow COMMAND)

    status                (marks members that do not answer; without a quorum: exit 4)
    endpoint status       each endpoint's own view, asked on its own (works without a quorum)
    endpoint health       each endpoint's gRPC health
    acquire   RESOURCE --ttl-ms D [--holder H] [--wait-ms D] [--op-id HEX]
    keepalive RESOURCE --token N [--ttl-ms D]
              (D: a duration, 10s, 500ms, 1.5m; a bare number is milliseconds)
    release   RESOURCE --token N [--op-id HEX]
    describe  RESOURCE
    ls        [PREFIX] [--limit N [--page-token TOKEN]]
              (resources by name: holder, token, remaining TTL, hwm, lock waiters)
    write     RESOURCE KEY VALUE --token N [--op-id HEX] [--expected-version N]
              (or --value-file PATH instead of VALUE; "-" is stdin)
    read      RESOURCE KEY
    delete    RESOURCE KEY --token N [--op-id HEX]
    lock      RESOURCE [--ttl D] [--holder H] [--wait D] [--grace D] -- CMD...
              (waits in line for the lease, runs CMD with FENCING_TOKEN, FENCING_RESOURCE,
              FENCING_TOKEN_PROOF; passes SIGTERM/SIGINT/SIGHUP on to CMD and stops it if
              the lease is lost; exits with CMD's status, its own failures 124-127:
              coordinator/client/lockcmd.py)
    watch     PREFIX [--rev N] [--count N]
              (one line per change under PREFIX: REVISION TYPE RESOURCE FIELD=VALUE...)
    elect     NAME [PROPOSAL] [--ttl D]
              (observe the leader of NAME, or campaign as PROPOSAL until SIGINT/SIGTERM)
    admin force-release   RESOURCE [--op-id HEX]
    admin set-epoch-floor FLOOR [--no-fence-all]
    admin snapshot        --out FILE
    admin restore         --in FILE --epoch-floor N
    admin member list
    admin member add      MEMBER_ID RAFT_ADDRESS
    admin member remove   MEMBER_ID
    admin member replace  MEMBER_ID [--address RAFT_ADDRESS]

Membership (one change at a time, through the Raft log): ``member add`` brings a member in
as a learner, promoted to a voter once it has caught up; ``member replace`` removes a lost
incarnation (a wiped disk) and adds a fresh member under the same id, at the same or a new
address. ``status`` and ``member list`` show every member's id, address, incarnation, role,
match index and whether it votes.

Backups: ``admin snapshot`` writes a consistent backup (read through the log) to FILE, and
``admin restore`` replaces the state by one, fencing every restored resource above
--epoch-floor (which must exceed every token ever issued). Both stream the backup in 1 MiB
chunks, so any state the limits allow fits (at most limits.BACKUP_BYTES_MAX, ~740 MB); each
may take up to five minutes at that size.

Every command except status, endpoint, member and snapshot also takes the request as one JSON object,
``--json '{"resource": "orders/7", "key": "k", "value": "v", "token": 3}'`` (``--json -``
reads stdin), instead of arguments; a binary value goes as ``"value_base64"``. The field
names are the API's (resource, key, value, token, op_id as hex, expected_version, ttl_ms,
holder, wait_ms, floor, fence_all, epoch_floor). Numbers must be JSON integers: a token that is 0,
negative, missing, a float, a string or a boolean is refused here, before anything is sent.

Endpoints come from ``--endpoints``, else ``$FENCING_ENDPOINTS``, else the local dev cluster
(``coordinator.client.DEFAULT_ENDPOINTS``). The caller's credential (a bearer token, not a
fencing token) comes from ``--credential`` or ``$FENCING_CREDENTIAL``, else ``--admin-token``
or ``$FENCING_ADMIN_TOKEN`` (its older name).

Exit codes (scripts may rely on them):

    0  ok
    1  other error (unexpected server status, local I/O error)
    2  usage error or invalid argument (ours, or INVALID_ARGUMENT from the server)
    3  refused: stale or unknown token, lease held or expired, version mismatch, op id
       conflict, epoch floor too low (nothing was applied)
    4  unavailable: no leader, no node reachable within the deadline (nothing was applied)
    5  outcome unknown: the mutation may have been applied; retry with the printed --op-id
       (a member change has none: ``admin member list`` says whether it applied)
    6  unauthenticated or permission denied
    7  limit exceeded, epoch exhausted or overloaded

``lock`` exits with its CMD's status instead, and with 124-127 for its own outcomes
(lockcmd.LockExit: 124 wait timed out, 125 any failure of fencingctl's, 126/127 CMD not
executable/not found), so no code of fencingctl's can pass for CMD's.

Errors are one line on stderr, ``fencingctl: <category>: <what happened>``; with
``--output json`` an ``{"error": {...}}`` object also goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from coordinator.client import exceptions as exc
from coordinator.client import lockcmd
from coordinator.client.ctl_parser import ADMIN_TOKEN_ENV, CREDENTIAL_ENV, ENDPOINTS_ENV, TLS_ENV, build_parser
from coordinator.client.ctl_request import UsageError, request_for
from coordinator.client.ctl_run import run
from coordinator.client.sync import DEFAULT_ENDPOINTS, FencingClient, tls_credentials
from coordinator.client.version import distribution_version

EXIT_OK = 0
EXIT_OTHER = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4
EXIT_OUTCOME_UNKNOWN = 5
EXIT_PERMISSION = 6
EXIT_LIMIT = 7


def exit_code_for(error: BaseException) -> int:
    """The exit code of an exception (the table above)."""
    if isinstance(error, exc.OutcomeUnknown):
        return EXIT_OUTCOME_UNKNOWN
    if isinstance(error, exc.Unavailable):
        return EXIT_UNAVAILABLE
    if isinstance(error, exc.Refused):
        return EXIT_REFUSED
    if isinstance(error, exc.ResourceExhausted):
        return EXIT_LIMIT
    if isinstance(error, (exc.InvalidArgument, UsageError)):
        return EXIT_USAGE
    if isinstance(error, exc.AuthError):
        return EXIT_PERMISSION
    return EXIT_OTHER


def _print_error(error: BaseException, category: str, output: str, code: int) -> None:
    text = " ".join(str(error).split())  # always one line
    print(f"fencingctl: {category}: {text}", file=sys.stderr)
    if output == "json":
        doc: dict[str, Any] = {"category": category, "message": text, "exit_code": code}
        if isinstance(error, exc.FencingError):
            doc.update(
                type=type(error).__name__,
                reason=error.reason,
                code=error.code.name if error.code is not None else None,
                metadata=error.metadata,
                endpoint=error.endpoint,
            )
            op_id = error.request.get("op_id")
            if isinstance(op_id, bytes):
                doc["op_id"] = op_id.hex()
        print(json.dumps({"error": doc}, sort_keys=True))
    sys.stdout.flush()


# A reader that closed our stdout (``fencingctl status | head -1``): the status a shell shows
# for a command SIGPIPE ended (128 + 13), as ``cat`` would exit, with nothing printed.
EXIT_CLOSED_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Run fencingctl; returns the exit code (the console script exits with it)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe is a line on stderr
        return code
    except KeyboardInterrupt:  # Ctrl-C: ended as the shell reports it, without a traceback
        print("fencingctl: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # Python's own advice: point stdout at /dev/null so the flush at exit is silent too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_CLOSED_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    parser.add_argument("--version", action="version", version=f"%(prog)s {distribution_version()}")
    output = "table"
    argv, lock_cmd = lockcmd.split_command(sys.argv[1:] if argv is None else list(argv))
    try:
        args = parser.parse_args(argv)
        output = args.output
        name = args.admin_command if args.command == "admin" else args.command
        if name == "member":
            name = f"member-{args.member_command}"  # arguments only, checked by the server too
        elif name == "endpoint":
            name = f"endpoint-{args.endpoint_command}"
        request = request_for(args, name, lock_cmd)
        client = _client(args)
    except UsageError as error:
        code = lockcmd.LockExit.FAILED if lock_cmd and error.exit_code == EXIT_USAGE else error.exit_code
        _print_error(error, error.category, output, code)
        return int(code)
    except SystemExit as done:  # --help, or argparse's own exit
        return int(done.code or 0) if isinstance(done.code, int) else EXIT_USAGE

    with client:
        try:
            if name == "lock":
                try:
                    return lockcmd.run(client, request)
                except exc.FencingError as error:  # before CMD ran: a code CMD cannot have
                    code = lockcmd.exit_code_for(error)
                    _print_error(error, error.category, output, code)
                    return int(code)
            ran = run(client, args, name, request)
            if ran:
                return ran  # status/endpoint: some endpoint down, after the output
        except exc.FencingError as error:
            code = exit_code_for(error)
            category = "invalid argument" if code == EXIT_USAGE else error.category
            _print_error(error, category, output, code)
            return code
        except BrokenPipeError:
            raise  # our reader went away: main() ends quietly
        except OSError as error:
            _print_error(error, "error", output, EXIT_OTHER)
            return EXIT_OTHER
    return EXIT_OK



def _client(args: argparse.Namespace) -> FencingClient:
    """The client the options and their environment variables describe."""
    endpoints = args.endpoints or os.environ.get(ENDPOINTS_ENV) or ",".join(DEFAULT_ENDPOINTS)
    credential = (
        args.credential or os.environ.get(CREDENTIAL_ENV)
        or args.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None
    )
    tls = {name: getattr(args, name) or os.environ.get(env) for name, env in TLS_ENV.items()}
    try:
        channel_credentials = tls_credentials(**tls)
    except OSError as error:
        raise UsageError(f"TLS file: {error}") from None
    try:
        return FencingClient(
            endpoints, timeout_s=args.timeout, bearer_token=credential, credentials=channel_credentials
        )
    except ValueError as error:
        raise UsageError(f"--endpoints: {error}") from None


if __name__ == "__main__":
    sys.exit(main())

"""fencingctl's command line: every command, subcommand and option, and its help.

Owns: the argparse tree (the global options, which every subcommand accepts too, each
command's arguments, ``--json`` where a command takes one, the exit-code epilog), and the
environment variables the global options default to. ``lock``'s arguments are lockcmd's.
Must never: check a field's value (ctl_request does, the same for arguments and ``--json``),
or exit on a usage error: it raises ``UsageError``, so the caller prints one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from coordinator.client import ctl_list, ctl_watch, lockcmd
from coordinator.client.ctl_request import UsageError
from coordinator.client.sync import DEFAULT_ENDPOINTS

ENDPOINTS_ENV = "FENCING_ENDPOINTS"
ADMIN_TOKEN_ENV = "FENCING_ADMIN_TOKEN"
CREDENTIAL_ENV = "FENCING_CREDENTIAL"
# TLS: the CA that signed the members' certificates, and for mutual TLS our own pair.
TLS_ENV = {"ca_file": "FENCING_CA_FILE", "cert_file": "FENCING_CERT_FILE", "key_file": "FENCING_KEY_FILE"}

_EXIT_CODES_HELP = """\
exit codes:
  0  ok
  1  other error
  2  usage error or invalid argument (nothing was applied)
  3  refused: stale/unknown token, lease held/expired, version mismatch,
     op id conflict, epoch floor too low (nothing was applied)
  4  unavailable: no leader or no node reachable (nothing was applied)
  5  outcome unknown: may have been applied; retry with the same --op-id
     (member add/remove/replace: `admin member list` says whether it applied)
  6  unauthenticated or permission denied
  7  limit exceeded, epoch exhausted or overloaded
"""


_DURATION_MS_HELP = "a duration: 10s, 500ms, 1.5m (a bare number: milliseconds)"


class _Parser(argparse.ArgumentParser):
    usage_exit = 2  # EXIT_USAGE; `lock` uses a code CMD's own status cannot be confused with

    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's own convention)
        self.print_usage(sys.stderr)
        raise UsageError(message, exit_code=self.usage_exit)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fencingctl",
        description="Client and admin tool of the fencing coordinator.",
        epilog=_EXIT_CODES_HELP
        + f"\nendpoints: --endpoints, else ${ENDPOINTS_ENV}, else {','.join(DEFAULT_ENDPOINTS)}"
        + f"\ncredential: --credential, else ${CREDENTIAL_ENV}, else --admin-token, else ${ADMIN_TOKEN_ENV}\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, help_text: str, *, json_form: bool = True, parent=sub):
        return _add_command(parent, name, help_text, json_form=json_form)

    command("status", "cluster members (and which answer), leader, term, indexes and epoch; "
            "without a quorum each member's own view, exit 4", json_form=False)
    _add_endpoint_commands(sub, command)
    _add_lease_commands(command)
    ctl_list.add_parser(command)  # ---- List (issue 29 point 4)
    _add_key_commands(command)
    lockcmd.add_parser(sub, command)
    ctl_watch.add_parsers(sub, command)
    _add_admin_commands(sub, command)
    return parser


def _add_command(parent, name: str, help_text: str, *, json_form: bool = True) -> argparse.ArgumentParser:
    """A subcommand of ``parent`` with the common options, and --json unless ``json_form`` is false."""
    p = parent.add_parser(
        name, help=help_text, description=help_text, epilog=_EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common_options(p, defaults=False)
    if json_form:
        p.add_argument("--json", metavar="OBJECT", help="the request as one JSON object ('-': stdin)")
    return p


def _add_lease_commands(command) -> None:
    p = command("acquire", "take the lease on RESOURCE and print its fencing token")
    p.add_argument("resource", nargs="?")
    p.add_argument("--ttl-ms", dest="ttl_ms", metavar="D", help=_DURATION_MS_HELP)
    p.add_argument("--holder")
    p.add_argument("--wait-ms", dest="wait_ms", metavar="D", help=_DURATION_MS_HELP)
    p.add_argument("--op-id", dest="op_id", metavar="HEX")

    p = command("keepalive", "renew the lease holding TOKEN once")
    p.add_argument("resource", nargs="?")
    p.add_argument("--token")
    p.add_argument("--ttl-ms", dest="ttl_ms", metavar="D", help=_DURATION_MS_HELP)

    p = command("release", "end the lease holding TOKEN (the high-water mark stays)")
    p.add_argument("resource", nargs="?")
    p.add_argument("--token")
    p.add_argument("--op-id", dest="op_id", metavar="HEX")

    p = command("describe", "lease holder, token, expiry and high-water mark of RESOURCE")
    p.add_argument("resource", nargs="?")


def _add_key_commands(command) -> None:
    p = command("write", "fenced write of KEY=VALUE under RESOURCE with TOKEN")
    p.add_argument("resource", nargs="?")
    p.add_argument("key", nargs="?")
    p.add_argument("value", nargs="?", help="UTF-8 text (or use --value-file)")
    p.add_argument("--value-file", metavar="PATH", help="read the value's bytes from PATH ('-': stdin)")
    p.add_argument("--token")
    p.add_argument("--op-id", dest="op_id", metavar="HEX")
    p.add_argument("--expected-version", dest="expected_version", metavar="N")

    p = command("read", "linearizable read of KEY under RESOURCE; a missing key prints '(not found)' and exits 0 "
                "(found: false in JSON), as etcdctl get does")
    p.add_argument("resource", nargs="?")
    p.add_argument("key", nargs="?")

    p = command("delete", "fenced delete of KEY under RESOURCE with TOKEN")
    p.add_argument("resource", nargs="?")
    p.add_argument("key", nargs="?")
    p.add_argument("--token")
    p.add_argument("--op-id", dest="op_id", metavar="HEX")


def _add_endpoint_commands(sub, command) -> None:
    endpoint = sub.add_parser("endpoint", help="ask each endpoint on its own (works with members down)")
    endpoint_sub = endpoint.add_subparsers(dest="endpoint_command", metavar="ENDPOINT_COMMAND", parser_class=_Parser)
    endpoint_sub.required = True
    command("status", "each endpoint's own view: reachable, leader, term, applied index, version, data size; "
            "exit 4 if one does not answer", json_form=False, parent=endpoint_sub)
    command("health", "each endpoint's gRPC health (SERVING: a quorum and a read through the log); "
            "exit 4 if one is not SERVING", json_form=False, parent=endpoint_sub)


def _add_admin_commands(sub, command) -> None:
    admin = sub.add_parser("admin", help="admin commands (need a credential)")
    admin_sub = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", parser_class=_Parser)
    admin_sub.required = True
    p = command("force-release", "fence RESOURCE at a new epoch and clear its lease", parent=admin_sub)
    p.add_argument("resource", nargs="?")
    p.add_argument("--op-id", dest="op_id", metavar="HEX")
    p = command("set-epoch-floor", "raise the epoch to at least FLOOR", parent=admin_sub)
    p.add_argument("floor", nargs="?")
    p.add_argument("--no-fence-all", dest="fence_all", action="store_false", default=None,
                   help="do not fence every resource at the new epoch")
    p = command("snapshot", "write a consistent backup to FILE (streamed; any size the limits allow)",
                json_form=False, parent=admin_sub)
    p.add_argument("--out", required=True, metavar="FILE")
    p = command("restore", "replace the state by the backup in FILE (streamed; fences above --epoch-floor)",
                parent=admin_sub)
    p.add_argument("--in", dest="in_path", required=True, metavar="FILE")
    p.add_argument("--epoch-floor", dest="epoch_floor", metavar="N")
    _add_member_commands(admin_sub, command)


def _add_member_commands(admin_sub, command) -> None:
    member = admin_sub.add_parser("member", help="list or change the cluster's members (one change at a time)")
    member_sub = member.add_subparsers(dest="member_command", metavar="MEMBER_COMMAND", parser_class=_Parser)
    member_sub.required = True
    command("list", "every member: id, address, incarnation, role, match index, voter",
            json_form=False, parent=member_sub)
    p = command("add", "add MEMBER_ID at RAFT_ADDRESS as a learner; promoted to a voter once caught up",
                json_form=False, parent=member_sub)
    p.add_argument("member_id", metavar="MEMBER_ID")
    p.add_argument("raft_address", metavar="RAFT_ADDRESS", help="HOST:PORT the new member's Raft listens on")
    p = command("remove", "remove MEMBER_ID from the configuration", json_form=False, parent=member_sub)
    p.add_argument("member_id", metavar="MEMBER_ID")
    p = command("replace", "replace MEMBER_ID's lost incarnation by a fresh member (same id), caught up first",
                json_form=False, parent=member_sub)
    p.add_argument("member_id", metavar="MEMBER_ID")
    p.add_argument("--address", dest="raft_address", default="", metavar="RAFT_ADDRESS",
                   help="the fresh member's HOST:PORT (default: the address the member has)")


def _add_common_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The global options; subcommands accept them too (``fencingctl read R K -o json``),
    without defaults there so that they only override what was given."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--endpoints", default=default(None), help="comma-separated host:port list of API endpoints"
    )
    parser.add_argument("--output", "-o", choices=("table", "json"), default=default("table"))
    parser.add_argument(
        "--timeout", type=_positive_float, default=default(10.0), metavar="S",
        help="deadline of the whole command, retries included (default 10)",
    )
    parser.add_argument(
        "--credential", default=default(None), metavar="TOKEN",
        help=f"this caller's bearer credential on a cluster with principals (default ${CREDENTIAL_ENV})",
    )
    parser.add_argument(
        "--admin-token", default=default(None), help=f"older name of --credential (default ${ADMIN_TOKEN_ENV})"
    )
    for name, env in TLS_ENV.items():
        what = {"ca_file": "TLS: PEM CA of the members' certificates (default: plaintext)",
                "cert_file": "mutual TLS: this client's PEM certificate",
                "key_file": "mutual TLS: its PEM private key"}[name]
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=default(None),
                            metavar="FILE", help=f"{what} (default ${env})")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


"""fencingctl: the command-line client and admin tool of the fencing coordinator.

Owns: argument parsing, strict validation of what the user typed (or the ``--json`` request)
before anything is sent, output as a table or JSON, and the exit codes below. Must never:
retry or interpret outcomes itself (``coordinator.client.sync`` does), or print more than one
line per error.

Usage::

    fencingctl [--endpoints HOST:PORT,...] [--output table|json] [--timeout S]
               [--credential TOKEN] [--admin-token TOKEN] [--ca-file F [--cert-file F --key-file F]]
               COMMAND ...   (these options may also follow COMMAND)

    status
    acquire   RESOURCE --ttl-ms N [--holder H] [--wait-ms N] [--op-id HEX]
    keepalive RESOURCE --token N [--ttl-ms N]
    release   RESOURCE --token N [--op-id HEX]
    describe  RESOURCE
    write     RESOURCE KEY VALUE --token N [--op-id HEX] [--expected-version N]
              (or --value-file PATH instead of VALUE; "-" is stdin)
    read      RESOURCE KEY
    delete    RESOURCE KEY --token N [--op-id HEX]
    lock      RESOURCE [--ttl D] [--holder H] [--wait D] [--grace D] -- CMD...
              (waits in line for the lease, runs CMD with FENCING_TOKEN, FENCING_RESOURCE,
              FENCING_TOKEN_PROOF; passes SIGTERM/SIGINT/SIGHUP on to CMD and stops it if
              the lease is lost; exits with CMD's status, its own failures 124-127:
              coordinator/client/lockcmd.py)
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

Every command except status and snapshot also takes the request as one JSON object,
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
import base64
import json
import os
import re
import signal
import sys
import tempfile
from typing import Any, Callable, NoReturn

from coordinator.client import exceptions as exc
from coordinator.client import lockcmd, proof
from coordinator.client.sync import DEFAULT_ENDPOINTS, FencingClient, tls_credentials
from coordinator.client.version import distribution_version
from coordinator.core import limits, validation

EXIT_OK = 0
EXIT_OTHER = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4
EXIT_OUTCOME_UNKNOWN = 5
EXIT_PERMISSION = 6
EXIT_LIMIT = 7

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


class UsageError(Exception):
    """What the user typed is not a valid command line; nothing was sent."""

    category = "usage"

    def __init__(self, message: str = "", *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # EXIT_USAGE, or lock's LockExit.FAILED


class BadField(UsageError):
    """A field of the request is malformed (checked here, before anything is sent)."""

    category = "invalid argument"


# -- strict field parsing (argv text or JSON values) -------------------------------------

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+", re.ASCII)


def _int_field(name: str, value: Any, *, low: int, high: int, from_json: bool) -> int:
    """A whole number in [low, high]: a JSON integer, or decimal digits on the command line."""
    shown = json.dumps(value) if from_json else repr(value)
    if from_json:
        # bool is an int in Python and in some JSON encoders' minds: never a number here.
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadField(f"{name} must be a JSON integer, got {shown}")
        number = value
    else:
        if not isinstance(value, str) or _DIGITS.fullmatch(value.strip()) is None:
            raise BadField(f"{name} must be a whole number, got {shown}")
        number = int(value.strip())
    if not low <= number <= high:
        raise BadField(f"{name} must be in [{low}, {high}], got {shown}")
    return number


def _token(value: Any, from_json: bool) -> int:
    try:
        return _int_field("token", value, low=1, high=limits.TOKEN_MAX, from_json=from_json)
    except BadField:
        shown = json.dumps(value) if from_json else repr(value)
        kind = "a JSON integer" if from_json else "a whole number"
        raise BadField(
            f"token must be {kind} from 1 to {limits.TOKEN_MAX} (tokens start at 1), got {shown}"
        ) from None


def _str_field(name: str, value: Any, from_json: bool) -> str:
    if not isinstance(value, str):
        raise BadField(f"{name} must be a string, got {json.dumps(value) if from_json else value!r}")
    return value


def _op_id(value: Any, from_json: bool) -> bytes:
    text = _str_field("op_id", value, from_json)
    lo, hi = limits.OP_ID_BYTES_MIN, limits.OP_ID_BYTES_MAX
    if _HEX.fullmatch(text) is None or not lo <= len(text) // 2 <= hi:
        raise BadField(f"op_id must be {lo}-{hi} bytes as hex ({2 * lo}-{2 * hi} hex digits), got {text!r}")
    return bytes.fromhex(text)


def _field_parsers() -> dict[str, Callable[[Any, bool], Any]]:
    def ranged(name: str, low: int, high: int) -> Callable[[Any, bool], int]:
        return lambda v, j: _int_field(name, v, low=low, high=high, from_json=j)

    return {
        "resource": lambda v, j: _str_field("resource", v, j),
        "key": lambda v, j: _str_field("key", v, j),
        "holder": lambda v, j: _str_field("holder", v, j),
        "value": lambda v, j: _str_field("value", v, j).encode("utf-8"),
        "value_base64": _value_base64,
        "token": _token,
        "op_id": _op_id,
        "ttl_ms": ranged("ttl_ms", limits.LEASE_TTL_MS_MIN, limits.LEASE_TTL_MS_MAX),
        "wait_ms": ranged("wait_ms", 0, limits.ACQUIRE_WAIT_MS_MAX),
        "expected_version": ranged("expected_version", 0, 2**64 - 1),
        "floor": ranged("floor", 1, limits.TOKEN_MAX),
        "epoch_floor": ranged("epoch_floor", 1, limits.TOKEN_MAX),
        "fence_all": _bool_field,
    }


def _value_base64(value: Any, from_json: bool) -> bytes:
    text = _str_field("value_base64", value, from_json)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise BadField("value_base64 is not valid base64") from None


def _bool_field(value: Any, from_json: bool) -> bool:
    if not isinstance(value, bool):
        raise BadField(f"fence_all must be true or false, got {json.dumps(value)}")
    return value


# command -> the RPC it sends. The fields a command takes, and which of them the user must
# give, are that RPC's in coordinator.core.validation.REQUESTS: what the client fills in
# (an op_id, the holder) may be left out.
_RPC_OF: dict[str, str] = {
    "acquire": "Acquire",
    "keepalive": "KeepAlive",
    "release": "Release",
    "describe": "Describe",
    "write": "Write",
    "read": "Read",
    "delete": "Delete",
    "force-release": "ForceRelease",
    "set-epoch-floor": "SetEpochFloor",
    "restore": "RestoreStream",
}
# Fields a command takes besides its RPC's: acquire's wait_ms (checked by the client; the
# server only clamps it), and write's value given as base64.
_EXTRA_FIELDS: dict[str, tuple[str, ...]] = {"acquire": ("wait_ms",), "write": ("value_base64",)}
# Fields given otherwise than by name, so never "missing": write's value may be VALUE,
# --value-file or value_base64 (exactly one, checked below); restore's backup is --in FILE.
_GIVEN_OTHERWISE = frozenset({"value", "data"})
_NOT_BY_NAME = frozenset({"data"})


def _fields_of(command: str) -> tuple[tuple[str, bool], ...]:
    """(field, must the user give it) for ``command``, in the order the fields are checked
    (the RPC's, as the client and the server check them, then the extra ones)."""
    spec = validation.REQUESTS[_RPC_OF[command]]
    fields = tuple(
        (name, f.required and not f.filled_by_client and name not in _GIVEN_OTHERWISE)
        for name, f in spec.items()
        if name not in _NOT_BY_NAME
    )
    return fields + tuple((name, False) for name in _EXTRA_FIELDS.get(command, ()))


_POSITIONAL = ("resource", "key", "floor")


def _build_request(
    command: str, raw: dict[str, Any], *, from_json: bool, value_bytes: bytes | None = None
) -> dict[str, Any]:
    """Check every field of ``raw`` strictly; return the typed request. ``value_bytes``: the
    bytes of --value-file, which take the place of the value field."""
    fields = _fields_of(command)
    allowed = {name for name, _ in fields}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise BadField(
            f"unknown field(s) {', '.join(unknown)} for {command} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )
    parsers = _field_parsers()
    out: dict[str, Any] = {}
    for name in (name for name, required in fields if required):
        if raw.get(name) is None:
            if from_json:
                flag = f"field {name!r}"
            elif name in _POSITIONAL:
                flag = name.upper()
            else:
                flag = "--" + name.replace("_", "-")
            raise BadField(f"{command}: missing {flag}")
    for name in (name for name, _ in fields if name in raw):
        value = raw[name]
        if value is None and not from_json:
            continue
        if value is None:
            raise BadField(f"{name} must not be null")
        out[name] = parsers[name](value, from_json)
    if value_bytes is not None:
        out["value"] = value_bytes
    if command == "write":
        has_value = "value" in out
        has_b64 = "value_base64" in out
        if has_value == has_b64:
            raise BadField("write needs exactly one of value / value_base64 (or --value-file)")
        if has_b64:
            out["value"] = out.pop("value_base64")
    return out


def _load_json(text: str) -> dict[str, Any]:
    if text == "-":
        text = sys.stdin.read()
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except ValueError as error:
        raise BadField(f"--json is not valid JSON: {error}") from None
    if not isinstance(doc, dict):
        raise BadField("--json must be a JSON object")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


# -- argparse ----------------------------------------------------------------------------


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

    command("status", "cluster members, leader, term, indexes and epoch", json_form=False)
    _add_lease_commands(command)
    _add_key_commands(command)
    lockcmd.add_parser(sub, command)
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
    p.add_argument("--ttl-ms", dest="ttl_ms")
    p.add_argument("--holder")
    p.add_argument("--wait-ms", dest="wait_ms")
    p.add_argument("--op-id", dest="op_id", metavar="HEX")

    p = command("keepalive", "renew the lease holding TOKEN once")
    p.add_argument("resource", nargs="?")
    p.add_argument("--token")
    p.add_argument("--ttl-ms", dest="ttl_ms")

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

    p = command("read", "linearizable read of KEY under RESOURCE")
    p.add_argument("resource", nargs="?")
    p.add_argument("key", nargs="?")

    p = command("delete", "fenced delete of KEY under RESOURCE with TOKEN")
    p.add_argument("resource", nargs="?")
    p.add_argument("key", nargs="?")
    p.add_argument("--token")
    p.add_argument("--op-id", dest="op_id", metavar="HEX")


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


# Every field any command takes: the argparse destinations a request is gathered from.
_ARG_FIELDS = frozenset(name for command in _RPC_OF for name, _ in _fields_of(command))
assert _ARG_FIELDS <= set(_field_parsers()), "every field fencingctl takes needs a parser"


def _request_from_args(args: argparse.Namespace, name: str) -> dict[str, Any]:
    raw = {f: getattr(args, f) for f in _ARG_FIELDS if getattr(args, f, None) is not None}
    value_file = getattr(args, "value_file", None)
    if getattr(args, "json", None) is not None:
        if raw or value_file is not None:
            raise UsageError("give the request either as arguments or as --json, not both")
        return _build_request(name, _load_json(args.json), from_json=True)
    if value_file is not None:
        if "value" in raw:
            raise UsageError("give VALUE or --value-file, not both")
        try:
            if value_file == "-":
                data = sys.stdin.buffer.read(limits.VALUE_BYTES_MAX + 1)
            else:
                with open(value_file, "rb") as f:
                    data = f.read(limits.VALUE_BYTES_MAX + 1)
        except OSError as error:
            raise UsageError(f"cannot read --value-file: {error}") from None
        return _build_request(name, raw, from_json=False, value_bytes=data)
    if name == "write" and "value" not in raw:
        raise UsageError("write: missing VALUE (or --value-file)")
    return _build_request(name, raw, from_json=False)


# -- output ------------------------------------------------------------------------------


def _jsonable(result: Any) -> dict[str, Any]:
    doc = result.as_dict()
    if "header" in doc and doc["header"] is not None:
        doc["header"] = dict(doc["header"])
    return doc


def _emit(result: dict[str, Any], output: str, table: list[tuple[str, Any]] | None = None) -> None:
    if output == "json":
        print(json.dumps(result, sort_keys=True))
        return
    rows = table if table is not None else [(k, v) for k, v in result.items() if k != "header"]
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        if isinstance(value, bool):
            value = "yes" if value else "no"
        print(f"{key:<{width}}  {value}")


def _value_fields(value: bytes) -> dict[str, Any]:
    try:
        text: str | None = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"value": text, "value_base64": base64.b64encode(value).decode("ascii")}


# -- commands ----------------------------------------------------------------------------


def _run(client: FencingClient, args: argparse.Namespace, name: str, request: dict[str, Any]) -> None:
    out = args.output
    if name == "status":
        _run_status(client, out)
    elif name.startswith("member-"):
        _run_member(client, args, name, out)
    elif name in _LEASE_COMMANDS:
        _run_lease(client, name, request, out)
    elif name in _KEY_COMMANDS:
        _run_key(client, name, request, out)
    else:
        _run_admin(client, args, name, request, out)


_LEASE_COMMANDS = ("acquire", "keepalive", "release", "describe")
_KEY_COMMANDS = ("write", "read", "delete")


def _run_status(client: FencingClient, out: str) -> None:
    status = client.status()
    doc = _jsonable(status)
    if out == "json":
        _emit(doc, out)
        return
    _emit(doc, out, [
        ("leader", f"{status.leader_api_address or '-'} (raft {status.leader or '-'})"),
        ("term", status.term),
        ("epoch", status.epoch),
        ("commit_index", status.commit_index),
        ("applied_index", status.applied_index),
        ("has_quorum", status.has_quorum),
        ("answered_by", status.header.member_id),
    ])
    print()
    _print_members(status.members)


def _run_member(client: FencingClient, args: argparse.Namespace, name: str, out: str) -> None:
    if name == "member-list":
        r = client.member_list()
    elif name == "member-add":
        r = client.member_add(args.member_id, args.raft_address)
    elif name == "member-remove":
        r = client.member_remove(args.member_id)
    else:
        r = client.member_replace(args.member_id, args.raft_address)
    if out == "json":
        _emit(_jsonable(r), out)
        return
    _emit(_jsonable(r), out, [("cluster_id", r.cluster_id or "-"), ("index", r.index),
                              ("answered_by", r.header.member_id)])
    print()
    _print_members(r.members)


def _run_lease(client: FencingClient, name: str, request: dict[str, Any], out: str) -> None:
    if name == "acquire":
        r = client.acquire(
            request["resource"], ttl_ms=request["ttl_ms"], holder=request.get("holder"),
            wait_ms=request.get("wait_ms", 0), op_id=request.get("op_id"),
        )
        doc = _jsonable(r)
        doc.pop("token_proof", None)
        if r.token_proof:  # only when the cluster signs (DESIGN §6); text form, for a guard
            doc["token_proof"] = proof.to_text(r.token_proof)
        _emit(doc, out)
    elif name == "keepalive":
        renewed = client.keep_alive(request["resource"], request["token"], ttl_ms=request.get("ttl_ms"))
        _emit(_jsonable(renewed), out)
    elif name == "release":
        released = client.release(request["resource"], request["token"], op_id=request.get("op_id"))
        _emit({"resource": request["resource"], "token": request["token"], **_jsonable(released)}, out)
    else:  # describe
        _emit(_jsonable(client.describe(request["resource"])), out)


def _run_key(client: FencingClient, name: str, request: dict[str, Any], out: str) -> None:
    if name == "write":
        r = client.write(
            request["resource"], request["key"], request["value"], token=request["token"],
            op_id=request.get("op_id"), expected_version=request.get("expected_version"),
        )
        _emit({"resource": request["resource"], "key": request["key"], **_jsonable(r)}, out)
    elif name == "read":
        got = client.read(request["resource"], request["key"])
        doc = {"resource": request["resource"], "key": request["key"], **_jsonable(got)}
        doc.update(_value_fields(got.value) if got.found else {"value": None, "value_base64": None})
        _emit(doc, out)
    else:  # delete
        deleted = client.delete(request["resource"], request["key"], token=request["token"], op_id=request.get("op_id"))
        _emit({"resource": request["resource"], "key": request["key"], **_jsonable(deleted)}, out)


def _run_admin(client: FencingClient, args: argparse.Namespace, name: str, request: dict[str, Any], out: str) -> None:
    if name == "force-release":
        r = client.force_release(request["resource"], op_id=request.get("op_id"))
        _emit({"resource": request["resource"], **_jsonable(r)}, out)
    elif name == "set-epoch-floor":
        fence_all = request.get("fence_all")
        floor = client.set_epoch_floor(request["floor"], fence_all=True if fence_all is None else fence_all)
        _emit(_jsonable(floor), out)
    elif name == "snapshot":
        snap = client.snapshot()
        _write_file_atomically(args.out, snap.data)
        _emit({"path": args.out, "bytes": len(snap.data), "epoch": snap.epoch, "index": snap.index,
               "header": dict(_jsonable(snap)["header"])}, out)
    elif name == "restore":
        restored = client.restore(request["data"], epoch_floor=request["epoch_floor"])
        _emit(_jsonable(restored), out)
    else:  # pragma: no cover - argparse only lets known commands through
        raise UsageError(f"unknown command {name}")


def _print_members(members) -> None:
    columns = [
        ("MEMBER", lambda m: m.member_id or "-"), ("RAFT", lambda m: m.id), ("API", lambda m: m.api_address or "-"),
        ("INCARNATION", lambda m: str(m.incarnation) if m.incarnation else "unbound"),
        ("ROLE", lambda m: m.role or ("leader" if m.is_leader else "-")),
        ("MATCH", lambda m: str(m.match_index)), ("VOTER", lambda m: "yes" if m.voter else "no"),
    ]
    rows = [[cell(m) for _, cell in columns] for m in members]
    widths = [max([len(title), *(len(row[i]) for row in rows)]) for i, (title, _) in enumerate(columns)]
    print("  ".join(f"{title:<{w}}" for (title, _), w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip())


def _write_file_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".fencingctl-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # any failure, interrupts too, removes the partial file; re-raised
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
        request: dict[str, Any] = {}
        if name == "lock":
            try:
                request = lockcmd.parse(args, lock_cmd)
            except lockcmd.LockUsage as error:
                raise UsageError(str(error), exit_code=lockcmd.LockExit.FAILED) from None
        elif name not in ("status", "snapshot") and not name.startswith("member-"):
            if name == "restore":
                raw_args = {"epoch_floor": args.epoch_floor} if args.epoch_floor is not None else {}
                if args.json is not None:
                    if raw_args:
                        raise UsageError("give the request either as arguments or as --json, not both")
                    request = _build_request(name, _load_json(args.json), from_json=True)
                else:
                    request = _build_request(name, raw_args, from_json=False)
                try:
                    with open(args.in_path, "rb") as f:
                        # One byte past the limit, so a file too large is refused, not cut short.
                        request["data"] = f.read(limits.BACKUP_BYTES_MAX + 1)
                except OSError as error:
                    raise UsageError(f"cannot read --in: {error}") from None
            else:
                request = _request_from_args(args, name)
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
            client = FencingClient(
                endpoints, timeout_s=args.timeout, bearer_token=credential, credentials=channel_credentials
            )
        except ValueError as error:
            raise UsageError(f"--endpoints: {error}") from None
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
            _run(client, args, name, request)
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


if __name__ == "__main__":
    sys.exit(main())

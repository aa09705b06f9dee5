"""What the user typed, as the request fencingctl sends: checked strictly, before anything is sent.

Owns: the command-line errors (``UsageError``, ``BadField``), parsing each field from argv
text or from ``--json`` values (whole numbers, tokens, op ids as hex, base64), which fields a
command takes and which of them the user must give (its RPC's, from
``coordinator.core.requests.REQUESTS``), and gathering a command's request from its
arguments, ``--json``, ``--value-file`` or restore's ``--in`` file.
Must never: send anything, fill in what the client fills in (an op id, the holder), or
accept a value the API would refuse for its form (a token of 0, a float, a boolean).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from typing import Any, Callable

from coordinator.client import durations, lockcmd
from coordinator.core import limits, requests, validation


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


def _duration_ms_field(name: str, value: Any, *, low: int, high: int, from_json: bool) -> int:
    """Milliseconds: a JSON integer, or on the command line a duration (``10s``, ``500ms``,
    ``1.5m``; a bare number is milliseconds, as the flag's name says)."""
    if from_json or not isinstance(value, str) or _DIGITS.fullmatch(value.strip()) is not None:
        return _int_field(name, value, low=low, high=high, from_json=from_json)
    try:
        ms = durations.parse_s(value, default_unit="ms") * 1000
    except ValueError as error:
        raise BadField(f"{name}: {error}") from None
    if ms != int(ms):
        raise BadField(f"{name} must be a whole number of milliseconds, got {value!r}")
    if not low <= ms <= high:
        raise BadField(f"{name} must be in [{low}, {high}] ms, got {value!r}")
    return int(ms)


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

    def duration_ms(name: str, low: int, high: int) -> Callable[[Any, bool], int]:
        return lambda v, j: _duration_ms_field(name, v, low=low, high=high, from_json=j)

    return {
        "resource": lambda v, j: _str_field("resource", v, j),
        "key": lambda v, j: _str_field("key", v, j),
        "holder": lambda v, j: _str_field("holder", v, j),
        "value": lambda v, j: _str_field("value", v, j).encode("utf-8"),
        "value_base64": _value_base64,
        "token": _token,
        "op_id": _op_id,
        "ttl_ms": duration_ms("ttl_ms", limits.LEASE_TTL_MS_MIN, limits.LEASE_TTL_MS_MAX),
        "wait_ms": duration_ms("wait_ms", 0, limits.ACQUIRE_WAIT_MS_MAX),
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
# give, are that RPC's in coordinator.core.requests.REQUESTS: what the client fills in
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
    spec = requests.REQUESTS[_RPC_OF[command]]
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


def request_for(args: argparse.Namespace, name: str, lock_cmd: list[str]) -> dict[str, Any]:
    """The checked request of command ``name`` (``member-*``, status and snapshot take
    arguments only, checked by the server too: an empty request)."""
    if name == "lock":
        try:
            return lockcmd.parse(args, lock_cmd)
        except lockcmd.LockUsage as error:
            raise UsageError(str(error), exit_code=lockcmd.LockExit.FAILED) from None
    if name == "ls":  # ---- List (issue 29 point 4)
        return _ls_request(args)
    if name in ("status", "snapshot", "watch", "elect") or name.startswith(("member-", "endpoint-")):
        return {}
    if name == "restore":
        return _restore_request(args)
    return _request_from_args(args, name)


def _ls_request(args: argparse.Namespace) -> dict[str, Any]:
    """ls's request: PREFIX, --limit (None: every page) and --page-token, checked as List's
    fields are (a token must continue a listing of this very PREFIX, with --limit)."""
    limit = None
    if args.limit is not None:
        limit = _int_field("--limit", args.limit, low=1, high=limits.LIST_LIMIT_MAX, from_json=False)
    elif args.page_token:
        raise BadField("--page-token continues a page: give --limit too")
    try:
        checked = requests.check_request(
            "List", {"prefix": args.prefix, "limit": limit, "page_token": args.page_token or None}
        )
    except validation.InvalidField as error:
        raise BadField(str(error)) from None
    if checked["page_token"] is not None and checked["page_token"][0] != args.prefix:
        raise BadField(f"--page-token continues a listing of {checked['page_token'][0]!r}, not {args.prefix!r}")
    return {"prefix": args.prefix, "limit": limit, "page_token": args.page_token}


def _restore_request(args: argparse.Namespace) -> dict[str, Any]:
    """restore's request: the epoch floor from the arguments or ``--json``, the backup from ``--in``."""
    raw_args = {"epoch_floor": args.epoch_floor} if args.epoch_floor is not None else {}
    if args.json is not None:
        if raw_args:
            raise UsageError("give the request either as arguments or as --json, not both")
        request = _build_request("restore", _load_json(args.json), from_json=True)
    else:
        request = _build_request("restore", raw_args, from_json=False)
    try:
        with open(args.in_path, "rb") as f:
            # One byte past the limit, so a file too large is refused, not cut short.
            request["data"] = f.read(limits.BACKUP_BYTES_MAX + 1)
    except OSError as error:
        raise UsageError(f"cannot read --in: {error}") from None
    return request

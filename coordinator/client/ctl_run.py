"""fencingctl's commands once their request is checked: one client call each, and its output.

Owns: which client call each command makes (status, the lease and key commands, admin and
member commands), the output as a table or one JSON object per command, and writing a
snapshot's file atomically. Must never: retry or interpret outcomes (the client does), or
print an error (fencingctl's ``main`` does, one line each).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
from typing import Any

from coordinator.client import ctl_endpoint, ctl_list, ctl_watch, durations, proof
from coordinator.client import exceptions as exc
from coordinator.client.ctl_request import UsageError
from coordinator.client.sync import FencingClient

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


def run(client: FencingClient, args: argparse.Namespace, name: str, request: dict[str, Any]) -> int | None:
    """Run command ``name``; an exit code when it is not 0 though nothing was raised (some
    endpoint down, after the output), else None."""
    out = args.output
    if name == "status":
        return _run_status(client, args, out)
    if name.startswith("endpoint-"):
        return ctl_endpoint.run_endpoint(client, args, name, out)
    if name in ctl_watch.COMMANDS:
        ctl_watch.run(client, args, name)
        return None
    if name == "ls":  # ---- List (issue 29 point 4)
        ctl_list.run(client, request, out)
    elif name.startswith("member-"):
        _run_member(client, args, name, out)
    elif name in _LEASE_COMMANDS:
        _run_lease(client, name, request, out)
    elif name in _KEY_COMMANDS:
        _run_key(client, name, request, out)
    else:
        _run_admin(client, args, name, request, out)
    return None


_LEASE_COMMANDS = ("acquire", "keepalive", "release", "describe")
_KEY_COMMANDS = ("write", "read", "delete")


def _run_status(client: FencingClient, args: argparse.Namespace, out: str) -> int | None:
    """The cluster's status, each member marked by whether it answers; without a quorum (or
    when too few members answer for one) the most advanced member's own view, said on
    stderr, and exit 4."""
    answers = ctl_endpoint.endpoint_statuses(client, ctl_endpoint.endpoint_deadline(args))
    status, why = None, "too few members answer for a quorum"
    if not ctl_endpoint.quorum_impossible(answers):
        try:
            status = client.status()
        except exc.Unavailable as error:
            answers = ctl_endpoint.endpoint_statuses(client, ctl_endpoint.endpoint_deadline(args))
            if ctl_endpoint.best_local_status(answers) is None:
                raise
            why = " ".join(str(error).split())
    local = status is None
    if status is None:
        status = ctl_endpoint.best_local_status(answers)
        if status is None:  # nobody answers: the routed call says why, in one line
            status = client.status()
        print(f"fencingctl: warning: no quorum ({why}); showing {status.header.member_id or '?'}'s "
              "own view (may be stale)", file=sys.stderr)
    reachable = ctl_endpoint.reachability(status.members, args)
    doc = _jsonable(status)
    for member in doc["members"]:
        member["reachable"] = reachable.get(member["api_address"])
    _emit_status(status, doc, reachable, out, local)
    return ctl_endpoint.EXIT_UNAVAILABLE if local else None


def _emit_status(status, doc: dict[str, Any], reachable: dict[str, bool | None], out: str, local: bool) -> None:
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
        ("cluster_level", f"{status.cluster_level} (this member's build applies up to {status.entry_level})"),
        ("answered_by", status.header.member_id + (" (its own view: no quorum)" if local else "")),
    ])
    print()
    _print_members(status.members, reachable)


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
        _emit(doc, out, _with_ttl(doc, request["ttl_ms"]))
    elif name == "keepalive":
        renewed = client.keep_alive(request["resource"], request["token"], ttl_ms=request.get("ttl_ms"))
        doc = _jsonable(renewed)
        _emit(doc, out, _with_ttl(doc, request.get("ttl_ms")))
    elif name == "release":
        released = client.release(request["resource"], request["token"], op_id=request.get("op_id"))
        _emit({"resource": request["resource"], "token": request["token"], **_jsonable(released)}, out)
    else:  # describe
        _run_describe(client, request["resource"], out)


def _with_ttl(doc: dict[str, Any], ttl_ms: int | None) -> list[tuple[str, Any]]:
    """A granted or renewed lease's table: its TTL as a duration in place of the expiry on the
    log clock (a number of milliseconds since no wall-clock time, kept in --output json)."""
    rows: list[tuple[str, Any]] = []
    for key, value in doc.items():
        if key == "expires_at_ms":
            rows.append(("ttl", durations.text_ms(ttl_ms) if ttl_ms is not None else "renewed, as before"))
        elif key != "header":
            rows.append((key, value))
    return rows


def _run_describe(client: FencingClient, resource: str, out: str) -> None:
    """The lease on ``resource`` with its remaining TTL (``remaining_ms`` in JSON, beside the
    raw expiry and log clock); the table shows the TTL as a duration and no raw clock values."""
    lease = client.describe(resource)
    remaining = max(0, lease.expires_at_ms - lease.log_clock_ms) if lease.held else None
    doc = {**_jsonable(lease), "remaining_ms": remaining}
    _emit(doc, out, [
        ("resource", lease.resource), ("held", lease.held), ("holder", lease.holder if lease.held else "-"),
        ("token", lease.token if lease.held else "-"),
        ("remaining_ttl", "-" if remaining is None else durations.text_ms(remaining)),
        ("hwm", lease.hwm), ("waiters", lease.waiters),
    ])


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
        if got.found:
            _emit(doc, out)
        else:  # a read that found nothing succeeded (exit 0, as etcdctl get): it says so
            _emit(doc, out, [("resource", doc["resource"]), ("key", doc["key"]), ("found", False),
                             ("value", "(not found)"), ("hwm", got.hwm)])
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


def _print_members(members, reachable: dict[str, bool | None] | None = None) -> None:
    def answers(m) -> str:
        up = (reachable or {}).get(m.api_address)
        return "?" if up is None else "yes" if up else "NO"

    columns = [
        ("MEMBER", lambda m: m.member_id or "-"), ("RAFT", lambda m: m.id), ("API", lambda m: m.api_address or "-"),
        ("INCARNATION", lambda m: str(m.incarnation) if m.incarnation else "unbound"),
        ("ROLE", lambda m: m.role or ("leader" if m.is_leader else "-")),
        ("MATCH", lambda m: str(m.match_index)), ("VOTER", lambda m: "yes" if m.voter else "no"),
    ]
    if reachable is not None:
        columns.append(("REACHABLE", answers))
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


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
import tempfile
from typing import Any

from coordinator.client import proof
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


def run(client: FencingClient, args: argparse.Namespace, name: str, request: dict[str, Any]) -> None:
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


"""The record format of a chaos run: one JSON object per line (JSONL).

Every line has a ``"type"``. Times are ``time.monotonic_ns()``: one clock shared by every process
on the machine, so comparing an invoke time of one process with a complete time of another gives
the exact real-time order. Fields not listed are ignored when reading (forward compatibility).

``op`` — one client operation (one attempt; a retry is another record with the same ``op_id``)::

    {"type": "op", "process": "c1", "op_id": "9f3c...", "f": "write", "resource": "r1",
     "key": "k", "value": "c1-17", "token": 4, "invoke_ns": 1200, "complete_ns": 1900,
     "outcome": "ok", "reason": null, "result": {"version": 7, "hwm": 4, "applied_index": 31}}

    f         acquire | keepalive | release | write | delete | read | force_release |
              set_epoch_floor | restore (cluster-wide admin ops: resource "*")
    key       the key of write / delete / read, else null
    value     the value a write stores (unique per logical write, so a value names its write)
    token     the fencing token carried by keepalive / release / write / delete, else null
    outcome   ok       — the server answered and the op took effect (reads: returned a value)
              refused  — the server answered with a refusal: the op definitely did not take
                         effect (STALE_TOKEN, UNKNOWN_TOKEN, LEASE_HELD, VERSION_MISMATCH, ...)
              unknown  — no answer (timeout, OUTCOME_UNKNOWN, connection lost, client crashed):
                         the op may take effect at any time after invoke_ns, or never
    complete_ns  when the answer arrived (or the client gave up); null if the process crashed
                 with the op in flight. Required for ok and refused.
    reason    refusal reason (or the unknown cause), else null
    hazard    optional: which deliberate hazard the op exercises (``hostile_*``: a token or
              request the server must refuse; ``late_holder``: a holder writing after pausing
              past its lease; ...). Counted per run; an ok ``hostile_*`` op is a violation.
    args      optional, for admin ops: ``floor`` (set_epoch_floor, restore), ``fence_all``
              (set_epoch_floor), ``backup`` (restore: resource -> key -> {value, version}, the
              data the restored backup holds, so the checker knows what the restore wrote)
    result    for ok ops, what the server reported, any of: token (acquire, keepalive),
              hwm (acquire, force_release — the new epoch —, release, write), version (write,
              delete, read; 0 for "absent"), value / found (read), applied_index (the Raft index
              at which the op was applied; a deduplicated retry reports the first one),
              expires_at_ms (acquire, keepalive), deleted (delete), epoch (set_epoch_floor,
              restore: the epoch the cluster reported after it)

``node`` — a status sample of one node::

    {"type": "node", "t_ns": 1500, "node": "127.0.0.2:7001", "term": 3, "is_leader": true}

``leader_report`` — a member's own report that it saw ``leader`` lead ``term`` (itself, or the
leader it followed), from its log (chaos.leader_reports); ``log_line`` says where::

    {"type": "leader_report", "node": "127.0.0.3:7001", "leader": "127.0.0.2:7001", "term": 3,
     "log_line": 57}

``final`` — one replica after heal and convergence::

    {"type": "final", "node": "127.0.0.2:7001", "applied_index": 812, "digest": "ab12..."}

``final_state`` — one resource read through the log after the run::

    {"type": "final_state", "resource": "r1", "hwm": 9,
     "data": {"k": {"value": "c2-40", "version": 57}}}

``fault`` — a fault the nemesis injected or healed (for reports; not checked)::

    {"type": "fault", "t_ns": 1400, "kind": "partition", "action": "inject",
     "nodes": ["127.0.0.2:7001"]}

``watch`` — one event a watcher saw (chaos.workload's ``--watch`` mode), in the order seen::

    {"type": "watch", "watcher": "w0.1", "prefix": "r", "start": 12, "seq": 3, "revision": 31,
     "event": "WRITTEN", "resource": "r1", "key": "k", "value": "c1-17", "token": 4}

    watcher   one unbroken stream of events (the client resumes across faults under the same
              name; after COMPACTED the watcher starts over under a new one)
    start     the revision that stream started from; with the last revision it saw, the
              range it must have seen every change of (chaos.watch_check)
    seq       its position in that stream (1, 2, ...)

``meta`` — free-form facts about the run (scenario, seed, versions); not checked::

    {"type": "meta", "scenario": "partition-leader", "seed": 7}

``read_history`` / ``write_history`` convert between files and these dataclasses;
``HistoryWriter`` appends records one line at a time (flushed, thread-safe) while a run goes on,
so a crash of the recorder loses at most the line being written.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import threading
from typing import Any, Iterable, Iterator, TextIO, Union

OP_FUNCTIONS = frozenset(
    {"acquire", "keepalive", "release", "write", "delete", "read", "force_release",
     "set_epoch_floor", "restore"}
)
#: Functions that carry a fencing token and are refused unless it equals hwm(resource).
FENCED_FUNCTIONS = frozenset({"keepalive", "release", "write", "delete"})
#: Functions that issue a new epoch (token) for their resource.
ISSUING_FUNCTIONS = frozenset({"acquire", "force_release"})
#: Cluster-wide admin functions that raise the epoch (and, fencing, every resource's hwm).
EPOCH_FUNCTIONS = frozenset({"set_epoch_floor", "restore"})
#: Functions that change a key's value.
KEY_MUTATIONS = frozenset({"write", "delete"})
OUTCOMES = frozenset({"ok", "refused", "unknown"})
FAULT_ACTIONS = frozenset({"inject", "heal"})


class HistoryError(ValueError):
    """The input is not a history in this format (the checker exits with 2)."""


@dataclasses.dataclass
class Op:
    """One attempt of one client operation (see the module docstring)."""

    process: str
    op_id: str | None
    f: str
    resource: str
    invoke_ns: int
    outcome: str
    complete_ns: int | None = None
    key: str | None = None
    value: str | None = None
    token: int | None = None
    reason: str | None = None
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    hazard: str | None = None
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Where the record came from (1-based line number); not written out.
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "op"

    @property
    def is_hostile(self) -> bool:
        return (self.hazard or "").startswith("hostile")

    @property
    def is_ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def applied_index(self) -> int | None:
        value = self.result.get("applied_index")
        return value if _is_int(value) else None

    def result_int(self, name: str) -> int | None:
        value = self.result.get(name)
        return value if _is_int(value) else None

    def issued_token(self) -> int | None:
        """The epoch an ok acquire / force_release established (acquire: result.token, falling
        back to result.hwm; force_release: result.hwm), else None."""
        if not self.is_ok or self.f not in ISSUING_FUNCTIONS:
            return None
        if self.f == "acquire":
            token = self.result_int("token")
            return token if token is not None else self.result_int("hwm")
        return self.result_int("hwm")

    def read_value(self) -> str | None:
        """The register value an ok read returned (None = the key is absent)."""
        if self.result.get("found") is False:
            return None
        return self.result.get("value")


@dataclasses.dataclass
class NodeSample:
    t_ns: int
    node: str
    term: int
    is_leader: bool
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "node"


@dataclasses.dataclass
class LeaderReport:
    node: str
    leader: str
    term: int
    log_line: int | None = None
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "leader_report"


@dataclasses.dataclass
class FinalReplica:
    node: str
    applied_index: int
    digest: str
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "final"


@dataclasses.dataclass
class FinalState:
    resource: str
    hwm: int
    #: key -> {"value": str, "version": int}
    data: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "final_state"


@dataclasses.dataclass
class Fault:
    t_ns: int
    kind: str
    action: str
    nodes: list[str] = dataclasses.field(default_factory=list)
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "fault"


@dataclasses.dataclass
class WatchSeen:
    watcher: str
    prefix: str
    start: int
    seq: int
    revision: int
    event: str
    resource: str
    key: str | None = None
    value: str | None = None
    token: int | None = None
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "watch"


@dataclasses.dataclass
class Meta:
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    line: int | None = dataclasses.field(default=None, compare=False)

    type = "meta"


Record = Union[Op, NodeSample, LeaderReport, FinalReplica, FinalState, Fault, WatchSeen, Meta]


@dataclasses.dataclass
class History:
    """A parsed history, records split by type, each list in file order."""

    ops: list[Op] = dataclasses.field(default_factory=list)
    nodes: list[NodeSample] = dataclasses.field(default_factory=list)
    leader_reports: list[LeaderReport] = dataclasses.field(default_factory=list)
    finals: list[FinalReplica] = dataclasses.field(default_factory=list)
    final_states: list[FinalState] = dataclasses.field(default_factory=list)
    faults: list[Fault] = dataclasses.field(default_factory=list)
    watches: list[WatchSeen] = dataclasses.field(default_factory=list)
    meta: list[Meta] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, records: Iterable[Record | dict[str, Any]]) -> "History":
        """A history from records (dataclasses, or dicts in the JSON shape)."""
        history = cls()
        for number, record in enumerate(records, start=1):
            if isinstance(record, dict):
                record = from_dict(record, line=number)
            history.add(record)
        return history

    def add(self, record: Record) -> None:
        target = {
            Op: self.ops,
            NodeSample: self.nodes,
            LeaderReport: self.leader_reports,
            FinalReplica: self.finals,
            FinalState: self.final_states,
            Fault: self.faults,
            WatchSeen: self.watches,
            Meta: self.meta,
        }.get(type(record))
        if target is None:
            raise HistoryError(f"not a history record: {record!r}")
        target.append(record)

    def records(self) -> Iterator[Record]:
        """Every record, in the order: meta, ops, nodes, leader reports, faults, finals, final
        states."""
        yield from self.meta
        yield from self.ops
        yield from self.nodes
        yield from self.leader_reports
        yield from self.faults
        yield from self.watches
        yield from self.finals
        yield from self.final_states


# -- validation helpers ----------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _where(line: int | None) -> str:
    return f"line {line}: " if line is not None else ""


def _need(doc: dict[str, Any], name: str, kind: str, line: int | None, *, nullable=False):
    if name not in doc:
        if nullable:
            return None
        raise HistoryError(f"{_where(line)}{doc.get('type')!r} record lacks {name!r}")
    value = doc[name]
    if value is None:
        if nullable:
            return None
        raise HistoryError(f"{_where(line)}{name!r} must not be null")
    ok = {
        "int": _is_int(value),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "dict": isinstance(value, dict),
        "list": isinstance(value, list),
    }[kind]
    if not ok:
        raise HistoryError(
            f"{_where(line)}{name!r} must be {kind}, got {type(value).__name__} {value!r}"
        )
    return value


def _op_from_dict(doc: dict[str, Any], line: int | None) -> Op:
    f = _need(doc, "f", "str", line)
    if f not in OP_FUNCTIONS:
        raise HistoryError(f"{_where(line)}unknown op function {f!r}")
    outcome = _need(doc, "outcome", "str", line)
    if outcome not in OUTCOMES:
        raise HistoryError(f"{_where(line)}unknown outcome {outcome!r}")
    invoke_ns = _need(doc, "invoke_ns", "int", line)
    complete_ns = _need(doc, "complete_ns", "int", line, nullable=True)
    if complete_ns is None and outcome != "unknown":
        raise HistoryError(f"{_where(line)}an {outcome} op needs complete_ns")
    if complete_ns is not None and complete_ns < invoke_ns:
        raise HistoryError(f"{_where(line)}complete_ns {complete_ns} < invoke_ns {invoke_ns}")
    result = _need(doc, "result", "dict", line, nullable=True) or {}
    value = doc.get("value")
    if value is not None and not isinstance(value, str):
        raise HistoryError(f"{_where(line)}'value' must be a string or null")
    return Op(
        process=_need(doc, "process", "str", line),
        op_id=_need(doc, "op_id", "str", line, nullable=True),
        f=f,
        resource=_need(doc, "resource", "str", line),
        key=_need(doc, "key", "str", line, nullable=True),
        value=value,
        token=_need(doc, "token", "int", line, nullable=True),
        invoke_ns=invoke_ns,
        complete_ns=complete_ns,
        outcome=outcome,
        reason=_need(doc, "reason", "str", line, nullable=True),
        result=result,
        hazard=_need(doc, "hazard", "str", line, nullable=True),
        args=_need(doc, "args", "dict", line, nullable=True) or {},
        line=line,
    )


def from_dict(doc: Any, line: int | None = None) -> Record:
    """One record from its JSON object; HistoryError if it is malformed."""
    if not isinstance(doc, dict):
        raise HistoryError(f"{_where(line)}a record must be a JSON object")
    kind = doc.get("type")
    if kind == "op":
        return _op_from_dict(doc, line)
    if kind == "node":
        return NodeSample(
            t_ns=_need(doc, "t_ns", "int", line),
            node=_need(doc, "node", "str", line),
            term=_need(doc, "term", "int", line),
            is_leader=_need(doc, "is_leader", "bool", line),
            line=line,
        )
    if kind == "leader_report":
        return LeaderReport(
            node=_need(doc, "node", "str", line),
            leader=_need(doc, "leader", "str", line),
            term=_need(doc, "term", "int", line),
            log_line=_need(doc, "log_line", "int", line, nullable=True),
            line=line,
        )
    if kind == "final":
        return FinalReplica(
            node=_need(doc, "node", "str", line),
            applied_index=_need(doc, "applied_index", "int", line),
            digest=_need(doc, "digest", "str", line),
            line=line,
        )
    if kind == "final_state":
        data = _need(doc, "data", "dict", line, nullable=True) or {}
        for key, entry in data.items():
            if not isinstance(entry, dict) or not _is_int(entry.get("version")):
                raise HistoryError(
                    f"{_where(line)}final_state data[{key!r}] must be "
                    '{"value": str, "version": int}'
                )
        return FinalState(
            resource=_need(doc, "resource", "str", line),
            hwm=_need(doc, "hwm", "int", line),
            data=data,
            line=line,
        )
    if kind == "fault":
        action = _need(doc, "action", "str", line)
        if action not in FAULT_ACTIONS:
            raise HistoryError(f"{_where(line)}unknown fault action {action!r}")
        return Fault(
            t_ns=_need(doc, "t_ns", "int", line),
            kind=_need(doc, "kind", "str", line),
            action=action,
            nodes=_need(doc, "nodes", "list", line, nullable=True) or [],
            line=line,
        )
    if kind == "watch":
        return WatchSeen(
            watcher=_need(doc, "watcher", "str", line),
            prefix=_need(doc, "prefix", "str", line),
            start=_need(doc, "start", "int", line),
            seq=_need(doc, "seq", "int", line),
            revision=_need(doc, "revision", "int", line),
            event=_need(doc, "event", "str", line),
            resource=_need(doc, "resource", "str", line),
            key=_need(doc, "key", "str", line, nullable=True),
            value=_need(doc, "value", "str", line, nullable=True),
            token=_need(doc, "token", "int", line, nullable=True),
            line=line,
        )
    if kind == "meta":
        return Meta(data={k: v for k, v in doc.items() if k != "type"}, line=line)
    raise HistoryError(f"{_where(line)}unknown record type {kind!r}")


def to_dict(record: Record) -> dict[str, Any]:
    """The JSON object of one record (without the ``line`` bookkeeping)."""
    if isinstance(record, Meta):
        return {"type": "meta", **record.data}
    doc: dict[str, Any] = {"type": record.type}
    for field in dataclasses.fields(record):
        if field.name != "line":
            doc[field.name] = getattr(record, field.name)
    if isinstance(record, Op):
        # optional fields: left out when unset, so older histories round-trip unchanged
        for name in ("hazard", "args"):
            if not doc[name]:
                del doc[name]
    return doc


def dumps(record: Record | dict[str, Any]) -> str:
    """One JSONL line (no newline)."""
    doc = record if isinstance(record, dict) else to_dict(record)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def parse_lines(lines: Iterable[str]) -> History:
    """A history from JSONL lines; blank lines are skipped; HistoryError on anything else
    that is not a valid record."""
    history = History()
    for number, text in enumerate(lines, start=1):
        text = text.strip()
        if not text:
            continue
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"line {number}: not JSON: {exc}") from None
        history.add(from_dict(doc, line=number))
    return history


def read_history(source: str | os.PathLike[str] | TextIO) -> History:
    """Parse a JSONL history file (path or open text file)."""
    if isinstance(source, io.TextIOBase) or hasattr(source, "read"):
        return parse_lines(source)
    try:
        with open(source, encoding="utf-8") as handle:
            return parse_lines(handle)
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"cannot read {os.fspath(source)!r}: {exc}") from None


def write_history(
    path: str | os.PathLike[str], records: Iterable[Record | dict[str, Any]] | History
) -> None:
    """Write records as JSONL (a History is written in ``History.records()`` order)."""
    items = records.records() if isinstance(records, History) else records
    with open(path, "w", encoding="utf-8") as handle:
        for record in items:
            handle.write(dumps(record) + "\n")


class HistoryWriter:
    """Append records to a JSONL file while a run goes on: one line per record, flushed, safe
    to share between threads. Use as a context manager or call ``close()``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._handle = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: Record | dict[str, Any]) -> None:
        line = dumps(record) + "\n"
        with self._lock:
            self._handle.write(line)
            self._handle.flush()

    def close(self) -> None:
        with self._lock:
            self._handle.close()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

"""Check a recorded chaos history (``chaos.history``) against DESIGN §3.

Usage::

    python -m chaos.check HISTORY.jsonl [--json]

Exit code 0: no violations; 1: violations; 2: the input could not be read or is not a history.

Attempts sharing an op_id (retries) form one logical operation: ok if any attempt was ok (its
first ok answer speaks for it), refused only if every attempt was refused (a refusal does not
cover an earlier attempt still in flight), else unknown. Reads are never grouped.

Checks, each reporting its own violation kind (the constants below):

1. Tokens (I1). ``TOKEN_DUPLICATE``: two different acquisitions (ok acquire / force_release,
   different op_ids) got the same token. ``TOKEN_NOT_MONOTONIC``: an acquisition that completed
   before another was invoked got a *greater* token (tokens come from one counter, so this is
   global, across resources). An acquisition retried under one op_id counts once, from its first
   invoke to its first ok answer. Equal tokens are reported only as TOKEN_DUPLICATE.
2. Fencing (I2, I3, I7), in apply order (``result.applied_index``) per resource.
   ``STALE_WRITE_ACCEPTED``: an ok fenced op (write, delete, and likewise keepalive, release)
   whose token is below a token already established on the resource at a lower applied index
   (by an ok acquire / force_release, or by an accepted fenced op, whose token equalled the hwm).
   ``UNISSUED_TOKEN_ACCEPTED``: an ok fenced op whose token no ok acquire / force_release of that
   resource ever returned, or returned only at a higher applied index (accepted before issued),
   or that carried no token at all. These checks need ``applied_index`` to be the index at
   which the op itself was applied: a retry answered from the dedup table must report the
   first application's index, not its own entry's, or an op applied before an epoch change
   would look applied after it.
   The stale check also holds in real time, whatever index the server reports (a deposed
   leader answering from a divergent log reports whatever its log says): an ok fenced op is
   ``STALE_WRITE_ACCEPTED`` when its token is below one that an ok op on the resource had
   established (issued, or carried by an accepted fenced op) and answered before the fenced op
   was first invoked. An op is reported once, by the apply-order sweep if both see it.
   ``MISSING_APPLIED_INDEX``: an ok acquire / force_release / fenced op reported no
   ``applied_index``, so its apply order cannot be checked; that is a fault of the server
   or the recorder, never a pass.
3. Durability (I8), against the ``final_state`` records. ``LOST_WRITE``: the final data of a key
   does not reflect its latest acknowledged write / delete in apply order — the final version is
   below that op's version, or the value differs (or the key is absent / present) and no
   unknown-outcome write / delete of the key can explain it; also a final hwm below an epoch
   established on the resource (a final hwm of 0 with no data is a resource forgotten after
   its release, not a loss). ``FAILED_WRITE_VISIBLE``: a final value or a value returned by a
   read is the value of a write that was refused on every attempt (values are unique per write).
   Such a read is reported only here and left out of the linearizability search (it cannot be
   linearized; one report per cause). A final value of a refused write is likewise not also
   reported as LOST_WRITE. ``DURABILITY_UNCHECKED``: the history has final states, but none for
   a resource that a write / delete may have changed (one not refused on every attempt): its
   acknowledged writes would go unchecked, so the run fails. A resource only ever written with
   refused ops (a malformed name, say) needs none. A history with no final state at all is
   only warned about (a run that ended before its final reads).
4. ``NOT_LINEARIZABLE`` (I9): per (resource, key), writes / deletes / reads as one register
   (``chaos.linearizability``; initial value: absent). Ok ops take effect between invoke and
   complete; unknown-outcome writes / deletes at any time after invoke (even after the client
   gave up) or never; refused ones never; unknown reads say nothing. A retried op spans from its
   first invoke to its first ok complete. A report names either one read that is wrong on its
   own (a value never written, written only later, or already overwritten) or the stretch of
   concurrent ops where the history stops being linearizable, with the values the register
   can hold before it and the later reads that pin its value.
5. ``DUPLICATE_EFFECT`` (I5): two ok answers with the same op_id report different effects
   (applied_index, version, token, or a force_release's hwm). Reads are not deduplicated and are
   not compared.
6. Epoch floors and restores (I7, I11). An ok ``set_epoch_floor`` (with fence_all) or
   ``restore`` with epoch E establishes E on every resource at its applied index (and in real
   time from its answer), so a holder from before it is stale (check 2). ``EPOCH_FLOOR_BROKEN``:
   E is below the floor asked for; or an acquisition that completed before the floor was
   invoked got a token >= E (the floor rolled the epoch back); or an acquisition / force_release
   invoked after the floor answered got a token <= E (a token at or below a pre-restore token
   issued again). A restore also writes every key: the backup's value (``args.backup``) or
   absent; durability and linearizability treat it as such a write per key.
   Check 2 counts only acquisitions as issuing a token to a holder: an epoch that only fenced
   (force_release, floor, restore) carried by an accepted fenced op is UNISSUED_TOKEN_ACCEPTED
   (I3).
7. ``HOSTILE_ACCEPTED``: an op marked ``hazard: hostile_*`` (a never-issued, foreign-resource,
   malformed or huge token, or a malformed request) was accepted. Their refusals must change
   nothing: their values must never be read (FAILED_WRITE_VISIBLE) and the linearizability
   search treats them as never applied.
   ``REFUSAL_CHANGED_STATE`` (I3: "rejection changes nothing"): a refused hostile op on a
   resource only its process touches, recorded with the resource's hwm and key version read
   (through the log) just before and just after it (``args``: ``quiet`` (that resource's
   name), ``hwm_before`` /
   ``hwm_after``, ``version_before`` / ``version_after``, ``watch_from_ns`` /
   ``watch_to_ns``), saw either change. A window that an epoch floor or restore (which fence
   every resource) or another op on the resource may have touched is not judged, only counted.
8. ``TWO_LEADERS_IN_TERM``: node samples show two nodes as leader in the same term; or the
   members' own reports (``leader_report`` records, from their logs: each member's every change
   of the leader it saw, itself included) name two different leaders for one term — whoever
   reported them, since a member takes a leader for a term only from that leader's append at
   that term. One violation per term, from whichever evidence shows it (samples first).
   ``REPLICAS_DIVERGED``: ``final`` records (the last one per node) disagree — different digests
   at the same applied index, or different applied indexes after convergence.
9. ``WATCH_MISSED_EVENT``, ``WATCH_REPEATED_EVENT``, ``WATCH_OUT_OF_ORDER`` (issue 29, Watch):
   each watcher's stream (``watch`` records) has every acknowledged change in its range once,
   in log order (chaos/watch_check.py).

Things the checker cannot judge (unordered mutations, a search over its state budget) are
listed as warnings, never silently passed as checked.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import sys
import time
from typing import Any, Iterable

from chaos import linearizability as lin
from chaos import watch_check
from chaos.history import (
    EPOCH_FUNCTIONS,
    FENCED_FUNCTIONS,
    ISSUING_FUNCTIONS,
    KEY_MUTATIONS,
    FinalState,
    History,
    HistoryError,
    Op,
    read_history,
)
from coordinator.core.validation import InvalidField, check_resource

TOKEN_DUPLICATE = "TOKEN_DUPLICATE"
TOKEN_NOT_MONOTONIC = "TOKEN_NOT_MONOTONIC"
STALE_WRITE_ACCEPTED = "STALE_WRITE_ACCEPTED"
UNISSUED_TOKEN_ACCEPTED = "UNISSUED_TOKEN_ACCEPTED"
MISSING_APPLIED_INDEX = "MISSING_APPLIED_INDEX"
LOST_WRITE = "LOST_WRITE"
FAILED_WRITE_VISIBLE = "FAILED_WRITE_VISIBLE"
NOT_LINEARIZABLE = "NOT_LINEARIZABLE"
DUPLICATE_EFFECT = "DUPLICATE_EFFECT"
TWO_LEADERS_IN_TERM = "TWO_LEADERS_IN_TERM"
REPLICAS_DIVERGED = "REPLICAS_DIVERGED"
EPOCH_FLOOR_BROKEN = "EPOCH_FLOOR_BROKEN"
HOSTILE_ACCEPTED = "HOSTILE_ACCEPTED"
REFUSAL_CHANGED_STATE = "REFUSAL_CHANGED_STATE"
DURABILITY_UNCHECKED = "DURABILITY_UNCHECKED"

VIOLATION_KINDS = (
    TOKEN_DUPLICATE,
    TOKEN_NOT_MONOTONIC,
    STALE_WRITE_ACCEPTED,
    UNISSUED_TOKEN_ACCEPTED,
    MISSING_APPLIED_INDEX,
    LOST_WRITE,
    FAILED_WRITE_VISIBLE,
    NOT_LINEARIZABLE,
    DUPLICATE_EFFECT,
    TWO_LEADERS_IN_TERM,
    REPLICAS_DIVERGED,
    EPOCH_FLOOR_BROKEN,
    HOSTILE_ACCEPTED,
    REFUSAL_CHANGED_STATE,
    *watch_check.KINDS,
)

#: States the register search may explore per segment before calling it inconclusive.
DEFAULT_MAX_STATES = 200_000


@dataclasses.dataclass
class Violation:
    kind: str
    detail: str
    ops: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "ops": self.ops}


@dataclasses.dataclass
class Report:
    violations: list[Violation]
    summary: dict[str, Any]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "violations": [v.to_dict() for v in self.violations],
            "summary": self.summary,
            "warnings": self.warnings,
        }


# -- helpers ----------------------------------------------------------------------------------


class _Refs:
    """Turns ops into the small dicts violations carry."""

    def __init__(self, ops: list[Op]) -> None:
        self._index = {id(op): i for i, op in enumerate(ops)}

    def __call__(self, op: Op) -> dict[str, Any]:
        ref: dict[str, Any] = {"index": self._index.get(id(op))}
        if op.line is not None:
            ref["line"] = op.line
        ref.update(process=op.process, f=op.f, op_id=op.op_id, resource=op.resource)
        for name in ("key", "value", "token"):
            if getattr(op, name) is not None:
                ref[name] = getattr(op, name)
        ref["outcome"] = op.outcome
        if op.reason is not None:
            ref["reason"] = op.reason
        ref["invoke_ns"] = op.invoke_ns
        ref["complete_ns"] = op.complete_ns
        if op.result:
            ref["result"] = op.result
        return ref

    def many(self, ops: Iterable[Op]) -> list[dict[str, Any]]:
        return [self(op) for op in ops]


@dataclasses.dataclass
class _Logical:
    """One logical operation: every attempt sharing an op_id (or one attempt without one).
    Derived facts are cached: build it with all its attempts, in invoke order, then read."""

    attempts: list[Op]

    @property
    def first(self) -> Op:
        return self.attempts[0]

    @property
    def f(self) -> str:
        return self.first.f

    @property
    def resource(self) -> str:
        return self.first.resource

    @property
    def key(self) -> str | None:
        return self.first.key

    @functools.cached_property
    def oks(self) -> list[Op]:
        return [a for a in self.attempts if a.is_ok]

    @functools.cached_property
    def outcome(self) -> str:
        """ok if any attempt was; refused if every attempt was; else unknown. (A refusal does
        not cover an earlier unknown attempt: its request may still be applied later.)"""
        if any(a.is_ok for a in self.attempts):
            return "ok"
        if all(a.outcome == "refused" for a in self.attempts):
            return "refused"
        return "unknown"

    @functools.cached_property
    def rep(self) -> Op:
        """The attempt that speaks for the op: the first ok answer, else the first attempt."""
        oks = self.oks
        return min(oks, key=lambda a: a.complete_ns) if oks else self.first

    @functools.cached_property
    def invoke_ns(self) -> int:
        return min(a.invoke_ns for a in self.attempts)

    @functools.cached_property
    def complete_ns(self) -> int | None:
        """The first ok answer's complete time (None unless ok)."""
        done = [a.complete_ns for a in self.attempts if a.is_ok]
        return min(done) if done else None

    @functools.cached_property
    def applied_index(self) -> int | None:
        return self.rep.applied_index if self.outcome == "ok" else None



def _nameable(resource: str) -> bool:
    """The server accepts ``resource`` as a name (validation.check_resource)."""
    try:
        check_resource(resource)
    except InvalidField:
        return False
    return True

def _logical_ops(ops: list[Op]) -> list[_Logical]:
    """Group mutation attempts by op_id (and function, resource, key); reads stay single."""
    groups: dict[Any, _Logical] = {}
    for i, op in enumerate(ops):
        if op.op_id is None or op.f == "read":
            ident: Any = ("#", i)
        else:
            ident = (op.op_id, op.f, op.resource, op.key)
        group = groups.get(ident)
        if group is None:
            groups[ident] = _Logical([op])
        else:
            group.attempts.append(op)
    for group in groups.values():
        group.attempts.sort(key=lambda a: a.invoke_ns)
    return list(groups.values())


def _fmt_value(value: Any) -> str:
    return "absent" if value is None else repr(value)


# -- 1. tokens --------------------------------------------------------------------------------


def _check_tokens(
    logical: list[_Logical], refs: _Refs, warnings: list[str]
) -> list[Violation]:
    issued: list[tuple[int, int, int, _Logical]] = []  # (token, invoke, complete, op)
    for op in logical:
        if op.f not in ISSUING_FUNCTIONS or op.outcome != "ok":
            continue
        token = op.rep.issued_token()
        if token is None:
            warnings.append(
                f"ok {op.f} without a token in its result (line {op.rep.line}): not checked"
            )
            continue
        issued.append((token, op.invoke_ns, op.complete_ns, op))
    violations: list[Violation] = []

    by_token: dict[int, list[_Logical]] = collections.defaultdict(list)
    for token, _, _, op in issued:
        by_token[token].append(op)
    for token in sorted(by_token):
        ops = by_token[token]
        if len(ops) > 1:
            where = ", ".join(f"{o.f} {o.resource} by {o.rep.process}" for o in ops)
            violations.append(
                Violation(
                    TOKEN_DUPLICATE,
                    f"token {token} was issued {len(ops)} times: {where}",
                    refs.many(o.rep for o in ops),
                )
            )

    # For each acquisition b, the greatest token among acquisitions completed before b began.
    by_complete = sorted(issued, key=lambda t: t[2])
    pos = 0
    best: tuple[int, _Logical] | None = None
    for token, invoke, _, op in sorted(issued, key=lambda t: t[1]):
        while pos < len(by_complete) and by_complete[pos][2] < invoke:
            earlier = by_complete[pos]
            if best is None or earlier[0] > best[0]:
                best = (earlier[0], earlier[3])
            pos += 1
        if best is not None and token < best[0]:
            prior = best[1]
            violations.append(
                Violation(
                    TOKEN_NOT_MONOTONIC,
                    f"{op.f} {op.resource} by {op.rep.process} got token {token}, but "
                    f"{prior.f} {prior.resource} by {prior.rep.process} had already completed "
                    f"with token {best[0]} before it was invoked",
                    refs.many([prior.rep, op.rep]),
                )
            )
    return violations


# -- 2. fencing -------------------------------------------------------------------------------


def _check_fencing(logical: list[_Logical], refs: _Refs) -> list[Violation]:
    violations: list[Violation] = []
    # resource -> token -> issuing ops
    issued: dict[str, dict[int, list[_Logical]]] = collections.defaultdict(dict)
    # resource -> [(applied_index, token, op)] of every op that established a token
    established: dict[str, list[tuple[int, int, _Logical]]] = collections.defaultdict(list)
    fenced: list[_Logical] = []
    floors = _fencing_floors(logical)
    for resource in {op.resource for op in logical if op.f not in EPOCH_FUNCTIONS}:
        for token, op in floors:
            if op.applied_index is not None:
                established[resource].append((op.applied_index, token, op))
    for op in logical:
        if op.outcome != "ok":
            continue
        if op.applied_index is None and op.f in ISSUING_FUNCTIONS | FENCED_FUNCTIONS:
            violations.append(
                Violation(
                    MISSING_APPLIED_INDEX,
                    f"ok {op.f} on {op.resource} by {op.rep.process} reported no applied_index:"
                    " its apply order cannot be checked",
                    [refs(op.rep)],
                )
            )
        if op.f in ISSUING_FUNCTIONS:
            token = op.rep.issued_token()
            if token is None:
                continue
            if op.f == "acquire":  # force_release only fences: it issues nothing to a holder
                issued[op.resource].setdefault(token, []).append(op)
            if op.applied_index is not None:
                established[op.resource].append((op.applied_index, token, op))
        elif op.f in FENCED_FUNCTIONS:
            fenced.append(op)
            token = op.rep.token
            if op.applied_index is not None and token is not None:
                established[op.resource].append((op.applied_index, token, op))

    for op in fenced:
        token = op.rep.token
        index = op.applied_index
        what = f"ok {op.f} on {op.resource}" + (f"/{op.key}" if op.key else "")
        if token is None:
            violations.append(
                Violation(
                    UNISSUED_TOKEN_ACCEPTED,
                    f"{what} by {op.rep.process} was accepted without a token",
                    [refs(op.rep)],
                )
            )
            continue
        issuers = issued.get(op.resource, {}).get(token)
        if not issuers:
            violations.append(
                Violation(
                    UNISSUED_TOKEN_ACCEPTED,
                    f"{what} by {op.rep.process} was accepted with token {token}, which no ok "
                    f"acquire of {op.resource} returned (an epoch that only fenced is no "
                    "holder's token)",
                    [refs(op.rep)],
                )
            )
            continue
        issue_indexes = [i.applied_index for i in issuers]
        if (
            index is not None
            and all(i is not None for i in issue_indexes)
            and min(issue_indexes) > index
        ):
            violations.append(
                Violation(
                    UNISSUED_TOKEN_ACCEPTED,
                    f"{what} by {op.rep.process} was accepted at applied index {index} with "
                    f"token {token}, which was issued only at index {min(issue_indexes)}",
                    refs.many([op.rep] + [i.rep for i in issuers]),
                )
            )
            continue

    # Stale: sweep each resource in apply order.
    stale: set[int] = set()  # id() of the ops found stale, so the real-time sweep skips them
    for resource, events in established.items():
        events.sort(key=lambda e: e[0])
        best: tuple[int, _Logical] | None = None
        i = 0
        while i < len(events):
            j = i
            while j < len(events) and events[j][0] == events[i][0]:
                j += 1
            for index, token, op in events[i:j]:
                if op.f in FENCED_FUNCTIONS and best is not None and token < best[0]:
                    prior = best[1]
                    stale.add(id(op))
                    violations.append(
                        Violation(
                            STALE_WRITE_ACCEPTED,
                            f"ok {op.f} on {resource}"
                            + (f"/{op.key}" if op.key else "")
                            + f" by {op.rep.process} at applied index {index} carried token "
                            f"{token}, but {prior.f} by {prior.rep.process} had established "
                            f"token {best[0]} at index {prior.applied_index}",
                            refs.many([op.rep, prior.rep]),
                        )
                    )
            for _, token, op in events[i:j]:
                if best is None or token > best[0]:
                    best = (token, op)
            i = j
    return violations + _check_stale_in_real_time(logical, refs, stale)


def _check_stale_in_real_time(
    logical: list[_Logical], refs: _Refs, already: set[int]
) -> list[Violation]:
    """STALE_WRITE_ACCEPTED by real time alone: an ok fenced op whose token is below one that
    an ok op on the same resource had established (issued it, or was accepted carrying it)
    and answered before the fenced op was first invoked. No index is trusted here: a deposed
    leader answering from a divergent log reports indexes below the newer acquisition's.
    Ops in ``already`` (found stale in apply order) are not reported again."""
    # resource -> [(complete_ns, token, op)] of every ok op that established a token
    established: dict[str, list[tuple[int, int, _Logical]]] = collections.defaultdict(list)
    # resource -> [(invoke_ns, token, op)] of every ok fenced op
    fenced: dict[str, list[tuple[int, int, _Logical]]] = collections.defaultdict(list)
    floors = _fencing_floors(logical)
    for resource in {op.resource for op in logical if op.f not in EPOCH_FUNCTIONS}:
        for token, op in floors:
            established[resource].append((op.complete_ns, token, op))
    for op in logical:
        if op.outcome != "ok":
            continue
        if op.f in ISSUING_FUNCTIONS:
            token = op.rep.issued_token()
        elif op.f in FENCED_FUNCTIONS:
            token = op.rep.token
            if token is not None:
                fenced[op.resource].append((op.invoke_ns, token, op))
        else:
            continue
        if token is not None:
            established[op.resource].append((op.complete_ns, token, op))

    violations: list[Violation] = []
    for resource, ops in fenced.items():
        # The token-order check's sweep: the greatest token answered before each invoke.
        by_complete = sorted(established[resource], key=lambda e: e[0])
        pos = 0
        best: tuple[int, _Logical] | None = None
        for invoke, token, op in sorted(ops, key=lambda e: e[0]):
            while pos < len(by_complete) and by_complete[pos][0] < invoke:
                if best is None or by_complete[pos][1] > best[0]:
                    best = (by_complete[pos][1], by_complete[pos][2])
                pos += 1
            if best is None or token >= best[0] or id(op) in already:
                continue
            prior = best[1]
            violations.append(
                Violation(
                    STALE_WRITE_ACCEPTED,
                    f"ok {op.f} on {resource}"
                    + (f"/{op.key}" if op.key else "")
                    + f" by {op.rep.process} carried token {token} (reported applied index "
                    f"{op.applied_index}), but {prior.f} by {prior.rep.process} had answered "
                    f"with token {best[0]} (reported applied index {prior.applied_index}) "
                    "before it was invoked",
                    refs.many([op.rep, prior.rep]),
                )
            )
    return violations


# -- epoch floors and restores ----------------------------------------------------------------


def _fencing_floors(logical: list[_Logical]) -> list[tuple[int, _Logical]]:
    """(epoch, op) of every ok floor / restore that fenced every resource at that epoch."""
    out = []
    for op in logical:
        if op.f not in EPOCH_FUNCTIONS or op.outcome != "ok":
            continue
        epoch = op.rep.result_int("epoch")
        if epoch is None:
            continue
        if op.f == "restore" or op.first.args.get("fence_all", True):
            out.append((epoch, op))
    return out


def _check_epoch_floors(logical: list[_Logical], refs: _Refs, warnings: list[str]) -> list[Violation]:
    """EPOCH_FLOOR_BROKEN (I7, I11): see the module docstring, check 6."""
    issued = [
        (op.rep.issued_token(), op) for op in logical
        if op.f in ISSUING_FUNCTIONS and op.outcome == "ok" and op.rep.issued_token() is not None
    ]
    violations: list[Violation] = []
    for op in logical:
        if op.f not in EPOCH_FUNCTIONS or op.outcome != "ok":
            continue
        epoch = op.rep.result_int("epoch")
        if epoch is None:
            warnings.append(f"ok {op.f} without an epoch in its result (line {op.rep.line}): not checked")
            continue
        floor = op.first.args.get("floor")
        what = f"{op.f} (floor {floor}) by {op.rep.process} answered epoch {epoch}"
        if isinstance(floor, int) and epoch < floor:
            violations.append(Violation(EPOCH_FLOOR_BROKEN, f"{what}, below its floor", [refs(op.rep)]))
        for token, other in issued:
            if other.complete_ns < op.invoke_ns and token >= epoch:
                violations.append(Violation(
                    EPOCH_FLOOR_BROKEN,
                    f"{what}, but {other.f} {other.resource} by {other.rep.process} had already "
                    f"got token {token} before it was invoked: the epoch went back",
                    refs.many([op.rep, other.rep])))
            elif other.invoke_ns > op.complete_ns and token <= epoch:
                violations.append(Violation(
                    EPOCH_FLOOR_BROKEN,
                    f"{what}, yet {other.f} {other.resource} by {other.rep.process}, invoked "
                    f"after that answer, got token {token}: a token at or below the floor was "
                    "issued again",
                    refs.many([op.rep, other.rep])))
    return violations


def _restore_writes(history: History, logical: list[_Logical]) -> list[_Logical]:
    """A restore (not refused) as one write per key: the backup's value, or a delete for a key
    the backup lacks — at the restore's applied index, with its outcome and times."""
    # Keys only ever refused hold nothing before the restore or after it: left out, so a
    # malformed name's refused writes do not become a resource the restore "changed".
    keys = {(op.resource, op.key) for op in history.ops
            if op.key is not None and op.f not in EPOCH_FUNCTIONS and op.outcome != "refused"}
    keys |= {(s.resource, k) for s in history.final_states for k in s.data}
    out: list[_Logical] = []
    for op in logical:
        if op.f != "restore" or op.outcome == "refused":
            continue
        backup = op.first.args.get("backup") or {}
        for resource, key in sorted(keys, key=lambda k: (k[0], k[1] or "")):
            entry = (backup.get(resource) or {}).get(key)
            attempts = []
            for a in op.attempts:
                result = {}
                if a.is_ok:
                    result = {"applied_index": a.applied_index,
                              "version": entry["version"] if entry else 0}
                attempts.append(dataclasses.replace(
                    a, f="write" if entry else "delete", resource=resource, key=key,
                    value=entry["value"] if entry else None, token=None, result=result,
                    op_id=f"{a.op_id}/{resource}/{key}", process=f"{a.process} (restore)",
                    args={"restored_version": entry["version"] if entry else 0}))
            out.append(_Logical(attempts))
    return out


def _check_hostile(logical: list[_Logical], refs: _Refs) -> list[Violation]:
    return [
        Violation(HOSTILE_ACCEPTED,
                  f"{op.first.hazard} {op.f} on {op.resource} by {op.rep.process} (token "
                  f"{op.rep.token}) was accepted; it must be refused",
                  [refs(op.rep)])
        for op in logical if op.first.is_hostile and op.outcome == "ok"
    ]


def _check_refusals_unchanged(history: History, refs: _Refs) -> tuple[list[Violation], dict[str, int]]:
    """REFUSAL_CHANGED_STATE (module docstring, check 7); and how many windows were judged."""
    violations: list[Violation] = []
    stats = {"judged": 0, "not_judged": 0}
    watched = [op for op in history.ops
               if op.is_hostile and op.outcome == "refused" and op.args.get("quiet") and "hwm_after" in op.args]
    quiet = {op.args["quiet"] for op in watched}
    touchers = [o for o in history.ops if o.f in EPOCH_FUNCTIONS or (o.resource in quiet and o.f != "read")]
    for op in watched:
        a = op.args
        start, end = a["watch_from_ns"], a["watch_to_ns"]

        def may_touch(other: Op, op: Op = op, a: dict = a, start: int = start, end: int = end) -> bool:
            if other is op or other.invoke_ns > end:
                return False
            if other.f not in EPOCH_FUNCTIONS and other.resource != a["quiet"]:
                return False
            # an unknown outcome may take effect any time after its invoke
            return other.outcome == "unknown" or other.complete_ns is None or other.complete_ns >= start

        if any(may_touch(other) for other in touchers):
            stats["not_judged"] += 1
            continue
        stats["judged"] += 1
        changed = [f"{name} {a[name + '_before']} -> {a[name + '_after']}" for name in ("hwm", "version")
                   if a[name + "_before"] != a[name + "_after"]]
        if changed:
            violations.append(Violation(
                REFUSAL_CHANGED_STATE,
                f"{op.hazard} {op.f} on {a['quiet']} by {op.process} was refused ({op.reason}) but "
                f"{', '.join(changed)} around it, and nothing else touched the resource then",
                [refs(op)]))
    return violations, stats


def hazard_counts(history: History, logical: list[_Logical]) -> dict[str, Any]:
    """What the run exercised: ops per hazard and outcome, admin ops by outcome, and the
    holders from before a floor / restore that were refused after it."""
    hazards: dict[str, dict[str, int]] = {}
    for op in logical:
        if op.first.hazard:
            per = hazards.setdefault(op.first.hazard, {})
            per[op.outcome] = per.get(op.outcome, 0) + 1
    admin: dict[str, dict[str, int]] = {}
    for op in logical:
        if op.f == "force_release" or op.f in EPOCH_FUNCTIONS:
            per = admin.setdefault(op.f, {})
            per[op.outcome] = per.get(op.outcome, 0) + 1
    floors = _fencing_floors(logical)
    fenced_out = 0
    for op in logical:
        if op.f in FENCED_FUNCTIONS and op.outcome == "refused" and op.first.token is not None:
            if any(op.invoke_ns > f.complete_ns and op.first.token < e for e, f in floors):
                fenced_out += 1
    return {"by_hazard": dict(sorted(hazards.items())), "admin": dict(sorted(admin.items())),
            "holders_fenced_by_floor_or_restore": fenced_out}


# -- 3. durability ----------------------------------------------------------------------------


def _refused_values(logical: list[_Logical]) -> dict[tuple[str, str | None], dict[str, _Logical]]:
    """(resource, key) -> value -> the write refused on every attempt that carried it."""
    refused: dict[tuple[str, str | None], dict[str, _Logical]] = collections.defaultdict(dict)
    maybe: set[tuple[str, str | None, str]] = set()
    for op in logical:
        if op.f != "write" or op.first.value is None:
            continue
        if op.outcome == "refused":
            refused[(op.resource, op.key)][op.first.value] = op
        else:
            maybe.add((op.resource, op.key, op.first.value))
    for resource, key, value in maybe:
        refused.get((resource, key), {}).pop(value, None)
    return refused


def _check_durability(
    history: History,
    logical: list[_Logical],
    refused: dict[tuple[str, str | None], dict[str, _Logical]],
    refs: _Refs,
    warnings: list[str],
) -> tuple[list[Violation], set[int]]:
    """LOST_WRITE and FAILED_WRITE_VISIBLE. Returns the violations and the ids of the reads
    already reported (left out of the linearizability search)."""
    violations: list[Violation] = []
    visible_reads: set[int] = set()
    for op in history.ops:
        if op.f != "read" or not op.is_ok:
            continue
        value = op.read_value()
        bad = refused.get((op.resource, op.key), {}).get(value) if value is not None else None
        if bad is not None:
            visible_reads.add(id(op))
            violations.append(
                Violation(
                    FAILED_WRITE_VISIBLE,
                    f"read of {op.resource}/{op.key} by {op.process} returned {value!r}, the "
                    f"value of a write refused with {bad.first.reason or 'a refusal'}",
                    refs.many([op] + bad.attempts),
                )
            )

    finals: dict[str, FinalState] = {}
    for state in history.final_states:
        previous = finals.get(state.resource)
        if previous is not None and (previous.hwm, previous.data) != (state.hwm, state.data):
            warnings.append(
                f"final_state of {state.resource} recorded twice with different contents; "
                "the last one is checked"
            )
        finals[state.resource] = state

    mutations: dict[tuple[str, str | None], list[_Logical]] = collections.defaultdict(list)
    issued_max: dict[str, tuple[int, _Logical]] = {}
    for op in logical:
        if op.f in KEY_MUTATIONS:
            mutations[(op.resource, op.key)].append(op)
        elif op.f in ISSUING_FUNCTIONS and op.outcome == "ok":
            token = op.rep.issued_token()
            if token is not None and (
                op.resource not in issued_max or token > issued_max[op.resource][0]
            ):
                issued_max[op.resource] = (token, op)

    checked_resources = set(finals)
    for resource, (token, op) in sorted(issued_max.items()):
        state = finals.get(resource)
        # hwm 0 and no data: the resource was forgotten (no lease, no data), and the global
        # epoch, not its hwm, keeps its old tokens refused (check 1 covers the epoch).
        forgotten = state is not None and state.hwm == 0 and not state.data
        if state is not None and state.hwm < token and not forgotten:
            violations.append(
                Violation(
                    LOST_WRITE,
                    f"final hwm of {resource} is {state.hwm}, below token {token} that "
                    f"{op.f} by {op.rep.process} established",
                    [refs(op.rep)],
                )
            )

    keys = {k for k in mutations if k[0] in checked_resources}
    keys |= {(r, k) for r, s in finals.items() for k in s.data}
    # A resource whose every write / delete was refused cannot have changed: nothing to check.
    # Nor can one whose name the server refuses at the door (the hostile role's "hot0 !"),
    # whatever its ops' outcomes: an unknown outcome there is a timeout before the refusal, no
    # entry is ever proposed for it, and an ``ok`` is a hostile-op violation of its own.
    changed = {r for (r, _), ops in mutations.items()
               if _nameable(r) and any(op.outcome != "refused" for op in ops)}
    unchecked = changed - checked_resources
    if unchecked and finals:
        for resource in sorted(unchecked):
            ops = [op for (r, _), group in mutations.items() if r == resource for op in group]
            violations.append(
                Violation(
                    DURABILITY_UNCHECKED,
                    f"no final_state for {resource}, which {len(ops)} write(s) / delete(s) may have "
                    "changed: its durability is not checked",
                    refs.many([op.rep for op in ops[:5]]),
                )
            )
    elif unchecked:
        warnings.append(
            "no final_state for " + ", ".join(sorted(unchecked)) + ": durability not checked"
        )

    for resource, key in sorted(keys, key=lambda k: (k[0], k[1] or "")):
        ops = mutations.get((resource, key), [])
        entry = finals[resource].data.get(key) if key is not None else None
        final_value = None if entry is None else entry.get("value")
        final_version = None if entry is None else entry.get("version")
        where = f"{resource}/{key}"
        if entry is not None:
            bad = refused.get((resource, key), {}).get(final_value)
            if bad is not None:
                violations.append(
                    Violation(
                        FAILED_WRITE_VISIBLE,
                        f"final value of {where} is {final_value!r} (version {final_version}), "
                        f"the value of a write refused with {bad.first.reason or 'a refusal'}",
                        refs.many(bad.attempts),
                    )
                )
                continue
        acked = [o for o in ops if o.outcome == "ok"]
        unknown = [o for o in ops if o.outcome == "unknown"]
        if not acked:
            if entry is not None and not any(
                o.f == "write" and o.first.value == final_value for o in unknown
            ):
                warnings.append(
                    f"final value {final_value!r} of {where} was written by no recorded write"
                )
            continue
        if all(o.applied_index is not None for o in acked):
            latest = max(acked, key=lambda o: o.applied_index)
        else:
            warnings.append(
                f"{where}: ok mutations without applied_index; ordered by version instead"
            )
            latest = max(acked, key=lambda o: o.rep.result_int("version") or 0)
        version = latest.rep.result_int("version") or 0
        expect_value = latest.first.value if latest.f == "write" else None
        facts = [f"version {version}", _fmt_value(expect_value)]
        if latest.applied_index is not None:
            facts.insert(0, f"applied index {latest.applied_index}")
        said = (
            f"the latest acknowledged {latest.f} of {where} ({', '.join(facts)}) by "
            f"{latest.rep.process}"
        )
        # A restore of unknown outcome may have put back the backup's value and version (lower
        # than a write acknowledged before it).
        restored = any(
            "restored_version" in o.first.args
            and o.first.value == final_value
            and (entry is None or o.first.args["restored_version"] == final_version)
            for o in unknown
        )
        if restored:
            continue
        if entry is not None and final_version is not None and final_version < version:
            violations.append(
                Violation(
                    LOST_WRITE,
                    f"final version of {where} is {final_version} ({final_value!r}), below "
                    f"{said}",
                    refs.many([latest.rep]),
                )
            )
            continue
        if final_value == expect_value and (
            entry is None or final_version is None or final_version >= version
        ):
            # The final state is the latest acknowledged mutation. (The same value at a higher
            # version would mean the write was applied twice: DUPLICATE_EFFECT's business,
            # reported when the answers show it.)
            continue
        later = (
            entry is None
            or latest.f == "delete"
            or final_version is None
            or final_version > version
        )
        explained = later and any(
            (o.f == "delete" and entry is None)
            or (o.f == "write" and entry is not None and o.first.value == final_value)
            for o in unknown
        )
        if explained:
            continue
        shown = (
            "absent" if entry is None else f"{final_value!r} (version {final_version})"
        )
        violations.append(
            Violation(
                LOST_WRITE,
                f"final state of {where} is {shown}, which does not reflect {said}, and no "
                f"unknown-outcome write could explain it",
                refs.many([latest.rep]),
            )
        )
    return violations, visible_reads


# -- 4. linearizability -----------------------------------------------------------------------


def _check_linearizability(
    history: History,
    logical: list[_Logical],
    skip_reads: set[int],
    refs: _Refs,
    warnings: list[str],
    max_states: int,
) -> tuple[list[Violation], dict[str, Any]]:
    per_key: dict[tuple[str, str | None], list[lin.RegisterOp]] = collections.defaultdict(list)
    for op in logical:
        if op.f not in KEY_MUTATIONS or op.outcome == "refused":
            continue
        value = op.first.value if op.f == "write" else None
        per_key[(op.resource, op.key)].append(
            lin.RegisterOp(
                kind=lin.WRITE,
                value=value,
                invoke=op.invoke_ns,
                complete=op.complete_ns,
                optional=op.outcome != "ok",
                ref=op,
            )
        )
    for op in history.ops:
        if op.f != "read" or not op.is_ok or id(op) in skip_reads:
            continue
        per_key[(op.resource, op.key)].append(
            lin.RegisterOp(
                kind=lin.READ,
                value=op.read_value(),
                invoke=op.invoke_ns,
                complete=op.complete_ns,
                ref=op,
            )
        )

    def rep(register_op: lin.RegisterOp) -> Op:
        ref = register_op.ref
        return ref.rep if isinstance(ref, _Logical) else ref

    def describe(register_op: lin.RegisterOp) -> str:
        op = rep(register_op)
        if op.f == "read":
            text = f"read -> {_fmt_value(register_op.value)}"
        else:
            text = f"{op.f} := {_fmt_value(register_op.value)}" if op.f == "write" else "delete"
            if register_op.optional:
                text = f"unknown-outcome {text}"
        first = register_op.ref.invoke_ns if isinstance(register_op.ref, _Logical) else op.invoke_ns
        done = "?" if register_op.optional else register_op.complete
        return f"{text} by {op.process} [{first}, {done}]"

    def describe_value(value: Any) -> str:
        if value is lin.ANY:
            return "any value (after an earlier violation)"
        if value is lin.UNOBSERVED:
            return "a value none of these ops reads"
        return _fmt_value(value)

    violations: list[Violation] = []
    stats = collections.Counter()
    started = time.perf_counter()
    for (resource, key), ops in sorted(per_key.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        result = lin.check_register(ops, None, max_states=max_states)
        stats["keys"] += 1
        stats["ops"] += result.ops_checked
        stats["unknown_dropped"] += result.optional_dropped
        stats["segments"] += result.segments
        stats["states"] += result.states
        stats["largest_segment"] = max(stats["largest_segment"], result.largest_segment)
        for anomaly in result.read_anomalies:
            said = f"{resource}/{key}: {describe(anomaly.read)} "
            if anomaly.kind == "never-written":
                detail = said + "returned a value no write wrote"
                involved = [anomaly.read]
            elif anomaly.kind == "future":
                detail = (
                    said + "returned the value of "
                    + "; ".join(describe(w) for w in anomaly.writers)
                    + ", invoked only after the read completed"
                )
                involved = [anomaly.read, *anomaly.writers]
            else:
                parts = []
                for source, over in anomaly.overwrites:
                    origin = "the initial (absent) value" if source is None else describe(source)
                    parts.append(f"{describe(over)} replaced {origin} before the read began")
                detail = said + "returned a value that was already overwritten: " + "; ".join(parts)
                involved = [anomaly.read]
                for source, over in anomaly.overwrites:
                    involved += ([] if source is None else [source]) + [over]
            unique = {id(rep(o)): rep(o) for o in involved}
            violations.append(Violation(NOT_LINEARIZABLE, detail, refs.many(unique.values())))
        for failure in result.failures:
            tail = failure.linearized[-3:]
            first = min(o.invoke for o in failure.ops)
            detail = (
                f"{resource}/{key}: no linearization for the {len(failure.ops)} op(s) from "
                f"time {first} until nothing is in flight (everything before linearizes). "
                + (
                    "Before them the register holds "
                    + " or ".join(describe_value(v) for v in failure.start_values)
                    + ". "
                    if failure.start_values
                    else ""
                )
                + (
                    "After " + "; ".join(describe(o) for o in tail) + ", it holds "
                    if tail
                    else "It holds "
                )
                + describe_value(failure.value_then)
                + ", and none of the ops that must come next fits: "
                + "; ".join(describe(o) for o in failure.next_candidates)
                + (
                    ". It cannot change, as nothing pending writes it again for the later "
                    + "; ".join(describe(o) for o in failure.holding_reads)
                    if failure.holding_reads
                    else ""
                )
            )
            shown = (
                failure.ops
                if len(failure.ops) <= 20
                else tail + failure.next_candidates + failure.holding_reads
            )
            unique = {id(rep(o)): rep(o) for o in shown}
            violations.append(Violation(NOT_LINEARIZABLE, detail, refs.many(unique.values())))
        for undecided in result.inconclusive:
            warnings.append(
                f"{resource}/{key}: linearizability of a segment of {len(undecided.ops)} ops "
                f"not decided within {max_states} states (inconclusive, not a violation)"
            )
    stats_dict: dict[str, Any] = dict(stats)
    stats_dict["seconds"] = round(time.perf_counter() - started, 3)
    return violations, stats_dict


# -- 5. op_id dedup ---------------------------------------------------------------------------


_EFFECT_FIELDS = ("applied_index", "version", "token")


def _effect(op: Op) -> dict[str, Any]:
    effect = {name: op.result[name] for name in _EFFECT_FIELDS if op.result.get(name) is not None}
    if op.f == "force_release" and op.result.get("hwm") is not None:
        effect["hwm"] = op.result["hwm"]
    return effect


def _check_dedup(history: History, refs: _Refs) -> list[Violation]:
    by_id: dict[str, list[Op]] = collections.defaultdict(list)
    for op in history.ops:
        if op.is_ok and op.op_id is not None and op.f != "read":
            by_id[op.op_id].append(op)
    violations = []
    for op_id, ops in by_id.items():
        if len(ops) < 2:
            continue
        effects = [_effect(op) for op in ops]
        differ = set()
        for a in range(len(ops)):
            for b in range(a + 1, len(ops)):
                for name in set(effects[a]) & set(effects[b]):
                    if effects[a][name] != effects[b][name]:
                        differ.add(name)
        if differ:
            shown = "; ".join(
                f"{op.process} at {op.complete_ns}: "
                + ", ".join(f"{k}={v}" for k, v in sorted(effect.items()))
                for op, effect in zip(ops, effects, strict=True)
            )
            violations.append(
                Violation(
                    DUPLICATE_EFFECT,
                    f"op_id {op_id} ({ops[0].f} {ops[0].resource}"
                    + (f"/{ops[0].key}" if ops[0].key else "")
                    + f") got {len(ops)} ok answers that differ in "
                    + ", ".join(sorted(differ))
                    + f": {shown}",
                    refs.many(ops),
                )
            )
    return violations


# -- 6. nodes ---------------------------------------------------------------------------------


def _check_leaders_per_term(history: History) -> list[Violation]:
    """TWO_LEADERS_IN_TERM from the Status samples, then from the members' own reports."""
    violations = []
    split: set[int] = set()
    leaders: dict[int, dict[str, int]] = collections.defaultdict(dict)
    for sample in history.nodes:
        if sample.is_leader:
            leaders[sample.term].setdefault(sample.node, sample.t_ns)
    for term in sorted(leaders):
        nodes = leaders[term]
        if len(nodes) > 1:
            split.add(term)
            shown = ", ".join(f"{n} (first seen at {t})" for n, t in sorted(nodes.items()))
            violations.append(
                Violation(TWO_LEADERS_IN_TERM, f"term {term} had {len(nodes)} leaders: {shown}")
            )
    reported: dict[int, dict[str, list[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for report in history.leader_reports:
        where = f"{report.node}" + (f" (log line {report.log_line})" if report.log_line else "")
        reported[report.term][report.leader].append(where)
    for term in sorted(set(reported) - split):
        named = reported[term]
        if len(named) > 1:
            shown = "; ".join(
                f"{leader} (reported by {', '.join(by)})" for leader, by in sorted(named.items())
            )
            violations.append(
                Violation(
                    TWO_LEADERS_IN_TERM,
                    f"term {term}: the members' own reports name {len(named)} leaders: {shown}",
                )
            )
    return violations


def _check_nodes(history: History) -> list[Violation]:
    violations = _check_leaders_per_term(history)

    last: dict[str, Any] = {}
    for final in history.finals:
        last[final.node] = final
    if len(last) > 1:
        by_index: dict[int, dict[str, list[str]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )
        for final in last.values():
            by_index[final.applied_index][final.digest].append(final.node)
        for index in sorted(by_index):
            digests = by_index[index]
            if len(digests) > 1:
                shown = "; ".join(
                    f"{d}: {', '.join(sorted(n))}" for d, n in sorted(digests.items())
                )
                violations.append(
                    Violation(
                        REPLICAS_DIVERGED,
                        f"replicas at applied index {index} have different digests: {shown}",
                    )
                )
        if len(by_index) > 1:
            shown = ", ".join(
                f"{f.node}={f.applied_index}" for f in sorted(last.values(), key=lambda f: f.node)
            )
            violations.append(
                Violation(
                    REPLICAS_DIVERGED,
                    f"replicas did not converge to one applied index: {shown}",
                )
            )
    return violations


# -- the whole check --------------------------------------------------------------------------


def check_history(
    history: History | Iterable[Any], *, max_states: int = DEFAULT_MAX_STATES
) -> Report:
    """Run every check; see the module docstring."""
    started = time.perf_counter()
    if not isinstance(history, History):
        history = History.of(history)
    refs = _Refs(history.ops)
    warnings: list[str] = []
    logical = _logical_ops(history.ops)
    # A restore writes every key: checked like writes by durability and linearizability.
    with_restores = logical + _restore_writes(history, logical)
    refused = _refused_values(with_restores)

    violations: list[Violation] = []
    violations += _check_tokens(logical, refs, warnings)
    violations += _check_fencing(logical, refs)
    durability, visible_reads = _check_durability(history, with_restores, refused, refs, warnings)
    violations += durability
    lin_violations, lin_stats = _check_linearizability(
        history, with_restores, visible_reads, refs, warnings, max_states
    )
    violations += lin_violations
    violations += _check_dedup(history, refs)
    violations += _check_epoch_floors(logical, refs, warnings)
    violations += _check_hostile(logical, refs)
    violations += [Violation(kind, detail, refs.many(ops) + [watch_check.event_ref(e) for e in events])
                   for kind, detail, ops, events in watch_check.check_watches(history)]
    unchanged, refusals_watched = _check_refusals_unchanged(history, refs)
    violations += unchanged
    violations += _check_nodes(history)

    by_f: dict[str, dict[str, int]] = {}
    for op in history.ops:
        by_f.setdefault(op.f, {}).setdefault(op.outcome, 0)
        by_f[op.f][op.outcome] += 1
    by_kind = collections.Counter(v.kind for v in violations)
    summary = {
        "ops": len(history.ops),
        "ops_by_f_outcome": {f: dict(sorted(c.items())) for f, c in sorted(by_f.items())},
        "logical_ops": len(logical),
        "node_samples": len(history.nodes),
        "leader_reports": len(history.leader_reports),
        "terms_reported": len({r.term for r in history.leader_reports}),
        "final_replicas": len(history.finals),
        "final_states": len(history.final_states),
        "faults": len(history.faults),
        "linearizability": lin_stats,
        "hazards": {**hazard_counts(history, logical), "refusals_watched": refusals_watched},
        "violations": len(violations),
        "violations_by_kind": {k: by_kind[k] for k in VIOLATION_KINDS if by_kind[k]},
        "seconds": round(time.perf_counter() - started, 3),
    }
    return Report(violations=violations, summary=summary, warnings=warnings)


def check_file(path: str, *, max_states: int = DEFAULT_MAX_STATES) -> Report:
    """Read and check a JSONL history; HistoryError if it cannot be read."""
    return check_history(read_history(path), max_states=max_states)


# -- CLI --------------------------------------------------------------------------------------


def format_report(report: Report, *, max_shown: int = 50) -> str:
    s = report.summary
    lines = []
    ops = ", ".join(
        f"{f} " + "/".join(f"{n} {o}" for o, n in outcomes.items())
        for f, outcomes in s["ops_by_f_outcome"].items()
    )
    lines.append(f"history: {s['ops']} ops ({ops or 'none'})")
    lines.append(
        f"         {s['node_samples']} node samples, {s['faults']} faults, "
        f"{s['final_replicas']} final replicas, {s['final_states']} final states"
    )
    lz = s["linearizability"]
    lines.append(
        f"linearizability: {lz.get('keys', 0)} keys, {lz.get('ops', 0)} ops, "
        f"{lz.get('segments', 0)} segments (largest {lz.get('largest_segment', 0)}), "
        f"{lz.get('states', 0)} states, {lz.get('unknown_dropped', 0)} unobservable "
        f"unknown ops dropped, {lz.get('seconds', 0)} s"
    )
    hz = s.get("hazards") or {}
    lines.append(
        "hazards: " + (", ".join(f"{h} " + "/".join(f"{n} {o}" for o, n in c.items())
                                 for h, c in hz.get("by_hazard", {}).items()) or "none")
        + "; admin: " + (", ".join(f"{f} " + "/".join(f"{n} {o}" for o, n in c.items())
                                   for f, c in hz.get("admin", {}).items()) or "none")
        + f"; holders fenced by a floor / restore: {hz.get('holders_fenced_by_floor_or_restore', 0)}"
    )
    lines.append(f"checked in {s['seconds']} s")
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    if report.ok:
        lines.append("OK: no violations")
        return "\n".join(lines)
    lines.append(f"VIOLATIONS: {len(report.violations)}")
    for kind, count in s["violations_by_kind"].items():
        lines.append(f"  {kind}: {count}")
    for violation in report.violations[:max_shown]:
        lines.append(f"[{violation.kind}] {violation.detail}")
        for ref in violation.ops[:8]:
            where = f"line {ref['line']}" if "line" in ref else f"op #{ref['index']}"
            fields = " ".join(
                f"{k}={ref[k]}" for k in ("process", "f", "op_id", "key", "value", "token",
                                         "outcome", "reason") if k in ref
            )
            lines.append(f"    {where}: {fields} result={ref.get('result', {})}")
        if len(violation.ops) > 8:
            lines.append(f"    ... and {len(violation.ops) - 8} more ops")
    if len(report.violations) > max_shown:
        lines.append(f"... and {len(report.violations) - max_shown} more (see --json)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.check",
        description="Check a recorded chaos history (JSONL) against the fencing invariants.",
    )
    parser.add_argument("history", help="the JSONL history file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--max-states",
        type=int,
        default=DEFAULT_MAX_STATES,
        help="register search budget per segment (default %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        report = check_file(args.history, max_states=args.max_states)
    except HistoryError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        else:
            print(f"cannot check {args.history}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str))
    else:
        print(format_report(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

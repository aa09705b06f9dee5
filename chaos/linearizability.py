"""Linearizability of one register (one key), WGL-style.

The model: a register whose value is any hashable, ``None`` meaning "absent" (the initial value);
a write (or a delete, which writes ``None``) sets it, a read returns it.

**The search** is Wing & Gong's depth-first search with Lowe's memoization: a search state is
``(set of linearized ops, register value)``; from a state, any not yet linearized op that no
other pending op precedes in real time (``p.complete < o.invoke``; equal times count as
concurrent) may be linearized next, if the model allows it (a read only if it returns the
current value). A state already explored is never explored again, so the cost is bounded by the
number of distinct states, not the number of interleavings. The search stops at the first
complete linearization.

What keeps it fast on long, highly concurrent histories (each rule keeps the answer exact; the
tests compare it with a brute-force oracle):

* **Compact states.** Ops are sorted by invoke time; every op before the first pending one is
  linearized, so a state is ``(index of the first pending op, bit set of the linearized ops
  after it, value)``: its size is the number of ops in flight, not the history length.
* **Segments.** The history is cut wherever no op is in flight (the next invoke is after every
  earlier complete). At a cut the state is just the register value. Failures are reported
  against segments.
* **Free steps.** Taken at once, without branching, because moving them earlier changes
  nothing any later op can see and only removes constraints: a read of the current value; an
  unknown-outcome write whose value no pending read returns (as skipped); and, while the current
  value is one no pending read returns, a write whose value no pending read returns.
* **Unobserved values are one value.** A value no pending read returns can never be seen again,
  so all such values are folded into one (``UNOBSERVED``), which merges states.
* **Dead ends cut early.** A state is abandoned when a read that may go next returns a value no
  pending write can produce, and a write may not replace a value that a pending read still
  returns when no pending write can bring it back.
* **Order of tries.** Writes whose value a read that may go next returns are tried first, then
  the other writes by earliest complete.
* **Reads wrong on their own** are found before any search (``ReadAnomaly``): a value no write
  wrote, a value only written after the read completed, or a value every source of which was
  overwritten — in real time — before the read began. (A search proves those only by
  exhausting every ordering of the ops before the read.) They are reported once and left out
  of the search.

**Unknown outcomes.** Ops whose outcome is unknown (the client timed out or crashed) are
*optional*: they may take effect at any time after their invoke — even after the client gave
up — or never. This module's choice, and why it is exact:

* an unknown **read** tells nothing and is dropped;
* an unknown **write** of value ``v`` matters only if some read returns ``v``: if a linearization
  places it after every read that returns ``v``, nothing observes it and it may as well never
  have happened (a read placed after it and before the next write would have to return ``v``).
  So it is dropped when no read returning ``v`` completes after its invoke, and otherwise it
  gets the deadline ``max(complete of those reads)`` instead of "never completes": it must be
  decided — take effect, or be skipped — by then. It is only tried (takes effect) right before
  a read of its value that may go next: a linearization where it takes effect earlier can
  move it there, since between it and the first read that sees it nothing else can change the
  value. Once no read of its value is pending it is skipped for free.
  Giving unknown ops an infinite complete time instead ("linearize them at the end") would
  keep one crashed client's write in flight until the end of the run: the history could never
  be cut into segments and every state would carry "has it happened yet" for the rest of the
  run, doubling the states for each such op.

With unique written values (the chaos clients write a fresh value every time) the deadline of an
unknown write is usually close to its invoke. An unknown delete writes ``None``, which every read
of an absent key returns, so its deadline can be long; still exact, just more ops in flight.

**Failures.** If the history cannot be linearized, the first segment at which a prefix of the
history stops being linearizable is found (by bisection: a prefix that fails stays failing), and
described starting from the values the history before it can leave in the register. Checking
then resumes after that segment from an unknown value (``ANY``: the first read fixes it), so
one anomaly yields one report and later segments are still checked — at the price that an
anomaly right after another one may go unseen until the key is written again. A search that
exceeds ``max_states`` is reported as inconclusive — never as a violation — and checking
resumes after the segment where it stood.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Hashable, Iterable, Sequence


class _Unknown:
    """The register value after a segment that failed or was not decided: any value."""

    _instance = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<any value>"


ANY = _Unknown()


class _Unobserved:
    """The register value when no pending read can return it: every such value behaves the
    same from then on (nothing will ever see it), so search states treat them as one."""

    _instance = None

    def __new__(cls) -> "_Unobserved":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<a value no later read returns>"


UNOBSERVED = _Unobserved()

WRITE = "write"
READ = "read"


@dataclasses.dataclass(frozen=True, eq=False)
class RegisterOp:
    """One operation on the register.

    ``kind`` is ``"write"`` (a delete is a write of None) or ``"read"``; ``value`` is the value
    written or the value the read returned (None = absent); ``complete`` is None only for an
    optional op that never completed. ``ref`` is anything the caller wants back in reports.
    """

    kind: str
    value: Hashable
    invoke: int
    complete: int | None
    optional: bool = False
    ref: Any = None

    def __post_init__(self) -> None:
        if self.kind not in (WRITE, READ):
            raise ValueError(f"kind must be 'write' or 'read', not {self.kind!r}")
        if self.complete is None and not self.optional:
            raise ValueError("an op that must take effect needs a complete time")
        if self.complete is not None and self.complete < self.invoke:
            raise ValueError("complete before invoke")


@dataclasses.dataclass
class SegmentReport:
    """A segment that could not be linearized (or, if inconclusive, not decided in budget)."""

    ops: list[RegisterOp]
    start_values: list[Any]
    #: The ops of this segment that took effect on the furthest search path, in linearization
    #: order, and the register value after them.
    linearized: list[RegisterOp]
    value_then: Any
    #: The ops that could have gone next after that prefix; none fits the model.
    next_candidates: list[RegisterOp]
    states: int
    inconclusive: bool = False
    #: Later reads of ``value_then`` that keep it from changing (nothing pending writes it
    #: again), if that is why the prefix cannot go on.
    holding_reads: list[RegisterOp] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ReadAnomaly:
    """A read that no linearization can explain, found without a search.

    ``kind`` is ``"never-written"`` (no write wrote its value, and it is not the initial one),
    ``"future"`` (every write of its value was invoked after the read completed) or
    ``"overwritten"`` (every write of its value — or the initial value — was followed, in real
    time, by a write of another value that completed before the read was invoked; a value
    written once, even with unknown outcome, took effect by the time the first read that
    could see it completed).
    ``overwrites`` pairs each possible source of the value (None for the initial value) with
    one write that overwrote it.
    """

    kind: str
    read: RegisterOp
    writers: list[RegisterOp]
    overwrites: list[tuple[RegisterOp | None, RegisterOp]] = dataclasses.field(
        default_factory=list
    )


@dataclasses.dataclass
class RegisterResult:
    ok: bool
    failures: list[SegmentReport]
    inconclusive: list[SegmentReport]
    read_anomalies: list[ReadAnomaly]
    ops_checked: int
    optional_dropped: int
    segments: int
    largest_segment: int
    states: int


# -- preparation ------------------------------------------------------------------------------


def _read_anomalies(ops: list[RegisterOp], initial: Any) -> list[ReadAnomaly]:
    """Reads that are wrong on their own (see ReadAnomaly). Exact: each kind rules out every
    linearization. Found up front because a search proves them only by exhausting every
    ordering of the ops before the read, which in a long stretch of concurrent ops is
    hopeless; they are then left out of the search, so each is reported once."""
    writers: dict[Any, list[RegisterOp]] = {}
    for op in ops:
        if op.kind == WRITE:
            writers.setdefault(op.value, []).append(op)
    # Writes that surely took effect, by invoke; for every suffix the two earliest completes
    # with different values (to find "a write of another value" quickly).
    required = sorted(
        (op for op in ops if op.kind == WRITE and not op.optional), key=lambda o: o.invoke
    )
    invokes = [op.invoke for op in required]
    best: list[tuple[RegisterOp | None, RegisterOp | None]] = [(None, None)] * (len(required) + 1)
    for i in range(len(required) - 1, -1, -1):
        first, second = best[i + 1]
        op = required[i]
        candidates = [c for c in (op, first, second) if c is not None]
        candidates.sort(key=lambda c: c.complete)
        top = candidates[0]
        other = next((c for c in candidates[1:] if c.value != top.value), None)
        best[i] = (top, other)

    def overwriter(after: int | None, before: int, value: Any) -> RegisterOp | None:
        """A surely-applied write of another value than ``value``, invoked after ``after``
        (None: any time) and completed before ``before``."""
        start = 0 if after is None else bisect.bisect_right(invokes, after)
        first, second = best[start]
        for c in (first, second):
            if c is not None and c.value != value:
                return c if c.complete < before else None
        return None

    # When a value has one writer and is not the initial value, that write took effect once,
    # before the first read that could see it completed — even if its own outcome is unknown.
    read_completes: dict[Any, list[int]] = {}
    for op in ops:
        if op.kind == READ and not op.optional:
            read_completes.setdefault(op.value, []).append(op.complete)
    for completes in read_completes.values():
        completes.sort()

    def effect_by(write: RegisterOp) -> int | None:
        """A time by which ``write`` surely took effect if it is the source of a read."""
        bounds = [] if write.optional else [write.complete]
        if len(writers.get(write.value, ())) == 1 and write.value != initial:
            completes = read_completes.get(write.value, [])
            k = bisect.bisect_left(completes, write.invoke)  # reads that could see it
            if k < len(completes):
                bounds.append(completes[k])
        return min(bounds) if bounds else None

    found = []
    for read in ops:
        if read.kind != READ or read.optional:
            continue
        assert read.complete is not None
        all_writers = writers.get(read.value, [])
        sources = [w for w in all_writers if w.invoke <= read.complete]
        initial_source = read.value == initial
        if not sources and not initial_source:
            kind = "future" if all_writers else "never-written"
            found.append(ReadAnomaly(kind, read, all_writers))
            continue
        deadlines = [effect_by(w) for w in sources]
        if any(d is None for d in deadlines):
            continue  # an unknown-outcome write may take effect just before the read
        pairs: list[tuple[RegisterOp | None, RegisterOp]] = []
        for source, deadline in ([(None, None)] if initial_source else []) + list(
            zip(sources, deadlines, strict=True)
        ):
            over = overwriter(deadline, read.invoke, read.value)
            if over is None:
                break
            pairs.append((source, over))
        else:
            found.append(ReadAnomaly("overwritten", read, sources, pairs))
    return found


def _prepare(ops: Iterable[RegisterOp]) -> tuple[list[RegisterOp], int]:
    """Drop what cannot matter and give every optional write a finite deadline (see module
    docstring). Returns the ops to search (in invoke order) and how many were dropped."""
    required: list[RegisterOp] = []
    optional: list[RegisterOp] = []
    for op in ops:
        (optional if op.optional else required).append(op)
    last_read_of: dict[Hashable, int] = {}
    for op in required:
        if op.kind == READ:
            assert op.complete is not None
            seen = last_read_of.get(op.value)
            if seen is None or op.complete > seen:
                last_read_of[op.value] = op.complete
    kept = list(required)
    dropped = 0
    for op in optional:
        deadline = last_read_of.get(op.value) if op.kind == WRITE else None
        if deadline is None or deadline < op.invoke:
            dropped += 1  # an unknown read, or a write nobody could have observed
            continue
        kept.append(dataclasses.replace(op, complete=deadline))
    kept.sort(key=lambda o: (o.invoke, o.complete))
    return kept, dropped


def _segments(ops: Sequence[RegisterOp]) -> Iterable[list[RegisterOp]]:
    """Cut ops (in invoke order, all with a complete time) where nothing is in flight."""
    current: list[RegisterOp] = []
    horizon = None
    for op in ops:
        if current and op.invoke > horizon:
            yield current
            current = []
            horizon = None
        current.append(op)
        horizon = op.complete if horizon is None else max(horizon, op.complete)
    if current:
        yield current


# -- the search -------------------------------------------------------------------------------


class _Budget(Exception):
    pass


@dataclasses.dataclass
class _Failure:
    deepest: tuple[int, int, Any]
    parents: dict[tuple[int, int, Any], tuple[Any, tuple[tuple[int, bool], ...]]]
    candidates: list[int]
    states: int
    #: pending reads of the deepest state's value that nothing pending can write again
    holding: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Success:
    states: int
    end_value: Any


def _search(
    ops: list[RegisterOp],
    start_values: Iterable[Any],
    max_states: int,
    *,
    exclude_ends: frozenset[Any] = frozenset(),
    fold: bool = True,
) -> _Failure | _Success:
    """Depth-first search for one linearization of ``ops`` (invoke order, all with a complete
    time) starting from any of ``start_values``, ending with a value not in ``exclude_ends``.
    ``fold=False`` keeps every value as it is instead of folding the ones no pending read
    returns into UNOBSERVED (slower; for reports, which show real values). Returns _Success
    or _Failure; raises _Budget(_Failure) past ``max_states``."""
    n = len(ops)
    invoke = [op.invoke for op in ops]
    complete = [op.complete for op in ops]
    is_read = [op.kind == READ for op in ops]
    value = [op.value for op in ops]
    optional = [op.optional for op in ops]
    by_complete = sorted(range(n), key=lambda i: complete[i])
    # value -> bit set of the ops that write / read it
    writers: dict[Any, int] = {}
    readers: dict[Any, int] = {}
    for i in range(n):
        table = readers if is_read[i] else writers
        table[value[i]] = table.get(value[i], 0) | 1 << i

    def linearized(low: int, rel: int, j: int) -> bool:
        return j < low or bool(rel >> (j - low) & 1)

    def any_pending(ops_bits: int | None, low: int, rel: int) -> bool:
        """Is any op of the bit set ``ops_bits`` not linearized?"""
        return bool(ops_bits and (ops_bits >> low) & ~rel)

    def canonical(val: Any, low: int, rel: int) -> Any:
        if (
            not fold
            or val is ANY
            or val is UNOBSERVED
            or any_pending(readers.get(val), low, rel)
        ):
            return val
        return UNOBSERVED

    def add(low: int, rel: int, j: int) -> tuple[int, int]:
        rel |= 1 << (j - low)
        if rel & 1:  # the first pending op is done: move past every done op
            ones = (rel ^ (rel + 1)).bit_length() - 1
            rel >>= ones
            low += ones
        return low, rel

    def candidates(low: int, rel: int, hint: int) -> tuple[list[int], int]:
        """Pending ops that no pending op precedes. ``hint`` indexes ``by_complete``: every op
        before it is linearized (it only grows along a search path)."""
        while linearized(low, rel, by_complete[hint]):
            hint += 1
        end = bisect.bisect_right(invoke, complete[by_complete[hint]], low)
        pending = ~rel & ((1 << (end - low)) - 1)  # zero bits of rel inside the window
        found = []
        while pending:
            bit = pending & -pending
            found.append(low + bit.bit_length() - 1)
            pending ^= bit
        return found, hint

    def free(i: int, val: Any, low: int, rel: int) -> bool | None:
        """May op i go next without branching? None if not; else whether it takes effect.

        Free are: a read of the current value; an unknown-outcome write no pending read
        observes (skipped: nothing could see it); and, while the current value is unobserved,
        a write no pending read observes. Each changes nothing any later op can see and only
        removes a constraint, so a linearization that places it later has one that places it
        now. (A write of the current value is not free: placed later, it would restore the
        value after another write.)"""
        if is_read[i]:
            return True if value[i] == val and val is not ANY and val is not UNOBSERVED else None
        if any_pending(readers.get(value[i]), low, rel):
            return None
        if optional[i]:
            return False  # (its deadline keeps every read that could see it in these ops)
        return True if val is UNOBSERVED else None

    Key = tuple  # (low, rel, value)

    def _failure(at: Key) -> _Failure:
        low, rel, val = at
        cands = candidates(low, rel, 0)[0] if low < n else []
        holding: list[int] = []
        if val is not ANY and val is not UNOBSERVED and not any_pending(writers.get(val), low, rel):
            bits = (readers.get(val, 0) >> low) & ~rel
            while bits and len(holding) < 3:
                bit = bits & -bits
                holding.append(low + bit.bit_length() - 1)
                bits ^= bit
        return _Failure(at, parents, cands, len(parents), holding)

    parents: dict[Key, tuple[Any, tuple[tuple[int, bool], ...]]] = {}
    deepest: Key = (0, 0, None)
    deepest_progress = -1
    stack: list[tuple[int, int, Any, int, Any, tuple[tuple[int, bool], ...]]] = [
        (0, 0, canonical(v, 0, 0), 0, None, ()) for v in start_values
    ]
    while stack:
        low, rel, val, hint, parent, steps = stack.pop()
        key = (low, rel, val)
        if key in parents:
            continue
        parents[key] = (parent, steps)
        taken: list[tuple[int, bool]] = []
        while low < n:
            cands, hint = candidates(low, rel, hint)
            now = [(i, effect) for i in cands
                   if (effect := free(i, val, low, rel)) is not None]
            if not now:
                break
            for i, effect in now:
                low, rel = add(low, rel, i)
                taken.append((i, effect))
            val = canonical(val, low, rel)
        if taken:
            closed = (low, rel, val)
            if closed in parents:
                continue
            parents[closed] = (key, tuple(taken))
            key = closed
        if len(parents) > max_states:
            raise _Budget(_failure(deepest))
        progress = low + rel.bit_count()
        if progress > deepest_progress:
            deepest, deepest_progress = key, progress
        if low == n:
            if val in exclude_ends:
                continue
            return _Success(len(parents), val)
        cands, hint = candidates(low, rel, hint)
        wanted = {value[i] for i in cands if is_read[i]}
        if val is not ANY and any(
            v != val and not any_pending(writers.get(v), low, rel) for v in wanted
        ):
            continue  # a read that may go next returns a value no pending write can produce
        # Overwriting an observed value is fatal if nothing pending can write it again.
        may_leave = (
            val is ANY
            or val is UNOBSERVED
            or not any_pending(readers.get(val), low, rel)
            or any_pending(writers.get(val), low, rel)
        )
        tries: list[tuple[tuple[int, int], int, Any, bool]] = []
        for i in cands:
            if is_read[i]:
                if val is ANY:
                    tries.append(((0, complete[i]), i, value[i], True))
                continue  # (a read of the current value was taken above)
            if not may_leave and value[i] != val:
                continue
            if value[i] in wanted:
                rank = 1
            elif optional[i]:
                # An unknown-outcome write that takes effect can always be moved to just
                # before the first read that sees it, and that read may then go next: so it
                # is only tried when such a read is a candidate. One nobody sees is skipped
                # for free (above) once no read of its value is pending.
                continue
            else:
                rank = 2
            tries.append(((rank, complete[i]), i, value[i], True))
        tries.sort(key=lambda t: t[0], reverse=True)  # the stack pops the best try first
        for _, i, new_val, effect in tries:
            new_low, new_rel = add(low, rel, i)
            new_val = canonical(new_val, new_low, new_rel)
            stack.append((new_low, new_rel, new_val, hint, key, ((i, effect),)))
    return _failure(deepest)


def _path(failure: _Failure) -> list[tuple[int, bool]]:
    """The steps (op index, took effect) from a start state to the deepest state."""
    steps: list[tuple[int, bool]] = []
    key = failure.deepest
    while key is not None and key in failure.parents:
        parent, taken = failure.parents[key]
        steps.extend(reversed(taken))
        key = parent
    steps.reverse()
    return steps


def _report(
    ops: list[RegisterOp], failure: _Failure, starts: list[Any], inconclusive: bool
) -> SegmentReport:
    """Describe a segment ``ops`` where ``failure`` (a search over just these ops) got stuck."""
    return SegmentReport(
        ops=list(ops),
        start_values=starts,
        linearized=[ops[i] for i, effect in _path(failure) if effect],
        value_then=failure.deepest[2],
        next_candidates=[ops[i] for i in failure.candidates],
        states=failure.states,
        inconclusive=inconclusive,
        holding_reads=[ops[i] for i in failure.holding],
    )


class _Checker:
    """One register history cut into segments; see check_register."""

    #: How many end values of the history before a failing segment to list in a report.
    MAX_START_VALUES = 8

    def __init__(self, prepared: list[RegisterOp], max_states: int) -> None:
        self.ops = prepared
        self.max_states = max_states
        self.bounds: list[int] = [0]  # segment j is ops[bounds[j]:bounds[j + 1]]
        for segment in _segments(prepared):
            self.bounds.append(self.bounds[-1] + len(segment))
        self.states = 0

    @property
    def segment_count(self) -> int:
        return len(self.bounds) - 1

    def search(self, first: int, end: int, starts: list[Any], **kwargs: Any) -> _Failure | _Success:
        """Search segments ``first`` .. ``end - 1``."""
        ops = self.ops[self.bounds[first]:self.bounds[end]]
        try:
            outcome = _search(ops, starts, self.max_states, **kwargs)
        except _Budget as exc:
            self.states += exc.args[0].states
            raise
        self.states += outcome.states
        return outcome

    def first_failing(self, first: int, starts: list[Any]) -> int:
        """The smallest k such that segments first..k cannot be linearized (the whole rest
        cannot). A prefix that cannot be linearized stays so when extended, so bisect."""
        lo, hi = first, self.segment_count - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if isinstance(self.search(first, mid + 1, starts), _Failure):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def end_values(self, first: int, end: int, starts: list[Any]) -> list[Any]:
        """Values segments first..end-1 can leave in the register, at most
        MAX_START_VALUES of them."""
        if first == end:
            return list(starts)
        found: list[Any] = []
        while len(found) < self.MAX_START_VALUES:
            outcome = self.search(first, end, starts, exclude_ends=frozenset(found), fold=False)
            if isinstance(outcome, _Failure):
                break
            found.append(outcome.end_value)
        return found

    def explain(self, first: int, starts: list[Any]) -> tuple[SegmentReport, int]:
        """Segments first.. cannot be linearized: find and describe the segment where it
        fails. Returns the report and the segment after it."""
        k = self.first_failing(first, starts)
        ops = self.ops[self.bounds[k]:self.bounds[k + 1]]
        before = self.end_values(first, k, starts) or [ANY]
        outcome = self.search(k, k + 1, before, fold=False)
        if isinstance(outcome, _Success):  # cannot happen; describe the whole prefix then
            outcome = self.search(first, k + 1, starts)
            assert isinstance(outcome, _Failure)
            ops = self.ops[self.bounds[first]:self.bounds[k + 1]]
            before = list(starts)
        return _report(ops, outcome, sorted(before, key=repr), False), k + 1

    def _segment_of(self, first: int, failure: _Failure) -> int:
        """The segment of the first op pending in ``failure``'s deepest state (a search
        that started at segment ``first``)."""
        at = min(self.bounds[first] + failure.deepest[0], len(self.ops) - 1)
        return bisect.bisect_right(self.bounds, at) - 1

    def _rough_report(
        self, k: int, first: int, failure: _Failure, inconclusive: bool
    ) -> SegmentReport:
        """Segment k, described from a search that started at segment ``first``."""
        base = self.bounds[first]
        ops = self.ops[self.bounds[k]:self.bounds[k + 1]]
        path = [(i + base, e) for i, e in _path(failure)]
        return SegmentReport(
            ops=ops,
            start_values=[],
            linearized=[self.ops[i] for i, e in path if e and self.bounds[k] <= i],
            value_then=failure.deepest[2],
            next_candidates=[self.ops[base + i] for i in failure.candidates],
            states=failure.states,
            inconclusive=inconclusive,
            holding_reads=[self.ops[base + i] for i in failure.holding],
        )

    def run(self, initial: Any) -> tuple[list[SegmentReport], list[SegmentReport]]:
        failures: list[SegmentReport] = []
        inconclusive: list[SegmentReport] = []
        first = 0
        starts: list[Any] = [initial]
        while first < self.segment_count:
            try:
                outcome = self.search(first, self.segment_count, starts)
            except _Budget as exc:
                k = self._segment_of(first, exc.args[0])
                inconclusive.append(self._rough_report(k, first, exc.args[0], True))
                first, starts = k + 1, [ANY]
                continue
            if isinstance(outcome, _Success):
                break
            try:
                report, first = self.explain(first, starts)
            except _Budget:
                # Surely not linearizable, but pinning down where ran out of budget: blame
                # the segment where the first search got furthest.
                k = self._segment_of(first, outcome)
                report, first = self._rough_report(k, first, outcome, False), k + 1
            failures.append(report)
            starts = [ANY]
        return failures, inconclusive


def check_register(
    ops: Iterable[RegisterOp], initial: Any = None, *, max_states: int = 200_000
) -> RegisterResult:
    """Is this history of one register linearizable? (See the module docstring.)

    Each failure is reported against the first segment at which the history stops being
    linearizable, with the values the history before it can leave in the register; checking
    resumes after it from an unknown value. ``max_states`` bounds the states one search may
    explore; past it the segment where the search stood is reported in ``inconclusive``
    (``ok`` stays true) and checking resumes after it.
    """
    ops = list(ops)
    anomalies = [] if initial is ANY else _read_anomalies(ops, initial)
    flagged = {id(a.read) for a in anomalies}
    prepared, dropped = _prepare(op for op in ops if id(op) not in flagged)
    checker = _Checker(prepared, max_states)
    failures, inconclusive = checker.run(initial)
    return RegisterResult(
        ok=not failures and not anomalies,
        failures=failures,
        inconclusive=inconclusive,
        read_anomalies=anomalies,
        ops_checked=len(prepared),
        optional_dropped=dropped,
        segments=checker.segment_count,
        largest_segment=max(
            (b - a for a, b in zip(checker.bounds, checker.bounds[1:], strict=False)), default=0
        ),
        states=checker.states,
    )

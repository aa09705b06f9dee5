"""What a caller can make a member write to its logs: bounded in size per line, and in lines
per caller (issue 26: 4 MB request fields copied whole into the audit and process logs grew
them by ~100 MB/s for a caller with no credential).

Owns: the one limiter of log lines about refused calls (``RefusedLines``: per caller key, at
most ``REFUSED_LOG_LINES_PER_CALLER_MAX`` lines a window and ``REFUSED_LOG_LINES_TOTAL_MAX``
member-wide, the rest counted and the count reported on the caller's next line that gets
through, in a table of at most ``REFUSED_LOG_CALLERS_MAX`` callers), the shortening of
caller-supplied values for a line (``shown``, ``field_summary``: a short prefix and a size,
never the whole value), and the filter that puts the gRPC library's per-request lines through
the same limiter (``install_library_filter``).
Must never: decide whether a call is refused (auth and the servicers do), write an audit line
itself (admin.py's Admin servicer does), keep more than ``REFUSED_LOG_CALLERS_MAX`` callers
in memory, or read the clock anywhere but ``clock``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import traceback
from typing import Any, Callable

# Characters of a caller-supplied string that a log or audit line shows; a longer one shows
# these and its length. 64 holds a resource name's useful part or a HOST:PORT, and keeps a
# line of a 4 MB field as short as a line of a short one.
AUDIT_FIELD_PREFIX_CHARS_MAX = 64
# Bytes of one audit line. Its fields are shortened to the prefix above (at most ~1.5 KB with
# every field escaped); this is the guard behind that: past it the line keeps its caller,
# RPC and outcome and says its arguments' size instead of them.
AUDIT_LINE_BYTES_MAX = 4096
# Lines about refused calls (no credential, not allowed, bad input, past a limit) that one
# caller -- its principal, or its client host without one -- gets per window; the rest are
# counted. 5 shows what a caller tried; a flood costs ~5 short lines a minute.
REFUSED_LOG_LINES_PER_CALLER_MAX = 5
# The window of the two counts: a minute is what an operator reads at a glance.
REFUSED_LOG_WINDOW_S = 60
# Lines about refused calls per window for the whole member, whatever the number of callers
# (many client hosts, or the gRPC library's own lines): ~1 a second, at most ~240 KiB a
# minute at AUDIT_LINE_BYTES_MAX each.
REFUSED_LOG_LINES_TOTAL_MAX = 60
# Characters of one line the gRPC library writes (its message and traceback): a traceback of
# our handlers is ~1,000; past it the middle is left out (the tail names the exception).
LIBRARY_LINE_CHARS_MAX = 4096
# Callers whose counts are kept; past it the least recently seen one is forgotten (its count of
# suppressed lines is reported by the next line that gets through). ~200 B each: ~200 KB.
REFUSED_LOG_CALLERS_MAX = 1024


@dataclasses.dataclass(frozen=True)
class Admitted:
    """A line may be written; it reports ``suppressed`` lines of its caller held back since its
    last one, and ``forgotten``, held back for callers no longer tracked."""

    suppressed: int = 0
    forgotten: int = 0

    def note(self) -> str:
        """What a text line appends: "" or " (37 similar suppressed)"."""
        parts = []
        if self.suppressed:
            parts.append(f"{self.suppressed} similar suppressed")
        if self.forgotten:
            parts.append(f"{self.forgotten} more from callers no longer tracked")
        return f" ({'; '.join(parts)})" if parts else ""

    def fields(self) -> dict[str, int]:
        """What a JSON line carries: the non-zero counts."""
        out = {"suppressed": self.suppressed, "suppressed_untracked": self.forgotten}
        return {k: v for k, v in out.items() if v}


@dataclasses.dataclass
class _Caller:
    window_started: float
    lines: int = 0
    suppressed: int = 0


class RefusedLines:
    """The limiter: ``admit(key)`` is an ``Admitted`` when a line about ``key``'s refused call
    may be written now, else None (the line is counted, not written). Thread-safe."""

    def __init__(
        self, *, per_caller_max: int = REFUSED_LOG_LINES_PER_CALLER_MAX, total_max: int = REFUSED_LOG_LINES_TOTAL_MAX,
        window_s: float = REFUSED_LOG_WINDOW_S, callers_max: int = REFUSED_LOG_CALLERS_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_caller_max = per_caller_max
        self.total_max = total_max
        self.window_s = window_s
        self.callers_max = callers_max
        self._clock = clock
        self._lock = threading.Lock()
        self._callers: collections.OrderedDict[str, _Caller] = collections.OrderedDict()  # least recent first
        self._total_started = float("-inf")
        self._total_lines = 0
        self._forgotten = 0  # suppressed lines of callers dropped from the table, not yet reported

    def tracked(self) -> int:
        with self._lock:
            return len(self._callers)

    def admit(self, key: str) -> Admitted | None:
        with self._lock:
            now = self._clock()
            caller = self._caller(key, now)
            if now - caller.window_started >= self.window_s:
                caller.window_started, caller.lines = now, 0
            if now - self._total_started >= self.window_s:
                self._total_started, self._total_lines = now, 0
            if caller.lines >= self.per_caller_max or self._total_lines >= self.total_max:
                caller.suppressed += 1
                return None
            caller.lines += 1
            self._total_lines += 1
            admitted = Admitted(caller.suppressed, self._forgotten)
            caller.suppressed, self._forgotten = 0, 0
            return admitted

    def _caller(self, key: str, now: float) -> _Caller:
        caller = self._callers.get(key)
        if caller is not None:
            self._callers.move_to_end(key)
            return caller
        if len(self._callers) >= self.callers_max:
            _, oldest = self._callers.popitem(last=False)
            self._forgotten += oldest.suppressed
        caller = self._callers[key] = _Caller(window_started=now)
        return caller


def shown(value: str, chars_max: int = AUDIT_FIELD_PREFIX_CHARS_MAX) -> str:
    """``value`` for a message or log line: whole if short, else its prefix and its length."""
    if len(value) <= chars_max:
        return repr(value)
    return f"{value[:chars_max]!r}... ({len(value)} characters)"


def field_summary(name: str, value: Any, out: dict[str, Any]) -> None:
    """Put what an audit line records of field ``name`` into ``out``: bytes by size only
    (``<name>_bytes``); a string whole up to AUDIT_FIELD_PREFIX_CHARS_MAX characters, else its
    prefix (``<name>_prefix``) and length (``<name>_chars``); numbers and booleans as they are;
    anything else (a message, a repeated field) by its count or size only."""
    if isinstance(value, bytes):
        out[f"{name}_bytes"] = len(value)
    elif isinstance(value, str):
        if len(value) <= AUDIT_FIELD_PREFIX_CHARS_MAX:
            out[name] = value
        else:
            out[f"{name}_prefix"] = value[:AUDIT_FIELD_PREFIX_CHARS_MAX]
            out[f"{name}_chars"] = len(value)
    elif isinstance(value, (bool, int, float)) or value is None:
        out[name] = value
    elif hasattr(value, "ByteSize"):
        out[f"{name}_bytes"] = value.ByteSize()
    else:
        out[f"{name}_items"] = len(value)


class LibraryLines(logging.Filter):
    """Puts a library logger's records through a limiter, one key per logger and message
    template: the gRPC library logs a line, with a traceback, per request it cannot decode and
    names no caller in it, so its lines are counted per kind, under the member-wide cap."""

    def __init__(self, limiter: RefusedLines) -> None:
        super().__init__()
        self._limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        kind = str(record.msg)[:AUDIT_FIELD_PREFIX_CHARS_MAX]  # the library formats some messages itself
        admitted = self._limiter.admit(f"library {record.name}: {kind}")
        if admitted is None:
            return False
        # The message and its traceback as one bounded text: an exception's message may
        # carry what a caller sent.
        parts = [record.getMessage()]
        if record.exc_info:
            parts += "".join(traceback.format_exception(*record.exc_info)).rstrip().splitlines()
        line_max = LIBRARY_LINE_CHARS_MAX // 8  # a traceback line is ~100; the exception's own may be a caller's
        text = "\n".join(_cut(part, line_max) for part in parts)
        record.msg, record.args = bounded_text(text) + admitted.note(), ()
        record.exc_info, record.exc_text = None, None
        return True


def _cut(line: str, chars_max: int) -> str:
    return line if len(line) <= chars_max else f"{line[:chars_max]}... ({len(line) - chars_max} characters left out)"


def bounded_text(text: str, chars_max: int = LIBRARY_LINE_CHARS_MAX) -> str:
    """``text`` whole if short, else its head and its tail (where a traceback names the
    exception) around a note of how much was left out."""
    if len(text) <= chars_max:
        return text
    half = chars_max // 2
    return f"{text[:half]} ... ({len(text) - 2 * half} characters left out) ... {text[-half:]}"


# The gRPC library's loggers that write a line per request (one with a traceback for each
# request it cannot decode, ~400 B for a few bytes sent, no credential needed; one per handler
# exception).
GRPC_LIBRARY_LOGGERS = ("grpc._common", "grpc._server")


def install_library_filter(limiter: RefusedLines, logger_names: tuple[str, ...] = GRPC_LIBRARY_LOGGERS) -> LibraryLines:
    """Rate-limit the records of ``logger_names`` through ``limiter`` (once per process: a
    second call adds a second filter with its own counts). Returns the filter."""
    line_filter = LibraryLines(limiter)
    for name in logger_names:
        logging.getLogger(name).addFilter(line_filter)
    return line_filter

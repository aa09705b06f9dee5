"""Durations as people type them on a command line: ``10s``, ``500ms``, ``1.5m``, ``2h``.

Owns: turning one such word into seconds, and the wording of its error; and the way back,
a duration as people read it (``29.5s``, ``4m10s``) for what fencingctl prints. Must never: accept a
word it has to guess about (an empty unit is the flag's own unit, given by the caller, so
``--wait-s 2`` keeps meaning two seconds and ``--ttl-ms 5000`` five seconds), or return a
value that is not finite.
"""

from __future__ import annotations

import math
import re

# Seconds per unit.
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_WORD = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h)?")


def parse_s(text: str, *, default_unit: str) -> float:
    """Seconds in ``text`` (a number, then optionally one of ms, s, m, h; no unit:
    ``default_unit``). ValueError names what was wrong."""
    if default_unit not in _UNITS:
        raise ValueError(f"unknown default unit {default_unit!r}")
    match = _WORD.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration (a number with an optional unit: ms, s, m or h, e.g. 10s, 500ms)"
        )
    value = float(match.group(1)) * _UNITS[match.group(2) or default_unit]
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is too large a duration")
    return value


def text_ms(ms: int) -> str:
    """``ms`` as people read a duration (Go's time.Duration style): ``750ms``, ``29.5s``,
    ``4m10s``, ``2h0m5s`` (a tenth of a second at most under a minute; whole seconds above)."""
    if ms < 1000:
        return f"{max(0, int(ms))}ms"
    if ms < 60_000:
        return f"{(ms // 100) / 10:.1f}".rstrip("0").rstrip(".") + "s"
    total_s = int(ms // 1000)
    hours, rest = divmod(total_s, 3600)
    minutes, seconds = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{seconds}s"

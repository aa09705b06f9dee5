"""Durations as people type them on a command line: ``10s``, ``500ms``, ``1.5m``, ``2h``.

Owns: turning one such word into seconds, and the wording of its error. Must never: accept a
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

"""SECURITY.md's "Limits and quotas" table names every limit, with the default the code has.

Every constant of ``coordinator/core/limits.py``, ``coordinator/raft/limits.py`` and
``coordinator/server/log_limits.py``, every
principals-file quota, the bounds ``server/auth.py`` and ``server/settings.py`` hold of their
files, every numeric config setting that is not plain timing, and the numeric constants of
the client modules in ``CLIENT_LIMIT_MODULES`` must have a row whose default is the code's:
a new limit without a row, or a changed value, fails here.
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from coordinator.client import _session, lockcmd, redis_guard
from coordinator.core import limits as core_limits
from coordinator.raft import limits as raft_limits
from coordinator.server import auth, log_limits, settings
from coordinator.server import config as config_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_HEADING = "## Limits and quotas"

# Numeric settings that pace the member rather than bound what a caller or peer can make it
# hold: each needs a reason to stay out of the table.
NOT_LIMITS = {
    "propose_deadline_margin_s": "a margin kept back from the caller's own deadline",
    "shutdown_grace_s": "how long a stopping member lets running RPCs finish",
    "health_check_interval_s": "how often health is re-checked",
    "raft_min_timeout_s": "election timing",
    "raft_max_timeout_s": "election timing",
    "leader_fallback_timeout_s": "election timing",
    "leader_lost_election_s": "election timing",
    "heartbeat_s": "election timing",
    "lease_read_clock_drift_s": "read-lease timing: shortens the leader's lease, bounds nothing a caller sends",
}
# Switches that turn a defence off or a surface on: each needs a row stating its default
# (true or false), so turning one is a documented choice.
SECURITY_SWITCHES = ("reflection", "insecure_api", "insecure_peer_transport")
# Client modules whose every numeric constant is a limit on the client's own inputs (a
# command's arguments), not pacing: the rest of the client's constants are retry timing.
CLIENT_LIMIT_MODULES = (lockcmd, redis_guard, _session)
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _constants(module) -> dict[str, int]:
    return {k: v for k, v in vars(module).items() if k.isupper() and type(v) is int}


def expected_limits() -> dict[str, int | float | bool]:
    """Table key -> the code's default."""
    out: dict[str, int | float] = {**_constants(core_limits), **_constants(raft_limits), **_constants(log_limits)}
    out["PRINCIPALS_MAX"] = auth.PRINCIPALS_MAX
    out["RAFT_SECRET_CHARS_MIN"] = settings.RAFT_SECRET_CHARS_MIN
    for module in CLIENT_LIMIT_MODULES:
        out.update({k: v for k, v in vars(module).items() if k.isupper() and type(v) in (int, float)})
    for field, default in auth.QUOTA_DEFAULTS.items():
        # A quota's row states its default's constant instead of having a row of its own.
        del out[quota_default_constant(field)]
        out[f"[[principal]] {field}"] = default
    for field in dataclasses.fields(config_mod.ServerConfig):
        numeric = type(field.default) in (int, float)
        if numeric and field.name not in NOT_LIMITS or field.name in SECURITY_SWITCHES:
            out[field.name] = field.default
    return out


def quota_default_constant(field: str) -> str:
    """``resources_max`` -> ``PRINCIPAL_RESOURCES_MAX``, the constant auth.py defaults it to."""
    name = f"PRINCIPAL_{field.upper()}"
    assert getattr(core_limits, name) == auth.QUOTA_DEFAULTS[field], name
    return name


def table_rows() -> dict[str, str]:
    """The table's first-column names -> their default cells."""
    with open(os.path.join(ROOT, "SECURITY.md"), encoding="utf-8") as f:
        text = f.read()
    assert TABLE_HEADING in text, f"SECURITY.md has no {TABLE_HEADING!r} section"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
        if name:
            assert name.group(1) not in rows, f"{name.group(1)} has two rows"
            rows[name.group(1)] = cells[1]
    return rows


def renderings(value: int | float) -> set[str]:
    """The ways the table may write ``value``: 1024, 1,024, 1 KiB, 2⁶³−1 ..., true"""
    if isinstance(value, bool):
        return {str(value).lower()}
    if isinstance(value, float):
        assert value.is_integer(), value
        value = int(value)
    out = {str(value), f"{value:,}"}
    for unit, size in (("KiB", 1024), ("MiB", 1024**2)):
        if value and value % size == 0:
            out.add(f"{value // size:,} {unit}")
    for exponent in range(8, 65):
        power = "2" + str(exponent).translate(SUPERSCRIPT)
        if value == 2**exponent:
            out.add(power)
        if value == 2**exponent - 1:
            out.add(power + "−1")
    return out


def default_written(cell: str, name: str) -> str:
    """The number a default cell states: before any parenthesis, without the unit (ms, s) its
    name carries (LEASE_TTL_MS_MIN, stream_idle_timeout_s)."""
    number = cell.split(" (", 1)[0].strip()
    for unit in set(name.lower().split("_")) & {"ms", "s"}:
        if number.endswith(" " + unit):
            return number[: -len(unit) - 1]
    return number


def test_every_limit_has_a_row_with_the_codes_default():
    rows = table_rows()
    missing = sorted(set(expected_limits()) - set(rows))
    assert not missing, f"SECURITY.md's limits table lacks: {', '.join(missing)}"
    wrong = {
        name: (rows[name], sorted(renderings(value)))
        for name, value in expected_limits().items()
        if default_written(rows[name], name) not in renderings(value)
    }
    assert not wrong, f"defaults in SECURITY.md differ from the code: {wrong}"


def test_each_quota_row_names_its_default_constant():
    rows = table_rows()
    for field in auth.QUOTA_DEFAULTS:
        assert f"`{quota_default_constant(field)}`" in rows[f"[[principal]] {field}"], field


def test_the_table_names_nothing_the_code_lacks():
    stale = sorted(set(table_rows()) - set(expected_limits()))
    assert not stale, f"SECURITY.md's limits table names what the code no longer has: {', '.join(stale)}"


def test_every_numeric_setting_is_a_limit_or_said_not_to_be():
    settings = {f.name for f in dataclasses.fields(config_mod.ServerConfig)}
    assert set(NOT_LIMITS) <= settings, "NOT_LIMITS names a setting that no longer exists"


@pytest.mark.parametrize("cell,name,value,ok", [
    ("64 KiB", "VALUE_BYTES_MAX", 65536, True),
    ("2⁶³−1", "REVISION_MAX", 2**63 - 1, True),
    ("60 s", "stream_idle_timeout_s", 60.0, True),
    ("5,000 ms", "RAFT_NAMING_DEADLINE_MS", 5000, True),
    ("16 (`PRINCIPAL_STREAMS_MAX`)", "x", 16, True),
    ("65 KiB", "VALUE_BYTES_MAX", 65536, False),
    ("2⁶³", "REVISION_MAX", 2**63 - 1, False),
])
def test_the_default_check_can_tell_a_wrong_value(cell, name, value, ok):
    assert (default_written(cell, name) in renderings(value)) is ok


# A claim backed by a test names it: a file (``tests/test_x.py``) and, where one test backs it,
# the test (``tests/test_x.py::test_y``, ``::test_y`` after a file, or `` `test_y` ``).
TEST_FILE = re.compile(r"tests/(test_[a-z0-9_]+\.py)")
TEST_NAME = re.compile(r"(?:::|`)(test_[A-Za-z0-9_]+)")


def named_tests(text: str) -> tuple[set[str], set[str]]:
    return set(TEST_FILE.findall(text)), set(TEST_NAME.findall(text))


def defined_tests() -> tuple[set[str], set[str]]:
    files, names = set(), set()
    tests_dir = os.path.join(ROOT, "tests")
    for entry in os.listdir(tests_dir):
        if entry.endswith(".py"):
            files.add(entry)
            with open(os.path.join(tests_dir, entry), encoding="utf-8") as f:
                names.update(re.findall(r"^\s*(?:async )?def (test_[A-Za-z0-9_]+)", f.read(), re.M))
    return files, names


def test_every_test_security_md_names_exists():
    with open(os.path.join(ROOT, "SECURITY.md"), encoding="utf-8") as f:
        files, names = named_tests(f.read())
    have_files, have_names = defined_tests()
    assert files, "SECURITY.md names no test"
    assert not files - have_files, f"SECURITY.md names test files that do not exist: {sorted(files - have_files)}"
    assert not names - have_names, f"SECURITY.md names tests that do not exist: {sorted(names - have_names)}"


def test_the_name_check_sees_a_missing_test():
    files, names = named_tests("(tests/test_nothing_here.py::test_never_written, `test_nor_this`)")
    have_files, have_names = defined_tests()
    assert files == {"test_nothing_here.py"} and not files <= have_files
    assert names == {"test_never_written", "test_nor_this"} and not names & have_names

"""Whether this install has the server's own dependencies (the ``[server]`` extra).

Owns: the one line ``fencingd`` prints, instead of an ImportError traceback from deep inside
``serve``, when only the client was installed (``pip install fencing-coordinator``), naming the
command that fixes it. What the server needs is read from the installed package's own
metadata (the ``server`` extra in pyproject.toml), so that list is written in one place.
Must never: import those dependencies (a missing one must give the line, not a traceback), or
refuse a source checkout that was never installed as a package (the tests run that way; the
imports then speak for themselves).
"""

from __future__ import annotations

import importlib.metadata
import re

DISTRIBUTION = "fencing-coordinator"
EXTRA = "server"
INSTALL_COMMAND = f"pip install '{DISTRIBUTION}[{EXTRA}]'"

# Requirement lines as installers write them into METADATA: `name[extras] spec; extra == "server"`.
_EXTRA_MARKER = re.compile(r";.*\bextra\s*==\s*['\"]" + EXTRA + r"['\"]")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def missing() -> list[str]:
    """The ``[server]`` distributions this environment lacks, in the metadata's order."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []  # a source checkout on sys.path, not an installed package
    lacking = []
    for line in requires:
        name = _NAME.match(line)
        if name is None or not _EXTRA_MARKER.search(line):
            continue
        try:
            importlib.metadata.distribution(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            lacking.append(name.group(0))
    return lacking


def require(prog: str) -> None:
    """Exit with one line (status 1) unless every ``[server]`` dependency is installed."""
    lacking = missing()
    if lacking:
        raise SystemExit(
            f"{prog}: the server's dependencies are not installed ({', '.join(lacking)}): {INSTALL_COMMAND}"
        )

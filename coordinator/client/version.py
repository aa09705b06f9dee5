"""The installed version of a distribution, for ``--version`` and ``fencing_build_info``.

Owns: one lookup in the installed package metadata (importlib.metadata), so both commands
and the build-info metric report the same string. Must never: fail (a source tree that was
never installed reports "unknown").
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "fencing-coordinator"


# Read once per process: the metadata lookup walks sys.path on every call (Status answers with
# it), and the code running does not change when a newer package is installed beside it.
@functools.cache
def distribution_version(name: str = DISTRIBUTION) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"

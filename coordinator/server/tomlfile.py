"""Read one TOML file, with errors that name the file and what it was for.

Shared by the server config and the principals file, so both refuse a missing or broken
file the same way.
"""

from __future__ import annotations

import tomllib
from typing import Any


def load(path: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """The parsed ``path``; ``error(message)`` if it cannot be read or is not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path} is not valid TOML: {exc}") from exc

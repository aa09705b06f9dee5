"""Read one PEM file, with errors that name what it was for.

Shared by the TLS settings (config.py) and the token signing keys (proof.py), so both
refuse a missing or non-PEM file the same way.
"""

from __future__ import annotations


def read(path: str, what: str, error: type[Exception]) -> bytes:
    """The bytes of ``path``; ``error(message)`` if it cannot be read or holds no PEM block."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise error(f"{what}: cannot read {path}: {exc}") from exc
    if b"-----BEGIN " not in data:
        raise error(f"{what}: {path} is not PEM")
    return data

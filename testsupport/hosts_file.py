"""Test host names in /etc/hosts that a test points at an address, moves, and hides.

Owns: ``HostNames``, a block of lines appended to the hosts file, one per name, each one
rewritten in place (same length, one ``pwrite``) to move the name or hide it, and the block
cut off again by ``close()``. The system resolver reads the file on every lookup, so a
member process sees a move at its next lookup, as it would see a DNS record change.
Must never: rewrite a line it did not append (the file is shared by every process on the
machine: other lines stay byte for byte where they are and a reader never sees them change),
or leave its lines behind (a context manager; ``close()`` runs from ``finally``).
"""

from __future__ import annotations

import fcntl
import os

HOSTS_PATH = "/etc/hosts"
# Two runs of these tests side by side append and cut their blocks one at a time.
LOCK_PATH = "/tmp/fencing-test-hosts.lock"
# The address column's width: every line of a name keeps one length whatever it points at.
_IP_CHARS = 15


def _line(name: str, ip: str | None) -> bytes:
    if ip is None:
        return f"#{'':<{_IP_CHARS - 1}} {name}\n".encode()  # hidden: the name does not resolve
    if len(ip) > _IP_CHARS:
        raise ValueError(f"{ip}: longer than {_IP_CHARS} characters")
    return f"{ip:<{_IP_CHARS}} {name}\n".encode()


class HostNames:
    """``names`` -> address (None: hidden), as lines appended to the hosts file."""

    def __init__(self, addresses: dict[str, str | None], path: str = HOSTS_PATH):
        self.path = path
        self._offsets: dict[str, int] = {}
        self._fd = os.open(path, os.O_RDWR)
        with _locked():
            self._start = os.fstat(self._fd).st_size
            lead = b"" if self._start == 0 or os.pread(self._fd, 1, self._start - 1) == b"\n" else b"\n"
            block = bytearray(lead)
            for name, ip in addresses.items():
                self._offsets[name] = self._start + len(block)
                block += _line(name, ip)
            self._block = bytes(block)
            os.pwrite(self._fd, self._block, self._start)

    def set(self, name: str, ip: str | None) -> None:
        """Point ``name`` at ``ip`` (None: it stops resolving), in one write of its own line."""
        line = _line(name, ip)
        offset = self._offsets[name]
        os.pwrite(self._fd, line, offset)
        at = offset - self._start
        self._block = self._block[:at] + line + self._block[at + len(line):]

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            with _locked():
                size = os.fstat(self._fd).st_size
                tail = os.pread(self._fd, size - self._start, self._start)
                if tail == self._block:
                    os.ftruncate(self._fd, self._start)  # nobody appended after us: cut our block
                else:
                    # Someone appended behind our block: take our lines out, keep theirs.
                    kept = tail.replace(self._block, b"", 1)
                    os.pwrite(self._fd, kept, self._start)
                    os.ftruncate(self._fd, self._start + len(kept))
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "HostNames":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _locked:
    def __enter__(self):
        self._fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)

"""systemd's readiness protocol (sd_notify(3)): ``READY=1``, ``STOPPING=1`` and ``STATUS=``.

A unit with ``Type=notify`` starts the process with ``$NOTIFY_SOCKET`` naming a datagram
socket; the process sends newline-separated ``KEY=VALUE`` lines to it, and ``systemctl start``
returns once ``READY=1`` arrived. A path starting with ``@`` is in the abstract namespace (the
``@`` stands for a leading NUL byte). Without ``$NOTIFY_SOCKET`` (no systemd, or another unit
type) every call does nothing.

Owns: reading ``$NOTIFY_SOCKET`` once (and removing it from the environment, so processes this
one starts, like ``fencingd dev``'s members, never speak for it) and sending the datagrams.
Must never: raise or block the member (a notification that cannot be sent is logged once and
dropped: the member serves all the same), or depend on libsystemd.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
# Longest STATUS= text sent: systemctl status shows one line; a datagram stays small.
STATUS_CHARS_MAX = 200
# A notification is a local datagram; the socket is never full for long, and a member must not
# wait on its supervisor.
SEND_TIMEOUT_S = 1.0


def socket_address(value: str) -> str | bytes | None:
    """``$NOTIFY_SOCKET`` as an AF_UNIX address: a path, or bytes for the abstract namespace;
    None for what this module does not speak (``vsock:``, a relative path, empty)."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None


class Notifier:
    """Sends notifications to the socket ``$NOTIFY_SOCKET`` named when it was made."""

    def __init__(self, address: str | bytes | None) -> None:
        self.address = address
        self._failed = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        """The notifier of this process; takes ``$NOTIFY_SOCKET`` out of ``environ`` (os.environ)."""
        env: MutableMapping[str, str] = os.environ if environ is None else environ
        value = env.pop(NOTIFY_SOCKET_ENV, "")
        address = socket_address(value)
        if value and address is None:
            log.warning("%s=%r: not a socket path this member can notify; readiness is not reported",
                        NOTIFY_SOCKET_ENV, value)
        return cls(address)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send ``fields`` (``KEY=VALUE`` each) in one datagram; True iff it was sent."""
        if self.address is None:
            return False
        data = "\n".join(fields).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_S)
                sock.sendto(data, self.address)
        except OSError as exc:
            if not self._failed:  # once: a supervisor gone away is not news at every change
                log.warning("%s: cannot notify the service manager: %s", NOTIFY_SOCKET_ENV, exc)
            self._failed = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", _status(status))

    def status(self, status: str) -> bool:
        return self.send(_status(status))

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", _status(status))


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.split())[:STATUS_CHARS_MAX]

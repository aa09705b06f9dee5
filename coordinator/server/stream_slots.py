"""Open KeepAliveStreams per principal on this member, counted against each one's quota.

Owns: ``StreamSlots``, the per-principal count of open KeepAliveStreams checked against the
principal's ``streams_max`` (principals file), refused with QUOTA_EXCEEDED past it.
Must never: enter the log (it counts open RPCs, not replicated state), count a stream
twice or forget one (the servicer gives the slot back when the RPC ends, however it ends), or
cap streams of every caller together (stream_admission.py does, before the RPC runs).
"""

from __future__ import annotations

import threading

from coordinator.core.names import ErrorMeta
from coordinator.core.state_machine import Reason
from coordinator.server.auth import Principal
from coordinator.server.errors import ServiceError


class StreamSlots:
    """Open KeepAliveStreams per principal on this member, against each one's ``streams_max``.

    A count of open RPCs, not replicated state: it never enters the log. No principal (no
    principals file) or no ``streams_max`` (admin): not counted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def open_count(self, name: str) -> int:
        with self._lock:
            return self._open.get(name, 0)

    def enter(self, caller: Principal | None) -> None:
        """Take a slot for ``caller``'s new stream; QUOTA_EXCEEDED when it holds all of its own."""
        if caller is None or caller.quota.streams_max is None:
            return
        maximum = caller.quota.streams_max
        with self._lock:
            held = self._open.get(caller.name, 0)
            if held >= maximum:
                raise ServiceError(
                    Reason.QUOTA_EXCEEDED,
                    f"principal {caller.name!r} is at its streams quota ({held} open, max {maximum})",
                    {ErrorMeta.QUOTA: "streams", ErrorMeta.MAX: maximum, ErrorMeta.PRINCIPAL: caller.name},
                )
            self._open[caller.name] = held + 1

    def leave(self, caller: Principal | None) -> None:
        if caller is None or caller.quota.streams_max is None:
            return
        with self._lock:
            left = self._open.get(caller.name, 0) - 1
            if left > 0:
                self._open[caller.name] = left
            else:
                self._open.pop(caller.name, None)

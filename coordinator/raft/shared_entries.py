"""Shared entries: commands queued from any thread and packed into Raft entries on the Raft thread.

Owns: ``SharedEntries``, the part of ``HardenedSyncObj`` (a mixin; syncobj.py wires it) that
queues commands in place of pysyncobj's own queue (same bound, ``commands_queue_size``), wakes
the Raft thread for the first of them (``_wake_raft_thread``), and packs them at the next tick:
commands proposed with a ``batch_key`` while the tick thread is busy share one Raft entry
(``raft_wire.encode_shared_entry``), applied one by one in order under one index, within
``raft_limits.RAFT_ENTRY_COMMANDS_MAX`` commands and ``RAFT_ENTRY_BYTES_MAX`` bytes; each
command's callback gets its own outcome (``fan_out``).
Must never: put two commands with the same key in one entry (per key, the service uses the
resource name, every command keeps an index of its own), reorder commands, or guess an
outcome: a shared entry answered with anything but one outcome per command stops the member.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON

from coordinator.raft import limits as raft_limits
from coordinator.raft import wire as raft_wire
from coordinator.raft.fatal import EXIT_APPLY_FAILED

if TYPE_CHECKING:  # for mypy only: the class it is mixed into is a pysyncobj SyncObj (untyped: Any)
    from pysyncobj import SyncObj as _Host
else:
    _Host = object


class SharedEntries(_Host):
    """Mixed into HardenedSyncObj; ``_init_shared_entries`` runs before SyncObj.__init__. Needs
    ``self._on_fatal``; ``_checkCommandsToApply`` (syncobj.py) calls ``_pack_queued``."""

    def _init_shared_entries(self, queue_size: int) -> None:
        self._queued_lock = threading.Lock()
        self._queued: list[tuple[bytes, Any, Callable]] = []  # (command, batch key, callback)
        self._queued_max = queue_size
        self._packing = False
        self.shared_entries = 0  # entries that carried more than one command

    def queue_command(self, command: bytes, batch_key, callback) -> None:
        """Queue ``command`` for the next tick, which packs queued commands into entries.

        Replaces pysyncobj's own queue for our commands (same bound: commands_queue_size),
        so commands keep their arrival order whether they share an entry or not.
        """
        with self._queued_lock:
            full = len(self._queued) >= self._queued_max
            if not full:
                self._queued.append((command, batch_key, callback))
                wake = len(self._queued) == 1
        if full:
            callback(None, FAIL_REASON.QUEUE_FULL)
            return
        if wake:
            self._wake_raft_thread()  # what pysyncobj's _applyCommand does (syncobj.py:498-499)

    def _wake_raft_thread(self) -> None:
        """End the Raft thread's poll early, from any thread (pysyncobj's pipe notifier)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return
        try:
            notifier.notify()
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending already

    def _applyCommand(self, command, callback, commandType=None):
        if not self._packing:
            return SyncObj._applyCommand(self, command, callback, commandType)
        # syncobj.py:492-501 without its pipe notify: on the Raft thread, right before
        # the queue is read, a wake-up would only cost one more (empty) tick per entry.
        if commandType is not None:
            command = _ps._bchr(commandType) + command
        try:
            self._SyncObj__commandsQueue.put_nowait((command, callback))
        except _ps.Queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)

    def _pack_queued(self) -> None:
        with self._queued_lock:
            queued, self._queued = self._queued, []
        group: list[tuple[bytes, Any, Callable]] = []
        keys: set = set()
        size = 0
        for item in queued:
            command, key, _ = item
            if key is None:
                # Commands without a key keep their place in line, each in an entry of its own.
                if group:
                    self._propose_group(group)
                    group, keys, size = [], set(), 0
                self._propose_group([item])
                continue
            if group and (
                key in keys
                or len(group) >= raft_limits.RAFT_ENTRY_COMMANDS_MAX
                or size + len(command) > raft_limits.RAFT_ENTRY_BYTES_MAX
            ):
                self._propose_group(group)
                group, keys, size = [], set(), 0
            group.append(item)
            keys.add(key)
            size += len(command)
        if group:
            self._propose_group(group)

    def _propose_group(self, group: list[tuple[bytes, Any, Callable]]) -> None:
        if len(group) == 1:
            command, _, callback = group[0]
            self._applyCommand(raft_wire.encode_entry(command), callback)
            return
        callbacks = [callback for _, _, callback in group]

        def fan_out(result, error):
            if error != FAIL_REASON.SUCCESS:
                for callback in callbacks:
                    callback(None, error)
                return
            index, outcomes = result
            if not isinstance(outcomes, list) or len(outcomes) != len(callbacks):
                # Only a shared entry we did not build could get here; never guess.
                self._on_fatal(f"shared entry at {index} answered {outcomes!r}", EXIT_APPLY_FAILED)
                return
            for callback, outcome in zip(callbacks, outcomes, strict=True):
                callback((index, outcome), error)

        self.shared_entries += 1
        shared = raft_wire.encode_shared_entry([command for command, _, _ in group])
        self._applyCommand(raft_wire.encode_entry(shared), fan_out)
